"""Fixtures of the ratelimit tests: the anyio backend and a real Redis when there is one."""

from __future__ import annotations

import functools
import os
import uuid

import pytest

REDIS_URL = os.environ.get("TOOLWIRE_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@functools.cache
def _redis_problem(url: str) -> str | None:
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (pip install 'toolwire[redis]')"
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        return f"no Redis answers at {url} ({exc})"
    finally:
        client.close()
    return None


@pytest.fixture
def redis_url() -> str:
    """A reachable Redis (skips, or fails under TOOLWIRE_REQUIRE_REDIS=1, without one).

    Nothing is flushed: each test uses its own ``state_prefix``.
    """
    problem = _redis_problem(REDIS_URL)
    if problem is not None:
        if os.environ.get("TOOLWIRE_REQUIRE_REDIS", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"TOOLWIRE_REQUIRE_REDIS=1 but {problem}", pytrace=False)
        pytest.skip(f"{problem}; set TOOLWIRE_REDIS_URL or start redis-server")
    return REDIS_URL


@pytest.fixture
def prefix() -> str:
    """A state prefix no other test uses."""
    return f"rl-test-{uuid.uuid4().hex[:10]}"
