"""Call events for embedders: observe calls without writing a plugin."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._types import ToolCall

__all__ = ["EVENT_KINDS", "CallEvent", "EventBus"]

log = logging.getLogger("toolwire.events")

EVENT_KINDS = frozenset(
    {
        "call_started",
        "attempt_failed",
        "retry",
        "fallback",
        "call_finished",
        "approval_required",
        "approval_decided",
    }
)
"""Kinds the kernel emits (``approval_*`` come from the approval plugin).

Plugins may emit their own kinds with ``kernel.events.emit``.
"""


@dataclass(slots=True, frozen=True)
class CallEvent:
    """One event. ``data`` carries the kind-specific facts (all JSON-compatible)."""

    kind: str
    call: ToolCall
    data: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


Subscriber = Callable[[CallEvent], Awaitable[None] | None]


class EventBus:
    """Subscribe to call events. Subscribers run inline, in subscription order.

    Keep subscribers fast (hand slow work to a queue): the call waits for them.
    A subscriber that raises is logged and never affects the call.
    """

    def __init__(self) -> None:
        self._subs: list[tuple[Subscriber, frozenset[str] | None, bool]] = []
        self.active = False

    def subscribe(self, fn: Subscriber, kinds: Iterable[str] | None = None) -> Callable[[], None]:
        """Call ``fn(event)`` (sync or async) for each event of ``kinds`` (None: all).

        Returns a function that unsubscribes.
        """
        kset = frozenset(kinds) if kinds is not None else None
        entry = (fn, kset, inspect.iscoroutinefunction(fn))
        self._subs.append(entry)
        self.active = True

        def unsubscribe() -> None:
            if entry in self._subs:
                self._subs.remove(entry)
            self.active = bool(self._subs)

        return unsubscribe

    async def emit(self, kind: str, call: ToolCall, **data: Any) -> None:
        """Deliver an event to the matching subscribers."""
        if not self._subs:
            return
        event = CallEvent(kind, call, data)
        for fn, kinds, is_async in list(self._subs):
            if kinds is not None and kind not in kinds:
                continue
            try:
                res = fn(event)
                if is_async or inspect.isawaitable(res):
                    await res  # type: ignore[misc]
            except Exception:
                log.exception("event subscriber %r failed on %s", fn, kind)
