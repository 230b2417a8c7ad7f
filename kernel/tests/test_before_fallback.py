"""The ``before_fallback`` hook: gates that apply to a call apply to where it is rerouted.

Before it existed, approval ran once, before the first attempt: a ``Fallback`` decided in
``on_error`` ran a tool that requires approval without anyone being asked.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolwire import (
    CallContext,
    CallRejected,
    ErrorInfo,
    Fallback,
    Kernel,
    Retry,
    ToolCall,
    ToolError,
    hookimpl,
)
from toolwire.testing import FakeClock, FakeTool

pytestmark = pytest.mark.anyio

DOWN = ToolError("primary is down", kind="unavailable")


class Decider:
    """on_error plugin returning scripted decisions."""

    name, order = "decider", 100

    def __init__(self, *decisions: Any) -> None:
        self.decisions = list(decisions)

    @hookimpl
    def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Any:
        return self.decisions.pop(0) if self.decisions else None


class Gate:
    """before_fallback plugin: records what it sees, then does ``action``."""

    order = 200

    def __init__(self, action: Any = None, name: str = "gate") -> None:
        self.name = name
        self.action = action
        self.seen: list[tuple[str, str, dict[str, Any], str | None, int]] = []

    @hookimpl
    async def before_fallback(self, call: ToolCall, next_call: ToolCall, ctx: CallContext) -> None:
        current = ctx.current_tool.name if ctx.current_tool is not None else None
        self.seen.append((call.name, next_call.name, dict(next_call.args), current, ctx.attempt))
        await anyio.lowlevel.checkpoint()
        if isinstance(self.action, BaseException):
            raise self.action
        if callable(self.action):
            self.action(next_call)


def kernel(*tools: FakeTool, plugins: tuple[object, ...]) -> Kernel:
    return Kernel(tools=[t.tool for t in tools], plugins=plugins, clock=FakeClock())


async def test_a_fallback_is_seen_before_it_runs_and_runs_when_let_through() -> None:
    primary, backup = FakeTool("primary", script=[DOWN]), FakeTool("backup")
    gate = Gate()
    async with kernel(primary, backup, plugins=(Decider(Fallback("backup")), gate)) as k:
        res = await k.call("primary", {"q": 1}, call_id="c1")
    assert res.error is None and res.meta.served_by == "backup"
    assert gate.seen == [("primary", "backup", {"q": 1}, "primary", 1)]
    assert backup.calls == [{"q": 1}]


async def test_a_refused_fallback_ends_the_call_and_the_tool_does_not_run() -> None:
    primary, backup = FakeTool("primary", script=[DOWN]), FakeTool("backup")
    no = CallRejected("denied", "nobody approved 'backup'", details={"request_id": "r1"})
    later = Gate(name="later")
    plugins = (Decider(Fallback("backup")), Gate(no), later)
    async with kernel(primary, backup, plugins=plugins) as k:
        res = await k.call("primary", {})
    assert backup.calls == [] and later.seen == []  # later hooks are skipped
    err = res.error
    assert err is not None and (err.kind, err.message) == ("denied", "nobody approved 'backup'")
    assert err.source == "gate" and err.details["request_id"] == "r1"
    assert err.details["fallback"] == {
        "from": "primary",
        "to": "backup",
        "after": {"kind": "unavailable", "message": "primary is down"},
    }
    assert [a.tool for a in res.meta.attempts] == ["primary"]


async def test_a_hook_that_raises_refuses_the_fallback_fail_closed() -> None:
    primary, backup = FakeTool("primary", script=[DOWN]), FakeTool("backup")
    plugins = (Decider(Fallback("backup")), Gate(KeyError("boom")))
    async with kernel(primary, backup, plugins=plugins) as k:
        res = await k.call("primary", {})
    assert backup.calls == []
    err = res.error
    assert err is not None and err.kind == "internal"
    assert "plugin 'gate' failed in before_fallback: KeyError: 'boom'" in err.message
    assert err.details["fallback"]["to"] == "backup"
    assert res.meta.plugin_errors == [
        {"plugin": "gate", "hook": "before_fallback", "error": "KeyError: 'boom'"}
    ]


async def test_a_hook_may_replace_the_rerouted_arguments() -> None:
    primary, backup = FakeTool("primary", script=[DOWN]), FakeTool("backup")

    def edit(nxt: ToolCall) -> None:
        nxt.args = {**nxt.args, "edited": True}

    plugins = (Decider(Fallback("backup")), Gate(edit))
    async with kernel(primary, backup, plugins=plugins) as k:
        res = await k.call("primary", {"q": 1})
    assert res.error is None and backup.calls == [{"q": 1, "edited": True}]


async def test_a_retry_with_other_arguments_is_a_reroute_a_plain_retry_is_not() -> None:
    flaky = FakeTool("flaky", script=[DOWN, DOWN, {"ok": True}])
    gate = Gate()
    plugins = (Decider(Retry(0), Retry(0, args={"q": 2})), gate)
    async with kernel(flaky, plugins=plugins) as k:
        res = await k.call("flaky", {"q": 1})
    assert res.error is None and flaky.calls == [{"q": 1}, {"q": 1}, {"q": 2}]
    assert gate.seen == [("flaky", "flaky", {"q": 2}, "flaky", 2)]


async def test_a_chain_of_fallbacks_asks_before_each() -> None:
    a, b, c = FakeTool("a", script=[DOWN]), FakeTool("b", script=[DOWN]), FakeTool("c")
    gate = Gate()
    plugins = (Decider(Fallback("b"), Fallback("c")), gate)
    async with kernel(a, b, c, plugins=plugins) as k:
        res = await k.call("a", {})
    assert res.meta.served_by == "c"
    assert [(s[0], s[1], s[3]) for s in gate.seen] == [("a", "b", "a"), ("a", "c", "b")]


async def test_a_refusal_message_is_scrubbed_of_known_secrets() -> None:
    primary, backup = FakeTool("primary", script=[DOWN]), FakeTool("backup")
    plugins = (Decider(Fallback("backup")), Gate(CallRejected("denied", "key sk-live-123 refused")))
    async with kernel(primary, backup, plugins=plugins) as k:
        k.add_secret("sk-live-123", "api")
        res = await k.call("primary", {})
    assert res.error is not None and "sk-live-123" not in res.error.message
