"""Background tasks owned by the kernel (refresh loops, lease renewals, flushes).

A kernel is often started with ``await kernel.start()`` rather than inside an
``async with`` block, so it cannot hold an anyio task group open across calls.
``Kernel.spawn`` starts the task on the running event loop instead (an asyncio
task, or a trio system task) inside its own cancel scope, and ``kernel.close()``
cancels every task still running and waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

__all__ = ["BackgroundTask"]

log = logging.getLogger("toolwire.background")


class BackgroundTask:
    """A running background task. ``await task.cancel()`` stops it and waits (≤ 5 s)."""

    def __init__(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], name: str) -> None:
        self.name = name
        self._fn = fn
        self._args = args
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._handle: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        """Whether the task has finished (returned, failed or was cancelled)."""
        return self._done.is_set()

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._handle = loop.create_task(self._run(), name=self.name)
            return
        import trio  # not on asyncio: the only other anyio backend

        trio.lowlevel.spawn_system_task(self._run, name=self.name)

    async def _run(self) -> None:
        try:
            with self._scope:
                await self._fn(*self._args)
        except Exception:
            log.exception("background task %r failed", self.name)
        finally:
            self._done.set()

    async def cancel(self, wait_s: float = 5.0) -> None:
        """Cancel the task and wait until it has stopped (at most ``wait_s`` seconds)."""
        self._scope.cancel()
        with anyio.move_on_after(wait_s, shield=True):
            await self._done.wait()
