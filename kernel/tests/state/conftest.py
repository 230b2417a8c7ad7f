"""Fixtures of the state-store conformance suite.

Every test that takes ``store`` (or ``backend``) runs against each backend:
memory and sqlite under asyncio *and* trio (with a fake clock), redis under
asyncio against a real server, and redis-cluster against a real three-node
Redis Cluster. A test module may restrict the backends with
``STATE_BACKENDS = ("sqlite", "redis")``, a test with
``@pytest.mark.state_backends("redis", "redis-cluster")``.

Redis: the URL comes from ``TOOLWIRE_REDIS_URL`` (default
``redis://127.0.0.1:6379/15``). THAT DATABASE IS FLUSHED before every redis
test. Redis Cluster: ``TOOLWIRE_REDIS_CLUSTER_URL`` (``redis+cluster://``;
``./dev test`` starts one); EVERY PRIMARY IS FLUSHED before every cluster
test. Without a reachable server the tests are skipped, unless
``TOOLWIRE_REQUIRE_REDIS=1``, which turns that into a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from toolwire.state import MemoryStore, RedisStore, SQLiteStore, StateStore
from toolwire.testing import require_redis, require_redis_cluster

REDIS_URL = os.environ.get("TOOLWIRE_REDIS_URL", "redis://127.0.0.1:6379/15")
ALL_BACKENDS = ("memory", "sqlite", "redis", "redis-cluster")

# (store backend, anyio backend)
_SPECS = [
    pytest.param(("memory", "asyncio"), id="memory-asyncio"),
    pytest.param(("memory", "trio"), id="memory-trio"),
    pytest.param(("sqlite", "asyncio"), id="sqlite-asyncio"),
    pytest.param(("sqlite", "trio"), id="sqlite-trio"),
    pytest.param(("redis", "asyncio"), id="redis", marks=pytest.mark.redis),
    pytest.param(("redis-cluster", "asyncio"), id="redis-cluster", marks=pytest.mark.redis),
]


class FakeClock:
    """A wall clock that only moves when told to (starts at the real time)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def redis_url() -> str:
    """The test Redis URL, or skip (fail under TOOLWIRE_REQUIRE_REDIS=1) without one."""
    return require_redis(REDIS_URL)


def flush_redis(url: str) -> None:
    import redis
    import redis.cluster

    client: redis.Redis | redis.cluster.RedisCluster
    if url.startswith("redis+cluster://"):
        client = redis.cluster.RedisCluster.from_url(url.replace("+cluster", "", 1))
        try:
            client.flushdb(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        finally:
            client.close()
        return
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


@dataclass
class Backend:
    """A store under test plus what a test needs to drive it."""

    name: str  # "memory" | "sqlite" | "redis" | "redis-cluster"
    store: StateStore
    clock: FakeClock | None  # None: real (Redis server) time
    url: str  # for open_store / other processes ("memory://" for memory)
    make_store: Callable[[], StateStore] | None  # another object on the same data

    async def pass_time(self, seconds: float) -> None:
        """Let ``seconds`` of store time pass (fake clock: instantly)."""
        if self.clock is not None:
            self.clock.advance(seconds)
            await anyio.lowlevel.checkpoint()
        else:
            await anyio.sleep(seconds)

    def now(self) -> float:
        return self.clock() if self.clock is not None else time.time()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_spec" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("state_backends")
        wanted = marker.args if marker else getattr(metafunc.module, "STATE_BACKENDS", ALL_BACKENDS)
        specs = [p for p in _SPECS if p.values[0][0] in wanted]  # type: ignore[index]
        metafunc.parametrize("backend_spec", specs, indirect=True)


@pytest.fixture
def backend_spec(request: pytest.FixtureRequest) -> tuple[str, str]:
    spec: tuple[str, str] = request.param
    return spec


@pytest.fixture
def anyio_backend(backend_spec: tuple[str, str]) -> str:
    return backend_spec[1]


@pytest.fixture
async def backend(backend_spec: tuple[str, str], tmp_path: Path) -> AsyncIterator[Backend]:
    name = backend_spec[0]
    if name == "memory":
        clock = FakeClock()
        b = Backend(name, MemoryStore(clock=clock), clock, "memory://", None)
    elif name == "sqlite":
        clock = FakeClock()
        path = tmp_path / "state.db"
        b = Backend(
            name,
            SQLiteStore(path, clock=clock),
            clock,
            f"sqlite:///{path}",
            lambda: SQLiteStore(path, clock=clock),
        )
    else:
        url = redis_url() if name == "redis" else require_redis_cluster()
        flush_redis(url)
        b = Backend(name, RedisStore(url), None, url, lambda: RedisStore(url))
    await b.store.open()
    try:
        yield b
    finally:
        await b.store.close()


@pytest.fixture
def fresh_redis_url() -> str:
    """A reachable Redis URL whose database was just flushed (skips/fails otherwise)."""
    url = redis_url()
    flush_redis(url)
    return url


@pytest.fixture
def fresh_redis_cluster_url() -> str:
    """A reachable Redis Cluster URL whose primaries were just flushed (skips/fails otherwise)."""
    url = require_redis_cluster()
    flush_redis(url)
    return url


@pytest.fixture
def store(backend: Backend) -> StateStore:
    """The store under test (opened), one per backend."""
    return backend.store
