"""A replay of an approved call returns the stored result without asking again.

Idempotency (order 200) runs before approval (order 300): a replay is answered
before anyone is asked. Tested with the real toolwire-idempotency plugin and
with a minimal stand-in short-circuit plugin at order 200 (the contract
approval relies on, independent of the idempotency plugin's internals).
"""

from __future__ import annotations

from typing import Any

import pytest
from approval_testkit import Pending, Recorder, plugin, running_call

from toolwire import CallContext, Kernel, ToolCall, ToolResult, hookimpl
from toolwire_idempotency import IdempotencyPlugin

pytestmark = pytest.mark.anyio


class StandIn:
    """Order 200: stores successful results by call_id, replays them."""

    name = "replay"
    order = 200

    def __init__(self) -> None:
        self.stored: dict[str, ToolResult] = {}

    @hookimpl
    def before_call(self, call: ToolCall) -> ToolResult | None:
        hit = self.stored.get(str(call.call_id))
        if hit is None:
            return None
        replay = ToolResult(dict(hit.content))
        replay.meta.replayed = True
        return replay

    @hookimpl
    def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
        if call.call_id is not None and not result.is_error and not result.meta.replayed:
            self.stored[call.call_id] = result


@pytest.mark.parametrize("make_replayer", [IdempotencyPlugin, StandIn], ids=["real", "stand-in"])
async def test_a_replay_of_an_approved_call_is_not_asked_again(make_replayer: Any) -> None:
    approval = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[approval, make_replayer()])
    assert [p.name for p in kernel.plugins.ordered()][-2:] in (
        ["idempotency", "approval"],
        ["replay", "approval"],
    )
    rec = Recorder()
    rec.add_to(kernel)
    pending = Pending(kernel)
    async with kernel:
        async with running_call(kernel, "send_email", {"to": "a@x"}, call_id="once") as first:
            await approval.approve((await pending.next())["id"], by="alice")
        replay = await kernel.call("send_email", {"to": "a@x"}, call_id="once")
        # a rejected call is not stored: its replay is still denied, by the standing decision
        async with running_call(kernel, "send_email", {"to": "b@x"}, call_id="never") as no:
            await approval.reject((await pending.next())["id"], "no")
        no_again = await kernel.call("send_email", {"to": "b@x"}, call_id="never")
    assert not first().is_error and first().meta.approval is not None
    assert replay.meta.replayed and replay.content == first().content
    assert len(pending.events) == 2 and len(rec.runs) == 1  # nobody was asked for the replay
    assert no().error is not None and no_again.error is not None
    assert no_again.error.kind == "denied" and no_again.error.details["reason"] == "no"
    assert len(pending.events) == 2
