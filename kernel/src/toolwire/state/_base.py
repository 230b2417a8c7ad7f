"""The StateStore contract shared by every backend.

Plugins never talk to Redis or SQLite directly: they use this interface, so one
``state = "..."`` line in the config moves all of them between backends.

Model
-----
A store maps string keys to *entries*. An entry holds:

- ``value``: any JSON-compatible value (dict, list, str, int, float, bool, None).
  Values are copied in and out (a caller mutating what it got back never
  changes the stored entry).
- ``version``: an int that changes on every write of the key. Versions are
  opaque: compare them for equality only. A key that is deleted and created
  again gets a version it never had before (no ABA).
- ``owner``: an optional string naming who holds the entry (a lease holder, a
  claim). Compare-and-set / compare-and-delete can test it.
- ``expires_at``: wall-clock expiry (seconds since the epoch) or None.

An expired entry is absent for every operation (get, scan, CAS, incr...).

Values are stored as JSON text by every backend (the memory one included), so
behaviour is identical everywhere: what you read back is what ``json.loads``
gives for ``json.dumps(value)`` - tuples come back as lists, non-string dict
keys as strings. NaN/Infinity and non-JSON types (sets, bytes, objects...) are
rejected with :class:`StateStoreError` before anything is written.

``set_if_absent_or_get`` is the claim-or-read primitive: it creates the key
or returns the live entry already there, atomically and in one round trip.

Backends: ``memory`` (one process), ``sqlite`` (one file shared by the
processes of one host) and ``redis`` (shared by hosts; asyncio only, as
``redis.asyncio`` is). Memory and SQLite work under asyncio and trio.

Lifecycle: a store opens itself on first use; ``close()`` releases it, after
which calls raise :class:`StateStoreError` until ``open()`` is called again.
"""

from __future__ import annotations

import abc
import json
import json.encoder as _json_encoder
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ANY", "Entry", "StateStore", "StateStoreError"]


class _Any:
    """Sentinel: 'do not compare this field'."""

    _instance: _Any | None = None

    def __new__(cls) -> _Any:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
"""Pass as ``expected_version`` / ``expected_owner`` to skip that comparison."""


class StateStoreError(Exception):
    """A backend failed (connection lost, database locked for too long...).

    The message names the backend and what to do. The original exception is
    chained as ``__cause__``.
    """


class StateNotAppliedError(StateStoreError):
    """A backend failed before the operation could take effect: nothing was written.

    Raised where the backend can tell: a closed store; SQLite, whose failed
    transaction is rolled back (but not a ``COMMIT`` that failed other than for a
    lock or a full disk: its frames may be in the -wal file); a single Redis server
    that could not be reached (connection refused, or every pooled connection busy),
    the request never sent; a Redis Cluster node whose pool is full. Any other
    ``StateStoreError`` from a write may or may not have been applied (on SQLite,
    such a ``COMMIT``; on Redis, a connection that broke after the request was sent,
    a timeout, any other failure of a Redis Cluster): read the key before acting on
    it.
    """


#: What to do about a closed store (the kernel that owns it closes it in ``kernel.close()``).
CLOSED_HINT = (
    "its kernel closed it (kernel.close()), or close() was called; open() it again "
    "(kernel.start() does)"
)


class StateDataError(StateStoreError):
    """A key holds data toolwire did not write (not JSON; in Redis, another data type).

    Unlike an outage, retrying does not help: the key must be deleted, or the
    plugin pointed at another key prefix. The message names the key.
    """


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored record, as read at one moment."""

    key: str
    value: Any
    version: int
    owner: str | None = None
    expires_at: float | None = None


class StateStore(abc.ABC):
    """Async key/value state with TTL, compare-and-set and change waits.

    Every method is a coroutine and is safe to call from many tasks at once.
    The SQLite and Redis backends are also safe across processes.
    ``ttl`` is in seconds (float); ``None`` means the entry never expires.
    """

    #: Short backend name: "memory", "sqlite" or "redis".
    backend: str = "abstract"

    # -- lifecycle ---------------------------------------------------------
    async def open(self) -> None:  # noqa: B027 - optional override
        """Connect / create tables. Called by the kernel at startup; idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional override
        """Release connections. Idempotent."""

    async def __aenter__(self) -> StateStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- reads -------------------------------------------------------------
    @abc.abstractmethod
    async def get_entry(self, key: str) -> Entry | None:
        """The live entry at ``key``, or None when absent or expired."""

    async def get(self, key: str, default: Any = None) -> Any:
        """The value at ``key``, or ``default`` when absent or expired."""
        entry = await self.get_entry(key)
        return default if entry is None else entry.value

    @abc.abstractmethod
    async def scan(self, prefix: str, *, limit: int | None = None) -> list[Entry]:
        """Live entries whose key starts with ``prefix``, sorted by key."""

    # -- writes ------------------------------------------------------------
    @abc.abstractmethod
    async def set(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry:
        """Write unconditionally; returns the new entry (with its new version).

        The owner and expiry are replaced too (``owner=None``: no owner).
        """

    @abc.abstractmethod
    async def set_if_absent(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry | None:
        """Create ``key`` only if it is absent (or expired).

        Returns the new entry, or None when a live entry already exists.
        Atomic: of N concurrent callers (tasks or processes) exactly one wins.
        """

    @abc.abstractmethod
    async def set_if_absent_or_get(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> tuple[Entry, bool]:
        """Create ``key`` if it is absent (or expired), else read it: one atomic step.

        Returns ``(entry, created)``: the entry now at ``key`` and whether this
        call created it. When the key already holds a live entry, that entry is
        returned untouched (``value``, ``ttl`` and ``owner`` are ignored, no
        version changes, no waiter wakes). Of N concurrent callers (tasks or
        processes) exactly one gets ``created=True`` and all get the same
        entry. One round trip on every backend (a claim-or-read is what an
        idempotency check needs: the replay path costs a single operation).
        ``value`` is checked like :meth:`set`'s even when the key exists.
        """

    @abc.abstractmethod
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
        """Replace the entry only if it matches; returns the new entry or None.

        ``expected_version``/``expected_owner``: the current entry must have this
        version / owner (``ANY`` skips the test). ``expected_version=None`` means
        "the key must be absent" (so the call creates it). ``expected_owner=None``
        means "a live entry with no owner"; any ``expected_owner`` other than
        ``ANY`` fails on an absent key. ``owner=ANY`` keeps the current owner
        (none when the call creates the key), ``owner=None`` clears it; ``ttl``
        replaces the expiry (None: no expiry). Atomic across tasks and processes.
        """

    @abc.abstractmethod
    async def compare_and_delete(
        self, key: str, *, expected_version: int | None = ANY, expected_owner: str | None = ANY
    ) -> bool:
        """Delete only if the live entry matches; True when it was deleted.

        The tests are those of :meth:`compare_and_set`; an absent key is never
        deleted (so ``expected_version=None`` always gives False).
        """

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete unconditionally; True when a live entry was there."""

    @abc.abstractmethod
    async def incr(self, key: str, amount: int = 1, *, ttl: float | None = None) -> int:
        """Add ``amount`` to an integer value (absent counts as 0); returns the new value.

        ``ttl`` is applied only when the call creates the key; an existing key
        keeps its owner and expiry. A non-integer value (``true`` included)
        raises ``StateStoreError``. On Redis the result must fit in 64 bits.
        """

    # -- waiting -----------------------------------------------------------
    @abc.abstractmethod
    async def wait_for_change(
        self,
        key: str,
        *,
        version: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> Entry | None:
        """Wait until the key's version is no longer ``version``, at most ``timeout`` s.

        ``version=None`` waits for the key to appear. Returns the entry current
        when it returns (None if absent) - on timeout that may be unchanged, so
        callers compare. Changes made by other processes are seen too (the
        SQLite backend polls; Redis uses pub/sub with a polling fallback).
        Expiry counts as a change. Cancellable at any point.
        """


StoreFactory = Callable[[str], StateStore]


# -- helpers shared by the backends (private) --------------------------------


def _check_key(key: str) -> None:
    """Keys are ``str`` that encode to UTF-8 (SQLite and Redis store them so)."""
    if not isinstance(key, str):
        raise TypeError(f"state keys are str, not {type(key).__name__}: {key!r}")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"state key {key!r} is not valid Unicode text") from exc


#: The longest ``ttl`` a store accepts: 1e9 seconds (about 31 years). Beyond it Redis's
#: expiry in milliseconds overflows; plugins bound the durations they store by it.
MAX_TTL_S = 1e9


def _check_ttl(ttl: float | None) -> float | None:
    """Validate a ``ttl`` argument: None or a positive, finite number of seconds <= MAX_TTL_S."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"ttl must be a number of seconds or None, not {type(ttl).__name__}")
    if not math.isfinite(ttl) or ttl <= 0 or ttl > MAX_TTL_S:
        raise ValueError(
            f"ttl must be a positive number of seconds up to {MAX_TTL_S:g} (about 31 years), "
            f"or None for no expiry, not {ttl!r}"
        )
    return float(ttl)


def _check_timeout(timeout: float) -> float:
    """Validate a ``wait_for_change`` timeout (>= 0; ``math.inf`` waits forever)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
    return max(float(timeout), 0.0)


def _check_expected(expected_version: object, expected_owner: object, owner: object) -> None:
    """Type-check the optional comparison arguments (``ANY`` is always allowed)."""
    if (
        expected_version is not ANY
        and expected_version is not None
        and (isinstance(expected_version, bool) or not isinstance(expected_version, int))
    ):
        raise TypeError(f"expected_version must be an int, None or ANY, not {expected_version!r}")
    for name, val in (("expected_owner", expected_owner), ("owner", owner)):
        if val is not ANY and val is not None and not isinstance(val, str):
            raise TypeError(f"{name} must be a str, None or ANY, not {val!r}")


def _check_amount(amount: int) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"incr amount must be an int, not {type(amount).__name__}")


def _reject(obj: object) -> Any:
    raise TypeError(f"{type(obj).__qualname__} is not JSON-serializable")


# A reusable C encoder (json.dumps builds an encoder object per call: ~2x slower,
# and this runs on every write). markers=None: no circular-reference bookkeeping;
# a cycle ends in RecursionError, and the slow path below then names the problem.
_c_make_encoder = getattr(_json_encoder, "c_make_encoder", None)  # None without the C accelerator
_fast_encode: Callable[[Any, int], Any] | None = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None, _reject, _json_encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
)


def _encode(key: str, value: Any) -> str:
    """``value`` as JSON text, or StateStoreError naming the key and the bad type."""
    if _fast_encode is not None:
        try:
            return "".join(_fast_encode(value, 0))
        except (TypeError, ValueError, RecursionError):
            pass  # the slow path explains what is wrong
    bad: list[str] = []

    def reject(obj: object) -> Any:
        bad.append(type(obj).__qualname__)
        raise TypeError(f"{type(obj).__qualname__} is not JSON-serializable")

    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), default=reject)
    except (TypeError, ValueError, RecursionError) as exc:
        if bad:
            what = f"contains a {bad[-1]}"
        elif isinstance(exc, ValueError) and "Out of range float" in str(exc):
            what = "contains a float NaN/Infinity"
        else:
            what = f"({type(value).__qualname__}) cannot be stored: {exc}"
        raise StateNotAppliedError(
            f"value for state key {key!r} is not JSON-compatible: it {what}; "
            "store dicts, lists, str, int, float, bool or None"
        ) from exc


def _decode(text: str, key: str) -> Any:
    """The value stored as ``text`` at ``key`` (a fresh object on every call).

    Text that is not JSON (written by something other than toolwire) is a
    ``StateStoreError`` naming the key, as the stores promise, not a bare
    ``JSONDecodeError``.
    """
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StateDataError(
            f"state key {key!r} holds a value that is not JSON ({exc}); something other than "
            "toolwire wrote it. Delete the key (or choose another key prefix)"
        ) from exc


def _is_int_value(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_JSON_TYPE_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    float: "a float",
    type(None): "null",
}


def _not_int_error(key: str, value: Any) -> StateStoreError:
    kind = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    shown = json.dumps(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return StateNotAppliedError(
        f"cannot incr state key {key!r}: its value is {kind} ({shown}), not an integer"
    )


def _matches(entry: Entry | None, expected_version: object, expected_owner: object) -> bool:
    """The ``compare_and_set`` / ``compare_and_delete`` test against a live entry."""
    if expected_version is not ANY:
        if expected_version is None:
            if entry is not None:
                return False
        elif entry is None or entry.version != expected_version:
            return False
    return expected_owner is ANY or (entry is not None and entry.owner == expected_owner)


def _changed(entry: Entry | None, version: int | None) -> bool:
    """Whether ``wait_for_change`` should return for this current entry."""
    if version is None:
        return entry is not None
    return entry is None or entry.version != version
