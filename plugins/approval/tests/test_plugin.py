"""The approval gate in one process: policies, decisions, edits, binding, audit, events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
import pytest
from approval_testkit import ManualClock, Pending, Recorder, plugin, running_call
from pydantic import AfterValidator

from toolwire import Kernel, ToolwireConfig, tool
from toolwire.state import StateStoreError, open_store
from toolwire.testing import FakeClock
from toolwire_approval import (
    AlreadyDecidedError,
    ApprovalExpiredError,
    ApprovalPlugin,
    ApprovalRequest,
    Approve,
    FingerprintMismatchError,
    InvalidEditError,
    Reject,
    UnknownApprovalError,
    fingerprint,
)

pytestmark = pytest.mark.anyio


def setup(**cfg: Any) -> tuple[Kernel, ApprovalPlugin, Recorder, Pending]:
    p = plugin(**cfg)
    kernel = Kernel(plugins=[p])
    rec = Recorder()
    rec.add_to(kernel)
    return kernel, p, rec, Pending(kernel)


async def test_no_config_runs_everything_and_says_so() -> None:
    kernel, _, rec, pending = setup()
    res = await kernel.call("send_email", {"to": "a@x"})
    assert not res.is_error and rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    assert res.meta.approval == {"status": "not_required", "policy": "NONE", "rule": "default"}
    assert pending.events == []


async def test_the_installed_plugin_loads_with_no_config_and_blocks_nothing() -> None:
    cfg = ToolwireConfig(enabled_plugins=["approval"])
    cfg.tools.modules = ["toolwire.examples"]
    kernel = Kernel.from_config(cfg)
    async with kernel:
        assert isinstance(kernel.get_plugin("approval"), ApprovalPlugin)
        res = await kernel.call("add", {"a": 1, "b": 2})
    assert res.content == {"result": 3}
    assert res.meta.approval is not None and res.meta.approval["status"] == "not_required"


async def test_required_waits_for_an_approval_then_runs() -> None:
    kernel, p, rec, pending = setup(tools={"send_email": "REQUIRED"})
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}, call_id="c1") as result:
        req = await pending.next()
        assert rec.runs == []
        listed = await p.pending()
        assert [r.id for r in listed] == [req["id"]]
        assert listed[0].status == "pending" and listed[0].call_id == "c1"
        done = await p.approve(req["id"], by="alice", comment="looks fine")
        assert done.status == "approved"
    res = result()
    assert not res.is_error and rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    meta = res.meta.approval
    assert meta is not None
    assert meta["status"] == "approved" and meta["how"] == "approved"
    assert meta["by"] == "alice" and meta["via"] == "api" and meta["policy"] == "REQUIRED"
    assert meta["rule"] == "tools.send_email" and meta["request_id"] == req["id"]
    assert meta["comment"] == "looks fine" and meta["edited"] is False
    async with kernel:
        audit = await p.audit_log(req["id"])
        assert await p.pending() == []
    assert [a["event"] for a in audit] == ["requested", "approved", "executed"]
    assert audit[0]["args"] == {"to": "a@x", "body": "hi", "count": 1}
    assert audit[1]["by"] == "alice" and audit[1]["rule"] == "tools.send_email"
    assert audit[2]["outcome"] == "ok"


async def test_reject_returns_denied_with_the_reason_and_never_runs() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    async with kernel, running_call(kernel, "send_email", {"to": "boss@x"}) as result:
        req = await pending.next()
        await p.reject(req["id"], "wrong recipient", by="bob")
    res = result()
    assert res.is_error and res.error is not None
    assert res.error.kind == "denied" and "wrong recipient" in res.error.message
    assert res.error.details["reason"] == "wrong recipient"
    assert res.error.details["by"] == "bob" and res.error.details["rule"] == "default"
    assert res.meta.approval is not None and res.meta.approval["how"] == "rejected"
    assert rec.runs == []


async def test_required_times_out_as_a_rejection_with_reason_timeout() -> None:
    clock = FakeClock()
    p = plugin(tools={"send_*": "REQUIRED"}, required_timeout_s=600)
    kernel = Kernel(plugins=[p], clock=clock)
    rec = Recorder()
    rec.add_to(kernel)
    async with kernel:
        res = await kernel.call("send_email", {"to": "a@x"})
    assert res.is_error and res.error is not None and res.error.kind == "denied"
    assert res.error.details["reason"] == "timeout"
    assert "within 600s" in res.error.message and "toolwire approvals approve" in res.error.message
    assert rec.runs == []
    assert res.meta.approval is not None and res.meta.approval["how"] == "timeout"
    assert res.meta.approval["rule"] == 'tools."send_*"'
    assert sum(clock.sleeps) == pytest.approx(600)


async def test_the_timeout_message_names_a_config_line_that_parses() -> None:
    """Before: "set plugins.approval.tools.mail.send = 'NONE'" for a tool named with a dot
    (as MCP and A2A tools often are): in TOML that is table `tools.mail`, key `send`."""
    import tomllib

    clock = FakeClock()
    p = plugin(default="REQUIRED", required_timeout_s=5)
    kernel = Kernel(plugins=[p], clock=clock)
    rec = Recorder()
    rec.add_to(kernel, name="mail.send")
    async with kernel:
        res = await kernel.call("mail.send", {"to": "a@x"})
    assert res.error is not None and res.error.details["reason"] == "timeout"
    line = res.error.message.split("or set plugins.approval.")[1]
    assert line == """tools."mail.send" = 'NONE'"""
    assert tomllib.loads(line) == {"tools": {"mail.send": "NONE"}}


async def test_lazy_proceeds_after_its_timeout() -> None:
    clock = FakeClock()
    p = plugin(tools={"send_email": "LAZY"})  # lazy_timeout_s defaults to 30
    kernel = Kernel(plugins=[p], clock=clock)
    rec = Recorder()
    rec.add_to(kernel)
    async with kernel:
        res = await kernel.call("send_email", {"to": "a@x"})
        audit = await p.audit_log()
    assert not res.is_error and len(rec.runs) == 1
    assert clock.sleeps == [30.0]
    meta = res.meta.approval
    assert meta is not None and meta["how"] == "lazy_timeout" and meta["policy"] == "LAZY"
    assert meta["by"] == "system" and meta["via"] == "lazy_timeout"
    assert [a["event"] for a in audit] == ["requested", "approved", "executed"]


async def test_lazy_can_still_be_rejected_before_its_timeout() -> None:
    kernel, p, rec, pending = setup(default="LAZY", lazy_timeout_s=300)
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}) as result:
        req = await pending.next()
        await p.reject(req["id"], "no")
    assert result().error is not None and result().error.kind == "denied"  # type: ignore[union-attr]
    assert rec.runs == []


async def test_approve_with_valid_edited_args_runs_the_edit() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}) as result:
        req = await pending.next()
        # "3" is coerced by the tool's own validator (pydantic lax mode), like a call's args
        await p.approve(req["id"], by="carol", args={"to": "b@x", "count": "3"})
    res = result()
    assert not res.is_error and rec.runs == [{"to": "b@x", "body": "hi", "count": 3}]
    meta = res.meta.approval
    assert meta is not None and meta["how"] == "approved_with_edits" and meta["edited"] is True
    assert meta["fingerprint"] == req["fingerprint"]
    assert meta["args_fingerprint"] == fingerprint(
        "send_email", {"to": "b@x", "body": "hi", "count": 3}
    )
    async with kernel:
        audit = await p.audit_log(req["id"])
    assert audit[1]["edited"] is True and audit[1]["args"]["to"] == "b@x"


async def test_invalid_edited_args_are_refused_and_the_request_stays_pending() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}) as result:
        req = await pending.next()
        with pytest.raises(InvalidEditError) as info:
            await p.approve(req["id"], args={"to": "b@x", "count": "many"})
        assert info.value.status == 422
        assert [pr["field"] for pr in info.value.problems] == ["count"]
        with pytest.raises(InvalidEditError):
            await p.approve(req["id"], args={"to": "b@x", "cc": "x"})  # unexpected argument
        with pytest.raises(InvalidEditError):
            await p.approve(req["id"], args=["not", "an", "object"])  # type: ignore[arg-type]
        assert (await p.get(req["id"])).status == "pending"
        assert rec.runs == []
        await p.approve(req["id"])
    assert not result().is_error and rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    async with kernel:
        events = [a["event"] for a in await p.audit_log(req["id"])]
    assert events == ["requested", "refused", "refused", "refused", "approved", "executed"]


async def test_the_audit_log_lines_carry_no_argument_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: an edit refused as invalid logged its problems, each quoting the value it got
    ("(got 'PIN-424242')"), on the audit logger whose lines are "without arguments"."""
    kernel, p, _, pending = setup(default="REQUIRED")
    caplog.set_level("INFO", logger="toolwire.approval.audit")
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}) as result:
        req = await pending.next()
        with pytest.raises(InvalidEditError):
            await p.approve(req["id"], args={"to": "a@x", "count": "PIN-424242"})
        await p.approve(req["id"], args={"to": "b@x", "body": "PIN-565656"})
    assert not result().is_error
    lines = [r.getMessage() for r in caplog.records if r.name == "toolwire.approval.audit"]
    assert [line.split(":")[0] for line in lines] == [
        "approval requested", "approval refused", "approval approved", "approval executed",
    ]  # fmt: skip
    assert '"count"' in lines[1]  # which field was wrong is still said
    assert not [line for line in lines if "PIN-" in line or "a@x" in line or "b@x" in line]
    async with kernel:  # the stored entries keep the problems whole
        [refused] = [a for a in await p.audit_log(req["id"]) if a["event"] == "refused"]
    assert "PIN-424242" in refused["problems"][0]["message"]


@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_args_json_cannot_carry_are_refused_as_args_not_as_a_store_failure(
    state: str, tmp_path: Any
) -> None:
    """Before: NaN in a call's args (the kernel's float validation takes it) ended the call
    `unavailable`, "retry when the store is back"; Infinity in edited args raised
    StateStoreError (HTTP 503), and edits nested 300 deep a bare ValueError (HTTP 500)."""
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path}/state.db"
    p = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[p], state=url)

    @tool
    def put(x: float, doc: dict[str, Any] | None = None) -> float:
        """Store x."""
        return x

    kernel.add_tool(put)
    pending = Pending(kernel)
    async with kernel:
        nan = await kernel.call("put", {"x": float("nan")})
        assert nan.error is not None and nan.error.kind == "invalid_args", nan.error
        assert "NaN or Infinity" in nan.error.message and await p.requests(status="all") == []
        async with running_call(kernel, "put", {"x": 1.0}) as result:
            req = await pending.next()
            with pytest.raises(InvalidEditError, match="NaN or Infinity") as inf:
                await p.approve(req["id"], args={"x": float("inf")})
            assert inf.value.status == 422 and inf.value.request_id == req["id"]
            deep: dict[str, Any] = {}
            for _ in range(300):
                deep = {"a": deep}
            with pytest.raises(InvalidEditError, match="cannot be recorded"):
                await p.approve(req["id"], args={"x": 2.0, "doc": deep})
            assert (await p.get(req["id"])).status == "pending"
            await p.approve(req["id"], args={"x": 2.0})
        audit = [a["event"] for a in await p.audit_log(req["id"])]
    assert result().content == {"result": 2.0}
    assert audit == ["requested", "refused", "refused", "approved", "executed"]


def email(v: str) -> str:
    """An e-mail address check a JSON Schema does not carry."""
    if "@" not in v:
        raise ValueError("not an e-mail address")
    return v


async def test_an_edit_the_tools_own_validator_refuses_spends_the_approval(
    tmp_path: Any,
) -> None:
    """The CLI (no tool there) checks edits against the stored JSON Schema only. Before, an
    edit the tool's own validator refused left the approval approved and unused: every
    retry of the call_id failed `invalid_args` on it until retention ended, and it could
    not be rejected (already decided)."""

    @tool
    def send(to: Annotated[str, AfterValidator(email)]) -> str:
        """Send."""
        return to

    url = f"sqlite:///{tmp_path}/state.db"
    p = plugin(default="REQUIRED")
    kernel = Kernel(tools=[send], plugins=[p], state=url)
    pending = Pending(kernel)
    async with kernel, open_store(url) as store:
        cli = ApprovalPlugin(p.config, store=store)
        async with running_call(kernel, "send", {"to": "a@x"}, call_id="c") as first:
            req = await pending.next()
            await cli.approve(req["id"], args={"to": "nobody"}, by="bob", via="cli")
        error = first().error
        assert error is not None and error.kind == "invalid_args" and "asks again" in error.message
        async with running_call(kernel, "send", {"to": "a@x"}, call_id="c") as again:
            retry = await pending.next()
            assert retry["id"] != req["id"]
            await p.approve(retry["id"])
        events = [(a["event"], a.get("reason")) for a in await p.audit_log(req["id"])]
    assert again().content == {"result": "a@x"}
    assert events == [("requested", None), ("approved", None), ("refused", "invalid_edit")]


async def test_a_decision_for_other_args_is_refused() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    other = fingerprint("send_email", {"to": "evil@x", "body": "hi", "count": 1})
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}) as result:
        req = await pending.next()
        assert req["fingerprint"] == fingerprint(
            "send_email", {"to": "a@x", "body": "hi", "count": 1}
        )
        with pytest.raises(FingerprintMismatchError):
            await p.approve(req["id"], fingerprint=other)
        with pytest.raises(FingerprintMismatchError):
            await p.reject(req["id"], fingerprint=other)
        with pytest.raises(FingerprintMismatchError) as short:  # "abc", not "abc..."
            await p.approve(req["id"], fingerprint="abc")
        assert f"of fingerprint {req['fingerprint'][:16]}..., not abc: " in str(short.value)
        assert (await p.get(req["id"])).status == "pending" and rec.runs == []
        await p.approve(req["id"], fingerprint=req["fingerprint"])
    assert not result().is_error and len(rec.runs) == 1


async def test_an_approval_never_releases_the_same_call_id_with_other_args() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    async with kernel:
        async with running_call(kernel, "send_email", {"to": "a@x"}, call_id="c9") as first:
            req1 = await pending.next()
            async with running_call(kernel, "send_email", {"to": "z@x"}, call_id="c9") as second:
                req2 = await pending.next()
                assert req1["id"] != req2["id"]
                await p.approve(req1["id"])
                await rec.wait_runs(1)
                await anyio.sleep(0.05)  # time for a wrong release of the second call to show
                assert rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
                await p.reject(req2["id"], "not that one")
        assert not first().is_error
        assert second().error is not None and second().error.kind == "denied"  # type: ignore[union-attr]


async def test_the_first_decision_stands() -> None:
    kernel, p, _, pending = setup(default="REQUIRED")
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}) as result:
        req = await pending.next()
        await p.reject(req["id"], "no", by="dan")
        with pytest.raises(AlreadyDecidedError, match="already rejected by 'dan'"):
            await p.approve(req["id"], by="eve")
        # whatever fingerprint it names: before, fingerprint_mismatch and a `refused` entry
        # per attempt, though a decision on a decided request is not recorded
        for _ in range(3):
            with pytest.raises(AlreadyDecidedError):
                await p.approve(req["id"], by="eve", fingerprint="0" * 64)
    assert result().is_error
    async with kernel:
        with pytest.raises(UnknownApprovalError):
            await p.get("nope")
        assert [a["event"] for a in await p.audit_log(req["id"])] == ["requested", "rejected"]


async def test_one_approval_runs_the_call_once_and_a_rejection_stands() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    async with kernel:
        async with running_call(kernel, "send_email", {"to": "a@x"}, call_id="k") as r1:
            await p.approve((await pending.next())["id"])
        assert not r1().is_error
        # the same call again (no idempotency plugin here): a new approval is needed
        async with running_call(kernel, "send_email", {"to": "a@x"}, call_id="k") as r2:
            req = await pending.next()
            await p.reject(req["id"], "once is enough")
        assert r2().is_error
        # a person's rejection stands for that call: no new question
        r3 = await kernel.call("send_email", {"to": "a@x"}, call_id="k")
        assert r3.error is not None and r3.error.kind == "denied"
        assert r3.error.details["request_id"] == req["id"]
        assert len(pending.events) == 2 and len(rec.runs) == 1


async def test_two_duplicates_waiting_on_one_approval_run_the_call_once() -> None:
    kernel, p, rec, pending = setup(default="REQUIRED")
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}, call_id="d") as first:
        req = await pending.next()
        async with running_call(kernel, "send_email", {"to": "a@x"}, call_id="d") as second:
            joined = await pending.next()
            assert joined["id"] == req["id"]
            assert pending.events[-1].data["resumed"] is True
            await p.approve(req["id"])
    results = [first(), second()]
    assert len(rec.runs) == 1
    [ok] = [r for r in results if not r.is_error]
    [dup] = [r for r in results if r.is_error]
    assert ok.content == {"sent": "a@x", "count": 1}
    assert dup.error is not None and dup.error.kind == "conflict"
    assert dup.error.details == {"reason": "approval_used", "request_id": req["id"]}


async def test_callbacks_decide_sync_or_async_and_none_means_no_opinion() -> None:
    seen: list[ApprovalRequest] = []

    async def abstain(req: ApprovalRequest) -> None:
        seen.append(req)

    def approver(req: ApprovalRequest) -> Approve | Reject:  # sync: runs in a worker thread
        if req.args["to"].endswith("@corp"):
            return Approve(
                by="policy-bot", args={**req.args, "body": "[checked] " + req.args["body"]}
            )
        return Reject("external recipient", by="policy-bot")

    kernel, p, rec, _ = setup(default="REQUIRED")
    p.add_callback(abstain)
    remove = p.add_callback(approver)
    async with kernel:
        ok = await kernel.call("send_email", {"to": "a@corp"})
        no = await kernel.call("send_email", {"to": "a@gmail"})
    assert not ok.is_error and rec.runs == [{"to": "a@corp", "body": "[checked] hi", "count": 1}]
    assert ok.meta.approval is not None and ok.meta.approval["via"] == "callback"
    assert no.error is not None and no.error.kind == "denied"
    assert no.error.message.endswith("external recipient; the tool was not run")
    assert [r.args["to"] for r in seen] == ["a@corp", "a@gmail"]
    remove()
    assert p._callbacks == [abstain]


async def test_a_sync_callback_waiting_for_a_human_does_not_stall_the_event_loop() -> None:
    """Before: a sync callback ran on the event loop, so one blocked in input() or a dialog
    stalled every call, the LAZY timeout included, until it returned."""
    import threading

    human = threading.Event()
    returned = threading.Event()

    def ask_at_the_console(req: ApprovalRequest) -> Approve | None:
        answered = human.wait(30)  # input(), a GUI dialog ...
        returned.set()
        return Approve(by="console") if answered else None

    kernel, p, rec, _ = setup(default="LAZY", lazy_timeout_s=0.2)
    p.add_callback(ask_at_the_console)
    async with kernel:
        r = await kernel.call("send_email", {"to": "a@x"})
        assert not returned.is_set()  # decided by the LAZY timeout while the human still thinks
        assert not r.is_error and r.meta.approval is not None
        assert r.meta.approval["how"] == "lazy_timeout"
        assert len(rec.runs) == 1
        human.set()  # the late answer is ignored; the abandoned thread ends
        await anyio.to_thread.run_sync(returned.wait, 10)
    assert returned.is_set()


_ABANDONED_AT_EXIT = """
import threading, time, anyio
from toolwire import Kernel, tool
from toolwire_approval import ApprovalConfig, ApprovalPlugin

@tool
def send(to: str) -> str:
    return "sent"

def nobody_answers(req):
    threading.Event().wait()  # input() at a console nobody is at

async def main():
    cfg = ApprovalConfig.model_validate({"default": "LAZY", "lazy_timeout_s": 0.1})
    kernel = Kernel(plugins=[ApprovalPlugin(cfg, callback=nobody_answers)])
    kernel.add_tool(send)
    async with kernel:
        print((await kernel.call("send", {"to": "x"})).content, flush=True)

anyio.run(main)
"""


def test_a_sync_callback_still_asking_does_not_keep_the_process_from_exiting() -> None:
    """Before: it ran in one of anyio's worker threads, which are not daemon threads: once
    the call was decided otherwise and main() had returned, the process waited at exit for
    the callback (for ever, for a console nobody answers)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", _ABANDONED_AT_EXIT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the process did not exit: an abandoned callback's thread held it")
    assert proc.returncode == 0, err
    assert out.strip() == "{'result': 'sent'}"


async def test_the_longest_timeout_and_retention_the_config_takes_still_run_calls() -> None:
    """Before: a request's TTL is its timeout plus retention_s, each <= MAX_TTL_S (the
    config's bound) but not their sum: every call needing approval failed 'internal'."""
    kernel, p, rec, _ = setup(default="REQUIRED", required_timeout_s=1e9, retention_s=1e9)
    p.add_callback(lambda req: Approve(by="bot"))
    async with kernel:
        r = await kernel.call("send_email", {"to": "a@x"})
    assert r.error is None, r.error
    assert r.meta.approval is not None and r.meta.approval["status"] == "approved"
    assert len(rec.runs) == 1


@pytest.mark.parametrize("http_token", [None, "approver-t0ken"])
async def test_the_http_api_is_offered_as_a_way_to_decide_only_when_it_answers(
    http_token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Without http_token the API answers 403: the hints (event, log) no longer send
    people there."""
    kernel, p, _, pending = setup(default="REQUIRED", http_token=http_token)
    async with kernel, running_call(kernel, "send_email", {"to": "a@x"}):
        req = await pending.next()
        await p.reject(req["id"])
    decide = pending.events[0].data["decide"]
    logged = " ".join(r.getMessage() for r in caplog.records if "waits for" in r.getMessage())
    assert "toolwire approvals approve " + req["id"] in decide["cli"]
    if http_token is None:
        assert "http" not in decide and "POST" not in logged
    else:
        assert decide["http"].startswith(f"POST /approvals/{req['id']}/approve")
        assert f"POST /approvals/{req['id']}/approve" in logged


async def test_the_approval_required_event_carries_what_a_ui_needs() -> None:
    kernel, p, _, pending = setup(tags={"mail": "REQUIRED"})
    kernel.remove_tool("send_email")
    Recorder().add_to(kernel, tags=["mail"], destructive=True)
    async with (
        kernel,
        running_call(
            kernel, "send_email", {"to": "a@x"}, call_id="c", session_id="s", tenant="t"
        ) as result,
    ):
        req = await pending.next()
        await p.reject(req["id"])
    assert result().is_error
    event = pending.events[0]
    assert event.kind == "approval_required" and event.call.name == "send_email"
    assert event.data["resumed"] is False
    assert "toolwire approvals approve " + req["id"] in event.data["decide"]["cli"]
    assert req["tool"] == "send_email" and req["args"] == {"to": "a@x", "body": "hi", "count": 1}
    assert req["policy"] == "REQUIRED" and req["rule"] == "tags.mail"
    assert req["description"] == "Send an e-mail."
    assert req["input_schema"]["properties"]["to"]["description"] == "recipient"
    assert req["annotations"] == {"destructiveHint": True} and req["tags"] == ["mail"]
    assert (req["call_id"], req["session_id"], req["tenant"]) == ("c", "s", "t")
    assert req["expires_at"] - req["created_at"] == pytest.approx(3600)


async def test_the_calls_deadline_ends_the_wait_but_keeps_the_request() -> None:
    kernel, p, rec, _ = setup(default="REQUIRED")
    async with kernel:
        res = await kernel.call("send_email", {"to": "a@x"}, call_id="d", timeout=0.2)
        assert res.error is not None and res.error.kind == "timeout"
        assert "stays pending" in res.error.message
        [req] = await p.pending()
        await p.approve(req.id)
        again = await kernel.call("send_email", {"to": "a@x"}, call_id="d")
    assert not again.is_error and len(rec.runs) == 1
    assert again.meta.approval is not None and again.meta.approval["request_id"] == req.id


async def test_a_deadline_without_a_call_id_does_not_promise_a_resumable_request() -> None:
    """Before: the error said "approve it, then call again with the same call_id" to a call
    that had none; approving it then did nothing, and calling again asked again."""
    kernel, _, rec, _ = setup(default="REQUIRED")
    async with kernel:
        res = await kernel.call("send_email", {"to": "a@x"}, timeout=0.2)
        assert res.error is not None and res.error.kind == "timeout"
        assert "same call_id" not in res.error.message
        assert "no call_id" in res.error.message and "asks again" in res.error.message
        assert res.error.details["resumable"] is False
        with_id = await kernel.call("send_email", {"to": "a@x"}, call_id="d", timeout=0.2)
        assert with_id.error is not None and with_id.error.details["resumable"] is True
    assert rec.runs == []


async def test_a_decision_after_the_request_expired_is_refused() -> None:
    """Nobody waits on the request (its call was cancelled), so nothing timed it out:
    approve/reject must still refuse it once its own timeout has passed."""
    clock = ManualClock()
    p = plugin(default="REQUIRED", required_timeout_s=60)
    kernel = Kernel(plugins=[p], clock=clock)
    rec = Recorder()
    rec.add_to(kernel)
    pending = Pending(kernel)
    async with kernel:
        async with anyio.create_task_group() as tg:
            tg.start_soon(kernel.call, "send_email", {"to": "a@x"})
            req = await pending.next()
            tg.cancel_scope.cancel()
        assert [r.id for r in await p.pending()] == [req["id"]]  # still pending, unwatched
        clock.advance(65)
        with pytest.raises(ApprovalExpiredError, match="expired") as exc:
            await p.approve(req["id"])
        # A date the approver can read, not a bare epoch number.
        when = datetime.fromtimestamp(req["expires_at"], UTC).isoformat(timespec="seconds")
        assert f"expired at {when} (5s ago;" in str(exc.value)
        assert "calling the tool again asks again" in str(exc.value)
        with pytest.raises(ApprovalExpiredError, match="expired"):
            await p.reject(req["id"], "too late")
    assert rec.runs == []


async def test_a_failing_store_refuses_the_call() -> None:
    kernel, _, rec, _ = setup(default="REQUIRED")
    async with kernel:
        await kernel.state.close()  # every store call now raises StateStoreError
        res = await kernel.call("send_email", {"to": "a@x"})
        await kernel.state.open()
    assert res.error is not None and res.error.kind == "unavailable"
    assert "state store failed" in res.error.message and rec.runs == []


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_a_waiting_call_is_released_by_a_decision_on_each_loop(
    state: str, anyio_backend: str, tmp_path: Any
) -> None:
    """The call waits; a decision taken on another kernel of the same store releases it
    (with edited args); a callback (run in a thread of its own) rejects the next call."""
    store = open_store("memory://") if state == "memory" else None
    url = f"sqlite:///{tmp_path / 's.db'}"
    p = plugin(default="REQUIRED", lazy_timeout_s=5)
    decider = plugin(default="REQUIRED", key_prefix=p.config.key_prefix)
    kernel = Kernel(state=store or url, plugins=[p])
    other = Kernel(state=store or url, plugins=[decider])
    rec = Recorder()
    rec.add_to(kernel)
    pending = Pending(kernel)
    async with kernel, other:
        async with running_call(kernel, "send_email", {"to": "a@x"}, call_id="t") as result:
            request = await pending.next()
            assert rec.runs == []  # waiting
            await decider.approve(request["id"], args={"to": "b@x"}, by=anyio_backend)
        p.add_callback(lambda req: Reject(f"{anyio_backend} says no"))
        no = await kernel.call("send_email", {"to": "c@x"})
    assert not result().is_error and rec.runs == [{"to": "b@x", "body": "hi", "count": 1}]
    assert result().meta.approval is not None and result().meta.approval["by"] == anyio_backend
    assert no.error is not None and no.error.details["reason"] == f"{anyio_backend} says no"


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(free_tcp_port: int) -> None:
    """redis.asyncio runs on asyncio only: the kernel says so when it starts (no hang, no
    traceback from inside redis-py), and nothing is asked or run."""
    kernel = Kernel(state=f"redis://127.0.0.1:{free_tcp_port}/0", plugins=[plugin()])
    rec = Recorder()
    rec.add_to(kernel)
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await kernel.call("send_email", {"to": "a@x"})
    assert rec.runs == []
