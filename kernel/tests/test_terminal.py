"""The terminal `toolwire call` offers to plugins (ctx.extensions["toolwire.terminal"])."""

from __future__ import annotations

import os

import anyio
import pytest

from toolwire import TERMINAL_EXTENSION, CallContext, Kernel, Terminal, tool

pytestmark = pytest.mark.anyio


async def test_lines_are_read_on_the_event_loop_until_the_end() -> None:
    rfd, wfd = os.pipe()
    shown: list[str] = []
    term = Terminal(rfd, shown.append)
    try:
        os.write(wfd, "yes\nnon-ascii: é\npart".encode())
        assert await term.read_line() == "yes"
        assert await term.read_line() == "non-ascii: é"
        os.write(wfd, b"ial\n")
        assert await term.read_line() == "partial"
        os.close(wfd)
        wfd = -1
        assert await term.read_line() is None  # end of input
        term.write("asked?")
        assert shown == ["asked?"]
    finally:
        os.close(rfd)
        if wfd != -1:
            os.close(wfd)


async def test_a_waiting_read_is_cancelled_cleanly() -> None:
    """Cleanly: nothing goes on reading after the cancellation (a worker thread left in
    os.read would swallow the next line), so the next read gets what is typed next."""
    rfd, wfd = os.pipe()
    term = Terminal(rfd, lambda _: None)
    try:
        with anyio.move_on_after(0.2) as scope:
            await term.read_line()  # nobody types
        assert scope.cancelled_caught
        os.write(wfd, b"typed later\n")
        with anyio.fail_after(5):
            assert await term.read_line() == "typed later"
    finally:
        os.close(rfd)
        os.close(wfd)


async def test_a_tool_sees_the_terminal_it_was_offered() -> None:
    @tool
    def who_asks(ctx: CallContext) -> bool:
        """Whether a terminal was offered."""
        return isinstance(ctx.extensions.get(TERMINAL_EXTENSION), Terminal)

    rfd, wfd = os.pipe()
    try:
        async with Kernel(tools=[who_asks]) as k:
            offered = Terminal(rfd, lambda _: None)
            r = await k.call("who_asks", {}, extensions={TERMINAL_EXTENSION: offered})
            assert r.content == {"result": True}
            assert (await k.call("who_asks", {})).content == {"result": False}
    finally:
        os.close(rfd)
        os.close(wfd)
