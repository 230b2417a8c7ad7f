"""SQLite: short operations run on the event loop thread, and the loop never waits on a lock.

Locks are held by a real second process (``LOCKER``) that releases them only
when the test tells it to, from the event loop: a store that waited for the
lock on the loop could never tell it, and would fail instead.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

import toolwire.state._sqlite as sqlite_mod
from toolwire.state import SQLiteStore, StateStoreError

pytestmark = pytest.mark.anyio

#: Holds the write lock of the file argv[1] until a line arrives on stdin.
LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
"""


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@asynccontextmanager
async def locker(path: Path) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Another process holding the database's write lock; yields ``release()``."""
    async with await anyio.open_process([sys.executable, "-c", LOCKER, str(path)]) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        with anyio.fail_after(30):
            assert (await proc.stdout.receive()).startswith(b"locked")
        stdin = proc.stdin
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await stdin.send(b"go\n")

        try:
            yield release
        finally:
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                await release()
                assert await proc.wait() == 0


class ThreadOps:
    """Counts the operations a store runs on a worker thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: SQLiteStore) -> None:
        self.count = 0
        self.entered = threading.Event()  # set when one starts on its thread
        original = store._in_thread

        def counting(fn: Callable[[sqlite3.Connection], Any]) -> Any:
            self.count += 1
            self.entered.set()
            return original(fn)

        monkeypatch.setattr(store, "_in_thread", counting)


async def test_single_key_operations_run_inline_scan_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SQLiteStore(tmp_path / "inline.db") as store:
        threads = ThreadOps(monkeypatch, store)
        entry = await store.set("a", 1)
        assert await store.get("a") == 1
        assert await store.set_if_absent("b", 2) is not None
        assert (await store.set_if_absent_or_get("b", 3))[1] is False
        entry2 = await store.compare_and_set("a", 4, expected_version=entry.version)
        assert entry2 is not None
        assert await store.compare_and_delete("a", expected_version=entry2.version)
        assert await store.incr("n", 5) == 5
        assert await store.delete("b")
        assert threads.count == 0
        assert [e.key for e in await store.scan("")] == ["n"]
        assert threads.count == 1
        # a large value costs in proportion to its size: written on the thread
        await store.set("big", "x" * (sqlite_mod._INLINE_MAX_TEXT + 1))
        assert threads.count == 2
        assert len(await store.get("big")) == sqlite_mod._INLINE_MAX_TEXT + 1


async def test_a_write_waits_for_another_process_on_a_thread_while_the_loop_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "wait.db"
    async with SQLiteStore(path, busy_timeout=10) as store:
        await store.set("k", 0)
        threads = ThreadOps(monkeypatch, store)
        longest_gap = 0.0  # between two ticks of the event loop

        async def write_while_locked(value: int) -> list[tuple[str, int]]:
            nonlocal longest_gap
            events: list[tuple[str, int]] = []
            ticks = 0

            async def write() -> None:
                await store.set("k", value)
                events.append(("written", ticks))

            async def tick_then_release(release: Callable[[], Awaitable[None]]) -> None:
                nonlocal ticks, longest_gap
                last = anyio.current_time()
                for _ in range(30):  # about 0.3 s, while the write waits for the lock
                    await anyio.sleep(0.01)
                    ticks += 1
                    now = anyio.current_time()
                    longest_gap, last = max(longest_gap, now - last), now
                events.append(("released", ticks))
                await release()

            async with locker(path) as release:
                with anyio.fail_after(30):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(write)
                        tg.start_soon(tick_then_release, release)
            return events

        # Twice: the second round shows the connection went back to busy_timeout 0
        # after the first round's wait on the thread.
        for round_ in (1, 2):
            assert await write_while_locked(round_) == [("released", 30), ("written", 30)]
            assert await store.get("k") == round_
            assert threads.count == round_  # the write, once, on the thread
        # Not a speed test: a write waiting for the lock on the loop would stop it for
        # the whole busy_timeout (10 s), as long as the lock is held.
        assert longest_gap < 5


async def test_a_lock_held_beyond_busy_timeout_fails_the_write_off_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "stuck.db"
    async with SQLiteStore(path, busy_timeout=0.3) as store:
        await store.set("k", 1)
        async with locker(path):
            ticks = 0
            done = anyio.Event()

            async def tick() -> None:
                nonlocal ticks
                while not done.is_set():
                    await anyio.sleep(0.01)
                    ticks += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(tick)
                await anyio.lowlevel.checkpoint()
                before = ticks
                try:
                    with pytest.raises(StateStoreError) as info:
                        await store.set("k", 2)
                finally:
                    done.set()
            assert ticks > before  # the loop ran while the write waited
            message = str(info.value)
            assert str(path) in message
            assert "locked" in message and "0.3s busy timeout" in message
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert await store.get("k") == 1  # reads go on while the lock is held (WAL)
        assert (await store.set("k", 3)).value == 3


async def test_busy_timeout_zero_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "zero.db"
    async with SQLiteStore(path, busy_timeout=0) as store:
        await store.set("k", 1)
        async with locker(path):
            with pytest.raises(StateStoreError, match="0s busy timeout"):
                await store.incr("n")
        assert await store.incr("n") == 1  # nothing was written by the failed call


async def test_a_cancelled_caller_waits_for_its_thread_write_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write on the worker thread is not abandoned when its caller is cancelled:
    the caller returns when it ends, and the write stands."""
    path = tmp_path / "cancel.db"
    async with SQLiteStore(path, busy_timeout=10) as store:
        await store.set("k", 1)
        threads = ThreadOps(monkeypatch, store)
        events: list[str] = []
        scope = anyio.CancelScope()

        async def write() -> None:
            with scope:
                await store.set("k", 2)
            events.append("write ended")

        async with locker(path) as release:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write)
                    await anyio.to_thread.run_sync(threads.entered.wait, 30)
                    scope.cancel()
                    await anyio.sleep(0.1)
                    events.append("released")
                    await release()
        assert events == ["released", "write ended"]
        assert await store.get("k") == 2
        assert (await store.set("k", 3)).value == 3


async def test_a_cancelled_caller_before_an_inline_write_writes_nothing(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "c.db") as store:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.set("k", 1)
        assert scope.cancelled_caught
        assert await store.get("k") is None


async def test_inline_writes_checkpoint_on_a_thread_and_keep_the_wal_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "wal.db"
    wal = path.with_name(path.name + "-wal")
    value = "x" * 4000
    writes = 3000  # 12 MB of values alone: a WAL never checkpointed would hold them all
    async with SQLiteStore(path) as store:
        conn = store._conn
        assert conn is not None
        # never a checkpoint inside a write, never a lock wait on the loop
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
        threads = ThreadOps(monkeypatch, store)
        for _ in range(writes):
            await store.set("big", value)
        assert 0 < threads.count < writes / 100  # the checkpoints; the writes ran inline
        assert wal.stat().st_size < 8 * 1024 * 1024 < writes * len(value)
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT length(value) FROM toolwire_state").fetchone() == (4002,)
    finally:
        raw.close()


async def test_nothing_runs_inline_while_a_thread_operation_holds_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan held on the worker thread (its clock blocks there): increments started
    meanwhile queue behind it instead of using the connection inline, the loop runs
    on, and every increment counts once."""
    gate, held = threading.Event(), threading.Event()
    hold = False

    def clock() -> float:
        if hold and threading.current_thread() is not threading.main_thread():
            held.set()
            gate.wait(30)
        return time.time()

    async with SQLiteStore(tmp_path / "held.db", clock=clock) as store:
        for i in range(10):
            await store.set(f"row:{i}", i)
        threads = ThreadOps(monkeypatch, store)
        done: list[int] = []

        async def scan() -> None:
            assert len(await store.scan("row:")) == 10

        async def increment() -> None:
            done.append(await store.incr("n"))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                hold = True
                tg.start_soon(scan)
                await anyio.to_thread.run_sync(held.wait, 30)  # the scan is on its thread
                for _ in range(10):
                    tg.start_soon(increment)
                await anyio.sleep(0.2)
                assert done == []  # all waiting for the scan
                hold = False
                gate.set()
        assert sorted(done) == list(range(1, 11))
        assert threads.count == 11
        assert await store.incr("n") == 11  # the connection is free again: inline
        assert threads.count == 11


async def test_purges_run_on_the_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inline writes never purge: the write after every ``_PURGE_EVERY`` runs on the
    thread and deletes the expired rows in its transaction, as before."""
    monkeypatch.setattr(sqlite_mod, "_PURGE_EVERY", 10)
    path = tmp_path / "purge.db"
    now = [1_000_000.0]
    async with SQLiteStore(path, clock=lambda: now[0]) as store:
        for i in range(5):
            await store.set(f"old{i}", i, ttl=1)
        now[0] += 2
        threads = ThreadOps(monkeypatch, store)
        for i in range(20):  # the store's 11th and 22nd writes purge
            await store.set(f"new{i}", i)
        assert threads.count == 2
        raw = sqlite3.connect(path)
        try:
            assert raw.execute("SELECT count(*) FROM toolwire_state").fetchone() == (20,)
        finally:
            raw.close()


async def test_a_file_not_in_wal_mode_waits_for_its_readers_on_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where SQLite cannot use WAL (some file systems), COMMIT waits for the readers
    of the file: met inline, that is rolled back and the write runs again on the
    thread, instead of failing at once as "busy longer than busy_timeout"."""
    connect = sqlite3.connect

    class NoWal(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "PRAGMA journal_mode = WAL":
                sql = "PRAGMA journal_mode = DELETE"
            return super().execute(sql, *args)

    monkeypatch.setattr(
        sqlite_mod.sqlite3, "connect", lambda *a, **kw: connect(*a, **kw, factory=NoWal)
    )
    path = tmp_path / "rollback.db"
    async with SQLiteStore(path, busy_timeout=10) as store:
        await store.set("k", 1)
        assert store._conn is not None
        assert store._conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        threads = ThreadOps(monkeypatch, store)
        reader = connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM toolwire_state").fetchall()  # holds the file
            events: list[str] = []

            async def write() -> None:
                await store.set("k", 2)
                events.append("written")

            async def release() -> None:
                await anyio.sleep(0.3)
                events.append("released")
                reader.execute("COMMIT")

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write)
                    tg.start_soon(release)
        finally:
            reader.close()
        assert events == ["released", "written"]
        assert threads.count == 1
        assert await store.get("k") == 2
