"""SQLite state store: one database file shared by the processes of one host."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from ._base import (
    ANY,
    CLOSED_HINT,
    Entry,
    StateNotAppliedError,
    StateStore,
    StateStoreError,
    _changed,
    _check_amount,
    _check_expected,
    _check_key,
    _check_timeout,
    _check_ttl,
    _decode,
    _encode,
    _is_int_value,
    _matches,
    _not_int_error,
)

log = logging.getLogger("toolwire.state")

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_TABLE = "toolwire_state"
_META = "toolwire_state_meta"

_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
        key TEXT PRIMARY KEY NOT NULL,
        value TEXT NOT NULL,
        version INTEGER NOT NULL,
        owner TEXT,
        expires_at REAL
    ) WITHOUT ROWID""",
    f"""CREATE INDEX IF NOT EXISTS {_TABLE}_expires_at
        ON {_TABLE} (expires_at) WHERE expires_at IS NOT NULL""",
    f"""CREATE TABLE IF NOT EXISTS {_META} (
        name TEXT PRIMARY KEY NOT NULL,
        value INTEGER NOT NULL
    ) WITHOUT ROWID""",
)

_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_SELECT_ONE = f"SELECT value, version, owner, expires_at FROM {_TABLE} WHERE key = ? AND {_LIVE}"

#: Poll interval of ``wait_for_change`` for writes by other processes / store
#: objects: starts at the first value, grows by 1.5x up to the second.
_POLL_MIN, _POLL_MAX = 0.05, 0.25

#: Expired rows are purged (besides being invisible) every this many writes.
_PURGE_EVERY = 1000
#: The WAL file is truncated to this size after a checkpoint (bytes).
_WAL_LIMIT = 64 * 1024 * 1024
#: Free pages handed back to the file system after a purge while writing (4 KiB each).
#: (``executescript``: ``execute`` steps the pragma once, which frees one page.)
_VACUUM_PAGES = 4096
#: The connection never checkpoints on its own (``wal_autocheckpoint = 0``: a checkpoint
#: writes and syncs the database file, which must not happen on the event loop). Instead
#: the store counts the WAL frames its writes add (an estimate, see ``_put``) and, past
#: this many (SQLite's own default), runs the next operation on the worker thread and a
#: PASSIVE checkpoint after it. The WAL stays about 4 MiB, as with SQLite's default.
_CHECKPOINT_FRAMES = 1000
#: A write whose JSON text is longer than this (characters; the text is ASCII) runs on the
#: worker thread: its cost grows with its size (one WAL page per 4 KiB, and more).
_INLINE_MAX_TEXT = 64 * 1024

_Row = tuple[str, int, "str | None", "float | None"]


def _create_private(path: str) -> None:
    """Create the database file readable by its owner only (0600), when there is none.

    It holds what plugins store: approval requests with their arguments, stored
    results, cached tool lists. sqlite3 would create it with the umask's 0644,
    readable by every local user; SQLite gives its -wal and -shm files the
    database file's mode. A file that exists keeps its mode. One that cannot be
    made (a directory not writable, a read-only or full file system) is a
    :class:`StateStoreError` naming the directory: sqlite3 would only say
    "unable to open database file".
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        parent = os.path.dirname(os.path.abspath(path))
        raise StateNotAppliedError(
            f"sqlite state store at {path}: cannot create the database file in {parent}: "
            f"{exc.strerror or exc}; make that directory writable for this process, or fix "
            "the state URL (`state` in toolwire.toml, or TOOLWIRE_STATE)"
        ) from exc
    os.close(fd)  # an empty file is an empty database


def _prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``.

    SQLite compares TEXT as UTF-8 bytes, which orders like Python's code-point
    comparison, so ``prefix <= key < bound`` selects exactly the prefixed keys
    (and uses the primary-key index).
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code <= 0x10FFFF:
            if 0xD800 <= code <= 0xDFFF:  # surrogates cannot be stored
                code = 0xE000
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


class _WouldWait(Exception):
    """An inline operation met a lock before writing anything: run it on the thread."""


class _CommitFailed(Exception):
    """``COMMIT`` failed in a way that does not prove the write was rolled back.

    In WAL mode SQLite appends the transaction's frames, the commit frame last, to
    the -wal file before it records them in the -shm index. When that last step
    fails (growing the -shm file on a full file system: "disk I/O error") the commit
    frame is on disk: the next process to open the file after a crash recovers the
    write from the -wal file. Only a busy/locked ``COMMIT`` (the transaction stays
    open, and is rolled back) and a full disk (a frame could not be written) are known
    to leave nothing behind."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _vacuum(conn: sqlite3.Connection, pragma: str) -> None:
    """Give freed pages back to the file system; best effort (another writer may hold
    the lock: the pages are given back after a later purge)."""
    try:
        conn.executescript(pragma)  # stepped to its end: ``execute`` frees one page
    except sqlite3.Error as exc:
        log.debug("sqlite state: incremental vacuum skipped: %s", exc)


#: The longest ``busy_timeout`` (seconds): SQLite's is milliseconds in a signed 32-bit int.
_MAX_BUSY_TIMEOUT_S = 2_000_000.0


class SQLiteStore(StateStore):
    """State in one SQLite file, safe across the tasks and processes of a host.

    One ``sqlite3`` connection per store object, used by one caller at a time.
    Single-key operations run inline on the event loop thread when nothing
    else is using the connection: they take tens of microseconds, less than
    the hop to a worker thread. The connection's ``busy_timeout`` is 0 there,
    so the loop never waits for a lock: an operation that finds the database
    locked before it wrote anything runs again on a worker thread, which
    waits up to ``busy_timeout`` seconds (then :class:`StateStoreError`).
    ``scan``, open/close, purges, vacuums and WAL checkpoints always run on a
    worker thread (``anyio.to_thread.run_sync``). The file is in WAL mode;
    conditional writes run in ``BEGIN IMMEDIATE`` transactions so concurrent
    processes serialise on the database lock. Versions come from a counter
    stored in the file, so they are never reused. ``wait_for_change`` wakes at
    once for writes through this object and polls (50 ms growing to 250 ms)
    for writes by other processes. Works under asyncio and trio.

    ``clock`` returns wall-clock seconds (default ``time.time``) and decides
    expiry; all processes sharing a file should use the same clock.
    """

    backend = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] | None = None,
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = os.fspath(path)
        self._clock: Callable[[], float] = clock or time.time
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)):
            raise TypeError(
                f"busy_timeout must be a number of seconds, not {type(busy_timeout).__name__}"
            )
        # SQLite takes whole milliseconds in a C int: inf or 1e300 cannot be given to it
        if not 0 <= busy_timeout <= _MAX_BUSY_TIMEOUT_S:
            raise ValueError(
                f"busy_timeout must be a number of seconds from 0 to {_MAX_BUSY_TIMEOUT_S:g} "
                f"(about 23 days), not {busy_timeout!r}"
            )
        self._busy_timeout = float(busy_timeout)
        self._busy_ms = int(self._busy_timeout * 1000)
        self._conn: sqlite3.Connection | None = None
        self._state: Literal["new", "open", "closed"] = "new"
        # anyio primitives belong to one event loop: made (again) per loop, see _loop_primitives
        self._primitives: tuple[object, anyio.Lock, anyio.CapacityLimiter] | None = None
        self._thread_lock = threading.Lock()  # one thread on the connection at a time
        self._waiters: dict[str, set[anyio.Event]] = {}
        self._writes = 0  # since the last purge
        self._wal_frames = 0  # estimated, since the last checkpoint
        self._inline_now = False  # set and read under _thread_lock

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # -- lifecycle ---------------------------------------------------------
    def _loop_primitives(self) -> tuple[anyio.Lock, anyio.CapacityLimiter]:
        """The open/close lock and the connection's limiter (one thread at a time).

        Re-created when the store is used from another event loop (another
        ``anyio.run``, or trio after asyncio); ``_thread_lock`` still serialises
        the connection across loops.
        """
        token = anyio.lowlevel.current_token()
        if self._primitives is None or self._primitives[0] != token:
            self._primitives = (token, anyio.Lock(), anyio.CapacityLimiter(1))
        return self._primitives[1], self._primitives[2]

    @property
    def _limiter(self) -> anyio.CapacityLimiter:
        return self._loop_primitives()[1]

    async def open(self) -> None:
        """Open the file (creating it, its parent directories and tables). Idempotent."""
        async with self._loop_primitives()[0]:
            if self._state == "open":
                return
            conn = await anyio.to_thread.run_sync(self._connect, limiter=self._limiter)
            with self._thread_lock:
                self._conn = conn
            self._state = "open"

    async def close(self) -> None:
        """Close the connection (after the call in progress); wakes waiters. Idempotent."""
        async with self._loop_primitives()[0]:
            if self._state != "open":
                self._state = "closed"
                return
            self._state = "closed"
            await anyio.to_thread.run_sync(self._disconnect, limiter=self._limiter)
        for key in list(self._waiters):
            self._notify(key)

    def _disconnect(self) -> None:
        with self._thread_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            parent = os.path.dirname(os.path.abspath(self.path))
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                raise StateNotAppliedError(
                    f"sqlite state store at {self.path}: cannot create directory {parent}: "
                    f"{exc}; fix the state URL (`state` in toolwire.toml, or TOOLWIRE_STATE)"
                ) from exc
            _create_private(self.path)
        deadline = time.monotonic() + self._busy_timeout
        while True:
            conn: sqlite3.Connection | None = None
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._busy_timeout,
                    isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                    check_same_thread=False,  # used from anyio worker threads, one at a time
                )
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                # Space freed by expired rows goes back to the file system: auto_vacuum
                # takes effect on a new file (before its first table), and the WAL is cut
                # back after each checkpoint instead of staying at its largest.
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute(f"PRAGMA journal_size_limit = {_WAL_LIMIT}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints: see _checkpoint
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                # Versions start at the creation time in microseconds: a file
                # deleted and created again does not reuse the old versions.
                conn.execute(
                    f"INSERT OR IGNORE INTO {_META} (name, value) VALUES ('version', ?)",
                    (time.time_ns() // 1000,),
                )
                purged = conn.execute(
                    f"DELETE FROM {_TABLE} WHERE expires_at <= ?", (self._clock(),)
                ).rowcount
                conn.execute("COMMIT")
                if purged:
                    _vacuum(conn, "PRAGMA incremental_vacuum;")
                    self._checkpoint(conn)
                # 0 at rest: inline operations must never wait. _in_thread sets the
                # configured timeout around each operation on the worker thread.
                conn.execute("PRAGMA busy_timeout = 0")
                return conn
            except sqlite3.Error as exc:
                if conn is not None:
                    conn.close()
                # Switching to WAL while another process opens the file can
                # fail fast with "locked" instead of waiting: retry a while.
                if _is_locked(exc) and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                raise self._error(exc) from exc

    async def _ensure_open(self) -> None:
        if self._state == "open":
            return
        if self._state == "closed":
            raise StateNotAppliedError(
                f"sqlite state store at {self.path} is closed; {CLOSED_HINT}"
            )
        await self.open()

    # -- plumbing ----------------------------------------------------------
    def _error(self, exc: sqlite3.Error) -> StateStoreError:
        if _is_locked(exc):
            return StateNotAppliedError(
                f"sqlite state store at {self.path} is locked: another connection kept it "
                f"busy longer than the {self._busy_timeout:g}s busy timeout ({exc}); look for "
                "a stuck process using that file, or put each deployment on its own file"
            )
        name = getattr(exc, "sqlite_errorname", "")
        if name == "SQLITE_FULL":
            return StateNotAppliedError(
                f"sqlite state store at {self.path} failed: {exc}: free space on the file "
                f"system holding {os.path.dirname(os.path.abspath(self.path))}"
            )
        if name.startswith("SQLITE_READONLY"):
            return StateNotAppliedError(
                f"sqlite state store at {self.path} failed: {exc}: this process may not "
                "write the file, or its -wal and -shm files beside it; make them and their "
                "directory writable, or fix the state URL (`state` in toolwire.toml, or "
                "TOOLWIRE_STATE)"
            )
        return StateNotAppliedError(
            f"sqlite state store at {self.path} failed: {exc}; check that the file is a "
            "writable toolwire state database, or fix the state URL (`state` in toolwire.toml, or TOOLWIRE_STATE)"
        )

    def _commit_error(self, exc: sqlite3.Error) -> StateStoreError:
        """A ``COMMIT`` that failed after its write may have reached the file (see
        ``_CommitFailed``): a plain ``StateStoreError``, never ``StateNotAppliedError``."""
        return StateStoreError(
            f"sqlite state store at {self.path} failed while committing a write: {exc}; it "
            "may or may not have been applied (SQLite can recover it from the -wal file when "
            "the database is next opened): read the key before acting on it. Check the file "
            f"system holding {os.path.dirname(os.path.abspath(self.path))} (free space, "
            "errors)"
        )

    def _connection(self) -> sqlite3.Connection:
        """The open connection (call with ``_thread_lock`` held)."""
        conn = self._conn
        if conn is None:
            raise StateNotAppliedError(
                f"sqlite state store at {self.path} is closed; {CLOSED_HINT}"
            )
        return conn

    def _call(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)``, its sqlite3 errors as :class:`StateStoreError`, or ``_WouldWait``
        for a lock met inline when nothing of the attempt stays written.

        In WAL mode only ``BEGIN IMMEDIATE`` or a read can meet a lock, before any
        write; in a file SQLite could not put in WAL mode ``COMMIT`` can too (while
        readers hold the file), and its transaction is rolled back. Either way the
        connection is then out of any transaction and the database as it was, so
        running ``fn`` again is safe: what it changed in Python before that is
        counters only (``_writes``, ``_wal_frames``)."""
        try:
            return fn(conn)
        except _CommitFailed as failed:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise self._commit_error(failed.error) from failed.error
        except sqlite3.Error as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if self._inline_now and _is_locked(exc) and not conn.in_transaction:
                raise _WouldWait from exc
            raise self._error(exc) from exc

    def _in_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` on a worker thread, waiting up to ``busy_timeout`` for locks;
        then the checkpoint, when one is due."""
        with self._thread_lock:
            conn = self._connection()
            try:
                if self._busy_ms:
                    conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
                try:
                    return self._call(conn, fn)
                finally:
                    if self._busy_ms:
                        conn.execute("PRAGMA busy_timeout = 0")
            finally:
                if self._wal_frames >= _CHECKPOINT_FRAMES:
                    self._checkpoint(conn)

    def _inline(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` on the event loop thread (``_thread_lock`` held, busy_timeout 0)."""
        conn = self._connection()
        self._inline_now = True
        try:
            return self._call(conn, fn)
        finally:
            self._inline_now = False

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """Copy the WAL into the database file (worker thread only: it writes and syncs
        the file). PASSIVE: never waits for other connections, so best effort; the
        next writer then starts the WAL over (and cuts it to ``journal_size_limit``)."""
        self._wal_frames = 0
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            log.debug("sqlite state: checkpoint skipped: %s", exc)

    async def _run(
        self, fn: Callable[[sqlite3.Connection], T], *, inline: bool = False, write: bool = True
    ) -> T:
        """Run ``fn(conn)`` inline when ``inline`` and nothing else uses the connection,
        else (or when it met a lock inline) in a worker thread; not abandoned on
        cancellation. ``fn`` must write only inside ``_write_tx`` and change nothing
        else a second run would notice: it runs again after meeting a lock inline."""
        await self._ensure_open()
        if inline:
            await anyio.lowlevel.checkpoint()  # a cancellation and scheduling point, as before
            # No await from here to the end of the inline run: nothing else on this event
            # loop can start a thread operation in between. A borrowed limiter token means
            # one of this loop's thread operations is under way or about to start; the
            # thread lock, one from another event loop (or a checkpoint in progress).
            if (
                self._wal_frames < _CHECKPOINT_FRAMES
                and (not write or self._writes < _PURGE_EVERY)
                and self._limiter.borrowed_tokens == 0
                and self._thread_lock.acquire(blocking=False)
            ):
                try:
                    return self._inline(fn)
                except _WouldWait:
                    pass  # locked by another connection: wait for it on the thread
                finally:
                    self._thread_lock.release()
        return await anyio.to_thread.run_sync(self._in_thread, fn, limiter=self._limiter)

    def _write_tx(self, conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
        """``fn()`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (ROLLBACK on error).

        Every ``_PURGE_EVERY`` writes the transaction also deletes the expired rows
        and gives their space back: on the worker thread only (inline writes wait
        for a thread write, see ``_run``)."""
        conn.execute("BEGIN IMMEDIATE")
        purged = 0
        try:
            result = fn()
            if self._writes >= _PURGE_EVERY and not self._inline_now:
                self._writes = 0
                purged = conn.execute(
                    f"DELETE FROM {_TABLE} WHERE expires_at <= ?", (self._clock(),)
                ).rowcount
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if not (_is_locked(exc) or getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL"):
                    raise _CommitFailed(exc) from exc
                raise  # nothing of it was written: rolled back below
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the error that ended the transaction is the one to report
            raise
        if purged:  # after COMMIT: the write stands whatever the vacuum does
            _vacuum(conn, f"PRAGMA incremental_vacuum({_VACUUM_PAGES});")
            self._wal_frames = _CHECKPOINT_FRAMES  # checkpoint after this operation
        return result

    def _put(
        self,
        conn: sqlite3.Connection,
        key: str,
        text: str,
        owner: str | None,
        expires_at: float | None,
    ) -> Entry:
        """Store a row with a fresh version (inside a write transaction)."""
        conn.execute(f"UPDATE {_META} SET value = value + 1 WHERE name = 'version'")
        (version,) = conn.execute(f"SELECT value FROM {_META} WHERE name = 'version'").fetchone()
        conn.execute(
            f"INSERT OR REPLACE INTO {_TABLE} (key, value, version, owner, expires_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (key, text, version, owner, expires_at),
        )
        self._writes += 1
        # WAL frames (pages) this adds, measured: 2-3 for a small value (the version
        # counter's page, the row's, the expiry index's), about 1.5 more per 4 KiB of value
        # (overflow and pointer-map pages). Over-counting only checkpoints a bit early.
        self._wal_frames += 3 + len(text) // 2048
        return Entry(key, _decode(text, key), int(version), owner, expires_at)

    def _delete(self, conn: sqlite3.Connection, key: str) -> None:
        """Delete the row (inside a write transaction)."""
        conn.execute(f"DELETE FROM {_TABLE} WHERE key = ?", (key,))
        self._wal_frames += 3

    def _select(self, conn: sqlite3.Connection, key: str, now: float) -> _Row | None:
        row: _Row | None = conn.execute(_SELECT_ONE, (key, now)).fetchone()
        return row

    def _notify(self, key: str) -> None:
        for event in self._waiters.pop(key, ()):
            event.set()

    def _expiry(self, ttl: float | None) -> float | None:
        return None if ttl is None else self._clock() + ttl

    # -- reads -------------------------------------------------------------
    async def get_entry(self, key: str) -> Entry | None:
        """The live entry at ``key``, or None when absent or expired."""
        _check_key(key)

        def op(conn: sqlite3.Connection) -> Entry | None:
            row = self._select(conn, key, self._clock())
            return None if row is None else Entry(key, _decode(row[0], key), *row[1:])

        return await self._run(op, inline=True, write=False)

    async def scan(self, prefix: str, *, limit: int | None = None) -> list[Entry]:
        """Live entries whose key starts with ``prefix``, sorted by key."""
        _check_key(prefix)
        if limit is not None and limit < 0:
            raise ValueError(f"scan limit must be >= 0 or None, not {limit}")
        upper = _prefix_upper_bound(prefix)

        def op(conn: sqlite3.Connection) -> list[Entry]:
            sql = f"SELECT key, value, version, owner, expires_at FROM {_TABLE} WHERE key >= ?"
            args: list[Any] = [prefix]
            if upper is not None:
                sql += " AND key < ?"
                args.append(upper)
            sql += f" AND {_LIVE} ORDER BY key LIMIT ?"
            args += [self._clock(), -1 if limit is None else limit]
            return [
                Entry(k, _decode(v, k), ver, o, x)
                for k, v, ver, o, x in conn.execute(sql, args)
                if k.startswith(prefix)
            ]

        return await self._run(op)

    # -- writes ------------------------------------------------------------
    async def set(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry:
        """Write unconditionally; returns the new entry (with its new version)."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)

        def op(conn: sqlite3.Connection) -> Entry:
            return self._write_tx(
                conn, lambda: self._put(conn, key, text, owner, self._expiry(ttl))
            )

        entry = await self._run(op, inline=len(text) <= _INLINE_MAX_TEXT)
        self._notify(key)
        return entry

    async def set_if_absent(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry | None:
        """Create ``key`` only if it is absent (or expired); None when it exists."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)

        def body(conn: sqlite3.Connection) -> Entry | None:
            if self._select(conn, key, self._clock()) is not None:
                return None
            return self._put(conn, key, text, owner, self._expiry(ttl))

        entry = await self._run(
            lambda conn: self._write_tx(conn, lambda: body(conn)),
            inline=len(text) <= _INLINE_MAX_TEXT,
        )
        if entry is not None:
            self._notify(key)
        return entry

    async def set_if_absent_or_get(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> tuple[Entry, bool]:
        """Create ``key`` if absent (or expired), else return the live entry; atomic.

        One operation (inline, or one trip to the worker thread): a plain read
        first (no write lock, so concurrent readers of an existing key never
        queue on the database lock), then, only when the key is absent,
        ``BEGIN IMMEDIATE``, read again and create.
        """
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)

        def found(row: _Row) -> tuple[Entry, bool]:
            return Entry(key, _decode(row[0], key), *row[1:]), False

        def body(conn: sqlite3.Connection) -> tuple[Entry, bool]:
            row = self._select(conn, key, self._clock())
            if row is not None:
                return found(row)
            return self._put(conn, key, text, owner, self._expiry(ttl)), True

        def op(conn: sqlite3.Connection) -> tuple[Entry, bool]:
            row = self._select(conn, key, self._clock())
            if row is not None:
                return found(row)
            return self._write_tx(conn, lambda: body(conn))

        entry, created = await self._run(op, inline=len(text) <= _INLINE_MAX_TEXT)
        if created:
            self._notify(key)
        return entry, created

    async def compare_and_set(
        self,
        key: str,
        value: Any,
        *,
        expected_version: int | None = ANY,
        expected_owner: str | None = ANY,
        ttl: float | None = None,
        owner: str | None = ANY,
    ) -> Entry | None:
        """Replace the entry only if it matches; returns the new entry or None."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(expected_version, expected_owner, owner)
        text = _encode(key, value)

        def body(conn: sqlite3.Connection) -> Entry | None:
            row = self._select(conn, key, self._clock())
            current = None if row is None else Entry(key, None, row[1], row[2])
            if not _matches(current, expected_version, expected_owner):
                return None
            new_owner = (None if current is None else current.owner) if owner is ANY else owner
            return self._put(conn, key, text, new_owner, self._expiry(ttl))

        entry = await self._run(
            lambda conn: self._write_tx(conn, lambda: body(conn)),
            inline=len(text) <= _INLINE_MAX_TEXT,
        )
        if entry is not None:
            self._notify(key)
        return entry

    async def compare_and_delete(
        self, key: str, *, expected_version: int | None = ANY, expected_owner: str | None = ANY
    ) -> bool:
        """Delete only if the live entry matches; True when it was deleted."""
        _check_key(key)
        _check_expected(expected_version, expected_owner, ANY)

        def body(conn: sqlite3.Connection) -> bool:
            row = self._select(conn, key, self._clock())
            if row is None:
                return False
            if not _matches(Entry(key, None, row[1], row[2]), expected_version, expected_owner):
                return False
            self._delete(conn, key)
            return True

        deleted = await self._run(
            lambda conn: self._write_tx(conn, lambda: body(conn)), inline=True
        )
        if deleted:
            self._notify(key)
        return deleted

    async def delete(self, key: str) -> bool:
        """Delete unconditionally; True when a live entry was there."""
        _check_key(key)

        def body(conn: sqlite3.Connection) -> bool:
            live = self._select(conn, key, self._clock()) is not None
            self._delete(conn, key)
            return live

        deleted = await self._run(
            lambda conn: self._write_tx(conn, lambda: body(conn)), inline=True
        )
        if deleted:
            self._notify(key)
        return deleted

    async def incr(self, key: str, amount: int = 1, *, ttl: float | None = None) -> int:
        """Add ``amount`` to an integer value (absent counts as 0); returns the new value."""
        _check_key(key)
        _check_amount(amount)
        ttl = _check_ttl(ttl)

        def body(conn: sqlite3.Connection) -> int:
            row = self._select(conn, key, self._clock())
            if row is None:
                self._put(conn, key, str(amount), None, self._expiry(ttl))
                return amount
            current = _decode(row[0], key)
            if not _is_int_value(current):
                raise _not_int_error(key, current)
            new = int(current) + amount
            self._put(conn, key, str(new), row[2], row[3])
            return new

        result = await self._run(lambda conn: self._write_tx(conn, lambda: body(conn)), inline=True)
        self._notify(key)
        return result

    # -- waiting -----------------------------------------------------------
    async def wait_for_change(
        self,
        key: str,
        *,
        version: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> Entry | None:
        """Wait until the key's version is no longer ``version``, at most ``timeout`` s.

        Writes through this store object wake the waiter at once; writes by
        other processes (or other store objects) are seen by polling every
        50-250 ms.
        """
        _check_key(key)
        timeout = _check_timeout(timeout)
        deadline = anyio.current_time() + timeout
        poll = _POLL_MIN
        while True:
            # Register before reading: a write finishing after the read sets it.
            event = anyio.Event()
            self._waiters.setdefault(key, set()).add(event)
            try:
                entry = await self.get_entry(key)
                if _changed(entry, version):
                    return entry
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return entry
                delay = min(remaining, poll)
                if entry is not None and entry.expires_at is not None:
                    delay = min(delay, max(entry.expires_at - self._clock(), 0.0) + 0.001)
                with anyio.move_on_after(delay):
                    await event.wait()
            finally:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]
            poll = min(poll * 1.5, _POLL_MAX)


def _is_locked(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)
