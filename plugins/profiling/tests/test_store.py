"""Fleet-wide figures: deltas merged into the StateStore by compare-and-set."""

from __future__ import annotations

import inspect
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolwire import Kernel, StateStore
from toolwire.state import MemoryStore, StateStoreError, open_store
from toolwire.testing import FakeClock, FakeTool
from toolwire_profiling import ProfilingConfig, ProfilingPlugin

pytestmark = pytest.mark.anyio
HERE = Path(__file__).resolve().parent


async def eventually(check: Callable[[], Any], within_s: float = 5.0) -> None:
    """Poll ``check`` (sync, or returning an awaitable) until it gives a truthy value."""
    for _ in range(int(within_s / 0.01)):
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        await anyio.sleep(0.01)
    raise AssertionError("condition not met in time")


def cfg(**kw: Any) -> ProfilingConfig:
    kw.setdefault("tracing", "off")
    kw.setdefault("metrics", "off")
    return ProfilingConfig(**kw)


async def test_flush_writes_one_document_per_tool() -> None:
    store = MemoryStore()
    p = ProfilingPlugin(cfg(), store=store)
    p.record_execution("a", 10)
    p.record_execution("a", 20)
    p.record_execution("b", 5, success=False)
    await p.flush()
    keys = [e.key for e in await store.scan("profiling:")]
    assert keys == ["profiling:v1:a", "profiling:v1:b"]
    doc = await store.get("profiling:v1:a")
    assert doc["v"] == 1 and doc["count"] == 2 and doc["ok"] == 2 and doc["updated_at"] > 0
    # Figures are not counted twice once stored.
    assert p.get_statistics("a")["count"] == 2
    await p.flush()
    assert (await store.get("profiling:v1:a"))["count"] == 2


async def test_two_processes_see_fleet_wide_figures(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    s1, s2 = open_store(url), open_store(url)
    a = ProfilingPlugin(cfg(), store=s1)
    b = ProfilingPlugin(cfg(), store=s2)
    async with s1, s2:
        for _ in range(30):
            a.record_execution("search", 100)
        for _ in range(10):
            b.record_execution("search", 300, success=False)
        # Before any flush each process sees its own figures only.
        assert a.get_statistics("search")["count"] == 30
        assert b.get_statistics("search")["count"] == 10
        await a.flush()
        await b.flush()  # b read a's document while merging: b now sees both
        assert b.get_statistics("search")["count"] == 40
        await a.refresh()  # a sees b's figures at its next refresh
        s = a.get_statistics("search")
        assert s["count"] == 40 and s["success_rate"] == 0.75
        assert abs(s["p50_time_ms"] - 100) <= 1 and abs(s["p90_time_ms"] - 300) <= 3
        # Local, unflushed figures are added to the stored ones.
        a.record_execution("search", 100)
        assert a.get_statistics("search")["count"] == 41


@pytest.mark.parametrize("shared", ["memory", "sqlite"])
async def test_concurrent_flushes_lose_nothing(tmp_path: Path, shared: str) -> None:
    if shared == "memory":
        one = MemoryStore()
        stores: list[StateStore] = [one] * 6
    else:
        url = f"sqlite:///{tmp_path / 'state.db'}"
        stores = [open_store(url) for _ in range(6)]
    plugins = [ProfilingPlugin(cfg(), store=s) for s in stores]
    for s in set(stores):
        await s.open()
    try:
        for round_ in range(3):
            for i, p in enumerate(plugins):
                for j in range(10 + i):
                    p.record_execution("hot", 1 + j + round_, success=j % 4 != 0)
            async with anyio.create_task_group() as tg:
                for p in plugins:
                    tg.start_soon(p.flush)
        await plugins[0].refresh()
        s = plugins[0].get_statistics("hot")
        want = 3 * sum(10 + i for i in range(6))
        assert s["count"] == want and s["calls"] == want
        assert s["success_count"] == 3 * sum(
            sum(1 for j in range(10 + i) if j % 4) for i in range(6)
        )
    finally:
        for s in set(stores):
            await s.close()


async def test_background_flusher_and_shutdown(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    p = ProfilingPlugin(cfg(flush_interval_s=0.02))
    tool = FakeTool("t")
    async with Kernel(tools=[tool.tool], plugins=[p], state=url) as k:
        await k.call("t", {})
        await eventually(lambda: k.state.get("profiling:v1:t"))
        await eventually(lambda: not p._flusher_active)  # it stops once nothing is pending
        # A call right before shutdown is flushed by shutdown.
        p.config.flush_interval_s = 3600
        await k.call("t", {})
    reader = ProfilingPlugin(cfg(), store=open_store(url))
    async with reader._store:  # type: ignore[union-attr]
        await reader.refresh()
    assert reader.get_statistics("t")["calls"] == 2


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_the_flusher_stores_the_statistics_on_each_loop(state: str, tmp_path: Path) -> None:
    """The background flusher (an asyncio task, or a trio system task) writes them while the
    kernel runs, and the last flush at shutdown takes the rest."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    memory = MemoryStore() if state == "memory" else None
    p = ProfilingPlugin(cfg(flush_interval_s=0.02))
    tool = FakeTool("t", script=[{"ok": 1}, {"ok": 1}, ValueError("boom"), {"ok": 1}]).tool
    async with Kernel(tools=[tool], plugins=[p], state=memory or url) as k:
        for _ in range(3):
            await k.call("t", {})
        await eventually(lambda: k.state.get("profiling:v1:t"))
        await k.call("t", {})
    reader = ProfilingPlugin(cfg(), store=memory or open_store(url))
    async with reader._store:  # type: ignore[union-attr]
        await reader.refresh()
    stats = reader.get_statistics("t")
    assert (stats["count"], stats["success_count"], stats["errors"]) == (4, 3, {"tool_error": 1})


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(free_tcp_port: int) -> None:
    """redis.asyncio runs on asyncio only: the kernel says so when it starts (no hang, no
    traceback from inside redis-py), and nothing is recorded."""
    p = ProfilingPlugin(cfg())
    kernel = Kernel(
        tools=[FakeTool("t").tool], plugins=[p], state=f"redis://127.0.0.1:{free_tcp_port}/0"
    )
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await kernel.call("t", {})
    assert p.tools() == []


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_store_of_its_own_under_trio_warns_why_and_keeps_the_figures(
    free_tcp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    p = ProfilingPlugin(cfg(), store=open_store(f"redis://127.0.0.1:{free_tcp_port}/0"))
    async with Kernel(tools=[FakeTool("t").tool], plugins=[p]) as k:
        res = await k.call("t", {})
    assert not res.is_error and p.get_statistics("t")["count"] == 1
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("could not store the statistics" in m and "needs asyncio" in m for m in warned)


class FlakyStore(MemoryStore):
    """A memory store whose writes fail while ``down`` is set."""

    down = False

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
        if self.down:
            raise StateStoreError("memory: pretend the connection is lost")
        return await super().compare_and_set(key, value, **kw)


async def test_failed_flush_keeps_the_figures_for_the_next_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore()
    p = ProfilingPlugin(cfg(), store=store)
    p.record_execution("t", 10)
    store.down = True
    await p.flush()
    assert "could not store the statistics" in caplog.text
    assert await store.get("profiling:v1:t") is None
    p.record_execution("t", 20)
    assert p.get_statistics("t")["count"] == 2  # still counted locally
    store.down = False
    await p.flush()
    assert (await store.get("profiling:v1:t"))["count"] == 2
    assert p.get_statistics("t")["count"] == 2


class CountingStore(MemoryStore):
    """A memory store that counts its reads and fails them while ``failure`` is set."""

    failure: Exception | None = None

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    async def get_entry(self, key: str) -> Any:
        self.reads.append(key)
        if self.failure is not None:
            raise self.failure
        return await super().get_entry(key)


async def test_a_store_that_is_down_is_tried_once_per_flush_not_once_per_tool() -> None:
    # A hung Redis answers each command with its socket timeout (10 s): trying every
    # tool made one flush, and the kernel's close, last 10 s per tool.
    store = CountingStore()
    p = ProfilingPlugin(cfg(), store=store)
    for t in ("a", "b", "c"):
        p.record_execution(t, 10.0)
    store.failure = StateStoreError("memory: pretend the server stopped answering")
    await p.flush()
    assert len(store.reads) == 1
    assert [p.get_statistics(t)["count"] for t in "abc"] == [1, 1, 1]
    store.failure = None
    await p.flush()
    assert [(await store.get(f"profiling:v1:{t}"))["count"] for t in "abc"] == [1, 1, 1]


async def test_a_store_error_of_any_type_keeps_the_figures() -> None:
    # A custom store (or a driver error it does not wrap) raising something else than
    # StateStoreError: every delta of the flush was dropped.
    store = CountingStore()
    p = ProfilingPlugin(cfg(), store=store)
    for t in ("a", "b"):
        p.record_execution(t, 10.0)
    store.failure = RuntimeError("driver hiccup")
    await p.flush()
    p.record_execution("a", 30.0)
    assert [p.get_statistics(t)["count"] for t in "ab"] == [2, 1]
    store.failure = None
    await p.flush()
    assert [(await store.get(f"profiling:v1:{t}"))["count"] for t in "ab"] == [2, 1]
    assert p.get_statistics("a")["max_time_ms"] == 30.0


class UnsureStore(MemoryStore):
    """A memory store whose next compare-and-set fails after it was sent: ``applied``
    says whether it took effect (a Redis timeout: the server may run it, or not)."""

    applied: bool | None = None

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
        applied, self.applied = self.applied, None
        if applied is None:
            return await super().compare_and_set(key, value, **kw)
        if applied:
            await super().compare_and_set(key, value, **kw)
        raise StateStoreError("memory: no answer after the write was sent")


@pytest.mark.parametrize("applied", [True, False])
async def test_a_write_of_unknown_fate_is_counted_once(applied: bool) -> None:
    store = UnsureStore()
    p = ProfilingPlugin(cfg(), store=store)
    p.record_execution("a", 10.0)
    p.record_execution("b", 10.0)
    store.applied = applied
    await p.flush()  # "a" may or may not be stored; "b" waits for the next flush
    assert [p.get_statistics(t)["count"] for t in "ab"] == [1, 1]
    p.record_execution("a", 20.0)
    await p.flush()
    assert [(await store.get(f"profiling:v1:{t}"))["count"] for t in "ab"] == [2, 1]
    assert [p.get_statistics(t)["count"] for t in "ab"] == [2, 1]
    await p.flush()
    assert (await store.get("profiling:v1:a"))["count"] == 2


async def test_a_store_whose_read_fails_at_start_does_not_stop_the_kernel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a store raising something else than StateStoreError (a custom store, a
    driver error it does not wrap) while the plugin read the stored figures at startup
    made the kernel's start fail ('plugin profiling: startup failed'): no call could be
    made for the sake of statistics. Flushes already treated any error as the store's."""

    class ScanFails(MemoryStore):
        async def scan(self, prefix: str, *args: Any, **kw: Any) -> Any:
            raise RuntimeError("driver hiccup")

    store = ScanFails()
    p = ProfilingPlugin(cfg(), store=store)
    async with Kernel(tools=[FakeTool("echo").tool], plugins=[p]) as k:
        r = await k.call("echo", {})
        assert not r.is_error
    assert "could not read the stored statistics" in caplog.text
    assert (await store.get("profiling:v1:echo"))["count"] == 1


async def test_a_bad_document_does_not_keep_the_other_tools_from_the_store() -> None:
    store = CountingStore()
    await store.set("profiling:v1:a", {"v": 2})
    p = ProfilingPlugin(cfg(), store=store)
    for t in ("a", "b"):
        p.record_execution(t, 10.0)
    await p.flush()
    assert (await store.get("profiling:v1:b"))["count"] == 1
    assert p.get_statistics("a")["count"] == 1  # kept, not stored


class GatedStore(MemoryStore):
    """A store whose compare-and-set of one key waits for ``gate``."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.gate = anyio.Event()
        self.waiting = anyio.Event()

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
        if key == self.held:
            self.waiting.set()
            await self.gate.wait()
        return await super().compare_and_set(key, value, **kw)


async def test_figures_read_during_a_flush_are_not_counted_twice() -> None:
    # A flush writes tool after tool; a tool already stored must not also be counted
    # from the figures still being written (it read twice its count meanwhile).
    store = GatedStore("profiling:v1:b")
    p = ProfilingPlugin(cfg(), store=store)
    for _ in range(10):
        p.record_execution("a", 10.0)
        p.record_execution("b", 20.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.flush)
        await store.waiting.wait()  # "a" is stored, "b" is being written
        a, b = p.get_statistics("a"), p.get_statistics("b")
        est = p.estimate("a")
        store.gate.set()
    assert (a["count"], a["calls"], b["count"]) == (10, 10, 10)
    assert est.samples == 10
    assert p.get_statistics("a")["count"] == 10 and p.get_statistics("b")["count"] == 10


async def test_retention_expires_idle_tools() -> None:
    clock = FakeClock()
    p = ProfilingPlugin(cfg(retention_s=60))
    async with Kernel(tools=[FakeTool("t").tool], plugins=[p], clock=clock) as k:
        await k.call("t", {})
        await p.flush()
        assert await k.state.get("profiling:v1:t") is not None
        clock.advance(61)
        assert await k.state.get("profiling:v1:t") is None


async def test_key_prefix_separates_fleets_and_reset() -> None:
    store = MemoryStore()
    a = ProfilingPlugin(cfg(key_prefix="blue"), store=store)
    b = ProfilingPlugin(cfg(key_prefix="green"), store=store)
    a.record_execution("t", 1)
    b.record_execution("t", 1)
    b.record_execution("u", 1)
    await a.flush()
    await b.flush()
    await a.refresh()
    assert a.get_statistics("t")["count"] == 1 and a.tools() == ["t"]
    assert await b.reset("t") == 1
    assert b.tools() == ["u"] and await store.get("green:v1:t") is None
    assert await b.reset() == 1 and b.tools() == []
    assert await store.get("blue:v1:t") is not None


async def test_newer_document_format_is_not_overwritten(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    await store.set("profiling:v1:t", {"v": 2, "future": True})
    p = ProfilingPlugin(cfg(), store=store)
    p.record_execution("t", 1)
    await p.flush()
    assert await store.get("profiling:v1:t") == {"v": 2, "future": True}
    assert "another format" in caplog.text


def test_processes_sharing_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "_fleet_worker.py"), url, "fleet", "200"])
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.wait(120) == 0

    async def read() -> dict[str, Any]:
        p = ProfilingPlugin(cfg(key_prefix="fleet"), store=open_store(url))
        async with p._store:  # type: ignore[union-attr]
            await p.refresh()
        return p.get_statistics("work")

    s = anyio.run(read)
    assert s["calls"] == 600 and s["count"] == 600 and s["errors"] == {"unavailable": 60}
    assert s["success_rate"] == 0.9


@pytest.mark.redis
async def test_fleet_on_redis(redis_url: str) -> None:
    prefix = f"test-profiling-{uuid.uuid4().hex[:8]}"
    stores = [open_store(redis_url) for _ in range(3)]
    plugins = [ProfilingPlugin(cfg(key_prefix=prefix), store=s) for s in stores]
    try:
        for s in stores:
            await s.open()
        for i, p in enumerate(plugins):
            for j in range(100):
                p.record_execution("remote", 10 * (i + 1), {"page": j % 3})
        async with anyio.create_task_group() as tg:
            for p in plugins:
                tg.start_soon(p.flush)
        fresh = ProfilingPlugin(cfg(key_prefix=prefix), store=stores[0])
        await fresh.refresh()
        s = fresh.get_statistics("remote")
        assert s["count"] == 300 and abs(s["p50_time_ms"] - 20) <= 0.2
        assert fresh.estimate("remote", {"page": 1}).basis == "similar"
    finally:
        await plugins[0].reset()
        for s in stores:
            await s.close()


def test_processes_sharing_redis(redis_url: str) -> None:
    prefix = f"test-fleet-{uuid.uuid4().hex[:8]}"
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "_fleet_worker.py"), redis_url, prefix, "150"])
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.wait(120) == 0

    async def read() -> dict[str, Any]:
        store = open_store(redis_url)
        p = ProfilingPlugin(cfg(key_prefix=prefix), store=store)
        async with store:
            await p.refresh()
            out = p.get_statistics("work")
            await p.reset()
        return out

    s = anyio.run(read)
    assert s["calls"] == 450 and s["errors"] == {"unavailable": 45}


test_processes_sharing_redis = pytest.mark.redis(test_processes_sharing_redis)


#: Keeps the server busy for about a second (a long script: every other client waits).
_BUSY_LUA = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1000000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1
"""


@pytest.mark.redis
async def test_a_write_applied_after_its_timeout_is_not_counted_twice(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A busy Redis took the compare-and-set and ran it after the store gave up waiting
    (the error says the write may or may not have been applied). Before, the delta went
    back to pending as if nothing had been written, and the next flush added it again:
    3 executions were stored as 6."""
    import redis.asyncio as aioredis

    prefix = f"test-profiling-{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in redis_url else "?"
    store = open_store(f"{redis_url}{sep}socket_timeout=0.3")
    raw = aioredis.Redis.from_url(redis_url)
    busy_started = False

    real_get_entry = store.get_entry

    async def get_entry(key: str) -> Any:
        """The real read; then the server turns busy, before the flush's write."""
        nonlocal busy_started
        entry = await real_get_entry(key)
        if not busy_started:
            busy_started = True
            tg.start_soon(raw.eval, _BUSY_LUA, 0)
            await anyio.sleep(0.1)  # the script runs: the write is sent while it does
        return entry

    store.get_entry = get_entry  # type: ignore[method-assign]
    p = ProfilingPlugin(cfg(key_prefix=prefix), store=store)
    try:
        async with store:
            await raw.ping()  # connected: the script starts at once
            for ms in (10, 20, 30):
                p.record_execution("t", ms)
            async with anyio.create_task_group() as tg:
                await p.flush()  # the write times out; the server runs it once the script ends
            assert "may or may not have been applied" in caplog.text
            key = f"{prefix}:v1:t"
            await eventually(lambda: store.get(key))  # it was applied, after the timeout
            assert (await store.get(key))["count"] == 3
            await p.flush()  # the next flush must find it applied, not add it again
            assert (await store.get(key))["count"] == 3
            assert p.get_statistics("t")["count"] == 3
            p.record_execution("t", 40)
            await p.flush()
            assert (await store.get(key))["count"] == 4
            assert p.get_statistics("t")["count"] == 4
            await p.reset()
    finally:
        await raw.aclose()
