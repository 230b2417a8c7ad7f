"""The approval plugin: human-in-the-loop for tool calls (order 300).

State layout (``key_prefix`` default ``toolwire:approval``)::

    {prefix}:req:{id}                 the request record (JSON, see _new_record)
    {prefix}:call:{bind}              {"id": ...}: the request of (tenant, tool, call_id, args)
    {prefix}:audit:{id}:{µs}:{rand}   one audit entry

Request lifecycle (every transition is one compare-and-set, so exactly one
decision wins across channels, tasks and processes)::

    pending --approve (a person / callback / LAZY timeout)--> approved --used--> approved+used_at
    pending --reject (a person) / REQUIRED timeout--> rejected

A waiting call watches its record with ``StateStore.wait_for_change``: a
decision written by any process sharing the store releases it. An approval is
used by exactly one execution (``used_at``); a later call with the same
(tenant, tool, call_id, args) asks again, while a person's rejection stands
for it.
"""

from __future__ import annotations

import contextvars
import inspect
import itertools
import json
import logging
import os
import secrets
import shlex
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import pydantic
import pydantic_core

from toolwire import (
    ArgsError,
    CallContext,
    CallRejected,
    ErrorKind,
    SystemClock,
    Tool,
    ToolCall,
    ToolResult,
    describe_validation_error,
    hookimpl,
    validate_json_schema,
)
from toolwire.state import MAX_TTL_S, Entry, StateStore, StateStoreError

from ._channels import (
    ELICIT_EXTENSION,
    ELICIT_KEY,
    ELICIT_SCHEMA,
    INPUT_REQUIRED,
    STATE_PREFIX,
    TERMINAL_EXTENSION,
    Elicitor,
    TerminalPrompt,
    elicitation_message,
    parse_elicitation,
    terminal_prompt,
)
from ._config import ApprovalConfig, Policy
from ._rules import Resolution, RuleSet, _quoted
from ._types import (
    APPROVED,
    EXPIRED,
    PENDING,
    REJECTED,
    AlreadyDecidedError,
    ApprovalDecision,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalRequest,
    Approve,
    FingerprintMismatchError,
    InvalidEditError,
    Reject,
    UnknownApprovalError,
    fingerprint,
    jsonable_args,
)

if TYPE_CHECKING:
    from toolwire import Clock, Kernel

__all__ = ["ApprovalCallback", "ApprovalPlugin"]

log = logging.getLogger("toolwire.approval")
audit_log = logging.getLogger("toolwire.approval.audit")

STATE_KEY = "approval"  # ctx.state[STATE_KEY]
#: A callback channel: gets the request, returns a decision (or None: no opinion).
ApprovalCallback = Callable[
    [ApprovalRequest], Awaitable[ApprovalDecision | None] | ApprovalDecision | None
]

_CONTENTION_ROUNDS = 32


#: The statuses a stored request can have.
_REQUEST_STATUSES = (PENDING, APPROVED, REJECTED, EXPIRED)


@dataclass(slots=True)
class _Signal:
    """Set by the elicitation channel when an MCP client must be asked out of band."""

    event: anyio.Event
    input_required: bool = False

    def raise_input_required(self) -> None:
        self.input_required = True
        self.event.set()


#: Sync approval callbacks running at once (each in a worker thread of its own pool).
CALLBACK_THREADS = 64


class ApprovalPlugin:
    """Human-in-the-loop approval of tool calls (entry point ``approval``, order 300).

    Per tool a policy applies (``NONE``, ``LAZY``, ``REQUIRED``), chosen by the
    rules of ``[plugins.approval]`` (see ``RuleSet``). A call that needs approval
    creates a pending request in the kernel's state store and waits; channels
    (callbacks, MCP elicitation, the terminal, the HTTP API, the CLI, events)
    decide it with :meth:`approve` / :meth:`reject` / :meth:`decide`.

    Args:
        config: the ``[plugins.approval]`` configuration (defaults: no rules).
        callback: an in-process approver, see :meth:`add_callback`.
        store: a state store to use before (or without) a kernel, e.g. in a
            CLI that only decides; the kernel's store is used once started.
        clock: wall-clock source without a kernel (default ``time.time``).
    """

    name = "approval"
    order = 300
    Config = ApprovalConfig

    def __init__(
        self,
        config: ApprovalConfig | None = None,
        *,
        callback: ApprovalCallback | None = None,
        store: StateStore | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config if config is not None else ApprovalConfig()
        self.rules = RuleSet(self.config)
        self._callbacks: list[ApprovalCallback] = [callback] if callback is not None else []
        # sync callbacks' threads: their own pool, so callbacks waiting for people never
        # take the threads of the kernel's sync tools (anyio's default pool)
        self._callback_threads: anyio.CapacityLimiter | None = None
        self._kernel: Kernel | None = None
        self._cli_command: str | None = None  # `toolwire [--config PATH] approvals`
        self._store = store
        self._time = clock or time.time
        self._prefix = self.config.key_prefix
        self._seq = itertools.count()
        #: True once ``http_routes()`` handed the HTTP API to a server.
        self.http_mounted = False

    # ------------------------------------------------------------- hooks
    @hookimpl
    def startup(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._cli_command = None
        self._cli()  # the config's absolute path now, before anyone changes directory

    @hookimpl
    async def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        tool = ctx.tool
        if tool is None:  # pragma: no cover - the kernel resolves the tool first
            return
        res = self.rules.resolve(tool)
        if res.policy is Policy.NONE:
            ctx.meta.approval = {"status": "not_required", "policy": "NONE", "rule": res.rule}
            return
        await self._gate_or_refuse(call, ctx, tool, res, rerouted=False)

    @hookimpl
    async def before_fallback(self, call: ToolCall, next_call: ToolCall, ctx: CallContext) -> None:
        """A fallback (or a retry with other arguments) is asked for as a call would be:
        the tool it would run, with the arguments it would run with."""
        held = ctx.state.pop(STATE_KEY, None)
        if held and held.get("used"):
            # the approved call's run ended with the attempt that just failed: its audit
            # line is due now (after_call writes the line of an approval asked for here)
            last = ctx.attempts[-1] if ctx.attempts else None
            kind = last.error_kind if last is not None else None
            await self._audit_executed(ctx, held["record"], kind or "tool_error")
        tool = ctx.kernel.get_tool(next_call.name)
        if tool is None:  # pragma: no cover - the kernel resolved it a moment ago
            return
        res = self.rules.resolve(tool)
        if res.policy is Policy.NONE:
            return
        await self._gate_or_refuse(next_call, ctx, tool, res, rerouted=True)

    async def _gate_or_refuse(
        self, call: ToolCall, ctx: CallContext, tool: Tool, res: Resolution, *, rerouted: bool
    ) -> None:
        """``_gate``; a failing state store refuses the call (fail-closed)."""
        if self._kernel is None:
            self._kernel = ctx.kernel
        try:
            await self._gate(call, ctx, tool, res, rerouted=rerouted)
        except StateStoreError as exc:
            what = "fallback tool" if rerouted else "tool"
            raise CallRejected(
                ErrorKind.UNAVAILABLE,
                f"plugin 'approval': {what} {call.name!r} needs approval ({res.describe()}) "
                f"but the state store failed ({exc}); the tool was not run. Retry when the "
                "store is back.",
                details={"reason": "store_error", "rule": res.rule},
            ) from None

    @hookimpl
    async def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
        held = ctx.state.get(STATE_KEY)
        if not held or not held.get("used"):
            return
        err = result.error
        await self._audit_executed(ctx, held["record"], str(err.kind) if err is not None else None)

    async def _audit_executed(
        self, ctx: CallContext, rec: dict[str, Any], error_kind: str | None
    ) -> None:
        """The ``executed`` audit line of an approved call (``error_kind`` None: it succeeded)."""
        try:
            await self._audit(
                ctx.kernel.state,
                "executed",
                rec,
                outcome="ok" if error_kind is None else "error",
                error_kind=error_kind,
            )
        except StateStoreError as exc:  # the result matters more than its audit line
            log.error("approval: could not audit the execution of %r: %s", rec.get("tool"), exc)

    # ------------------------------------------------------------ public
    def add_callback(self, callback: ApprovalCallback) -> Callable[[], None]:
        """Ask ``callback(request)`` whenever a call needs approval; returns a remover.

        The callback (sync or async) returns ``Approve(...)``, ``Reject(...)``
        or None (no opinion: the other channels and the timeouts decide). It
        runs concurrently with the other channels; the first decision wins.
        A sync callback runs in a worker thread, so one that waits for a human
        (``input()``, a GUI dialog) does not stall the event loop; one still
        asking when the call is decided otherwise is abandoned, its answer
        ignored.
        """
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def resolve(self, tool: Tool | str) -> Resolution:
        """The policy and the decisive rule for ``tool`` (a Tool, or a name in the catalog)."""
        if isinstance(tool, str):
            found = self._kernel.get_tool(tool) if self._kernel is not None else None
            if found is None:
                raise KeyError(f"no tool {tool!r} in the catalog")
            tool = found
        return self.rules.resolve(tool)

    async def requests(
        self, *, status: str | None = None, tool: str | None = None
    ) -> list[ApprovalRequest]:
        """Stored requests, oldest first; ``status`` filters (``pending``, ``approved``,
        ``rejected``, ``expired``; None or ``all``: every one), ``tool`` too.

        Another status is a ``ValueError`` naming the accepted ones.
        """
        if status == "all":
            status = None
        if status is not None and status not in _REQUEST_STATUSES:
            raise ValueError(
                f"status {status!r}: use one of {', '.join(_REQUEST_STATUSES)}, 'all' or None"
            )
        store = self._state()
        now = self._now()
        out = []
        for entry in await store.scan(f"{self._prefix}:req:"):
            req = ApprovalRequest.from_record(entry.value, now)
            if (status is None or req.status == status) and (tool is None or req.tool == tool):
                out.append(req)
        out.sort(key=lambda r: (r.created_at, r.id))
        return out

    async def pending(self, *, tool: str | None = None) -> list[ApprovalRequest]:
        """Requests waiting for a decision (not expired), oldest first."""
        return await self.requests(status=PENDING, tool=tool)

    async def get(self, request_id: str) -> ApprovalRequest:
        """One request; ``UnknownApprovalError`` when there is none with this id."""
        if not _possible_id(request_id):
            raise self._unknown(request_id)
        entry = await self._state().get_entry(self._req_key(request_id))
        if entry is None:
            raise self._unknown(request_id)
        return ApprovalRequest.from_record(entry.value, self._now())

    def _unknown(self, request_id: str) -> UnknownApprovalError:
        return UnknownApprovalError(
            f"no approval request {request_id!r} (unknown, or older than "
            f"plugins.approval.retention_s = {self.config.retention_s:g}s)",
            request_id=request_id,
        )

    async def approve(
        self,
        request_id: str,
        *,
        by: str | None = None,
        args: dict[str, Any] | None = None,
        comment: str | None = None,
        fingerprint: str | None = None,
        via: str = "api",
    ) -> ApprovalRequest:
        """Approve a pending request (``args``: run with these instead, validated first).

        ``fingerprint`` (the request's, as the approver saw it) makes the
        decision refuse to apply to a request for other arguments. Raises
        ``UnknownApprovalError``, ``AlreadyDecidedError``,
        ``ApprovalExpiredError``, ``FingerprintMismatchError`` or
        ``InvalidEditError`` (the request then stays pending).
        """
        decision = Approve(by=by, args=args, comment=comment)
        return await self.decide(request_id, decision, via=via, fingerprint=fingerprint)

    async def reject(
        self,
        request_id: str,
        reason: str = "rejected",
        *,
        by: str | None = None,
        fingerprint: str | None = None,
        via: str = "api",
    ) -> ApprovalRequest:
        """Reject a pending request: the call ends ``denied`` with ``reason`` and never runs."""
        decision = Reject(reason=reason, by=by)
        return await self.decide(request_id, decision, via=via, fingerprint=fingerprint)

    async def decide(
        self,
        request_id: str,
        decision: ApprovalDecision,
        *,
        via: str = "api",
        fingerprint: str | None = None,
        client: str | None = None,
    ) -> ApprovalRequest:
        """Record ``decision`` for a pending request; the first decision wins.

        ``via`` names the channel in the audit log; ``client`` (e.g. an HTTP
        client address) is recorded too. See :meth:`approve` for the errors.
        """
        return await self._decide(
            request_id, decision, via=via, fingerprint=fingerprint, client=client, late=False
        )

    async def _decide(
        self,
        request_id: str,
        decision: ApprovalDecision,
        *,
        via: str,
        fingerprint: str | None,
        client: str | None,
        late: bool,
    ) -> ApprovalRequest:
        """``decide``; ``late``: also on a request past its timeout that is still pending
        (the answer a 2026-07-28 MCP client brings back on a LAZY call, see ``_wait``)."""
        if not isinstance(decision, (Approve, Reject)):
            raise TypeError(f"decision must be Approve or Reject, not {type(decision).__name__}")
        if not _possible_id(request_id):
            raise self._unknown(request_id)
        store = self._state()
        key = self._req_key(request_id)
        by = decision.by or via
        for _ in range(_CONTENTION_ROUNDS):
            entry = await store.get_entry(key)
            if entry is None:
                raise self._unknown(request_id)
            rec = entry.value
            now = self._now()
            # Decided or expired first: such a decision changes nothing and is not
            # recorded, whatever fingerprint it names (before, each one added a
            # `refused` audit entry and answered fingerprint_mismatch).
            if rec["status"] != PENDING:
                d = rec.get("decision") or {}
                raise AlreadyDecidedError(
                    f"approval request {request_id!r} was already {rec['status']} by "
                    f"{d.get('by')!r} via {d.get('via')}; the first decision stands",
                    request_id=request_id,
                )
            if now >= rec["expires_at"] and not late:
                when = datetime.fromtimestamp(rec["expires_at"], UTC).isoformat(timespec="seconds")
                raise ApprovalExpiredError(
                    f"approval request {request_id!r} expired at {when} "
                    f"({now - rec['expires_at']:.0f}s ago; {rec['policy']}, timeout "
                    f"{rec['timeout_s']:g}s) and can no longer be decided; calling the tool "
                    "again asks again",
                    request_id=request_id,
                )
            if fingerprint is not None and fingerprint != rec["fingerprint"]:
                await self._audit(
                    store, "refused", rec, by=by, via=via, client=client,
                    reason="fingerprint_mismatch", given_fingerprint=fingerprint,
                )  # fmt: skip
                raise FingerprintMismatchError(
                    f"approval request {request_id!r} is for tool {rec['tool']!r} with arguments "
                    f"of fingerprint {_short_fp(rec['fingerprint'])}, not {_short_fp(fingerprint)}: a "
                    "decision only applies to the arguments it was made for. Look at the "
                    "request again (`toolwire approvals show ID`, or GET it over HTTP) and decide "
                    "on what it shows.",
                    request_id=request_id,
                )
            if isinstance(decision, Approve):
                d = {"action": "approve", "by": by, "via": via, "at": now, "edited": False}
                if decision.comment:
                    d["comment"] = decision.comment
                if decision.args is not None:
                    try:
                        edited = self._validate_edit(rec, decision.args)
                    except InvalidEditError as exc:
                        exc.request_id = request_id
                        await self._audit(
                            store, "refused", rec, by=by, via=via, client=client,
                            reason="invalid_edit", problems=exc.problems,
                        )  # fmt: skip
                        raise
                    edited_fp = _fingerprint(rec["tool"], edited)
                    if edited_fp != rec["fingerprint"]:
                        d.update(edited=True, args=edited, args_fingerprint=edited_fp)
                new = {**rec, "status": APPROVED, "decision": d}
            else:
                reason = decision.reason or "rejected"
                d = {"action": "reject", "by": by, "via": via, "at": now, "reason": reason}
                new = {**rec, "status": REJECTED, "decision": d}
            if client is not None:
                d["client"] = client
            done = await store.compare_and_set(
                key, new, expected_version=entry.version, ttl=self._ttl(rec, now)
            )
            if done is None:
                continue  # changed meanwhile (another decision?): look again
            await self._audit(
                store,
                "approved" if new["status"] == APPROVED else "rejected",
                new,
                by=by,
                via=via,
                client=client,
                reason=d.get("reason"),
                comment=d.get("comment"),
                edited=d.get("edited"),
                args=d.get("args"),
            )
            return ApprovalRequest.from_record(new, now)
        raise ApprovalError(  # pragma: no cover - needs 32 concurrent writers in a row
            f"approval request {request_id!r} kept changing; try again", request_id=request_id
        )

    async def audit_log(
        self, request_id: str | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit entries (oldest first): every request, decision, refusal and execution.

        Each has ``at``, ``event`` (``requested``, ``approved``, ``rejected``,
        ``refused``, ``executed``), ``request_id``, ``tool``, ``call_id``,
        ``fingerprint``, ``policy``, ``rule``, ``by``, ``via`` and what the event
        adds (``reason``, ``args``, ``edited``, ``outcome``...). ``limit``: the
        most recent ones.
        """
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(f"limit {limit!r}: give a whole number >= 1, or None for every entry")
        if request_id and not _possible_id(request_id):
            return []
        prefix = f"{self._prefix}:audit:" + (f"{request_id}:" if request_id else "")
        entries = [e.value for e in await self._state().scan(prefix)]
        entries.sort(key=lambda v: (v["at"], v.get("seq", "")))
        return entries[-limit:] if limit else entries

    def http_routes(self) -> list[Any]:
        """The HTTP API as Starlette routes under ``http_prefix`` (``toolwire serve``
        mounts them behind its bearer auth). Needs ``starlette``."""
        from ._http import build_routes

        self.http_mounted = True
        return build_routes(self, self.config.http_prefix)

    # ----------------------------------------------------------- the gate
    async def _gate(
        self,
        call: ToolCall,
        ctx: CallContext,
        tool: Tool,
        res: Resolution,
        *,
        rerouted: bool = False,
    ) -> None:
        kernel = ctx.kernel
        store = kernel.state
        clock = kernel.clock
        try:
            args_json = jsonable_args(call.args)
        except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
            raise CallRejected(
                ErrorKind.INVALID_ARGS,
                f"plugin 'approval': the arguments of tool {call.name!r} cannot be shown to an "
                f"approver ({exc}); the tool was not run. Pass JSON values (no NaN or Infinity)",
                details={"reason": "unserializable_args"},
            ) from None
        fp = _fingerprint(call.name, args_json)
        elicit: Elicitor | None = None
        if self.config.mcp_elicitation:
            offered = ctx.extensions.get(ELICIT_EXTENSION)
            # A reroute is not asked in input_required rounds: the client answers by sending
            # the whole call again, which would run (and re-approve) the failed tool first.
            if isinstance(offered, Elicitor) and not (rerouted and offered.mode == INPUT_REQUIRED):
                elicit = offered
        started = clock.monotonic()
        entry, created = await self._open(store, call, tool, res, fp, args_json, elicit)
        rec = entry.value
        rid = rec["id"]
        now = clock.time()
        if created:
            await self._audit(store, "requested", rec, via=rec.get("via"), args=args_json)
        if rec["status"] == PENDING and now < rec["expires_at"]:
            req = ApprovalRequest.from_record(rec, now)
            self._announce_log(req, created, self._has_local_channel(ctx, elicit))
            if kernel.events.active:
                await kernel.events.emit(
                    "approval_required",
                    call,
                    request=req.to_dict(),
                    resumed=not created,
                    decide=self._how_to_decide(rid),
                )
        entry, signal = await self._wait(ctx, entry, elicit)
        rec = entry.value
        waited_ms = round((clock.monotonic() - started) * 1000.0, 3)
        if signal == INPUT_REQUIRED:
            ctx.meta.approval = _meta(rec, "pending", waited_ms)
            raise CallRejected(
                INPUT_REQUIRED,
                f"plugin 'approval': tool {call.name!r} needs approval ({res.describe()}); "
                f"request {rid} is being asked of the MCP client's user",
                details={"reason": "input_required", "request_id": rid, "rule": rec["rule"]},
            )
        if signal == "deadline":
            ctx.meta.approval = _meta(rec, "pending", waited_ms)
            resumable = call.call_id is not None
            raise CallRejected(
                ErrorKind.TIMEOUT,
                f"plugin 'approval': the call's deadline passed while tool {call.name!r} waited "
                f"for approval (request {rid}, {res.describe()}); "
                + (
                    "the request stays pending: approve it, then call again with the same call_id"
                    if resumable
                    # Nothing recognises a call without a call_id: an approval of this
                    # request would never be used.
                    else "this call has no call_id, so nothing can resume its request: "
                    "calling again asks again. Pass a call_id (the same on every retry) to "
                    "resume a request after a deadline"
                ),
                details={
                    "reason": "deadline",
                    "request_id": rid,
                    "rule": rec["rule"],
                    "resumable": resumable,
                },
            )
        d = rec.get("decision") or {}
        if rec["status"] == REJECTED:
            timed_out = d.get("via") == "timeout"
            ctx.meta.approval = _meta(rec, "timeout" if timed_out else "rejected", waited_ms)
            await self._emit_decided(kernel, call, rec)
            raise CallRejected(ErrorKind.DENIED, self._denied_message(rec), details=_denial(rec))
        run_args = await self._validate_for_run(store, tool, entry) if d.get("edited") else None
        used = await self._use(store, entry)
        if used is None:
            ctx.meta.approval = _meta(rec, "already_used", waited_ms)
            raise CallRejected(
                ErrorKind.CONFLICT,
                f"plugin 'approval': the approval of request {rid} (tool {call.name!r}) was "
                "already used by another execution of this call; an approval runs a call once. "
                "Call again to ask for a new approval.",
                details={"reason": "approval_used", "request_id": rid},
            )
        rec = used.value
        if run_args is not None:
            call.args = run_args
        how = "lazy_timeout" if d.get("via") == "lazy_timeout" else "approved"
        if how == "approved" and d.get("edited"):
            how = "approved_with_edits"
        ctx.meta.approval = _meta(rec, how, waited_ms)
        ctx.state[STATE_KEY] = {"used": True, "record": rec}
        await self._emit_decided(kernel, call, rec)

    async def _open(
        self,
        store: StateStore,
        call: ToolCall,
        tool: Tool,
        res: Resolution,
        fp: str,
        args_json: dict[str, Any],
        elicit: Elicitor | None,
    ) -> tuple[Entry, bool]:
        """The request this call waits on: an existing one for the same call, or a new one."""
        if call.call_id is None:
            # An MCP client retrying a call after answering an elicitation (2026-07-28
            # protocol) echoes the request id in the (server-sealed) request_state.
            state = elicit.request_state if elicit is not None else None
            if state and state.startswith(STATE_PREFIX):
                found = await store.get_entry(self._req_key(state[len(STATE_PREFIX) :]))
                if found is not None and _reusable(found.value, call, fp):
                    return await self._tighten(store, found, res), False
            rec = self._new_record(call, tool, res, fp, args_json)
            made = await store.set_if_absent(
                self._req_key(rec["id"]), rec, ttl=self._ttl(rec, rec["created_at"])
            )
            if made is None:  # pragma: no cover - 64 random bits collided
                raise StateStoreError("approval request id collision; retry")
            return made, True
        index_key = self._index_key(call, fp)
        for _ in range(_CONTENTION_ROUNDS):
            index = await store.get_entry(index_key)
            if index is not None:
                found = await store.get_entry(self._req_key(index.value["id"]))
                if found is not None and _reusable(found.value, call, fp):
                    return await self._tighten(store, found, res), False
            rec = self._new_record(call, tool, res, fp, args_json)
            ttl = self._ttl(rec, rec["created_at"])
            key = self._req_key(rec["id"])
            # Write the request before pointing the index at it, so a reader of the
            # index always finds the request; the loser of a race removes its own.
            # Shielded: a cancellation in between would leave an orphan request.
            with anyio.CancelScope(shield=True):
                written = await store.set(key, rec, ttl=ttl)
                won = await store.compare_and_set(
                    index_key,
                    {"id": rec["id"]},
                    expected_version=index.version if index is not None else None,
                    ttl=ttl,
                )
                if won is None:
                    await store.delete(key)
            if won is not None:
                return written, True
        raise StateStoreError(  # pragma: no cover - 32 concurrent creators in a row
            f"approval: could not open a request for tool {call.name!r}; retry"
        )

    async def _tighten(self, store: StateStore, entry: Entry, res: Resolution) -> Entry:
        """A pending request made under a weaker policy than today's takes today's."""
        rec = entry.value
        if rec["status"] != PENDING or Policy(rec["policy"]).strictness >= res.policy.strictness:
            return entry
        timeout = self._timeout(res.policy)
        new = {
            **rec,
            "policy": str(res.policy),
            "rule": res.rule,
            "timeout_s": timeout,
            "expires_at": rec["created_at"] + timeout,
        }
        done = await store.compare_and_set(
            self._req_key(rec["id"]),
            new,
            expected_version=entry.version,
            ttl=self._ttl(new, self._now()),
        )
        if done is not None:
            return done
        return await store.get_entry(self._req_key(rec["id"])) or entry

    async def _wait(
        self, ctx: CallContext, entry: Entry, elicit: Elicitor | None
    ) -> tuple[Entry, str | None]:
        """Wait for a decision, running the channels meanwhile; (entry, signal)."""
        kernel = ctx.kernel
        rec = entry.value
        signal = _Signal(anyio.Event())
        now = kernel.clock.time()
        async with anyio.create_task_group() as tg:
            if rec["status"] == PENDING and now < rec["expires_at"]:
                self._start_channels(tg, ctx, ApprovalRequest.from_record(rec, now), elicit, signal)
            elif (
                rec["status"] == PENDING
                and rec["policy"] == Policy.LAZY
                and elicit is not None
                and elicit.mode == INPUT_REQUIRED
            ):
                # A 2026-07-28 client's user answered after lazy_timeout_s. Nothing ran
                # meanwhile (the first round ended the call), and this retry carries the
                # answer: it decides, not the timeout (which ran the tool the user rejected).
                req = ApprovalRequest.from_record(rec, now)
                await self._run_elicitation(elicit, req, signal, late=True)
                entry = await kernel.state.get_entry(entry.key) or entry
            try:
                outcome = await self._watch(ctx, entry, signal)
            finally:
                tg.cancel_scope.cancel()
        return outcome

    async def _watch(
        self, ctx: CallContext, entry: Entry | None, signal: _Signal
    ) -> tuple[Entry, str | None]:
        kernel = ctx.kernel
        store, clock = kernel.state, kernel.clock
        assert entry is not None
        key = entry.key
        rid = entry.value["id"]
        while True:
            if entry is None:
                raise CallRejected(
                    ErrorKind.DENIED,
                    f"plugin 'approval': approval request {rid} disappeared from the state store "
                    f"(deleted?) while tool {ctx.call.name!r} waited for it; the tool was not run",
                    details={"reason": "gone", "request_id": rid},
                )
            rec = entry.value
            if rec["status"] != PENDING:
                return entry, None
            if signal.input_required:
                return entry, INPUT_REQUIRED
            left = rec["expires_at"] - clock.time()
            if left <= 0:
                entry = await self._expire(store, entry)
                continue
            call_left = ctx.time_left()
            if call_left is not None:
                if call_left <= 0:
                    return entry, "deadline"
                left = min(left, call_left)
            entry = await _wait_change(store, clock, key, entry.version, left, signal.event)

    async def _expire(self, store: StateStore, entry: Entry) -> Entry | None:
        """The timeout of a pending request: LAZY proceeds, REQUIRED is rejected."""
        rec = entry.value
        now = self._now()
        d: dict[str, Any]
        if rec["policy"] == Policy.LAZY:
            d = {
                "action": "approve",
                "by": "system",
                "via": "lazy_timeout",
                "at": now,
                "edited": False,
                "reason": f"nobody answered within {rec['timeout_s']:g}s",
            }
            new = {**rec, "status": APPROVED, "decision": d}
        else:
            d = {
                "action": "reject",
                "by": "system",
                "via": "timeout",
                "at": now,
                "reason": "timeout",
            }
            new = {**rec, "status": REJECTED, "decision": d}
        done = await store.compare_and_set(
            entry.key, new, expected_version=entry.version, ttl=self.config.retention_s
        )
        if done is None:
            return await store.get_entry(entry.key)
        event = "approved" if new["status"] == APPROVED else "rejected"
        await self._audit(store, event, new, by="system", via=d["via"], reason=d["reason"])
        return done

    async def _use(self, store: StateStore, entry: Entry | None) -> Entry | None:
        """Mark an approval used by this execution; None when another one used it."""
        for _ in range(_CONTENTION_ROUNDS):
            if entry is None or entry.value["status"] != APPROVED:
                return None
            rec = entry.value
            if rec.get("used_at") is not None:
                return None
            now = self._now()
            new = {**rec, "used_at": now}
            done = await store.compare_and_set(
                entry.key, new, expected_version=entry.version, ttl=self._ttl(rec, now)
            )
            if done is not None:
                return done
            entry = await store.get_entry(entry.key)
        return None  # pragma: no cover

    # ---------------------------------------------------------- channels
    def _start_channels(
        self,
        tg: anyio.abc.TaskGroup,
        ctx: CallContext,
        request: ApprovalRequest,
        elicit: Elicitor | None,
        signal: _Signal,
    ) -> None:
        for cb in list(self._callbacks):
            tg.start_soon(self._run_callback, cb, request)
        if elicit is not None:
            tg.start_soon(self._run_elicitation, elicit, request, signal)
        if self.config.terminal:
            term = terminal_prompt(ctx.extensions.get(TERMINAL_EXTENSION))
            if term is not None:
                tg.start_soon(self._run_terminal, term, request)

    async def _run_callback(self, cb: ApprovalCallback, request: ApprovalRequest) -> None:
        try:
            if _is_async(cb):
                res = cb(request)
            else:  # it may block (input(), a dialog): not on the event loop
                if self._callback_threads is None:
                    self._callback_threads = anyio.CapacityLimiter(CALLBACK_THREADS)
                res = await _in_daemon_thread(cb, request, self._callback_threads)
            if inspect.isawaitable(res):
                res = await res
            if res is None:
                return
            if not isinstance(res, (Approve, Reject)):
                log.error(
                    "approval callback %r returned %s; expected Approve, Reject or None",
                    cb,
                    type(res).__name__,
                )
                return
            await self.decide(request.id, res, via="callback", fingerprint=request.fingerprint)
        except ApprovalError as exc:
            log.warning("approval callback %r: decision not recorded: %s", cb, exc)
        except Exception:
            log.exception("approval callback %r failed on request %s", cb, request.id)

    async def _run_elicitation(
        self, elicit: Elicitor, request: ApprovalRequest, signal: _Signal, *, late: bool = False
    ) -> None:
        """Ask the MCP client's user; ``late``: the request is past its LAZY timeout, and
        only an answer the (retried) call carries decides it: without one the call goes on."""
        principal = getattr(elicit, "principal", None)  # a [server.clients] name: authenticated
        if principal:
            by = f"client:{principal}"
        else:  # the name the client gives itself, or none
            by = f"mcp-client:{elicit.client}" if elicit.client else "mcp-client"
        note = ""
        for _ in range(3):
            try:
                answer = await elicit.ask(
                    f"{ELICIT_KEY}/{request.id}",
                    note + elicitation_message(request, cli=self._cli()),
                    ELICIT_SCHEMA,
                    state=STATE_PREFIX + request.id,
                )
            except Exception as exc:
                log.warning("approval: asking the MCP client's user failed: %s", exc)
                return
            if answer is None:
                if not (late and not note):  # asked again after a refused edit: wait for it
                    signal.raise_input_required()
                return
            try:
                decision = parse_elicitation(answer, by=by)
                if decision is None:
                    return  # cancelled: the other channels and the timeout decide
                await self._decide(
                    request.id,
                    decision,
                    via="mcp_elicitation",
                    fingerprint=request.fingerprint,
                    client=None,
                    late=late,
                )
                return
            except InvalidEditError as exc:
                note = f"Your edited arguments were refused: {exc}. Decide again.\n\n"
            except ApprovalError as exc:
                log.info("approval: MCP elicitation answer not recorded: %s", exc)
                return
            except Exception:
                log.exception("approval: MCP elicitation answer for %s failed", request.id)
                return

    async def _run_terminal(self, term: TerminalPrompt, request: ApprovalRequest) -> None:
        note: str | None = None
        for _ in range(5):
            try:
                decision = await term.ask(request, note, cli=self._cli())
                if decision is None:
                    return
                done = await self.decide(
                    request.id, decision, via="terminal", fingerprint=request.fingerprint
                )
                term.say(f"toolwire: request {request.id} {done.status}")
                return
            except InvalidEditError as exc:
                note = f"{exc}; decide again"
            except ApprovalError as exc:
                term.say(f"toolwire: {exc}")
                return
            except Exception:
                log.exception("approval: terminal prompt failed on request %s", request.id)
                return

    # ---------------------------------------------------------- helpers
    def _state(self) -> StateStore:
        if self._kernel is not None:
            return self._kernel.state
        if self._store is not None:
            return self._store
        raise ApprovalError(
            "the approval plugin has no state store yet: start its kernel first "
            "(or pass store= when using it without one)"
        )

    def _now(self) -> float:
        if self._kernel is not None:
            return self._kernel.clock.time()
        return self._time()

    def _req_key(self, rid: str) -> str:
        return f"{self._prefix}:req:{rid}"

    def _index_key(self, call: ToolCall, fp: str) -> str:
        bind = _fingerprint(
            "\x00call", {"t": call.tenant, "n": call.name, "c": call.call_id, "f": fp}
        )
        return f"{self._prefix}:call:{bind[:40]}"

    def _timeout(self, policy: Policy) -> float:
        cfg = self.config
        return cfg.required_timeout_s if policy is Policy.REQUIRED else cfg.lazy_timeout_s

    def _ttl(self, rec: dict[str, Any], now: float) -> float:
        # the two durations are each <= MAX_TTL_S, their sum need not be
        return min(max(float(rec["expires_at"]) - now, 0.0) + self.config.retention_s, MAX_TTL_S)

    def _new_record(
        self,
        call: ToolCall,
        tool: Tool,
        res: Resolution,
        fp: str,
        args_json: dict[str, Any],
    ) -> dict[str, Any]:
        now = self._now()
        timeout = self._timeout(res.policy)
        via = call.metadata.get("via")
        return {
            "v": 1,
            "id": secrets.token_hex(8),
            "tool": call.name,
            "call_id": call.call_id,
            "session_id": call.session_id,
            "tenant": call.tenant,
            "args": args_json,
            "fingerprint": fp,
            "policy": str(res.policy),
            "rule": res.rule,
            "status": PENDING,
            "created_at": now,
            "expires_at": now + timeout,
            "timeout_s": timeout,
            "tool_info": {
                "description": tool.description,
                "input_schema": tool.input_schema,
                "annotations": tool.annotations.to_dict(),
                "tags": sorted(tool.tags),
                "source": tool.source,
            },
            "via": via if isinstance(via, str) else None,
            "decision": None,
            "used_at": None,
        }

    def _validate_edit(self, rec: dict[str, Any], args: Any) -> dict[str, Any]:
        """Edited args checked against the tool's schema (its validator when this process
        has the tool, else the input schema stored with the request)."""
        name = rec["tool"]
        if not isinstance(args, dict):
            raise InvalidEditError(
                f"edited arguments for tool {name!r} must be a JSON object, not "
                f"{type(args).__name__}; the request stays pending",
                request_id=rec["id"],
            )
        tool = self._kernel.get_tool(name) if self._kernel is not None else None
        try:
            if tool is not None:
                valid = _validate(tool, args)
            else:
                schema = (rec.get("tool_info") or {}).get("input_schema") or {}
                valid = validate_json_schema(args, schema)
        except (pydantic.ValidationError, ArgsError) as exc:
            text, problems = describe_validation_error(exc)
            raise InvalidEditError(
                f"edited arguments for tool {name!r} are invalid: {text}; the request stays "
                "pending (approve with valid arguments, or without edits)",
                request_id=rec["id"],
                problems=problems,
            ) from None
        try:
            return jsonable_args(valid)
        except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
            # Before: NaN/Infinity (which json.loads and the HTTP API take) failed in the
            # store (HTTP 503, "the state store failed"), too deep a nesting with a 500.
            raise InvalidEditError(
                f"edited arguments for tool {name!r} cannot be recorded: {exc}; the request "
                "stays pending (approve with other arguments, or without edits)",
                request_id=rec["id"],
                problems=[{"field": "", "message": str(exc)}],
            ) from None

    async def _validate_for_run(self, store: StateStore, tool: Tool, entry: Entry) -> Any:
        """The edited args of an approval, validated by the tool's own validator.

        Invalid here (the approver's process checked them against the JSON Schema only):
        the approval is spent, so a retry of the call asks again instead of failing on
        the same edit until the request's retention ends (nobody could undo it).
        """
        rec = entry.value
        d = rec.get("decision") or {}
        try:
            return _validate(tool, d["args"])
        except (pydantic.ValidationError, ArgsError) as exc:
            text, problems = describe_validation_error(exc)
        await self._use(store, entry)
        await self._audit(
            store, "refused", rec, by=d.get("by"), via=d.get("via"),
            reason="invalid_edit", problems=problems,
        )  # fmt: skip
        raise CallRejected(
            ErrorKind.INVALID_ARGS,
            f"plugin 'approval': the arguments edited by {d.get('by')!r} for tool "
            f"{tool.name!r} are invalid here: {text}; the tool was not run. The approval is "
            "spent: calling again asks again",
            details={"problems": problems, "request_id": rec["id"]},
        )

    async def _audit(
        self,
        store: StateStore,
        event: str,
        rec: dict[str, Any],
        *,
        by: str | None = None,
        via: str | None = None,
        **extra: Any,
    ) -> None:
        now = self._now()
        # Sorts by time, then by write order in this process (a fake clock may stand
        # still), then by a random tie-break between processes.
        seq = f"{int(now * 1_000_000):017d}-{next(self._seq):09d}-{secrets.token_hex(3)}"
        item: dict[str, Any] = {
            "at": now,
            "seq": seq,
            "event": event,
            "request_id": rec["id"],
            "tool": rec["tool"],
            "call_id": rec.get("call_id"),
            "session_id": rec.get("session_id"),
            "tenant": rec.get("tenant"),
            "fingerprint": rec["fingerprint"],
            "policy": rec["policy"],
            "rule": rec["rule"],
            "by": by,
            "via": via,
        }
        item.update({k: v for k, v in extra.items() if v is not None})
        key = f"{self._prefix}:audit:{rec['id']}:{seq}"
        await store.set(key, item, ttl=self.config.retention_s)
        if audit_log.isEnabledFor(logging.INFO):
            shown = {k: v for k, v in item.items() if k not in ("args", "seq")}
            if "problems" in shown:
                # The fields only: a problem's message quotes the value it got (the line
                # is "without arguments"; the stored entry keeps the messages).
                shown["problems"] = [
                    {k: v for k, v in pr.items() if k in ("field", "type")}
                    for pr in shown["problems"]
                    if isinstance(pr, dict)
                ]
            audit_log.info("approval %s: %s", event, json.dumps(shown, default=str))

    def _has_local_channel(self, ctx: CallContext, elicit: Elicitor | None) -> bool:
        """Whether someone is asked in this process (a callback, the MCP client, a prompt)."""
        if self._callbacks or elicit is not None:
            return True
        term = terminal_prompt(ctx.extensions.get(TERMINAL_EXTENSION))
        return self.config.terminal and term is not None

    def _announce_log(self, req: ApprovalRequest, created: bool, asked_here: bool) -> None:
        # A warning when nobody in this process is asked: the call may sit there for
        # required_timeout_s, and the log line is how an operator learns what to do.
        log.log(
            logging.INFO if asked_here else logging.WARNING,
            "tool %r %s approval (%s, rule %s): request %s; approve with `%s approve %s`, "
            "%sor a channel (see the approval plugin's README)",
            req.tool,
            "waits for" if created else "still waits for",
            req.policy,
            req.rule,
            req.id,
            self._cli(),
            req.id,
            f"POST {self.config.http_prefix}/{req.id}/approve on the gateway, "
            if self.config.http_token is not None
            else "",
        )

    def _cli(self) -> str:
        """``toolwire approvals``, with ``--config`` when the kernel was loaded from a file:
        a hint run elsewhere must open the same store."""
        if self._kernel is None:
            return "toolwire approvals"
        if self._cli_command is None:
            cfg = self._kernel.config
            path = cfg.path if cfg is not None else None
            self._cli_command = (
                f"toolwire --config {shlex.quote(os.path.abspath(path))} approvals"
                if path
                else "toolwire approvals"
            )
        return self._cli_command

    def _how_to_decide(self, rid: str) -> dict[str, str]:
        p = self.config.http_prefix
        cli = self._cli()
        how = {"cli": f"{cli} approve {rid} | {cli} reject {rid}"}
        if self.config.http_token is not None:  # without it the HTTP API answers 403
            how["http"] = f"POST {p}/{rid}/approve | POST {p}/{rid}/reject"
        return how

    async def _emit_decided(self, kernel: Kernel, call: ToolCall, rec: dict[str, Any]) -> None:
        if kernel.events.active:
            req = ApprovalRequest.from_record(rec, kernel.clock.time())
            await kernel.events.emit("approval_decided", call, request=req.to_dict())

    def _denied_message(self, rec: dict[str, Any]) -> str:
        d = rec.get("decision") or {}
        rid, name = rec["id"], rec["tool"]
        if d.get("via") == "timeout":
            rule = Resolution(Policy(rec["policy"]), rec["rule"]).describe()
            return (
                f"plugin 'approval': tool {name!r} requires approval ({rule}) and "
                f"nobody approved request {rid} within {rec['timeout_s']:g}s, so it was rejected "
                f"(reason 'timeout'); the tool was not run. Approve the next call with "
                f"`{self._cli()} approve <id>`"
                + (
                    f" or POST {self.config.http_prefix}/<id>/approve"
                    if self.config.http_token is not None
                    else ""
                )
                + f" while it waits, or set plugins.approval.tools.{_quoted(name)} = 'NONE'"
            )
        return (
            f"plugin 'approval': tool {name!r} was rejected by {d.get('by')!r} via "
            f"{d.get('via')} (request {rid}): {d.get('reason')}; the tool was not run"
        )


# --------------------------------------------------------------- helpers
def _fingerprint(tool: str, args: dict[str, Any]) -> str:
    return fingerprint(tool, args)


def _validate(tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
    """The kernel's argument validation (the tool's validator, else its JSON Schema)."""
    if tool.validator is not None:
        return tool.validator(args)
    return validate_json_schema(args, tool.input_schema)


def _reusable(rec: dict[str, Any], call: ToolCall, fp: str) -> bool:
    """Whether a stored request stands for this call (same tenant, tool and args)."""
    if (
        rec.get("tool") != call.name
        or rec.get("fingerprint") != fp
        or rec.get("tenant") != call.tenant
    ):
        return False
    status = rec.get("status")
    if status == PENDING:
        return True
    if status == APPROVED:
        return rec.get("used_at") is None  # an approval runs the call once
    return (rec.get("decision") or {}).get("via") != "timeout"  # a person's "no" stands


def _meta(rec: dict[str, Any], how: str, waited_ms: float) -> dict[str, Any]:
    """``result.meta.approval``: how the call was (or was not) approved."""
    d = rec.get("decision") or {}
    out: dict[str, Any] = {
        "status": rec["status"],
        "how": how,
        "policy": rec["policy"],
        "rule": rec["rule"],
        "request_id": rec["id"],
        "fingerprint": rec["fingerprint"],
        "by": d.get("by"),
        "via": d.get("via"),
        "decided_at": d.get("at"),
        "waited_ms": waited_ms,
        "edited": bool(d.get("edited")),
    }
    for k in ("reason", "comment", "args_fingerprint"):
        if d.get(k):
            out[k] = d[k]
    return out


def _denial(rec: dict[str, Any]) -> dict[str, Any]:
    d = rec.get("decision") or {}
    return {
        "reason": d.get("reason"),
        "request_id": rec["id"],
        "rule": rec["rule"],
        "policy": rec["policy"],
        "by": d.get("by"),
        "via": d.get("via"),
    }


async def _wait_change(
    store: StateStore,
    clock: Clock,
    key: str,
    version: int,
    seconds: float,
    wake: anyio.Event,
) -> Entry | None:
    """Until the record changes, ``seconds`` pass on the kernel's clock, or ``wake`` is set."""
    async with anyio.create_task_group() as tg:

        async def on_store() -> None:
            await store.wait_for_change(key, version=version, timeout=seconds)
            tg.cancel_scope.cancel()

        async def on_wake() -> None:
            await wake.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(on_store)
        tg.start_soon(on_wake)
        if not isinstance(clock, SystemClock):  # a test clock: time moves by its own rules

            async def on_clock() -> None:
                await clock.sleep(seconds)
                tg.cancel_scope.cancel()

            tg.start_soon(on_clock)
    return await store.get_entry(key)


async def _in_daemon_thread(
    fn: Callable[[ApprovalRequest], Any], request: ApprovalRequest, limiter: anyio.CapacityLimiter
) -> Any:
    """``fn(request)`` in a daemon thread of its own; cancelled, the thread is abandoned.

    Not anyio's worker threads: those are not daemon threads, so one abandoned in
    ``input()`` or a dialog kept the process from exiting (after ``anyio.run`` had
    returned) until somebody answered. The thread holds a ``limiter`` slot until it
    ends, so at most ``CALLBACK_THREADS`` run at once, abandoned ones included.
    """
    borrower = object()
    await limiter.acquire_on_behalf_of(borrower)
    try:
        token = anyio.lowlevel.current_token()
        done = anyio.Event()
        outcome: list[tuple[bool, Any]] = []
        context = contextvars.copy_context()

        def finish() -> None:
            limiter.release_on_behalf_of(borrower)
            done.set()

        def work() -> None:
            try:
                outcome.append((True, context.run(fn, request)))
            except BaseException as exc:  # handed to the awaiting task
                outcome.append((False, exc))
            try:
                anyio.from_thread.run_sync(finish, token=token)
            except Exception:  # the event loop has ended: nobody is waiting
                pass

        threading.Thread(target=work, name="toolwire-approval-callback", daemon=True).start()
    except BaseException:
        limiter.release_on_behalf_of(borrower)
        raise
    await done.wait()
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def _is_async(fn: Any) -> bool:
    """``fn`` (a function, a partial, or an object with ``__call__``) is ``async def``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def _possible_id(request_id: object) -> bool:
    """Whether ``request_id`` can name a stored request: a str that is valid Unicode text.

    (A command-line argument with bytes undecodable in the locale, ``'\udcff'``, made the
    state store raise a bare ValueError: a traceback instead of "no approval request".)
    """
    if not isinstance(request_id, str):
        return False
    try:
        request_id.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short_fp(fingerprint: str) -> str:
    """A fingerprint as messages show it: its first 16 characters, "..." if it had more."""
    return fingerprint if len(fingerprint) <= 16 else fingerprint[:16] + "..."
