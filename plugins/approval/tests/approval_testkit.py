"""Helpers shared by the toolwire-approval tests (a plain module with a unique name,
not a `tests` package: several distributions in the workspace have a `tests/`)."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolwire import CallEvent, Clock, Kernel, ToolResult, tool
from toolwire.testing import require_redis
from toolwire_approval import ApprovalConfig, ApprovalPlugin

REDIS_URL = os.environ.get("TOOLWIRE_REDIS_URL", "redis://127.0.0.1:6379/13")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ManualClock(Clock):
    """A clock that moves only when the test says so; ``sleep`` waits for that."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._mono = 1000.0
        self._moved = anyio.Event()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._mono += seconds
        moved, self._moved = self._moved, anyio.Event()
        moved.set()

    async def sleep(self, seconds: float) -> None:
        until = self._mono + seconds
        while self._mono < until:
            await self._moved.wait()


class Recorder:
    """A tool that records its executions: (args, approval meta) per run."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self._ran = anyio.Event()

    async def wait_runs(self, n: int, wait_s: float = 10.0) -> None:
        """Until the tool ran ``n`` times."""
        with anyio.fail_after(wait_s):
            while len(self.runs) < n:
                await self._ran.wait()

    def add_to(self, kernel: Kernel, name: str = "send_email", **settings: Any) -> None:
        recorder = self

        @tool(name=name, **settings)
        async def send_email(to: str, body: str = "hi", count: int = 1) -> dict[str, Any]:
            """Send an e-mail.

            Args:
                to: recipient
                body: text
                count: copies
            """
            recorder.runs.append({"to": to, "body": body, "count": count})
            ran, recorder._ran = recorder._ran, anyio.Event()
            ran.set()
            return {"sent": to, "count": count}

        kernel.add_tool(send_email)


class Pending:
    """Collects ``approval_required`` events; ``await next()`` gives the next request."""

    def __init__(self, kernel: Kernel) -> None:
        self.events: list[CallEvent] = []
        self._seen = 0
        self._changed = anyio.Event()
        kernel.events.subscribe(self._on, kinds=["approval_required"])

    def _on(self, event: CallEvent) -> None:
        self.events.append(event)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def next(self, wait_s: float = 10.0) -> dict[str, Any]:
        with anyio.fail_after(wait_s):
            while self._seen >= len(self.events):
                await self._changed.wait()
        event = self.events[self._seen]
        self._seen += 1
        request: dict[str, Any] = event.data["request"]
        return request


def plugin(**cfg: Any) -> ApprovalPlugin:
    """An approval plugin with a unique key prefix (safe on a shared Redis)."""
    cfg.setdefault("key_prefix", f"test:{secrets.token_hex(6)}:approval")
    return ApprovalPlugin(ApprovalConfig.model_validate(cfg))


@asynccontextmanager
async def running_call(
    kernel: Kernel, name: str, args: dict[str, Any], **kw: Any
) -> AsyncIterator[Callable[[], ToolResult]]:
    """Start ``kernel.call`` in the background; yields a getter for its result."""
    box: list[ToolResult] = []
    done = anyio.Event()

    async def run() -> None:
        box.append(await kernel.call(name, args, **kw))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.lowlevel.checkpoint()

        def result() -> ToolResult:
            assert box, "the call has not finished"
            return box[0]

        yield result
        with anyio.fail_after(15):
            await done.wait()


def redis_url() -> str:
    """The test Redis (nothing is flushed: tests use unique key prefixes); skips without
    one, fails under TOOLWIRE_REQUIRE_REDIS=1."""
    return require_redis(REDIS_URL)
