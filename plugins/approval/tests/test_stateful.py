"""A Hypothesis state machine: REQUIRED never executes without an approval.

Calls (with or without a call id) are started, approved (some with edited
arguments), rejected, timed out by moving a manual clock, and the process is
"restarted" (calls cancelled, a new kernel and plugin on the same store). A
model predicts every outcome; the invariant checks every execution the tool
saw against the approvals the test gave: each execution belongs to a request
the test approved, runs the approved (or edited) arguments, and runs once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from approval_testkit import ManualClock
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from toolwire import CallContext, CallEvent, Kernel, ToolResult, tool
from toolwire.state import SQLiteStore
from toolwire_approval import (
    AlreadyDecidedError,
    ApprovalConfig,
    ApprovalExpiredError,
    ApprovalPlugin,
)

TIMEOUT = 100.0
WAIT_S = 10.0  # real seconds a step may take before the test fails (never reached when fine)


@dataclass
class Req:
    call_id: str | None
    to: str
    created: float
    status: str = "pending"  # pending | approved | rejected
    via: str | None = None  # person | timeout
    used: bool = False
    run_to: str | None = None  # the args an approval runs (edited or not)


@dataclass
class Live:
    future: Future[ToolResult]
    call_id: str | None
    to: str
    rid: str | None = None


@dataclass
class Seen:
    events: list[tuple[int, str]] = field(default_factory=list)


def _wait(cond: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.0005)


class ApprovalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._cm = start_blocking_portal("asyncio")
        self.portal: BlockingPortal = self._cm.__enter__()
        self.clock = ManualClock()
        self.tmp = tempfile.mkdtemp(prefix="approval-sm-")
        self.executions: list[tuple[str, str]] = []  # (request id, to)
        self.reqs: dict[str, Req] = {}
        self.index: dict[tuple[str, str], str] = {}
        self.approved_by_test: set[str] = set()
        self.live: dict[int, Live] = {}
        self.probe = 0
        self.seen = Seen()
        self._boot()

    # ------------------------------------------------------------ plumbing
    def _boot(self) -> None:
        executions = self.executions

        @tool(name="send", approval="REQUIRED")  # the tool's own setting; no plugin config
        async def send(to: str, ctx: CallContext) -> dict[str, str]:
            meta = ctx.meta.approval or {}
            executions.append((str(meta.get("request_id")), to))
            return {"sent": to}

        cfg = ApprovalConfig(required_timeout_s=TIMEOUT, key_prefix="sm:approval")
        self.plugin = ApprovalPlugin(cfg)
        # A new store object on the same SQLite file after every restart, as a new process has.
        store = SQLiteStore(os.path.join(self.tmp, "state.db"), clock=self.clock.time)
        self.kernel = Kernel(state=store, clock=self.clock, plugins=[self.plugin])
        self.kernel.add_tool(send)
        seen = self.seen

        def on_event(event: CallEvent) -> None:
            seen.events.append((event.call.metadata["probe"], event.data["request"]["id"]))

        self.kernel.events.subscribe(on_event, kinds=["approval_required"])
        self.portal.call(self.kernel.start)

    def _rid_of(self, probe: int) -> str | None:
        for p, rid in reversed(self.seen.events):
            if p == probe:
                return rid
        return None

    def _expired(self, rid: str) -> bool:
        return self.clock.now >= self.reqs[rid].created + TIMEOUT

    def _waiting_on(self, rid: str) -> list[int]:
        return [p for p, c in self.live.items() if c.rid == rid]

    def _settle_decided(self, rid: str) -> list[ToolResult]:
        probes = self._waiting_on(rid)
        for p in probes:
            _wait(self.live[p].future.done, f"call {p} to finish after a decision on {rid}")
        return [self.live.pop(p).future.result() for p in probes]

    def _new_request(self, probe: int, call_id: str | None, to: str) -> None:
        live = self.live[probe]
        _wait(lambda: self._rid_of(probe) is not None, "the approval_required event")
        rid = self._rid_of(probe)
        assert rid is not None and rid not in self.reqs
        live.rid = rid
        self.reqs[rid] = Req(call_id, to, self.clock.now)
        if call_id is not None:
            self.index[(call_id, to)] = rid

    # --------------------------------------------------------------- rules
    @rule(call_id=st.sampled_from(["a", "b", None]), to=st.sampled_from(["x", "y"]))
    def request(self, call_id: str | None, to: str) -> None:
        self.probe += 1
        probe = self.probe

        async def run() -> ToolResult:
            return await self.kernel.call(
                "send", {"to": to}, call_id=call_id, metadata={"probe": probe}
            )

        self.live[probe] = Live(self.portal.start_task_soon(run), call_id, to)
        rid = self.index.get((call_id, to)) if call_id is not None else None
        req = self.reqs.get(rid) if rid is not None else None
        if req is None or (req.status == "approved" and req.used) or req.via == "timeout":
            self._new_request(probe, call_id, to)
            return
        assert rid is not None
        if req.status == "pending" and not self._expired(rid):
            _wait(lambda: self._rid_of(probe) == rid, "the resumed call's event")
            self.live[probe].rid = rid
            return
        fut = self.live.pop(probe).future
        _wait(fut.done, "an immediate answer")
        res = fut.result()
        if req.status == "pending":  # expired while nobody waited: this call times it out
            assert res.error is not None and res.error.details["reason"] == "timeout"
            req.status, req.via = "rejected", "timeout"
        elif req.status == "approved":  # approved while nobody waited: runs now
            assert not res.is_error, res.error
            req.used = True
        else:  # a person's rejection stands
            assert res.error is not None and res.error.kind == "denied"

    def _pending_rids(self) -> list[str]:
        # creation order (dicts keep it), not the random ids: draws must be reproducible
        return [r for r, q in self.reqs.items() if q.status == "pending"]

    @precondition(lambda self: any(q.status == "pending" for q in self.reqs.values()))
    @rule(data=st.data(), edit=st.booleans())
    def approve(self, data: st.DataObject, edit: bool) -> None:
        rid = data.draw(st.sampled_from(self._pending_rids()))
        req = self.reqs[rid]
        args = {"to": "edited"} if edit else None
        if self._expired(rid):
            with pytest.raises(ApprovalExpiredError):
                self.portal.call(lambda: self.plugin.approve(rid, args=args))
            return
        self.portal.call(lambda: self.plugin.approve(rid, by="test", args=args))
        self.approved_by_test.add(rid)
        req.status, req.via = "approved", "person"
        req.run_to = "edited" if edit else req.to
        results = self._settle_decided(rid)
        if results:
            ok = [r for r in results if not r.is_error]
            assert len(ok) == 1, results  # one approval, one execution
            assert all(r.error.kind == "conflict" for r in results if r.error is not None)
            req.used = True

    @precondition(lambda self: any(q.status == "pending" for q in self.reqs.values()))
    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._pending_rids()))
        req = self.reqs[rid]
        if self._expired(rid):
            with pytest.raises(ApprovalExpiredError):
                self.portal.call(lambda: self.plugin.reject(rid, "no"))
            return
        self.portal.call(lambda: self.plugin.reject(rid, "no", by="test"))
        req.status, req.via = "rejected", "person"
        for res in self._settle_decided(rid):
            assert res.error is not None and res.error.kind == "denied"
            assert res.error.details["reason"] == "no"

    @precondition(lambda self: any(q.status != "pending" for q in self.reqs.values()))
    @rule(data=st.data())
    def decide_again(self, data: st.DataObject) -> None:
        decided = [r for r, q in self.reqs.items() if q.status != "pending"]
        rid = data.draw(st.sampled_from(decided))
        with pytest.raises(AlreadyDecidedError):
            self.portal.call(lambda: self.plugin.approve(rid))

    @rule(seconds=st.sampled_from([TIMEOUT / 2, TIMEOUT]))
    def time_passes(self, seconds: float) -> None:
        self.portal.call(self.clock.advance, seconds)  # on the loop: Event.set is not thread-safe
        for rid, req in self.reqs.items():
            if req.status != "pending" or not self._expired(rid) or not self._waiting_on(rid):
                continue
            req.status, req.via = "rejected", "timeout"
            for res in self._settle_decided(rid):
                assert res.error is not None and res.error.kind == "denied"
                assert res.error.details["reason"] == "timeout"

    @rule()
    def restart(self) -> None:
        for live in self.live.values():
            live.future.cancel()
        for live in self.live.values():
            _wait(live.future.done, "a cancelled call")
        self.live.clear()
        self.portal.call(self.kernel.close)
        self._boot()

    # ---------------------------------------------------------- invariants
    @invariant()
    def only_approved_calls_ran_once_with_the_approved_args(self) -> None:
        rids = [rid for rid, _ in self.executions]
        assert len(rids) == len(set(rids)), f"an approval ran twice: {self.executions}"
        for rid, to in self.executions:
            assert rid in self.approved_by_test, f"ran without an approval: {rid}"
            assert to == self.reqs[rid].run_to, (rid, to, self.reqs[rid])
        used = {rid for rid, q in self.reqs.items() if q.used}
        assert used == set(rids)

    @invariant()
    def pending_calls_are_still_waiting(self) -> None:
        for probe, live in self.live.items():
            assert not live.future.done(), (probe, live.future.result())

    def teardown(self) -> None:
        try:
            for live in self.live.values():
                live.future.cancel()
            self.portal.call(self.kernel.close)
        finally:
            self._cm.__exit__(None, None, None)
            shutil.rmtree(self.tmp, ignore_errors=True)


ApprovalMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestApprovalStateMachine = ApprovalMachine.TestCase
