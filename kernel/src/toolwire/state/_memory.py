"""In-process state store: a dict, for one process (tests, single-worker setups)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel

from ._base import (
    ANY,
    CLOSED_HINT,
    Entry,
    StateNotAppliedError,
    StateStore,
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

__all__ = ["MemoryStore"]

# Longest single sleep of a waiter on an entry with an expiry: the clock may be
# a test clock that jumps, so re-check at least this often.
_EXPIRY_RECHECK = 1.0


@dataclass(slots=True)
class _Record:
    text: str  # the value as JSON
    version: int
    owner: str | None
    expires_at: float | None


class MemoryStore(StateStore):
    """Entries in a dict of this process, with the same semantics as the shared backends.

    Values are kept as JSON text, so they are copied in and out exactly as the
    SQLite and Redis backends do. Every operation is atomic with respect to
    other tasks (no await inside a critical section). Works under asyncio and
    trio. ``clock`` returns wall-clock seconds (default ``time.time``); tests
    pass a fake one to drive expiry.
    """

    backend = "memory"

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._clock: Callable[[], float] = clock or time.time
        self._data: dict[str, _Record] = {}
        self._versions = itertools.count(1)
        self._waiters: dict[str, set[anyio.Event]] = {}
        self._closed = False
        self._writes_since_sweep = 0

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._data)} keys)"

    # -- lifecycle ---------------------------------------------------------
    async def open(self) -> None:
        """Mark the store usable (again). Idempotent; the data survives close/open."""
        self._closed = False

    async def close(self) -> None:
        """Make further calls fail until :meth:`open`; wakes current waiters. Idempotent."""
        self._closed = True
        for key in list(self._waiters):
            self._notify(key)

    # -- internals ---------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StateNotAppliedError(f"memory state store is closed; {CLOSED_HINT}")

    def _live(self, key: str, now: float) -> _Record | None:
        rec = self._data.get(key)
        if rec is None:
            return None
        if rec.expires_at is not None and rec.expires_at <= now:
            del self._data[key]
            return None
        return rec

    @staticmethod
    def _entry(key: str, rec: _Record) -> Entry:
        return Entry(key, _decode(rec.text, key), rec.version, rec.owner, rec.expires_at)

    def _notify(self, key: str) -> None:
        for event in self._waiters.pop(key, ()):
            event.set()

    def _write(
        self, key: str, text: str, owner: str | None, expires_at: float | None, now: float
    ) -> Entry:
        rec = _Record(text, next(self._versions), owner, expires_at)
        self._data[key] = rec
        self._notify(key)
        self._writes_since_sweep += 1
        if self._writes_since_sweep > max(1000, len(self._data)):
            self._sweep(now)
        return self._entry(key, rec)

    def _sweep(self, now: float) -> None:
        """Drop expired records (amortised O(1) per write)."""
        self._writes_since_sweep = 0
        dead = [
            k for k, r in self._data.items() if r.expires_at is not None and r.expires_at <= now
        ]
        for k in dead:
            del self._data[k]

    async def _enter(self) -> float:
        """Checkpoint (cancellation point), check the store is open; returns now."""
        await anyio.lowlevel.checkpoint()
        self._check_open()
        return self._clock()

    # -- reads -------------------------------------------------------------
    async def get_entry(self, key: str) -> Entry | None:
        """The live entry at ``key``, or None when absent or expired."""
        _check_key(key)
        now = await self._enter()
        rec = self._live(key, now)
        return None if rec is None else self._entry(key, rec)

    async def scan(self, prefix: str, *, limit: int | None = None) -> list[Entry]:
        """Live entries whose key starts with ``prefix``, sorted by key."""
        _check_key(prefix)
        if limit is not None and limit < 0:
            raise ValueError(f"scan limit must be >= 0 or None, not {limit}")
        now = await self._enter()
        out: list[Entry] = []
        for key in sorted(k for k in self._data if k.startswith(prefix)):
            if limit is not None and len(out) >= limit:
                break
            rec = self._live(key, now)
            if rec is not None:
                out.append(self._entry(key, rec))
        return out

    # -- writes ------------------------------------------------------------
    async def set(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry:
        """Write unconditionally; returns the new entry (with its new version)."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)
        now = await self._enter()
        return self._write(key, text, owner, None if ttl is None else now + ttl, now)

    async def set_if_absent(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry | None:
        """Create ``key`` only if it is absent (or expired); None when it exists."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)
        now = await self._enter()
        if self._live(key, now) is not None:
            return None
        return self._write(key, text, owner, None if ttl is None else now + ttl, now)

    async def set_if_absent_or_get(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> tuple[Entry, bool]:
        """Create ``key`` if absent (or expired), else return the live entry; atomic."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)
        now = await self._enter()
        rec = self._live(key, now)
        if rec is not None:
            return self._entry(key, rec), False
        return self._write(key, text, owner, None if ttl is None else now + ttl, now), True

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
        now = await self._enter()
        rec = self._live(key, now)
        current = None if rec is None else Entry(key, None, rec.version, rec.owner)
        if not _matches(current, expected_version, expected_owner):
            return None
        new_owner = (None if rec is None else rec.owner) if owner is ANY else owner
        return self._write(key, text, new_owner, None if ttl is None else now + ttl, now)

    async def compare_and_delete(
        self, key: str, *, expected_version: int | None = ANY, expected_owner: str | None = ANY
    ) -> bool:
        """Delete only if the live entry matches; True when it was deleted."""
        _check_key(key)
        _check_expected(expected_version, expected_owner, ANY)
        now = await self._enter()
        rec = self._live(key, now)
        if rec is None:
            return False
        if not _matches(Entry(key, None, rec.version, rec.owner), expected_version, expected_owner):
            return False
        del self._data[key]
        self._notify(key)
        return True

    async def delete(self, key: str) -> bool:
        """Delete unconditionally; True when a live entry was there."""
        _check_key(key)
        now = await self._enter()
        rec = self._live(key, now)
        if rec is None:
            return False
        del self._data[key]
        self._notify(key)
        return True

    async def incr(self, key: str, amount: int = 1, *, ttl: float | None = None) -> int:
        """Add ``amount`` to an integer value (absent counts as 0); returns the new value."""
        _check_key(key)
        _check_amount(amount)
        ttl = _check_ttl(ttl)
        now = await self._enter()
        rec = self._live(key, now)
        if rec is None:
            self._write(key, str(amount), None, None if ttl is None else now + ttl, now)
            return amount
        current = _decode(rec.text, key)
        if not _is_int_value(current):
            raise _not_int_error(key, current)
        new = int(current) + amount
        self._write(key, str(new), rec.owner, rec.expires_at, now)
        return new

    # -- waiting -----------------------------------------------------------
    async def wait_for_change(
        self,
        key: str,
        *,
        version: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> Entry | None:
        """Wait until the key's version is no longer ``version``, at most ``timeout`` s.

        Writes by other tasks wake the waiter at once; expiry is noticed when
        the entry's expiry time is reached.
        """
        _check_key(key)
        timeout = _check_timeout(timeout)
        deadline = anyio.current_time() + timeout
        while True:
            now = await self._enter()
            rec = self._live(key, now)
            entry = None if rec is None else self._entry(key, rec)
            if _changed(entry, version):
                return entry
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return entry
            delay = remaining
            if rec is not None and rec.expires_at is not None:
                delay = min(delay, max(rec.expires_at - now, 0.0) + 0.001, _EXPIRY_RECHECK)
            # Registered in the same synchronous step as the read above: no
            # write can slip in between.
            event = anyio.Event()
            self._waiters.setdefault(key, set()).add(event)
            try:
                with anyio.move_on_after(delay):
                    await event.wait()
            finally:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]
