"""Fixtures: every test taking ``env`` runs against memory, SQLite and a real Redis.

Redis: ``toolwire.testing.require_redis`` (``TOOLWIRE_REDIS_URL``, default
``redis://127.0.0.1:6379/15``; skipped without a server unless
``TOOLWIRE_REQUIRE_REDIS=1``). Each test writes under
its own key prefix and deletes its keys afterwards (the database is not flushed).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolwire import CallContext, Kernel, Tool, ToolAnnotations
from toolwire.state import ANY, Entry, StateStore, open_store
from toolwire.testing import FakeClock, require_redis
from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin


def redis_url() -> str:
    """The test Redis URL, or skip (fail under TOOLWIRE_REQUIRE_REDIS=1)."""
    return require_redis()


def delete_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


class CountingStore(StateStore):
    """Wraps a store and counts every operation (by name); ``fail`` makes some raise."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.ops: list[str] = []
        self.fail: set[str] = set()
        #: these operations are applied, then raise (an answer lost on its way back)
        self.fail_after: set[str] = set()

    def _op(self, name: str) -> None:
        self.ops.append(name)
        if name in self.fail:
            from toolwire.state import StateStoreError

            raise StateStoreError(f"injected failure of {name}")

    def _lost(self, name: str) -> None:
        if name in self.fail_after:
            from toolwire.state import StateStoreError

            raise StateStoreError(f"injected: {name} applied, its answer lost")

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def get_entry(self, key: str) -> Entry | None:
        self._op("get_entry")
        return await self.inner.get_entry(key)

    async def scan(self, prefix: str, *, limit: int | None = None) -> list[Entry]:
        self._op("scan")
        return await self.inner.scan(prefix, limit=limit)

    async def set(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry:
        self._op("set")
        return await self.inner.set(key, value, ttl=ttl, owner=owner)

    async def set_if_absent(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry | None:
        self._op("set_if_absent")
        return await self.inner.set_if_absent(key, value, ttl=ttl, owner=owner)

    async def set_if_absent_or_get(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> tuple[Entry, bool]:
        self._op("set_if_absent_or_get")
        got = await self.inner.set_if_absent_or_get(key, value, ttl=ttl, owner=owner)
        self._lost("set_if_absent_or_get")
        return got

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Entry | None:  # type: ignore[override]
        self._op("compare_and_set")
        got = await self.inner.compare_and_set(key, value, **kw)
        self._lost("compare_and_set")
        return got

    async def compare_and_delete(
        self, key: str, *, expected_version: int | None = ANY, expected_owner: str | None = ANY
    ) -> bool:
        self._op("compare_and_delete")
        got = await self.inner.compare_and_delete(
            key, expected_version=expected_version, expected_owner=expected_owner
        )
        self._lost("compare_and_delete")
        return got

    async def delete(self, key: str) -> bool:
        self._op("delete")
        return await self.inner.delete(key)

    async def incr(self, key: str, amount: int = 1, *, ttl: float | None = None) -> int:
        self._op("incr")
        return await self.inner.incr(key, amount, ttl=ttl)

    async def wait_for_change(
        self,
        key: str,
        *,
        version: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> Entry | None:
        self._op("wait_for_change")
        return await self.inner.wait_for_change(key, version=version, timeout=timeout)


@dataclass
class Env:
    """One backend under test: builds kernels (with the plugin) on the same state."""

    name: str  # "memory" | "sqlite" | "redis"
    url: str
    prefix: str  # the plugin's key prefix for this test
    clock: FakeClock | None  # memory/sqlite: the kernels' fake clock; redis: None
    kernels: list[Kernel] = field(default_factory=list)
    shared: StateStore | None = None  # memory: one store object shared by the kernels

    def plugin(self, **config: Any) -> IdempotencyPlugin:
        config.setdefault("prefix", self.prefix)
        return IdempotencyPlugin(IdempotencyConfig(**config), env={})

    def store(self) -> StateStore:
        if self.name == "memory":
            if self.shared is None:
                self.shared = open_store("memory://", clock=self.clock.time if self.clock else None)
            return self.shared
        return open_store(self.url, clock=self.clock.time if self.clock else None)

    def kernel(
        self,
        tools: Iterable[Any] = (),
        plugins: Iterable[object] = (),
        *,
        counting: bool = False,
        **kw: Any,
    ) -> Kernel:
        store: StateStore = self.store()
        if counting:
            store = CountingStore(store)
        kernel = Kernel(tools=tools, plugins=plugins, state=store, clock=self.clock, **kw)
        self.kernels.append(kernel)
        return kernel

    def key(
        self, plugin: IdempotencyPlugin, tool: str, call_id: str, tenant: str | None = None
    ) -> str:
        return plugin.key_for(tool, call_id, tenant=tenant)


SCHEMA = {"type": "object", "properties": {}, "additionalProperties": True}


def counting_tool(
    name: str = "send",
    result: Any = None,
    *,
    read_only: bool | None = None,
    delay: float = 0.0,
    gate: anyio.Event | None = None,
    gate_first_only: bool = False,
) -> tuple[Tool, list[dict[str, Any]]]:
    """A tool recording its executions; returns ``result`` (default: a fresh dict).

    ``gate``: executions wait for it (only the first one with ``gate_first_only``).
    """
    runs: list[dict[str, Any]] = []

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        runs.append(dict(args))
        if gate is not None and (len(runs) == 1 or not gate_first_only):
            await gate.wait()
        if delay:
            await anyio.sleep(delay)
        if isinstance(result, BaseException):
            raise result
        if callable(result):
            return result(args)
        return {"run": len(runs), "args": args} if result is None else result

    tool = Tool(
        name=name,
        description="test tool",
        input_schema=SCHEMA,
        executor=executor,
        annotations=ToolAnnotations(readOnlyHint=read_only),
    )
    return tool, runs


BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=BACKENDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    prefix = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        e = Env("memory", "memory://", prefix, FakeClock())
    elif request.param == "sqlite":
        e = Env("sqlite", f"sqlite:///{tmp_path}/state.db", prefix, FakeClock())
    else:
        e = Env("redis", redis_url(), prefix, None)
    try:
        yield e
    finally:
        for kernel in e.kernels:
            await kernel.close()
        if e.name == "redis":
            delete_prefix(e.url, prefix)


@pytest.fixture
def make_env(tmp_path: Path) -> Callable[[str], Env]:
    """Build an Env by name (for tests that pick their backends themselves)."""

    def make(name: str) -> Env:
        prefix = f"t{uuid.uuid4().hex[:12]}"
        if name == "sqlite":
            return Env("sqlite", f"sqlite:///{tmp_path}/state.db", prefix, None)
        return Env("redis", redis_url(), prefix, None)

    return make
