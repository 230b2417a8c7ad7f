"""Small helpers over the kernel's StateStore: a compare-and-set loop, a per-loop lock,
and the outbound token bucket (GCRA) shared by every process on the same store."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from toolwire import Clock, StateStore
from toolwire.state import MAX_TTL_S, StateStoreError

from ._config import RateSpec

__all__ = ["NOCHANGE", "LoopLock", "Throttle", "Throttled", "cas_update"]

T = TypeVar("T")
NOCHANGE: Any = object()
_MAX_TRIES = 500


class LoopLock:
    """An ``anyio.Lock`` per event loop (a plugin may outlive one ``anyio.run``)."""

    __slots__ = ("_pair",)

    def __init__(self) -> None:
        self._pair: tuple[object, anyio.Lock] | None = None

    def get(self) -> anyio.Lock:
        """The lock of the running event loop."""
        token = anyio.lowlevel.current_token()
        if self._pair is None or self._pair[0] != token:
            self._pair = (token, anyio.Lock())
        return self._pair[1]


async def cas_update(
    store: StateStore,
    key: str,
    fn: Callable[[Any, float], tuple[T, Any]],
    *,
    lock: LoopLock,
    now: Callable[[], float],
    ttl: float | None = None,
) -> T:
    """Read ``key``, compute ``fn(value, now) -> (result, new_value)``, write it back atomically.

    ``new_value`` may be ``NOCHANGE`` (nothing written). Tasks of this process
    take turns on ``lock``; other processes are detected by the store's
    compare-and-set and the computation is redone. ``fn`` may raise: nothing is
    written and the exception propagates.
    """
    async with lock.get():
        for attempt in range(_MAX_TRIES):
            entry = await store.get_entry(key)
            result, new = fn(None if entry is None else entry.value, now())
            if new is NOCHANGE:
                return result
            if entry is None:
                ok = await store.compare_and_set(key, new, expected_version=None, ttl=ttl)
            else:
                ok = await store.compare_and_set(key, new, expected_version=entry.version, ttl=ttl)
            if ok is not None:
                return result
            # another process wrote in between: back off a little and redo
            await anyio.sleep(random.uniform(0, min(0.05, 0.001 * (attempt + 1))))
    raise StateStoreError(
        f"state key {key!r}: gave up after {_MAX_TRIES} conflicting writes from other processes"
    )


class Throttled(Exception):
    """The outbound rate would be exceeded; ``wait_s`` until a slot frees up."""

    def __init__(self, name: str, wait_s: float) -> None:
        super().__init__(f"outbound rate limit {name!r}: next slot in {wait_s:.3f}s")
        self.name = name
        self.wait_s = wait_s


@dataclass(slots=True)
class Throttle:
    """A token bucket (as GCRA: one timestamp) in the StateStore, shared by all replicas.

    ``take()`` reserves the next slot. In ``wait`` mode it sleeps until the slot
    (at most ``max_wait_seconds`` and the call's time left); in ``fail_fast``
    mode, or when the wait would be longer, it raises ``Throttled`` without
    reserving anything.
    """

    name: str
    spec: RateSpec
    store: StateStore
    clock: Clock
    key: str
    lock: LoopLock

    async def take(self, max_wait: float | None = None) -> float:
        """Reserve a slot; returns the seconds slept."""
        interval = self.spec.interval
        capacity = self.spec.capacity
        limit = 0.0 if self.spec.mode == "fail_fast" else self.spec.max_wait_seconds
        if max_wait is not None:
            limit = min(limit, max(0.0, max_wait))

        def fn(value: Any, now: float) -> tuple[tuple[float, bool], Any]:
            tat = now
            if isinstance(value, dict) and isinstance(value.get("tat"), (int, float)):
                tat = max(float(value["tat"]), now)
            wait = max(0.0, tat - (capacity - 1) * interval - now)
            if wait > limit:
                return (wait, False), NOCHANGE
            return (wait, True), {"tat": tat + interval}

        wait, ok = await cas_update(
            self.store,
            self.key,
            fn,
            lock=self.lock,
            now=self.clock.time,
            # a slow rate with a big burst can ask for more than a store keeps a key
            ttl=min(capacity * interval + 60.0, MAX_TTL_S),
        )
        if not ok:
            raise Throttled(self.name, wait)
        if wait > 0:
            await self.clock.sleep(wait)
        return wait
