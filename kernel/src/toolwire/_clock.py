"""The kernel's clock: monotonic time and sleeping, replaceable in tests."""

from __future__ import annotations

import time

import anyio

__all__ = ["Clock", "SystemClock"]


class Clock:
    """Interface: ``monotonic()`` for deadlines, ``time()`` for timestamps, ``sleep()``."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock."""
        raise NotImplementedError

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        """Sleep (a fake clock advances instead)."""
        raise NotImplementedError


class SystemClock(Clock):
    """The real clock."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        await anyio.sleep(seconds)
