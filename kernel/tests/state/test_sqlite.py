"""SQLite-specific behaviour: locking, bad files, purging, durable versions."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from toolwire.state import SQLiteStore, StateNotAppliedError, StateStoreError

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_locked_database_beyond_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    async with SQLiteStore(path, busy_timeout=0.2) as store:
        await store.set("k", 1)
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # holds the write lock
            with pytest.raises(StateNotAppliedError) as info:  # rolled back: not applied
                await store.set("k", 2)
            message = str(info.value)
            assert str(path) in message
            assert "locked" in message
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert await store.get("k") == 1  # WAL: reads go on
            with pytest.raises(StateStoreError, match="locked"):
                await store.compare_and_set("k", 3, expected_version=None)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert (await store.set("k", 4)).value == 4  # usable again, nothing half-done


async def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an sqlite database" * 100)
    store = SQLiteStore(path)
    with pytest.raises(StateStoreError) as info:
        await store.open()
    assert str(path) in str(info.value)


async def test_directory_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "sub" / "state.db"
    with pytest.raises(StateStoreError) as info:
        await SQLiteStore(path).get("k")
    assert str(path) in str(info.value)


async def test_a_file_that_cannot_be_created_names_the_directory(tmp_path: Path) -> None:
    """Before: "unable to open database file; check that the file is a writable toolwire
    state database" about a file that does not exist: the directory was the problem."""
    path = tmp_path / ("x" * 300 + ".db")  # longer than a file name may be
    with pytest.raises(StateStoreError) as info:
        await SQLiteStore(path).open()
    message = str(info.value)
    assert f"cannot create the database file in {tmp_path}: " in message
    assert "make that directory writable" in message
    assert isinstance(info.value.__cause__, OSError)


_OPEN_AND_SAY = """
import asyncio, sys
from toolwire.state import SQLiteStore, StateStoreError
try:
    asyncio.run(SQLiteStore(sys.argv[1]).open())
except StateStoreError as exc:
    print(exc)
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_directory_not_writable_is_named(tmp_path: Path) -> None:
    """Run in a child process; as root (CI), without the capabilities that let root write
    into any directory (capsh, from libcap2-bin), so the test runs there too."""
    folder = tmp_path / ".toolwire"
    folder.mkdir(mode=0o555)
    cmd = [sys.executable, "-c", _OPEN_AND_SAY, str(folder / "state.db")]
    if os.geteuid() == 0:
        capsh = shutil.which("capsh")
        if capsh is None:
            pytest.skip("root writes into any directory, and capsh is not installed to drop that")
        line = " ".join(shlex.quote(c) for c in cmd)
        cmd = [capsh, "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c", line]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
        assert f"cannot create the database file in {folder}: Permission denied" in out, out
    finally:
        folder.chmod(0o755)


async def test_a_full_disk_and_a_read_only_file_say_what_to_do(tmp_path: Path) -> None:
    """Before: "check that the file is a writable toolwire state database" for both."""
    async with SQLiteStore(tmp_path / "s.db") as store:
        await store.set("k", 1)
        conn = store._conn
        assert conn is not None
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages}")  # no room for one more page
        with pytest.raises(StateStoreError) as info:
            await store.set("big", "x" * 20_000)
        assert f"free space on the file system holding {tmp_path}" in str(info.value)
        assert await store.get("k") == 1
        conn.execute("PRAGMA max_page_count = 1073741823")
        conn.execute("PRAGMA query_only = 1")
        with pytest.raises(StateStoreError) as info:
            await store.set("k", 2)
        assert "this process may not write the file, or its -wal and -shm" in str(info.value)
        conn.execute("PRAGMA query_only = 0")
        assert (await store.set("k", 3)).value == 3


class _CommitFault:
    """The store's connection, whose ``COMMIT`` fails with ``error``: once, after it ran
    (``commit_first``), or every time, instead of it."""

    def __init__(self, conn: sqlite3.Connection, error: sqlite3.Error, commit_first: bool):
        self._conn, self._error, self._commit_first = conn, error, commit_first
        self.armed = True

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql == "COMMIT" and self.armed:
            if self._commit_first:
                self.armed = False
                self._conn.execute(sql, *args)
            raise self._error
        return self._conn.execute(sql, *args)


def _sqlite_error(message: str, name: str) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorname = name  # type: ignore[attr-defined]
    return error


async def test_a_commit_that_fails_after_its_frames_were_written_may_have_been_applied(
    tmp_path: Path,
) -> None:
    """In WAL mode COMMIT writes the transaction's frames to the -wal file, then indexes
    them in the -shm file; growing the -shm file on a full file system fails with "disk
    I/O error" after the commit frame is on disk, and the next process to open the file
    after a crash recovers the write. Before, every sqlite3 error was a
    StateNotAppliedError ("nothing was written"), so the idempotency plugin left such a
    claim standing. (Seen on a full tmpfs; here the COMMIT runs, then fails.)"""
    async with SQLiteStore(tmp_path / "s.db") as store:
        conn = store._conn
        assert conn is not None
        store._conn = _CommitFault(  # type: ignore[assignment]
            conn, _sqlite_error("disk I/O error", "SQLITE_IOERR_SHMSIZE"), commit_first=True
        )
        with pytest.raises(StateStoreError) as info:
            await store.set_if_absent("claim", 1, owner="me")
        assert not isinstance(info.value, StateNotAppliedError)
        message = str(info.value)
        assert "failed while committing a write: disk I/O error" in message
        assert "may or may not have been applied" in message
        store._conn = conn
        entry = await store.get_entry("claim")
        assert entry is not None and entry.owner == "me"  # it was

        # A COMMIT refused for a full disk or a lock (also on the worker thread, after
        # the inline attempt met it) wrote nothing: still "not applied".
        for error in (
            _sqlite_error("database or disk is full", "SQLITE_FULL"),
            _sqlite_error("database is locked", "SQLITE_BUSY"),
        ):
            store._conn = _CommitFault(conn, error, commit_first=False)  # type: ignore[assignment]
            with pytest.raises(StateNotAppliedError):
                await store.set_if_absent("other", 1, owner="me")
            store._conn = conn
            assert await store.get_entry("other") is None
            assert not conn.in_transaction


def _modes(folder: Path, prefix: str) -> dict[str, int]:
    return {
        f.name: stat.S_IMODE(f.stat().st_mode)
        for f in folder.iterdir()
        if f.name.startswith(prefix)
    }


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
async def test_a_new_database_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """Before: sqlite3 created it with the umask's 0644; every local user could read the
    approval requests' arguments and the stored results in it."""
    old_umask = os.umask(0o022)
    try:
        path = tmp_path / "new.db"
        async with SQLiteStore(path) as store:
            await store.set("k", 1)
            modes = _modes(tmp_path, "new.db")
        assert modes.keys() >= {"new.db", "new.db-wal"} and set(modes.values()) == {0o600}
        kept = tmp_path / "kept.db"
        kept.touch()
        kept.chmod(0o640)  # a file that exists keeps the mode its owner gave it
        async with SQLiteStore(kept) as store:
            await store.set("k", 1)
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    finally:
        os.umask(old_umask)


async def test_wal_mode_and_tables(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    async with SQLiteStore(path) as store:
        await store.set("k", {"x": 1})
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT key, value FROM toolwire_state").fetchall() == [("k", '{"x":1}')]
    finally:
        raw.close()


async def test_expired_rows_are_purged(tmp_path: Path) -> None:
    path = tmp_path / "purge.db"
    clock = Clock()
    async with SQLiteStore(path, clock=clock) as store:
        for i in range(5):
            await store.set(f"t{i}", i, ttl=1)
        await store.set("keep", 1)
    clock.now += 2
    async with SQLiteStore(path, clock=clock) as store:  # open purges
        assert [e.key for e in await store.scan("")] == ["keep"]
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT count(*) FROM toolwire_state").fetchone()[0] == 1
    finally:
        raw.close()


async def test_versions_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "versions.db"
    seen = set()
    for _ in range(3):
        async with SQLiteStore(path) as store:
            seen.add((await store.set("k", 1)).version)
            assert await store.delete("k")
    assert len(seen) == 3


async def test_space_of_expired_rows_goes_back_to_the_file_system(tmp_path: Path) -> None:
    """Before: 270 MB of expired idempotency records left a 272 MB file and a 277 MB WAL
    holding 1 MB of live data, for good."""
    path = tmp_path / "shrink.db"
    clock = Clock()
    big = "x" * 200_000
    async with SQLiteStore(path, clock=clock) as store:
        for i in range(100):  # about 20 MB
            await store.set(f"big{i}", big, ttl=1)
        await store.set("keep", 1)
    full = path.stat().st_size
    assert full > 15_000_000
    clock.now += 2
    async with SQLiteStore(path, clock=clock) as store:  # opening purges, then vacuums
        assert [e.key for e in await store.scan("")] == ["keep"]
    assert path.stat().st_size < full / 10
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size < 64 * 1024 * 1024


async def test_the_purge_while_writing_also_gives_space_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolwire.state._sqlite as sqlite_mod

    monkeypatch.setattr(sqlite_mod, "_PURGE_EVERY", 10)
    path = tmp_path / "shrink2.db"
    clock = Clock()
    async with SQLiteStore(path, clock=clock) as store:
        for i in range(50):
            await store.set(f"big{i}", "x" * 200_000, ttl=1)
        clock.now += 2
        for i in range(20):  # crosses a purge
            await store.set(f"small{i}", i)
        raw = sqlite3.connect(path)
        try:
            free, pages = (
                raw.execute(f"PRAGMA {p}").fetchone()[0] for p in ("freelist_count", "page_count")
            )
        finally:
            raw.close()
    assert pages < 500 and free < 100, (pages, free)


def test_a_failing_vacuum_never_fails_the_write_before_it() -> None:
    """The vacuum runs after COMMIT: a lock taken by another writer in between made a
    committed `incr` raise, and a caller retrying it counted twice."""
    import toolwire.state._sqlite as sqlite_mod

    class Busy:
        def executescript(self, sql: str) -> None:
            raise sqlite3.OperationalError("database is locked")

    sqlite_mod._vacuum(Busy(), "PRAGMA incremental_vacuum;")  # type: ignore[arg-type]
