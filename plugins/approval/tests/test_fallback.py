"""A fallback is asked for as a call is: the tool it would run, with its arguments.

Before: approval ran once, before the first attempt. A retry ``Fallback`` from a tool
that needs no approval into one that is REQUIRED ran it with nobody asked
(``meta.approval = not_required``), and a ``{tool, args}`` fallback could run an
approved tool with arguments nobody approved.
"""

from __future__ import annotations

from typing import Any

import pytest
from approval_testkit import Pending, Recorder, plugin, running_call

from toolwire import (
    CallContext,
    ErrorInfo,
    ErrorKind,
    Fallback,
    Kernel,
    Retry,
    ToolCall,
    ToolError,
    hookimpl,
    tool,
)
from toolwire_ratelimit import RateLimitPlugin
from toolwire_retry import RetryConfig, RetryPlugin

pytestmark = pytest.mark.anyio


@tool
async def send_fast(to: str, body: str = "hi", count: int = 1) -> dict[str, Any]:
    """Send through the fast provider (down)."""
    raise ToolError("fast provider is down", kind=ErrorKind.UNAVAILABLE)


def gateway(policy: str, **approval: Any) -> tuple[Kernel, Recorder, Pending, Any]:
    """``send_fast`` (no approval) failing over to ``send_email`` (``policy``)."""
    retry = RetryPlugin(
        RetryConfig.model_validate({"fallbacks": {"send_fast": ["send_email"]}, "base_s": 0})
    )
    gate = plugin(tools={"send_email": policy, "send_fast": "NONE"}, **approval)
    kernel = Kernel(tools=[send_fast], plugins=[gate, retry, RateLimitPlugin()])
    rec = Recorder()
    rec.add_to(kernel)  # send_email, which records its runs
    return kernel, rec, Pending(kernel), gate


async def test_a_fallback_into_a_required_tool_waits_for_approval() -> None:
    kernel, rec, pending, gate = gateway("REQUIRED")
    async with kernel:
        async with running_call(kernel, "send_fast", {"to": "a@x"}, call_id="c1") as res:
            request = await pending.next()
            assert request["tool"] == "send_email" and request["args"]["to"] == "a@x"
            assert rec.runs == []  # not before it is approved
            await gate.approve(request["id"], by="alice")
        audit = await gate.audit_log(request["id"])
    out = res()
    assert out.error is None and out.meta.served_by == "send_email"
    assert rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    assert out.meta.approval is not None
    assert (out.meta.approval["status"], out.meta.approval["by"]) == ("approved", "alice")
    assert [e["event"] for e in audit] == ["requested", "approved", "executed"]
    assert audit[-1]["outcome"] == "ok"


async def test_a_rejected_fallback_ends_the_call_denied_naming_both_tools() -> None:
    kernel, rec, pending, gate = gateway("REQUIRED")
    async with kernel, running_call(kernel, "send_fast", {"to": "a@x"}) as res:
        await gate.reject((await pending.next())["id"], "not today", by="bob")
    err = res().error
    assert rec.runs == []
    assert err is not None and err.kind == "denied" and "not today" in err.message
    assert err.details["fallback"] == {
        "from": "send_fast",
        "to": "send_email",
        "after": {"kind": "unavailable", "message": "fast provider is down"},
    }


async def test_a_lazy_fallback_runs_when_nobody_answers_in_time() -> None:
    kernel, rec, pending, _ = gateway("LAZY", lazy_timeout_s=0.05)
    async with kernel:
        out = await kernel.call("send_fast", {"to": "a@x"})
    assert len(pending.events) == 1  # it was asked
    assert out.error is None and rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    assert out.meta.approval is not None and out.meta.approval["how"] == "lazy_timeout"


async def test_a_fallback_that_needs_no_approval_runs_unasked() -> None:
    kernel, rec, pending, _ = gateway("NONE")
    async with kernel:
        out = await kernel.call("send_fast", {"to": "a@x"})
    assert out.error is None and len(rec.runs) == 1 and pending.events == []


class Rerouter:
    """on_error: the first failure is retried as it is, the second with other arguments."""

    name, order = "rerouter", 500

    def __init__(self) -> None:
        self.decisions: list[Any] = [Retry(0), Retry(0, args={"to": "b@x", "count": 9})]

    @hookimpl
    def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Any:
        return self.decisions.pop(0) if self.decisions else None


async def test_an_approved_call_rerouted_with_other_arguments_is_asked_again() -> None:
    """An approval covers the tool and the arguments approved: a retry with other
    arguments is another request; a plain retry is not. The first approval's
    execution is audited as ended with the failure that led to the reroute."""
    gate = plugin(tools={"send_email": "REQUIRED"})
    kernel = Kernel(plugins=[gate, Rerouter()])
    calls: list[dict[str, Any]] = []

    @tool(name="send_email")
    async def send_email(to: str, body: str = "hi", count: int = 1) -> dict[str, Any]:
        """Send an e-mail."""
        calls.append({"to": to, "count": count})
        if to == "a@x":
            raise ToolError("mail server is down", kind=ErrorKind.UNAVAILABLE)
        return {"sent": to, "count": count}

    kernel.add_tool(send_email)
    pending = Pending(kernel)
    async with kernel:
        async with running_call(kernel, "send_email", {"to": "a@x"}) as res:
            first = await pending.next()
            await gate.approve(first["id"], by="alice")
            second = await pending.next()
            assert second["id"] != first["id"]
            assert (second["args"]["to"], second["args"]["count"]) == ("b@x", 9)
            await gate.approve(second["id"], by="carol")
        first_audit = await gate.audit_log(first["id"])
    a, b = {"to": "a@x", "count": 1}, {"to": "b@x", "count": 9}
    assert res().error is None and calls == [a, a, b]
    assert len(pending.events) == 2  # the plain retry was not asked for
    assert first_audit[-1]["event"] == "executed" and first_audit[-1]["outcome"] == "error"
    assert first_audit[-1]["error_kind"] == "unavailable"


class InputRequiredElicitor:
    """What `toolwire serve` offers on a 2026-07-28 connection: ``ask`` returns the
    answer the retried call carries, or records the question and defers (None)."""

    mode = "input_required"
    client = "test-client"

    def __init__(self, request_state: str | None, answers: dict[str, Any]) -> None:
        self.request_state = request_state
        self.answers = answers
        self.asked: tuple[str, str | None] | None = None

    async def ask(
        self, key: str, message: str, schema: dict[str, Any], *, state: str | None = None
    ) -> dict[str, Any] | None:
        if key in self.answers:
            return self.answers[key]
        self.asked = (key, state)
        return None


async def test_a_fallback_is_not_asked_in_input_required_rounds() -> None:
    """The client answers an input_required round by sending the whole call again, which
    runs the failed tool first (under a new approval: the first was used). Before: when
    both the tool and its fallback needed approval, the rounds alternated between them
    for ever and the failed tool ran again every other round. Now the fallback is asked
    through the other channels (none here: REQUIRED, so it is rejected at its timeout)."""
    runs: list[str] = []

    @tool
    async def charge_primary(amount: int) -> dict[str, Any]:
        """Charge through the primary provider (down)."""
        runs.append("primary")
        raise ToolError("primary provider is down", kind=ErrorKind.UNAVAILABLE)

    @tool
    async def charge_backup(amount: int) -> dict[str, Any]:
        """Charge through the backup provider."""
        runs.append("backup")
        return {"charged": amount}

    class FailOver:
        name, order = "failover", 500

        @hookimpl
        def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Any:
            current = ctx.current_tool
            return (
                Fallback("charge_backup") if current and current.name == "charge_primary" else None
            )

    gate = plugin(
        tools={"charge_primary": "REQUIRED", "charge_backup": "REQUIRED"},
        required_timeout_s=0.2,
    )
    kernel = Kernel(tools=[charge_primary, charge_backup], plugins=[gate, FailOver()])
    answers: dict[str, Any] = {}
    state: str | None = None
    rounds: list[str] = []
    async with kernel:
        for _ in range(6):
            el = InputRequiredElicitor(state, answers)
            ext = {"mcp.elicit": el}
            res = await kernel.call("charge_primary", {"amount": 5}, extensions=ext)
            if res.error is None or res.error.kind != "input_required":
                rounds.append("done" if res.error is None else str(res.error.kind))
                break
            assert el.asked is not None
            key, state = el.asked
            rounds.append("input_required")
            answers = {key: {"action": "accept", "content": {"decision": "approve"}}}
    assert rounds == ["input_required", "denied"], rounds
    assert runs == ["primary"]
    assert res.error is not None and res.error.details["fallback"]["to"] == "charge_backup"
