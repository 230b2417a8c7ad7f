"""Fixtures of the ratelimit tests: the anyio backend and a real Redis when there is one."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def prefix() -> str:
    """A state prefix no other test uses."""
    return f"rl-test-{uuid.uuid4().hex[:10]}"
