"""The idempotency plugin: a replayed tool call returns the stored result, never runs twice.

Record lifecycle at ``{prefix}:idempotency:{sha256(tenant, tool, call_id)}``::

    absent --claim (set_if_absent_or_get, owner=o, lease)--> pending(o)
    pending(o) --renew (CAS on o)--> pending(o) with a later lease
    pending(o) --renew while the call waits in before_call, or between attempts after
        refusals only (CAS on o)--> pending(o) with "w": nothing applied, a replay after a
        crash may take it over; taken off (CAS on o) before the next attempt starts
    pending(o) --complete (CAS on o, owner cleared)--> done | oversized
    pending(o) --release (compare-and-delete on o)--> absent
    pending(o), lease lapsed --reclaim (CAS on o + version, read-only tools)--> pending(o')
    pending(o) --interrupted (CAS on o; unknown_after_interrupt)--> pending(no owner),
        lease lapsed, "i" saying why: replays answer "outcome unknown" as for a dead owner

Each record carries the request hash (sha256 over tenant, tool, call_id and
the canonical args): a call whose hash differs from the record's is a
payload mismatch (``conflict``) and never runs.

Store round trips: a replay costs one (``set_if_absent_or_get``), a first call
two (that claim, then the completing compare-and-set). Lease renewals only
happen for calls running longer than ``lease_secs / 4``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import secrets
import shlex
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from toolwire import (
    IMAGE_FILE_EXTRA,
    CallContext,
    CallRejected,
    ErrorInfo,
    ErrorKind,
    ResultMeta,
    ToolCall,
    ToolResult,
    hookimpl,
)
from toolwire.state import (
    MAX_TTL_S,
    Entry,
    StateDataError,
    StateNotAppliedError,
    StateStore,
    StateStoreError,
)

from ._canonical import UnencodableArgumentError, hashes, record_hash
from ._config import IdempotencyConfig, apply_env

if TYPE_CHECKING:
    from toolwire import BackgroundTask, Kernel, Tool

__all__ = ["IdempotencyCounters", "IdempotencyPlugin"]

log = logging.getLogger("toolwire.idempotency")

STATE_KEY = "idempotency"  # ctx.state[STATE_KEY]: the claim this call holds
#: ctx.state[UNPROTECTED_KEY]: why a call runs without a claim (on_store_error = "fail_open")
UNPROTECTED_KEY = "idempotency.unprotected"
PENDING, DONE, OVERSIZED = "pending", "done", "oversized"
#: The kernel's ``details["reason"]`` for an attempt it did not start: the call's deadline
#: had passed (the tool never ran, so such a ``timeout`` leaves no outcome unknown).
_DEADLINE_BEFORE_START = "deadline_before_attempt"
#: The keys a tool's own ``idempotency`` setting may hold, when it is a table.
_TOOL_SETTING_KEYS = frozenset({"unknown_after_interrupt"})


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _record_problem(value: Any) -> str | None:
    """What makes ``value`` no idempotency record this plugin wrote, or None.

    Checks the fields the replay and wait paths read, so a damaged record is a
    ``corrupt_record`` naming the key, not a bare ``KeyError`` or ``ValueError``.
    """
    if type(value) is not dict:
        return f"a {type(value).__name__}, not an object"
    if not isinstance(value.get("req"), str) or not isinstance(value.get("s"), str):
        return "no 'req' and 's' strings"
    state = value["s"]
    if state == PENDING and not _is_number(value.get("lease")):
        return "a pending record without a numeric 'lease'"
    if state == DONE:
        if type(value.get("c")) is not dict:
            return "a result whose content 'c' is not an object"
        if value.get("e") is not None and type(value["e"]) is not dict:
            return "an error 'e' that is not an object"
        for field in ("d", "end", "at"):
            if value.get(field) is not None and not _is_number(value[field]):
                return f"a non-numeric {field!r}"
    return None


_JSON_SEPARATORS = (",", ":")


def _not_kept(
    result: ToolResult, reason: str, message: str, *, recorded: bool | None = False
) -> None:
    """Tell the caller its result was not kept for replays (it still gets it now);
    ``recorded=None``: whether it was cannot be told."""
    result.meta.extra[STATE_KEY] = {"recorded": recorded, "reason": reason, "message": message}


def _limit(record: Mapping[str, Any]) -> str:
    """Why an oversized marker ``record`` replaced the result, for a message."""
    if "budget" in record:
        return f"max_stored_bytes ({record['budget']}) is spent"
    if record["size"] >= 0:
        return f"over max_result_bytes ({record['limit']})"
    return "not JSON"


#: What ``_read_back`` found, besides the applied entry.
_RELEASED, _PENDING, _THEIRS, _UNKNOWN = object(), object(), object(), object()


def _setting_problem(setting: Any) -> str | None:
    """What is wrong with a tool's own ``idempotency`` setting (not None/True/False), or None."""
    if not isinstance(setting, Mapping):
        return (
            f"is {type(setting).__name__} {setting!r:.80}; give False (exempt the tool), True, "
            'or a table such as {"unknown_after_interrupt": true}'
        )
    unknown = sorted(str(k) for k in setting if k not in _TOOL_SETTING_KEYS)
    if unknown:
        return f"has unknown key(s) {', '.join(map(repr, unknown))}; the only key is " + (
            "'unknown_after_interrupt'"
        )
    value = setting.get("unknown_after_interrupt")
    if value is not None and not isinstance(value, bool):
        return f"has unknown_after_interrupt = {value!r:.80}; give true or false"
    return None


def _not_started(error: Any) -> bool:
    """Whether ``error`` (an ``ErrorInfo``) is a timeout of an attempt that did nothing: the
    kernel's, for an attempt it never started, or one saying its request was never sent
    (``details.in_flight`` false: still waiting for a connection)."""
    details = getattr(error, "details", None)
    return isinstance(details, Mapping) and (
        details.get("reason") == _DEADLINE_BEFORE_START or details.get("in_flight") is False
    )


#: Error kinds that say the upstream refused the request: nothing of it was applied.
_REFUSALS = frozenset({ErrorKind.RATE_LIMIT, ErrorKind.QUOTA})


def _nothing_applied(error: ErrorInfo) -> bool:
    """Whether a failed attempt's ``error`` (as classified) says it applied nothing.

    Yes: a refusal (``rate_limit``, ``quota``: a 429, an exhausted quota, the tool's
    ``ToolError(kind="rate_limit")``) that no 5xx status nor ``details.in_flight = true``
    contradicts, an error whose ``details.in_flight`` is false (the request was never
    sent), and the kernel's timeout for an attempt it never started. Anything else (a
    timeout, a 5xx, a lost connection, an unclassified error) may have done its work.
    """
    details = error.details
    if not isinstance(details, Mapping):
        return False
    in_flight = details.get("in_flight")
    if in_flight is True:
        return False
    if in_flight is False or details.get("reason") == _DEADLINE_BEFORE_START:
        return True
    if str(error.kind) not in _REFUSALS:
        return False
    status = details.get("status")
    return not (isinstance(status, int) and not isinstance(status, bool) and status >= 500)


def _when(t: Any) -> str:
    """Kernel clock seconds as an ISO 8601 UTC time, for a message."""
    try:
        return datetime.fromtimestamp(float(t), UTC).isoformat(timespec="milliseconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"{t!r} s"


@dataclass(slots=True)
class IdempotencyCounters:
    """What the plugin did, since it was created (plain ints; read them, reset them)."""

    hits: int = 0  #: replays answered from a stored result (waited ones included)
    misses: int = 0  #: first executions: claims won (reclaims included)
    waits: int = 0  #: duplicates that waited for an in-flight original
    conflicts: int = 0  #: every `conflict` answer (the four below)
    in_flight: int = 0  #: ... the original still ran past the wait (or on_in_flight="error")
    mismatches: int = 0  #: ... same call_id, different args
    outcome_unknown: int = 0  #: ... a side-effecting original died before recording
    result_unavailable: int = 0  #: ... the original's result was too large to keep
    reclaims: int = 0  #: read-only calls re-run after their original's owner died
    released: int = 0  #: claims given back (failures, cancellation): a replay re-runs
    errors_cached: int = 0  #: terminal errors kept for replays (cache_errors = true)
    oversized: int = 0  #: results too large to keep (a marker was stored instead)
    over_budget: int = 0  #: results not kept because max_stored_bytes was spent (marker kept)
    store_errors: int = 0  #: state store failures seen (claim, completion, renewal)
    fail_open: int = 0  #: calls run unprotected because the store failed (fail_open)
    no_call_id: int = 0  #: calls without call_id (not de-duplicated)
    exempt: int = 0  #: calls of exempt tools (no store access)
    unencodable: int = 0  #: calls refused because an argument has no canonical encoding
    lost_claims: int = 0  #: claims found gone or taken over (renewal, start, completion): once each
    renewals: int = 0  #: lease renewals of long-running calls
    #: claims kept as "outcome unknown" after a timeout or a cancellation stopped a running
    #: attempt (unknown_after_interrupt): replays answer `conflict` instead of running again
    interrupted: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a dict."""
        return asdict(self)

    def reset(self) -> None:
        """Set every counter back to zero."""
        for f in fields(self):
            setattr(self, f.name, 0)


@dataclass(slots=True, eq=False)
class _Claim:
    """A claim this process holds for one running call (in ``ctx.state``)."""

    key: str
    owner: str
    pending: dict[str, Any]  # the pending record (renewals copy it with a new lease)
    renewed_at: float  # kernel clock time of the claim or its last renewal
    store: StateStore
    clock: Callable[[], float]
    ctx: CallContext | None = None
    finished: bool = False
    #: The record says the tool has not started (``"w"``): the call waits in a later
    #: plugin's ``before_call`` (approval); ``lock`` orders that write and its undoing.
    parked: bool = False
    started: bool = False
    lock: anyio.Lock | None = None
    #: The attempt after whose failure the call waits (a retry's backoff) with its record
    #: marked "nothing applied" (``"w"``; every attempt so far was refused): ``idle`` until
    #: the step in ``ctx.before_next_attempt`` takes the mark off. 0: never marked so.
    idle_after: int = 0
    idle: bool = False
    #: A write saying ``"w"`` was sent (it may have been applied, even when its answer was
    #: lost): the mark must be taken off before the tool runs.
    marked: bool = False
    #: Each failed attempt's error (by attempt number), the very object the classifying
    #: plugins refine after this plugin's on_error: read when deciding whether to mark.
    failures: dict[int, ErrorInfo] | None = None
    #: Found gone or taken over (counted in ``lost_claims`` and logged then, once).
    lost: bool = False
    #: Attempt numbers (1-based) that ended with the kernel's timeout for an attempt it never
    #: started (the call's deadline had passed): such a timeout leaves no outcome unknown.
    not_started: set[int] | None = None
    #: Kernel clock time at which each attempt that ended with a ``timeout`` failed.
    timed_out_at: dict[int, float] | None = None
    #: Kernel clock time at which each attempt lost its connection after the request
    #: went out (an error with ``details.in_flight = true``: an upstream that crashed
    #: mid-call): its outcome is unknown too.
    lost_at: dict[int, float] | None = None


class _Renewer:
    """The one background task (``kernel.spawn``) renewing this plugin's claims, on one loop."""

    __slots__ = ("idle", "loop", "task", "wake")

    def __init__(self, loop: object) -> None:
        self.loop = loop
        self.wake = anyio.Event()
        self.idle = False
        self.task: BackgroundTask | None = None

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done


# Bumped in every forked child, so owner ids are never shared with the parent
# (cheaper than calling os.getpid() on every claim).
_fork_generation = 0


def _after_fork() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _current_loop() -> object:
    """The running asyncio loop, or the trio token (identifies the event loop)."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop
    import trio

    return trio.lowlevel.current_trio_token()


class IdempotencyPlugin:
    """De-duplicates tool calls by ``call_id``: a replay returns the stored result.

    Register it (``Kernel(plugins=[IdempotencyPlugin()])``) or enable it in
    ``toolwire.toml`` (``[plugins.idempotency]``, see :class:`IdempotencyConfig`).
    ``counters`` tells what it did. ``env`` (default ``os.environ``) supplies
    ``TOOL_IDEMPOTENCY_ENABLED`` / ``TOOL_IDEMPOTENCY_TTL_SECS``.
    """

    name = "idempotency"
    order = 200  # after profiling (100), before approval (300): replays skip approval
    Config = IdempotencyConfig

    def __init__(
        self, config: IdempotencyConfig | None = None, *, env: Mapping[str, str] | None = None
    ) -> None:
        cfg = apply_env(config or IdempotencyConfig(), os.environ if env is None else env)
        self.config = cfg
        self.counters = IdempotencyCounters()
        self._exempt = frozenset(cfg.exempt_tools)
        self._read_only = frozenset(cfg.read_only_tools)
        self._unknown_after_interrupt = frozenset(cfg.unknown_after_interrupt_tools)
        self._key_prefix = f"{cfg.prefix}:idempotency:"
        self._renew_every = cfg.lease_secs / 4
        # A claim must outlive its lease (a dead owner's claim is what makes a
        # replay answer "outcome unknown"), even when ttl_secs is shorter.
        # (<= MAX_TTL_S, what a store accepts: lease_secs may be up to that bound itself)
        self._pending_ttl = min(max(cfg.ttl_secs, 2 * cfg.lease_secs), MAX_TTL_S)
        self._pid = -1  # the _fork_generation of _owner_base
        self._owner_base = ""
        self._seq = itertools.count(1)
        self._active: dict[str, _Claim] = {}
        self._renewer: _Renewer | None = None
        self._kernel: Kernel | None = None

    def __repr__(self) -> str:
        return f"IdempotencyPlugin(enabled={self.config.enabled}, prefix={self.config.prefix!r})"

    # ------------------------------------------------------------ public helpers
    def key_for(self, tool: str, call_id: str, *, tenant: str | None = None) -> str:
        """The state key of the record for (tenant, tool, call_id)."""
        return self._key_prefix + record_hash(tenant, tool, call_id)

    async def forget(
        self,
        tool: str,
        call_id: str,
        *,
        tenant: str | None = None,
        store: StateStore | None = None,
    ) -> bool:
        """Delete the record of one call (after settling an "outcome unknown" by hand).

        The next call with that call_id runs again. True when a record was there.
        ``store`` defaults to the state store of the kernel the plugin started with.
        """
        if store is None:
            if self._kernel is None:
                raise RuntimeError("forget() before startup: pass store=kernel.state")
            store = self._kernel.state
        return await store.delete(self.key_for(tool, call_id, tenant=tenant))

    def is_read_only(self, tool: Tool) -> bool:
        """Whether ``tool`` counts as read-only (``readOnlyHint`` or ``read_only_tools``)."""
        return tool.annotations.readOnlyHint is True or tool.name in self._read_only

    def unknown_after_interrupt(self, tool: Tool) -> bool:
        """Whether a timeout or cancellation of a running attempt of ``tool`` keeps its record.

        Listed in ``unknown_after_interrupt_tools``: on. Else the tool's own setting
        ``idempotency={"unknown_after_interrupt": ...}``, else the global
        ``unknown_after_interrupt``. A read-only tool is never kept so (it runs again,
        as after a dead owner), whatever this says.
        """
        if tool.name in self._unknown_after_interrupt:
            return True
        setting = tool.settings.get("idempotency")
        if isinstance(setting, Mapping):
            own = setting.get("unknown_after_interrupt")
            if isinstance(own, bool):
                return own
        return self.config.unknown_after_interrupt

    # -------------------------------------------------------------- lifecycle
    @hookimpl
    def startup(self, kernel: Kernel) -> None:
        self._kernel = kernel
        if self.config.enabled:
            self._ensure_renewer(kernel)
            if getattr(kernel.state, "backend", None) == "memory":
                log.warning(
                    "idempotency keeps its records in memory: a replay after a restart (a "
                    "crash and checkpoint resume) runs the tool again; set state = "
                    '"sqlite:///path/state.db" (one host) or "redis://..." (shared)'
                )

    @hookimpl
    async def shutdown(self) -> None:
        await self._stop_renewer()

    # ------------------------------------------------------------------ hooks
    @hookimpl
    async def before_call(self, call: ToolCall, ctx: CallContext) -> ToolResult | None:
        cfg = self.config
        if not cfg.enabled:
            return None
        name = call.name
        tool = ctx.tool
        setting = tool.settings.get("idempotency") if tool is not None else None
        if name in self._exempt or setting is False:
            self.counters.exempt += 1
            return None
        if setting is not None and setting is not True:
            problem = _setting_problem(setting)
            if problem is not None:
                raise CallRejected(
                    ErrorKind.CONFIG_ERROR,
                    f"tool {name!r}: its setting idempotency {problem}; it was not run. Fix "
                    "the tool's definition (@tool(idempotency=...) or Tool(settings=...))",
                    details={"reason": "bad_tool_setting", "setting": "idempotency"},
                )
        read_only = tool is not None and (
            tool.annotations.readOnlyHint is True or name in self._read_only
        )
        if read_only and cfg.exempt_read_only:
            self.counters.exempt += 1
            return None
        call_id = call.call_id
        if call_id is None:
            if cfg.require_call_id:
                raise CallRejected(
                    ErrorKind.INVALID_ARGS,
                    f"tool {name!r} needs a call_id (plugins.idempotency.require_call_id = true); "
                    "pass the tool call's id, the same one on every replay",
                    details={"reason": "call_id_required"},
                )
            self.counters.no_call_id += 1
            log.debug("tool %r called without call_id: not de-duplicated", name)
            return None
        try:
            rec_hash, req = hashes(call.tenant, name, call_id, call.args)
        except UnencodableArgumentError as exc:
            self.counters.unencodable += 1
            raise CallRejected(
                ErrorKind.INVALID_ARGS,
                f"tool {name!r}: argument {exc.path} ({exc.type_name}) has no canonical "
                f"encoding for the idempotency key: {exc.reason}; nothing was run. Pass "
                f"encodable values, or add {name!r} to plugins.idempotency.exempt_tools",
                details={"reason": "unencodable_argument", "path": exc.path, "type": exc.type_name},
            ) from None
        key = self._key_prefix + rec_hash
        kernel = ctx.kernel
        store = kernel.state
        now = kernel.clock.time()
        pending = {
            "s": PENDING,
            "req": req,
            "lease": now + cfg.lease_secs,
            "at": now,
            "ro": read_only,
        }
        owner = self._new_owner()
        try:
            try:  # _claim(), inlined: this is the path of every call
                entry, created = await store.set_if_absent_or_get(
                    key, pending, ttl=self._pending_ttl, owner=owner
                )
            except anyio.get_cancelled_exc_class():
                await self._undo(store, key, owner)
                raise
            if created:
                self._hold(ctx, key, owner, pending, now)
                return None
            value = entry.value
            if (
                type(value) is dict
                and value.get("s") == DONE
                and value.get("req") == req
                and _record_problem(value) is None
            ):
                self.counters.hits += 1  # the replay path, without the general loop below
                return self._replay(call, value, waited=False)
            return await self._existing(call, ctx, key, req, read_only, pending, owner, entry)
        except StateStoreError as exc:
            if not isinstance(exc, (StateDataError, StateNotAppliedError)):
                # A claim whose answer was lost may stand (Redis: "may or may not have been
                # applied"): take it back, else this call's retry, told the tool did not
                # run, would find it and answer "outcome unknown" once its lease lapsed.
                # Not when the store says nothing was written (a refused connection, a
                # rolled-back SQLite transaction): in an outage that is one more failing
                # round per call.
                await self._undo(store, key, owner)
            self._store_failed(call, store, exc)  # raises unless fail_open
            ctx.state[UNPROTECTED_KEY] = str(exc)  # after_call tells the caller
            return None

    @hookimpl
    def on_error(self, error: ErrorInfo, ctx: CallContext) -> None:
        """Note when an attempt of a claimed call ended with ``timeout`` or lost its
        connection mid-call (for ``unknown_after_interrupt``), or that the kernel never
        started it; keep the error (classified later) for marking a backoff."""
        claim = ctx.state.get(STATE_KEY)
        if claim is None:
            return
        if claim.failures is None:
            claim.failures = {}
        claim.failures[ctx.attempt] = error
        if error.kind != ErrorKind.TIMEOUT:
            if error.details.get("in_flight") is True:
                if claim.lost_at is None:
                    claim.lost_at = {}
                claim.lost_at[ctx.attempt] = claim.clock()
            return
        if _not_started(error):
            if claim.not_started is None:
                claim.not_started = set()
            claim.not_started.add(ctx.attempt)
        else:
            if claim.timed_out_at is None:
                claim.timed_out_at = {}
            claim.timed_out_at[ctx.attempt] = claim.clock()

    @hookimpl
    async def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
        claim = ctx.state.get(STATE_KEY)
        if claim is None:
            unprotected = ctx.state.pop(UNPROTECTED_KEY, None)
            if unprotected is not None:  # on_store_error = "fail_open" let it through
                _not_kept(
                    result,
                    "fail_open",
                    f"the state store failed before the call ({unprotected}) and "
                    "on_store_error = 'fail_open': the call was not de-duplicated, and a "
                    "replay runs it again",
                )
            return
        del ctx.state[STATE_KEY]
        claim.finished = True
        self._active.pop(claim.owner, None)
        store = claim.store
        cfg = self.config
        release = False
        if result.is_error:
            err = result.error
            if (
                not cfg.cache_errors
                or err is None
                or err.retryable
                or err.kind == ErrorKind.CANCELLED
                or not ctx.attempts  # the tool never ran: nothing to protect
            ):
                if claim.lost:  # someone else's record now: nothing of ours to give back
                    return
                if (
                    claim.pending.get("ro") is not True
                    and ctx.tool is not None
                    and self.unknown_after_interrupt(ctx.tool)
                ):
                    interrupted = self._interruption(claim, err, ctx)
                    if interrupted is not None:
                        await self._keep_interrupted(call, result, claim, interrupted)
                        return
                release = True
        # Shielded: a cancellation arriving during the write (the caller went away) must
        # not leave the claim pending, which a replay would answer 'outcome unknown' (the
        # result lost). Bounded by the lease: past it the claim is lapsed anyway.
        done: Entry | None = None
        record: dict[str, Any] | None = None
        deadline = anyio.current_time() + cfg.lease_secs
        try:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = deadline
                if release:
                    await store.compare_and_delete(claim.key, expected_owner=claim.owner)
                    self.counters.released += 1
                    return
                record = self._done_record(claim, result)
                if cfg.max_stored_bytes is not None and record["s"] == DONE:
                    record = await self._within_budget(store, claim, record, call.name)
                done = await store.compare_and_set(
                    claim.key, record, expected_owner=claim.owner, owner=None, ttl=cfg.ttl_secs
                )
            if scope.cancelled_caught:
                raise StateStoreError(
                    f"no answer within lease_secs ({cfg.lease_secs:g}s), after which the "
                    "claim is lapsed anyway"
                )
        except StateStoreError as exc:
            self.counters.store_errors += 1
            # The write may have been applied all the same (Redis: the connection broke
            # after it was sent, "may or may not have been applied"): read the key back.
            seen, why = await self._read_back(claim, record, exc, deadline)
            if seen is _RELEASED:
                self.counters.released += 1
                return
            if seen is _THEIRS and release:
                return  # someone else's record now: nothing of ours to give back
            if isinstance(seen, Entry):
                done = seen  # the write was applied: as if its answer had come
            elif seen is _THEIRS:
                pass  # the claim was gone or taken over: the write changed nothing
            else:
                self._write_failed(call, result, claim, exc, why, release, record)
                return
        if done is None:
            _not_kept(
                result,
                "lost_claim",
                "the claim was gone or taken over when the result came; a replay does not "
                "get this result",
            )
            if self._lost(claim):
                log.warning(
                    "idempotency: the claim of tool %r call %r was gone or taken over when "
                    "its result came (the lease lapsed, or the record was forgotten); result "
                    "not stored",
                    call.name,
                    call.call_id,
                )
            else:  # a renewal found it lost while the tool ran, and warned then
                log.info(
                    "idempotency: result of tool %r call %r not stored: its claim was lost "
                    "while the tool ran",
                    call.name,
                    call.call_id,
                )
        else:
            assert record is not None  # a release returned above
            if record["s"] == OVERSIZED:
                _not_kept(
                    result, "oversized", f"a replay gets 'result unavailable': {_limit(record)}"
                )
            elif result.is_error:
                self.counters.errors_cached += 1

    # ------------------------------------------------------------ internals
    async def _read_back(
        self,
        claim: _Claim,
        record: dict[str, Any] | None,
        exc: StateStoreError,
        deadline: float,
    ) -> tuple[object, str]:
        """What a write of ``claim``'s outcome that raised ``exc`` left, read back.

        The written entry when it was applied (``record``: the completing write);
        ``_RELEASED`` when the key is gone after a release (``record`` None);
        ``_PENDING`` when the key still holds this call's pending claim (not applied);
        ``_THEIRS`` when the key is gone or holds another owner's record; ``_UNKNOWN``
        (with why) when that cannot be told: the read failed too, or no time is left
        before ``deadline`` (the lease: the caller is never held past it). Shielded,
        at most 5 s, best effort.
        """
        if isinstance(exc, StateDataError):
            return _UNKNOWN, "the key holds data that is no state entry"
        now = anyio.current_time()
        if now >= deadline:
            return _UNKNOWN, "no time was left within lease_secs to read the key back"
        entry: Entry | None = None
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = min(deadline, now + 5.0)
            try:
                entry = await claim.store.get_entry(claim.key)
            except StateStoreError as again:
                return _UNKNOWN, f"reading the key back failed too: {again}"
        if scope.cancelled_caught:
            return _UNKNOWN, "reading the key back got no answer in time"
        if entry is None:
            return (_RELEASED if record is None else _THEIRS), ""
        value = entry.value
        if entry.owner == claim.owner:
            if type(value) is dict and value.get("s") == PENDING:
                return _PENDING, ""
            return _UNKNOWN, "the key holds this call's claim, but not pending"
        if record is None:
            return _THEIRS, ""
        if (
            entry.owner is None
            and type(value) is dict
            and all(value.get(k) == record[k] for k in ("s", "req", "at", "d", "end"))
        ):
            # This call's record: another execution's would match its timings and its
            # "end" (the clock when it completed) only by a coincidence of clock readings.
            return entry, ""
        return _THEIRS, ""

    def _write_failed(
        self,
        call: ToolCall,
        result: ToolResult,
        claim: _Claim,
        exc: StateStoreError,
        why: str,
        release: bool,
        record: dict[str, Any] | None,
    ) -> None:
        """Tell the caller (and the log) what a replay gets after the outcome's write
        failed: not applied (the key read back is still the claim: ``why`` empty), or
        cannot be told (``why`` says why)."""
        cfg = self.config
        ro = claim.pending.get("ro") is True
        lapsed = (
            "runs it again (a read-only tool's lapsed claim is taken over)"
            if ro
            else "answers 'outcome unknown'"
        )
        if not why:
            log.warning(
                "idempotency: could not record the outcome of tool %r call %r (%s); the caller "
                "gets the result, and a replay after the lease (%gs) %s",
                call.name,
                call.call_id,
                exc,
                cfg.lease_secs,
                "runs it again" if ro else "answers 'outcome unknown'",
            )
            _not_kept(
                result,
                "store_error",
                f"the state store failed ({exc}), and the key read back is still this "
                f"call's claim; a replay after lease_secs {lapsed}",
            )
            return
        if release:
            kept = "a replay runs the call again if it was given back, else, after lease_secs, "
            kept += lapsed
        else:
            gets = (
                "this result"
                if record is not None and record["s"] == DONE
                else "'result unavailable'"
            )
            kept = f"a replay gets {gets} if it was kept, else, after lease_secs, {lapsed}"
        log.warning(
            "idempotency: could not record the outcome of tool %r call %r (%s), and whether "
            "it was cannot be told (%s); the caller gets the result, and %s",
            call.name,
            call.call_id,
            exc,
            why,
            kept,
        )
        _not_kept(
            result,
            "store_error",
            f"the state store failed ({exc}), and whether the "
            f"{'claim was given back' if release else 'outcome was kept'} cannot be told "
            f"({why}); {kept}",
            recorded=None,
        )

    @staticmethod
    def _interruption(
        claim: _Claim, err: ErrorInfo | None, ctx: CallContext
    ) -> dict[str, Any] | None:
        """How a started attempt of the call was interrupted, or None.

        A cancellation that came while an attempt ran (``ctx.attempt`` counts it, no
        ``Attempt`` records it yet), else the latest attempt that ended with ``timeout``
        (the tool may have done its work, or its thread may still run), except the
        kernel's timeout for an attempt it never started, or that lost its connection
        after the request went out (``details.in_flight``).
        """
        if err is not None and err.kind == ErrorKind.CANCELLED and ctx.attempt > len(ctx.attempts):
            return {"why": "cancelled", "at": claim.clock(), "attempt": ctx.attempt}
        attempts = ctx.attempts
        not_started = set(claim.not_started or ())
        if err is not None and attempts and _not_started(err):
            not_started.add(len(attempts))  # the last attempt, in case on_error missed it
        lost = claim.lost_at or {}
        for n in range(len(attempts), 0, -1):
            if n in lost:
                return {"why": "lost", "at": lost[n], "attempt": n}
            if attempts[n - 1].error_kind == ErrorKind.TIMEOUT and n not in not_started:
                at = (claim.timed_out_at or {}).get(n)
                return {"why": "timeout", "at": claim.clock() if at is None else at, "attempt": n}
        return None

    @staticmethod
    def _interrupted_what(interrupted: Mapping[str, Any]) -> str:
        """'timed out while it ran (attempt 2, 2026-...)' for a message."""
        why = interrupted.get("why")
        what = (
            "timed out while it ran"
            if why == "timeout"
            else "lost its connection while it ran"
            if why == "lost"
            else "was cancelled while it ran"
        )
        attempt = interrupted.get("attempt")
        which = f"attempt {attempt}, " if isinstance(attempt, int) else ""
        return f"{what} ({which}at {_when(interrupted.get('at'))})"

    async def _keep_interrupted(
        self, call: ToolCall, result: ToolResult, claim: _Claim, interrupted: dict[str, Any]
    ) -> None:
        """Leave the claim as a dead owner's, saying why: its replays answer "outcome unknown".

        The lease is lapsed at once and the owner cleared (a renewal still on its way
        cannot revive it); a read-only caller could still take it over, as a dead
        owner's (compare-and-set on the version). Shielded, bounded by the lease and,
        for a cancelled call, by the time the kernel gives its after_call hooks.
        """
        cfg = self.config
        deadline = anyio.current_time() + cfg.lease_secs
        bound = f"lease_secs ({cfg.lease_secs:g}s)"
        err = result.error
        if err is not None and err.kind == ErrorKind.CANCELLED:
            outer = anyio.current_effective_deadline()  # the kernel's bound, outside our shield
            if outer < deadline:
                deadline = outer
                bound = "the time the kernel gives the after_call hooks of a cancelled call"
        value = {k: v for k, v in claim.pending.items() if k != "w"}
        value["lease"] = claim.clock()
        value["i"] = interrupted
        what = self._interrupted_what(interrupted)
        kept: Entry | None = None
        try:
            with anyio.CancelScope(shield=True, deadline=deadline) as scope:
                kept = await claim.store.compare_and_set(
                    claim.key, value, expected_owner=claim.owner, owner=None, ttl=cfg.ttl_secs
                )
            if scope.cancelled_caught:
                raise StateStoreError(f"no answer within {bound}")
        except StateStoreError as exc:
            self.counters.store_errors += 1
            log.warning(
                "idempotency: tool %r call %r %s, and its record could not say so (%s); a "
                "replay after the lease (%gs) answers 'outcome unknown' all the same",
                call.name,
                call.call_id,
                what,
                exc,
                cfg.lease_secs,
            )
            _not_kept(
                result,
                "store_error",
                f"the attempt {what}, and the state store failed as the record was to say so "
                f"({exc}); a replay after lease_secs answers 'outcome unknown'",
            )
            return
        if kept is None:
            _not_kept(
                result,
                "lost_claim",
                f"the attempt {what}, and the claim was gone or taken over by then; a replay "
                "is not told that its outcome is unknown",
            )
            if self._lost(claim):
                log.warning(
                    "idempotency: tool %r call %r %s, and its claim was gone or taken over by "
                    "then (its lease lapsed, or the record was forgotten); not marked outcome "
                    "unknown",
                    call.name,
                    call.call_id,
                    what,
                )
            return
        self.counters.interrupted += 1
        _not_kept(
            result,
            "outcome_unknown",
            f"the attempt {what}: a replay with this call_id gets a 'conflict' (outcome "
            "unknown) instead of running the tool again (unknown_after_interrupt); check "
            "whether it took effect",
        )
        log.info(
            "idempotency: tool %r call %r %s; its replays get 'outcome unknown' "
            "(unknown_after_interrupt)",
            call.name,
            call.call_id,
            what,
        )

    def _new_owner(self) -> str:
        """A claim owner id unique across processes, hosts and time."""
        if self._pid != _fork_generation:  # first use, or a forked child
            self._pid = _fork_generation
            self._owner_base = f"{os.getpid()}-{secrets.token_hex(8)}-"
        return self._owner_base + str(next(self._seq))

    async def _claim(
        self, store: StateStore, key: str, pending: dict[str, Any], owner: str
    ) -> tuple[Entry, bool]:
        """Claim ``key`` or read what is there; a cancelled claim is taken back."""
        try:
            return await store.set_if_absent_or_get(
                key, pending, ttl=self._pending_ttl, owner=owner
            )
        except anyio.get_cancelled_exc_class():
            await self._undo(store, key, owner)
            raise

    async def _undo(self, store: StateStore, key: str, owner: str) -> None:
        """Delete a claim we may have made when the call was cancelled mid-request."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            try:
                await store.compare_and_delete(key, expected_owner=owner)
            except StateStoreError:
                pass

    def _hold(
        self, ctx: CallContext, key: str, owner: str, pending: dict[str, Any], now: float
    ) -> None:
        kernel = ctx.kernel
        claim = _Claim(key, owner, pending, now, kernel.state, kernel.clock.time, ctx)
        ctx.state[STATE_KEY] = claim
        self._active[owner] = claim
        self.counters.misses += 1
        r = self._renewer
        if r is None or r.loop is not _current_loop() or not r.alive:
            r = self._ensure_renewer(kernel)
        if r.idle:
            r.idle = False
            r.wake.set()

    async def _existing(
        self,
        call: ToolCall,
        ctx: CallContext,
        key: str,
        req: str,
        read_only: bool,
        pending: dict[str, Any],
        owner: str,
        entry: Entry | None,
    ) -> ToolResult | None:
        """Someone else's record is at ``key``: replay, wait, reclaim or refuse."""
        cfg = self.config
        store = ctx.kernel.state
        clock = ctx.kernel.clock
        deadline: float | None = None
        while True:
            if entry is None:  # released or expired while we waited: our turn
                now = clock.time()
                pending["lease"] = now + cfg.lease_secs
                entry, created = await self._claim(store, key, pending, owner)
                if created:
                    self._hold(ctx, key, owner, pending, now)
                    return None
            value = entry.value
            problem = _record_problem(value)
            if problem is not None:
                raise CallRejected(
                    ErrorKind.INTERNAL,
                    f"state key {key!r} holds something that is not an idempotency record "
                    f"({problem}); tool {call.name!r} was not run. Delete the key or change "
                    "plugins.idempotency.prefix",
                    details={"reason": "corrupt_record", "key": key},
                )
            if value["req"] != req:
                self.counters.conflicts += 1
                self.counters.mismatches += 1
                kept = (
                    "the stored result is kept"
                    if value["s"] in (DONE, OVERSIZED)
                    else "the first call's record is kept (that call has not finished, or "
                    "its outcome is unknown: there is no result to replay yet)"
                )
                raise CallRejected(
                    ErrorKind.CONFLICT,
                    f"call_id {call.call_id!r} was already used for tool {call.name!r} with "
                    f"different arguments; nothing was run and {kept}. A "
                    "replay must repeat the original arguments; a new call needs a new call_id",
                    details={"reason": "payload_mismatch", "call_id": call.call_id},
                )
            state = value["s"]
            if state == DONE:
                self.counters.hits += 1
                return self._replay(call, value, waited=deadline is not None)
            if state == OVERSIZED:
                self.counters.conflicts += 1
                self.counters.result_unavailable += 1
                size = value.get("size")
                if "budget" not in value and isinstance(size, int) and size < 0:
                    # not a size: the content was not JSON, and no setting keeps it
                    what, why, fix = (
                        "its result",
                        "its content was not JSON (a value such as a datetime that a "
                        "plugin's after_call hook put into result.content)",
                        "",
                    )
                    key_ = "max_result_bytes"
                else:
                    why, key_ = (
                        (
                            f"the store's budget, max_stored_bytes ({value['budget']}), was spent",
                            "max_stored_bytes",
                        )
                        if "budget" in value
                        else (
                            f"it was larger than max_result_bytes ({value.get('limit')})",
                            "max_result_bytes",
                        )
                    )
                    what = f"its result ({size} bytes)"
                    fix = f", or raise plugins.idempotency.{key_}"
                raise CallRejected(
                    ErrorKind.CONFLICT,
                    f"tool {call.name!r} call {call.call_id!r} already ran, but {what} was "
                    f"not kept: {why}; it is not run again. Use a new call_id to run it "
                    f"again{fix}",
                    details={
                        "reason": "result_unavailable",
                        "call_id": call.call_id,
                        "size": value.get("size"),
                        key_: value.get("budget", value.get("limit")),
                        "started_at": value.get("at"),
                        **({"not_json": True} if not fix else {}),
                    },
                )
            if state != PENDING:
                raise CallRejected(
                    ErrorKind.INTERNAL,
                    f"idempotency record {key!r} has unknown state {state!r}; tool "
                    f"{call.name!r} was not run (written by a newer toolwire-idempotency?)",
                    details={"reason": "corrupt_record", "key": key},
                )
            now = clock.time()
            lease = float(value["lease"])
            if lease <= now:  # the owner stopped renewing: it died (or lost the store)
                # "w": the owner's call was still waiting in before_call (for an approval,
                # say) at its last renewal, and the tool had not started: safe to run.
                if read_only or value.get("w") is True:
                    pending["lease"] = now + cfg.lease_secs
                    won = await self._reclaim(store, key, pending, owner, entry)
                    if won is not None:
                        self.counters.reclaims += 1
                        self._hold(ctx, key, owner, pending, now)
                        return None
                    entry = await store.get_entry(key)
                    continue
                self.counters.conflicts += 1
                self.counters.outcome_unknown += 1
                raise self._outcome_unknown(call, value, lease)
            if cfg.on_in_flight == "error":
                raise self._in_flight(call, value, waited=0.0)
            if deadline is None:
                self.counters.waits += 1
                wait_for = cfg.wait_secs
                left = ctx.time_left()  # the call's own deadline bounds the wait too
                if left is not None and left < wait_for:
                    wait_for = max(0.0, left)
                    cut_by_deadline = True
                else:
                    cut_by_deadline = False
                started = anyio.current_time()
                deadline = started + wait_for
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                if cut_by_deadline:
                    self.counters.conflicts += 1
                    self.counters.in_flight += 1
                    raise CallRejected(
                        ErrorKind.TIMEOUT,
                        f"tool {call.name!r} call {call.call_id!r} was still running elsewhere "
                        f"when this call's deadline came (after waiting "
                        f"{anyio.current_time() - started:.3g}s); retry later, with more time, "
                        "to get its result (it is never run twice)",
                        retryable=True,
                        details={
                            "reason": "deadline",
                            "call_id": call.call_id,
                            "started_at": value.get("at"),
                        },
                    )
                raise self._in_flight(call, value, waited=cfg.wait_secs)
            # wake on any change of the record, and when its lease would lapse
            timeout = min(remaining, lease - now + 0.01)
            entry = await store.wait_for_change(key, version=entry.version, timeout=timeout)

    async def _reclaim(
        self,
        store: StateStore,
        key: str,
        pending: dict[str, Any],
        owner: str,
        entry: Entry,
    ) -> Entry | None:
        """Take over a lapsed claim: compare-and-set on its owner and version."""
        try:
            return await store.compare_and_set(
                key,
                pending,
                expected_version=entry.version,
                expected_owner=entry.owner,
                ttl=self._pending_ttl,
                owner=owner,
            )
        except anyio.get_cancelled_exc_class():
            await self._undo(store, key, owner)
            raise

    def _outcome_unknown(self, call: ToolCall, value: dict[str, Any], lease: float) -> CallRejected:
        """The answer to a replay of a side-effecting call whose outcome is unknown."""
        details: dict[str, Any] = {
            "reason": "outcome_unknown",
            "call_id": call.call_id,
            "started_at": value.get("at"),
            "lease_expired_at": lease,
        }
        forget = f"`toolwire idempotency forget {shlex.quote(call.name)} " + (
            f"{shlex.quote(str(call.call_id))}"
            + (f" --tenant {shlex.quote(call.tenant)}" if call.tenant is not None else "")
            + "` (or IdempotencyPlugin.forget() in code)"
        )
        interrupted = value.get("i")
        if type(interrupted) is dict and interrupted.get("why") in ("timeout", "cancelled", "lost"):
            details["interrupted"] = interrupted["why"]
            details["interrupted_at"] = interrupted.get("at")
            what = f"its attempt {self._interrupted_what(interrupted)}"
            why = (
                "it may or may not have taken effect (a sync tool's thread even runs on after "
                "a timeout), so with plugins.idempotency.unknown_after_interrupt it is not run "
                "again"
                if interrupted["why"] == "timeout"
                else "it may or may not have taken effect, so with "
                "plugins.idempotency.unknown_after_interrupt it is not run again"
            )
        else:
            what = (
                "whoever ran it stopped renewing its claim before recording a result (its "
                "process died, or the state store failed as it saved the result)"
            )
            why = "it may or may not have taken effect, so it is not run again"
        return CallRejected(
            ErrorKind.CONFLICT,
            f"outcome unknown: tool {call.name!r} call {call.call_id!r} started earlier, but "
            f"{what}; {why}. Check whether it took effect; to run it anyway, use a new "
            f"call_id, or delete the record with {forget}",
            details=details,
        )

    def _in_flight(self, call: ToolCall, value: dict[str, Any], waited: float) -> CallRejected:
        self.counters.conflicts += 1
        self.counters.in_flight += 1
        how = "is still running" if not waited else f"was still running after {waited:g}s"
        return CallRejected(
            ErrorKind.CONFLICT,
            f"tool {call.name!r} call {call.call_id!r} {how} elsewhere; retry later to get "
            "its result (it is never run twice)",
            retryable=True,
            retry_after_s=max(1.0, min(self.config.lease_secs, 5.0)),
            details={"reason": "in_flight", "call_id": call.call_id, "started_at": value.get("at")},
        )

    def _replay(self, call: ToolCall, value: dict[str, Any], waited: bool) -> ToolResult:
        extra: dict[str, Any] = {
            STATE_KEY: {"replayed": True, "waited": waited, "completed_at": value.get("end")}
        }
        if "img" in value:  # the kernel vouched for this image file on the first call
            extra[IMAGE_FILE_EXTRA] = value["img"]
        meta = ResultMeta(
            call_id=call.call_id,
            tool=call.name,
            duration_ms=value.get("d") or 0.0,
            replayed=True,
            served_by=value.get("by"),
            approval=value.get("ap"),
            started_at=value.get("at"),
            extra=extra,
        )
        e = value.get("e")
        if e is None:
            return ToolResult(content=value["c"], meta=meta)
        info = ErrorInfo(
            kind=e.get("kind") or ErrorKind.INTERNAL,
            message=e.get("message") or "",
            retryable=bool(e.get("retryable")),
            retry_after_s=e.get("retry_after_s"),
            source=e.get("source"),
            details=e.get("details") or {},
        )
        return ToolResult(content=value["c"], is_error=True, error=info, meta=meta)

    def _done_record(self, claim: _Claim, result: ToolResult) -> dict[str, Any]:
        meta = result.meta
        base = {
            "req": claim.pending["req"],
            "at": meta.started_at,
            "d": meta.duration_ms,
            "end": claim.clock(),
        }
        limit = self.config.max_result_bytes
        try:
            size = len(json.dumps(result.content, separators=_JSON_SEPARATORS, allow_nan=False))
        except (TypeError, ValueError, RecursionError):
            size = -1  # not JSON: cannot be kept either
        if size < 0 or size > limit:
            self.counters.oversized += 1
            # not JSON: a plugin's after_call put a value there in place (a tool's return
            # value, a replacement and a Recover are normalized): a bug, not a setting
            log.log(
                logging.WARNING if size < 0 else logging.INFO,
                "idempotency: result of tool %r is %s; a replay will get 'result unavailable'",
                meta.tool,
                f"{size} bytes (max_result_bytes = {limit})" if size >= 0 else "not JSON",
            )
            return {"s": OVERSIZED, **base, "size": size, "limit": limit}
        record = {"s": DONE, **base, "c": result.content, "by": meta.served_by}
        if result.is_error and result.error is not None:
            record["e"] = result.error.to_dict()
        if meta.approval is not None:
            record["ap"] = meta.approval
        if IMAGE_FILE_EXTRA in meta.extra:
            record["img"] = meta.extra[IMAGE_FILE_EXTRA]
        return record

    async def _within_budget(
        self, store: StateStore, claim: _Claim, record: dict[str, Any], tool: str
    ) -> dict[str, Any]:
        """``record``, or a marker when it would spend more than ``max_stored_bytes``.

        The bytes kept are counted per window of ``ttl_secs`` (one counter per
        window, expiring after two); records live one ``ttl_secs``, so the
        store holds at most two windows' budgets of results.
        """
        cfg = self.config
        budget = cfg.max_stored_bytes
        assert budget is not None
        size = len(json.dumps(record, separators=_JSON_SEPARATORS, default=str))
        window = int(claim.clock() // cfg.ttl_secs)
        key = f"{cfg.prefix}:idempotency:bytes:{window}"
        spent = await store.incr(key, size, ttl=min(2 * cfg.ttl_secs, MAX_TTL_S))
        if spent <= budget:
            return record
        self.counters.over_budget += 1
        log.warning(
            "idempotency: result of tool %r (%d bytes) not kept: max_stored_bytes (%d) is "
            "spent for this window of ttl_secs; a replay will get 'result unavailable'",
            tool,
            size,
            budget,
        )
        keep = ("req", "at", "d", "end")
        return {"s": OVERSIZED, **{k: record[k] for k in keep}, "size": size, "budget": budget}

    def _store_failed(
        self, call: ToolCall, store: StateStore, exc: StateStoreError
    ) -> ToolResult | None:
        self.counters.store_errors += 1
        if isinstance(exc, StateDataError):  # retrying cannot help: someone must fix the key
            raise CallRejected(
                ErrorKind.INTERNAL,
                f"{exc}; tool {call.name!r} was not run",
                details={"reason": "corrupt_record", "backend": store.backend},
            )
        if self.config.on_store_error == "fail_open":
            self.counters.fail_open += 1
            log.warning(
                "idempotency: state store failed (%s); running tool %r call %r WITHOUT "
                "de-duplication (on_store_error = 'fail_open')",
                exc,
                call.name,
                call.call_id,
            )
            return None
        raise CallRejected(
            ErrorKind.UNAVAILABLE,
            f"the idempotency state store failed ({exc}); tool {call.name!r} was not run, so "
            "it cannot run twice. Retry when the store is back, or set "
            "plugins.idempotency.on_store_error = 'fail_open' to run unprotected",
            retryable=True,
            details={"reason": "store_error", "backend": store.backend},
        )

    # ----------------------------------------------------------- renewals
    def _ensure_renewer(self, kernel: Kernel) -> _Renewer:
        """The renewal task of the running event loop (spawned on ``kernel`` if needed).

        ``kernel.close()`` cancels it (and so does this plugin's ``shutdown``).
        A task left on an event loop that has ended is simply replaced.
        """
        loop = _current_loop()
        r = self._renewer
        if r is not None and r.loop is loop and r.alive:
            return r
        r = self._renewer = _Renewer(loop)
        r.task = kernel.spawn(self._renew_loop, r, name="toolwire-idempotency-renewer")
        return r

    async def _stop_renewer(self) -> None:
        r, self._renewer = self._renewer, None
        if r is not None and r.task is not None and r.loop is _current_loop():
            await r.task.cancel()

    async def _renew_loop(self, r: _Renewer) -> None:
        """Renew the leases of running calls; sleeps while there are none."""
        while True:
            if not self._active:
                r.wake = anyio.Event()
                r.idle = True
                await r.wake.wait()
                continue
            await anyio.sleep(self._renew_every)
            due = [
                c
                for c in list(self._active.values())
                if not c.finished and c.clock() - c.renewed_at >= self._renew_every
            ]
            if due:
                async with anyio.create_task_group() as tg:
                    for claim in due:
                        tg.start_soon(self._renew, claim)

    async def _renew(self, claim: _Claim) -> None:
        ctx = claim.ctx
        if claim.lock is None and ctx is not None and ctx.attempt == 0 and not claim.started:
            # Still in before_call after lease_secs / 4: a later plugin holds the call
            # (approval). Record that the tool has not started, so that a replay after a
            # crash runs it instead of answering "outcome unknown"; the kernel calls
            # _mark_started before the first attempt (registered before the write).
            claim.lock = anyio.Lock()
            claim.parked = True
            hooks = ctx.before_first_attempt
            if hooks is None:
                hooks = ctx.before_first_attempt = []
            hooks.append((self.name, functools.partial(self._mark_started, claim)))
        elif (
            ctx is not None
            and ctx.between_attempts is not None
            and claim.idle_after != ctx.attempt
            and self._applied_nothing(claim, ctx)
        ):
            # Backing off between two attempts, every one of them refused (a rate limit):
            # the record says nothing was applied, so that a replay after a crash runs the
            # call; the kernel calls _resume before the next attempt (registered first,
            # and only while it waits: it clears between_attempts right after the steps).
            if claim.lock is None:
                claim.lock = anyio.Lock()
            claim.idle_after = ctx.attempt
            claim.idle = True
            hooks = ctx.before_next_attempt
            if hooks is None:
                hooks = ctx.before_next_attempt = []
            hooks.append((self.name, functools.partial(self._resume, claim)))
        if claim.lock is not None:
            async with claim.lock:
                await self._renew_locked(claim)
        else:
            await self._renew_locked(claim)

    @staticmethod
    def _applied_nothing(claim: _Claim, ctx: CallContext) -> bool:
        """Whether every attempt of the call so far failed saying it applied nothing (each
        seen by on_error, and classified since), and none runs now."""
        n = len(ctx.attempts)
        failures = claim.failures
        if n == 0 or ctx.attempt != n or failures is None or ctx.between_attempts is None:
            return False
        if not _nothing_applied(ctx.between_attempts):
            return False
        for i in range(1, n + 1):
            error = failures.get(i)
            if error is None or not _nothing_applied(error):
                return False
        return True

    @staticmethod
    def _marking(claim: _Claim) -> bool:
        """Whether the record is to say "w" (nothing applied) at the next renewal."""
        return claim.idle or (claim.parked and not claim.started)

    async def _mark_started(self, claim: _Claim) -> None:
        """Before the first attempt of a parked call: the record stops saying "not started"."""
        claim.started = True
        await self._unmark(claim, "while it waited to run")

    async def _resume(self, claim: _Claim) -> None:
        """Before the next attempt of a call marked while it backed off: the record stops
        saying "nothing applied"."""
        claim.idle = False
        await self._unmark(claim, "while it waited between two attempts")

    async def _unmark(self, claim: _Claim, when: str) -> None:
        """Take the "w" mark off the record (a compare-and-set on the owner) before the
        tool runs; a claim found gone or taken over is a retryable ``lost_claim``."""
        assert claim.lock is not None
        async with claim.lock:
            if not claim.marked:
                return  # never sent, or a renewal took it off since
            now = claim.clock()
            value = {k: v for k, v in claim.pending.items() if k != "w"}
            value["lease"] = now + self.config.lease_secs
            call = claim.ctx.call if claim.ctx is not None else None
            name = call.name if call is not None else "?"
            try:
                done = await claim.store.compare_and_set(
                    claim.key,
                    value,
                    expected_owner=claim.owner,
                    owner=claim.owner,
                    ttl=self._pending_ttl,
                )
            except StateStoreError as exc:
                # The mark may still be there: the next renewal writes without it (a
                # fail_open call runs meanwhile; until then a replay after a crash could
                # run it too). Renewals copy claim.pending, so it must not say "w".
                claim.pending = value
                if call is None:
                    raise
                self._store_failed(call, claim.store, exc)  # raises unless fail_open
                return
            if done is None:
                if self._lost(claim):
                    log.warning(
                        "idempotency: the claim of tool %r call %r was gone or taken over "
                        "when it was about to %s (its lease lapsed and another caller "
                        "took it, or it was forgotten); not run here",
                        name,
                        call.call_id if call else None,
                        "start" if claim.idle_after == 0 else "run again",
                    )
                raise CallRejected(
                    ErrorKind.CONFLICT,
                    f"tool {name!r} call {call.call_id if call else None!r} lost its "
                    f"idempotency claim {when} (its lease lapsed and another "
                    "caller took it, or it was forgotten); it was not run here, so it cannot "
                    "run twice. Replay it to get the other run's result",
                    retryable=True,
                    details={"reason": "lost_claim"},
                )
            claim.pending = value
            claim.renewed_at = now
            claim.marked = False

    def _lost(self, claim: _Claim) -> bool:
        """Mark ``claim`` lost; True (and counted) only the first time, so log it then."""
        if claim.lost:
            return False
        claim.lost = True
        self.counters.lost_claims += 1
        return True

    async def _renew_locked(self, claim: _Claim) -> None:
        now = claim.clock()
        value = {**claim.pending, "lease": now + self.config.lease_secs}
        marking = self._marking(claim)
        if marking:
            value["w"] = True
            claim.marked = True  # from now on it may be there, whatever the answer
        else:
            value.pop("w", None)
        try:
            with anyio.move_on_after(self._renew_every):
                renewed = await claim.store.compare_and_set(
                    claim.key,
                    value,
                    expected_owner=claim.owner,
                    owner=claim.owner,
                    ttl=self._pending_ttl,
                )
                if renewed is not None:
                    claim.pending = value
                    claim.renewed_at = now
                    if not marking:
                        claim.marked = False
                    self.counters.renewals += 1
                elif not claim.finished:
                    self._active.pop(claim.owner, None)
                    if self._lost(claim):
                        call = claim.ctx.call if claim.ctx is not None else None
                        waiting = claim.parked and not claim.started
                        log.warning(
                            "idempotency: lost the claim %s of tool %r call %r %s (its lease "
                            "lapsed and another caller took it, or it was forgotten); %s",
                            claim.key,
                            call.name if call is not None else "?",
                            call.call_id if call is not None else None,
                            "before it started"
                            if waiting
                            else "between two attempts"
                            if claim.idle
                            else "while the tool ran",
                            "it will not run here"
                            if waiting
                            else "it will not run again here"
                            if claim.idle
                            else "its result will not be stored",
                        )
        except StateStoreError as exc:
            self.counters.store_errors += 1
            log.warning("idempotency: could not renew the claim %s: %s", claim.key, exc)
