"""The profiling plugin: records calls and attempts, keeps per-tool statistics, estimates.

Write path (docs/profiling.md, "Fleet-wide figures"): every call updates an
in-memory *delta* per tool (a few dict and counter updates, no I/O). A
background flusher, started by the first call after a quiet period, merges the
deltas into the state store every ``flush_interval_s`` with a read /
compare-and-set loop per tool, and stops once nothing is pending; shutdown
flushes what is left. ``get_statistics`` answers from the stored figures (as
read at the last flush or refresh) merged with the deltas not stored yet.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Status, StatusCode

from toolwire import (
    CallContext,
    ErrorInfo,
    ErrorKind,
    StateStore,
    ToolCall,
    ToolResult,
    hookimpl,
)
from toolwire.state import StateDataError, StateNotAppliedError, StateStoreError

from ._config import ProfilingConfig
from ._otel import UNKNOWN_TOOL, Telemetry, provider_is_configured
from ._sketch import Sketch
from ._stats import ToolStats, args_signature

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from toolwire import Attempt, Kernel, ResultMeta

__all__ = ["AttemptRecord", "CallRecord", "Estimate", "ProfilingPlugin"]

log = logging.getLogger("toolwire.profiling")

STATE_KEY = "profiling"
KEY_VERSION = "v1"
_CAS_TRIES = 16
#: Writers whose last write a document remembers (``"w"``: writer id -> write number).
_MAX_WRITERS = 64
#: gen_ai.tool.name on the metrics of calls to unknown tools (keeps their cardinality bounded).
_CANCELLED = str(ErrorKind.CANCELLED)
#: The error kind of a call that asks the MCP client for input and is retried with it.
_INPUT_REQUIRED = "input_required"


class _LostToWriters(StateStoreError):
    """Every compare-and-set try on one key lost to other writers (that key only)."""


class _Unsure(StateStoreError):
    """A compare-and-set failed after it was sent: the store may still apply it."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """An execution-time estimate: milliseconds, where it came from, on how many samples.

    ``basis`` is ``"similar"`` (the p50 of successful executions of calls with
    the same argument signature), ``"tool"`` (the p50 of the tool's successful
    executions) or ``"default"`` (the configured default; ``samples`` is 0).
    """

    ms: float
    basis: str
    samples: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        return {"estimate_ms": self.ms, "basis": self.basis, "samples": self.samples}


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One execution attempt of a recorded call."""

    tool: str
    source: str | None
    duration_ms: float
    success: bool
    error_kind: str | None
    decision: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        return {
            "tool": self.tool,
            "source": self.source,
            "duration_ms": self.duration_ms,
            "success": self.success,
            "error_kind": self.error_kind,
            "decision": self.decision,
        }


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One recorded call (or one ``record_execution``)."""

    tool: str
    source: str | None
    call_id: str | None
    session_id: str | None
    started_at: float | None
    duration_ms: float
    success: bool
    error_kind: str | None
    replayed: bool
    served_by: str | None
    cancelled: bool
    attempts: tuple[AttemptRecord, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        return {
            "tool": self.tool,
            "source": self.source,
            "call_id": self.call_id,
            "session_id": self.session_id,
            "started_at": self.started_at,
            "duration_ms": self.duration_ms,
            "success": self.success,
            "error_kind": self.error_kind,
            "replayed": self.replayed,
            "served_by": self.served_by,
            "cancelled": self.cancelled,
            "attempts": [a.to_dict() for a in self.attempts],
        }


class _CallState:
    """Per-call state in ``ctx.state["profiling"]`` (only with tracing or adaptive timeouts)."""

    __slots__ = ("ends", "sig", "span", "timeout_s", "token")

    def __init__(self) -> None:
        self.span: Any = None
        self.token: Any = None
        self.ends: list[int] | None = None
        self.sig: str | None = None
        self.timeout_s: float | None = None


class ProfilingPlugin:
    """Latency statistics, time estimates and OpenTelemetry for every tool call.

    Args:
        config: ``[plugins.profiling]`` (defaults when None).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).
        store: where the figures are kept (default: the kernel's ``state``);
            pass one to use the plugin without a kernel.
    """

    name = "profiling"
    order = 100  # outermost of the first-party plugins: sees replays and denials
    Config = ProfilingConfig

    def __init__(
        self,
        config: ProfilingConfig | None = None,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        store: StateStore | None = None,
    ) -> None:
        if config is not None and not isinstance(config, ProfilingConfig):
            raise TypeError(
                f"profiling: config must be a ProfilingConfig, not {type(config).__name__}; "
                "build one with ProfilingConfig(**settings) or ProfilingConfig.model_validate(...)"
            )
        for arg, method, kind in (
            (tracer_provider, "get_tracer", "TracerProvider"),
            (meter_provider, "get_meter", "MeterProvider"),
        ):
            if arg is not None and not callable(getattr(arg, method, None)):
                raise TypeError(
                    f"profiling: {kind[:-8].lower()}_provider must be an OpenTelemetry {kind} "
                    f"(with a {method}() method), not {type(arg).__name__}; pass e.g. "
                    f"opentelemetry.sdk.{'trace' if kind == 'TracerProvider' else 'metrics'}."
                    f"{kind}(), or None to use the global one"
                )
        self.config = cfg = config if config is not None else ProfilingConfig()
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._store: StateStore | None = store
        self._kernel: Kernel | None = None
        self._prefix = f"{cfg.key_prefix}:{KEY_VERSION}:"
        self._pending: dict[str, ToolStats] = {}
        self._inflight: dict[str, ToolStats] = {}
        # Deltas whose write failed after it was sent (a Redis timeout): the store may
        # have applied them, or may yet. tool -> [(write number, delta)]; each stored
        # document says which write of this writer it holds last (see _settle).
        self._unsure: dict[str, list[tuple[int, ToolStats]]] = {}
        self._writer = uuid.uuid4().hex[:16]
        self._seq = 0
        self._stored: dict[str, ToolStats] = {}
        self._gen = 0  # bumped whenever stored figures change: cached estimates expire
        self._est_cache: dict[tuple[str, str | None, int], tuple[Estimate, int, int]] = {}
        self._recent: deque[tuple[Any, ...]] = deque(maxlen=cfg.recent_calls)
        self._similar = cfg.similar_calls and cfg.max_signatures > 0
        self._exact = {k: frozenset(v) for k, v in cfg.signature_args.items()}
        self._max_sigs = cfg.max_signatures
        ad = cfg.adaptive_timeouts
        self._adaptive = ad.enabled
        self._adaptive_tools = frozenset(ad.tools)
        self._tel: Telemetry | None = None
        self._start_span: Callable[..., Any] = _no_tracer
        self._span_bases: dict[str, tuple[str, dict[str, Any]]] = {}
        self._span_base: Callable[[str], tuple[str, dict[str, Any]]] = _no_span_base
        self._tracing = False
        self._metrics = False
        self._hooks_active = False
        self._lock: anyio.Lock | None = None
        self._flusher_active = False
        self._flusher_task: asyncio.Task[None] | None = None
        self._flusher_scope: anyio.CancelScope | None = None
        self._flusher_done: anyio.Event | None = None
        self._stopping = False
        self._next_refresh = 0.0
        self._warned_at = 0.0
        self._clock: Callable[[], float] = time.monotonic

    # ------------------------------------------------------------------ lifecycle
    @hookimpl
    async def startup(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._stopping = False
        if self._lock is not None and not self._lock.locked():
            self._lock = None  # the kernel may be started again on another event loop
        if self._store is None:
            self._store = kernel.state
        self._clock = kernel.clock.monotonic
        self._setup_telemetry()
        try:
            await self.refresh()
        except Exception as exc:
            # Any error, like a flush's: a custom store, or a driver error it does not
            # wrap, must not keep the kernel from starting for the sake of statistics.
            log.warning(
                "profiling: could not read the stored statistics (%s: %s); starting from "
                "this process's own figures",
                type(exc).__name__,
                exc,
            )

    @hookimpl
    async def shutdown(self) -> None:
        await self._stop_flusher()
        try:
            await self.flush()
        except Exception as exc:
            log.warning("profiling: the final flush of the statistics failed: %s", exc)

    def _setup_telemetry(self) -> None:
        """Decide tracing and metrics (once: a restarted kernel keeps its instruments)."""
        if self._tel is not None or self._tracing or self._metrics:
            self._hooks_active = self._tracing or self._adaptive
            return
        cfg = self.config
        tracing = cfg.tracing == "on" or (
            cfg.tracing == "auto"
            and (self._tracer_provider is not None or _global_tracer_configured())
        )
        metrics_on = cfg.metrics == "on" or (
            cfg.metrics == "auto"
            and (self._meter_provider is not None or _global_meter_configured())
        )
        self._tracing, self._metrics = tracing, metrics_on
        if tracing or metrics_on:
            from . import __version__

            self._tel = tel = Telemetry(
                tracing=tracing,
                metrics_on=metrics_on,
                tracer_provider=self._tracer_provider,
                meter_provider=self._meter_provider,
                version=__version__,
            )
            if tracing:
                self._start_span = tel.tracer.start_span
                self._span_bases = tel.span_bases
                self._span_base = tel.span_base
        self._hooks_active = tracing or self._adaptive

    # ---------------------------------------------------------------------- hooks
    @hookimpl
    def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        if not self._hooks_active:
            return
        st = _CallState()
        ctx.state[STATE_KEY] = st
        if self._adaptive and (not self._adaptive_tools or call.name in self._adaptive_tools):
            self._apply_adaptive_timeout(call, ctx, st)
        if self._tracing:
            name = call.name
            base = self._span_bases.get(name)
            if base is None:
                base = self._span_base(name)
            span_name, attrs = base
            if call.call_id is not None or call.session_id is not None:
                attrs = dict(attrs)
                if call.call_id is not None:
                    attrs["gen_ai.tool.call.id"] = call.call_id
                if call.session_id is not None:
                    attrs["gen_ai.conversation.id"] = call.session_id
            span = st.span = self._start_span(span_name, attributes=attrs)
            st.token = _attach(_set_span_in_context(span))

    @hookimpl
    def on_error(self, error: ErrorInfo, ctx: CallContext) -> None:
        st = ctx.state.get(STATE_KEY)
        if st is None:
            return
        if st.timeout_s is not None:
            # The adaptive timeout is for the first attempt: retries run under the
            # tool's own timeout and the caller's deadline.
            if error.kind == ErrorKind.TIMEOUT:
                error.details.setdefault("adaptive_timeout_s", round(st.timeout_s, 3))
            ctx.attempt_timeout_s = None
            st.timeout_s = None
        if st.span is not None:
            if st.ends is None:
                st.ends = []
            st.ends.append(time.time_ns())

    @hookimpl
    def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
        # The hot path: keep it to plain dict and attribute updates (see bench/).
        st: _CallState | None = ctx.state.get(STATE_KEY) if self._hooks_active else None
        meta = result.meta
        err = result.error
        kind = None if err is None else str(err.kind)
        name = call.name
        tool = ctx.tool
        replayed = meta.replayed
        attempts = meta.attempts
        cancelled = kind == _CANCELLED and not replayed
        served = meta.served_by
        source = None
        if tool is not None:
            source = tool.source
        # An unknown tool name (not_found) has no figures to keep. Nor has an MCP
        # ``input_required`` round (an approval asked through elicitation on a 2026-07-28
        # connection): the client retries the same call with the answers, and that
        # request is the call; counting the round too made one call two, one an error.
        if tool is not None and kind != _INPUT_REQUIRED:
            acc = self._pending.get(name)
            if acc is None:
                acc = self._pending[name] = ToolStats()
            acc.source = source
            acc.calls += 1
            if replayed:
                acc.replays += 1
            elif kind is None:
                acc.calls_ok += 1
            elif cancelled:
                acc.cancelled += 1
            else:
                ce = acc.call_errors
                ce[kind] = ce.get(kind, 0) + 1
            if served is not None and served != name:
                sb = acc.served_by
                sb[served] = sb.get(served, 0) + 1
            if attempts and not replayed:
                if len(attempts) == 1 and attempts[0].tool == name:
                    a = attempts[0]
                    ms = a.duration_ms
                    if a.error_kind is None:
                        acc.add_execution(ms, None)
                        if self._similar:
                            sig = st.sig if st is not None else None
                            if sig is None:
                                sig = args_signature(call.args, self._exact.get(name, ()))
                            acc.add_signature(sig, ms, self._max_sigs)
                    else:
                        acc.add_execution(ms, a.error_kind)
                else:
                    self._record_attempts(call, acc, attempts, st)
            if not self._flusher_active and self._store is not None:
                self._spawn_flusher()
        if self._recent.maxlen:
            self._recent.append(
                (name, source, call.call_id, call.session_id, meta, kind, cancelled)
            )
        tel = self._tel
        if tel is None:
            return
        if self._tracing:
            if st is not None and st.span is not None:
                span, token, ends = st.span, st.token, st.ends
                st.span = st.token = None
                otel_context.detach(token)
            else:
                span = tel.start_late(
                    name, call.call_id, call.session_id, meta.started_at, unknown=tool is None
                )
                ends = None
            if span.is_recording():
                if replayed:
                    span.set_attribute("toolwire.replayed", True)
                else:
                    for n, a in enumerate(attempts):
                        # One event per attempt, in order (no "number" attribute: each
                        # attribute costs the SDK ~1 µs).
                        attrs: dict[str, Any] = {"toolwire.attempt.duration_ms": a.duration_ms}
                        if a.tool != name:
                            attrs["gen_ai.tool.name"] = a.tool
                        if a.error_kind is not None:
                            attrs["error.type"] = a.error_kind
                        if a.decision is not None:
                            attrs["toolwire.attempt.decision"] = a.decision
                        span.add_event(
                            "toolwire.attempt",
                            attrs,
                            ends[n] if ends is not None and n < len(ends) else None,
                        )
                if served is not None and served != name:
                    span.set_attribute("toolwire.served_by", served)
                if err is not None:
                    span.set_attribute("error.type", kind)
                    span.set_status(Status(StatusCode.ERROR, err.message[:256]))
            span.end()
        if self._metrics:
            mname = name if tool is not None else UNKNOWN_TOOL
            key = (mname, kind, replayed)
            hattrs = tel.hist_attrs.get(key)
            if hattrs is None:
                hattrs = tel.make_hist_attrs(key)
            tel.hist.record(meta.duration_ms / 1000.0, hattrs)
            calls = tel.calls
            calls[mname] = calls.get(mname, 0) + 1
            if kind is not None or replayed or len(attempts) > 1:
                tel.count(mname, kind, replayed, attempts)

    def _record_attempts(
        self, call: ToolCall, acc: ToolStats, attempts: list[Attempt], st: _CallState | None
    ) -> None:
        name = call.name
        pending = self._pending
        for a in attempts:
            t = a.tool
            ex = acc
            if t != name:
                found = pending.get(t)
                if found is None:
                    found = pending[t] = ToolStats()
                    k = self._kernel
                    other = k.get_tool(t) if k is not None else None
                    found.source = other.source if other is not None else None
                ex = found
            ex.add_execution(a.duration_ms, a.error_kind)
            if a.decision == "retry":
                acc.retries += 1
            elif a.decision == "fallback":
                acc.fallbacks += 1
            if self._similar and a.error_kind is None and t == name:
                sig = st.sig if st is not None else None
                if sig is None:
                    sig = args_signature(call.args, self._exact.get(name, ()))
                acc.add_signature(sig, a.duration_ms, self._max_sigs)

    # ------------------------------------------------------------ adaptive timeouts
    def _apply_adaptive_timeout(self, call: ToolCall, ctx: CallContext, st: _CallState) -> None:
        ad = self.config.adaptive_timeouts
        sig = None
        if self._similar:
            sig = st.sig = args_signature(call.args, self._exact.get(call.name, ()))
        est = self._estimate(call.name, sig, ad.min_samples)
        if est.basis == "default":
            return
        timeout = min(max(est.ms / 1000.0 * ad.factor, ad.min_s), ad.max_s)
        # The timeout the attempt runs under otherwise: the tool's own, else the kernel's
        # default. An adaptive timeout only tightens it: the kernel lets it win, so a
        # longer one (min_s, or a slow tool's estimate) undid the operator's limit.
        tool = ctx.tool
        configured = tool.timeout_s if tool is not None else None
        if configured is None and self._kernel is not None:
            configured = self._kernel.default_timeout_s
        if configured is not None and configured <= timeout:
            return
        left = ctx.time_left()
        if left is not None and left <= timeout:
            return  # the caller's own deadline is already tighter
        st.timeout_s = timeout
        ctx.attempt_timeout_s = timeout  # the kernel bounds it by the deadline
        ctx.meta.extra[STATE_KEY] = {
            "adaptive_timeout_s": timeout,
            "estimate_ms": est.ms,
            "basis": est.basis,
            "samples": est.samples,
        }

    # ------------------------------------------------------------- the public API
    def record_execution(
        self,
        tool_name: str,
        execution_time_ms: float,
        tool_args: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        success: bool = True,
        *,
        error_kind: str | None = None,
    ) -> None:
        """Record one execution that did not go through the kernel (other SDKs' API).

        It counts as one call with one attempt; a failure has ``error_kind``
        (default ``tool_error``). ``tool_args`` feed the similar-call estimates;
        ``session_id`` is kept in the recent call records.
        """
        if not isinstance(tool_name, str) or not tool_name:
            # A tuple or a number became a dict key here and broke every later flush (the
            # store key and the sorted names need strings): no tool was stored again.
            raise TypeError(
                f"record_execution(tool_name={tool_name!r}): tool_name must be a non-empty "
                f"string (the tool's name), not {type(tool_name).__name__}"
            )
        try:
            ms = float(execution_time_ms)
        except (TypeError, ValueError):
            ms = math.nan
        if not math.isfinite(ms) or ms < 0:
            # Checked before anything is counted: a NaN poisoned every later flush of the
            # tool's statistics; infinity raised from the sketch halfway through.
            raise ValueError(
                f"record_execution({tool_name!r}, execution_time_ms={execution_time_ms!r}): "
                "execution_time_ms must be a finite number of milliseconds >= 0"
            )
        kind = None if success else (error_kind or str(ErrorKind.TOOL_ERROR))
        acc = self._pending.get(tool_name)
        if acc is None:
            acc = self._pending[tool_name] = ToolStats()
        acc.calls += 1
        acc.add_execution(ms, kind)
        if kind is None:
            acc.calls_ok += 1
            if self._similar and tool_args is not None:
                sig = args_signature(tool_args, self._exact.get(tool_name, ()))
                acc.add_signature(sig, ms, self._max_sigs)
        else:
            acc.call_errors[kind] = acc.call_errors.get(kind, 0) + 1
        if self._recent.maxlen:
            rec = CallRecord(
                tool_name,
                acc.source,
                None,
                session_id,
                time.time(),
                ms,
                kind is None,
                kind,
                False,
                None,
                False,
                (AttemptRecord(tool_name, acc.source, ms, kind is None, kind, None),),
            )
            self._recent.append((rec,))
        if not self._flusher_active and self._store is not None:
            self._spawn_flusher()

    def estimate(self, tool: str, args: Mapping[str, Any] | None = None) -> Estimate:
        """How long an execution of ``tool`` with ``args`` should take (see ``Estimate``).

        Similar calls first (same argument signature, at least ``min_samples``
        successful executions), then the tool's p50, then the configured default.
        """
        sig = None
        if self._similar and args is not None:
            sig = args_signature(args, self._exact.get(tool, ()))
        return self._estimate(tool, sig, self.config.min_samples)

    def estimate_time(self, tool_name: str, tool_args: Mapping[str, Any] | None = None) -> float:
        """The estimated execution time of ``tool_name`` in milliseconds (see ``estimate``)."""
        return self.estimate(tool_name, tool_args).ms

    def get_statistics(self, tool_name: str) -> dict[str, Any]:
        """Fleet-wide figures of one tool: stored figures merged with this process's new ones.

        Keys include ``count``, ``success_rate``, ``avg_time_ms``,
        ``p50_time_ms``, ``p90_time_ms``, ``p99_time_ms`` (see docs/profiling.md
        for all of them). A tool never seen has ``count`` 0 and None figures.
        """
        view = self._view(tool_name) or ToolStats()
        out = view.summary(tool_name)
        est = self.estimate(tool_name)
        out["estimate_ms"] = est.ms
        out["estimate_basis"] = est.basis
        return out

    def all_statistics(self) -> list[dict[str, Any]]:
        """``get_statistics`` of every tool known here, sorted by name."""
        names = set(self._stored) | set(self._inflight) | set(self._pending) | set(self._unsure)
        return [self.get_statistics(n) for n in sorted(names)]

    def tools(self) -> list[str]:
        """Names of the tools with figures (stored or local)."""
        return sorted(
            set(self._stored) | set(self._inflight) | set(self._pending) | set(self._unsure)
        )

    def recent_calls(self, tool: str | None = None, limit: int | None = None) -> list[CallRecord]:
        """The most recent call records (oldest first), optionally for one tool only."""
        out: list[CallRecord] = []
        for item in reversed(self._recent):
            rec = item[0] if len(item) == 1 else self._make_record(*item)
            if tool is not None and rec.tool != tool:
                continue
            out.append(rec)
            if limit is not None and len(out) >= limit:
                break
        out.reverse()
        return out

    def _make_record(
        self,
        name: str,
        source: str | None,
        call_id: str | None,
        session_id: str | None,
        meta: ResultMeta,
        kind: str | None,
        cancelled: bool,
    ) -> CallRecord:
        attempts: tuple[AttemptRecord, ...] = ()
        if not meta.replayed:
            k = self._kernel
            recs = []
            for a in meta.attempts:
                if a.tool == name:
                    src = source
                else:
                    other = k.get_tool(a.tool) if k is not None else None
                    src = other.source if other is not None else None
                recs.append(
                    AttemptRecord(
                        a.tool, src, a.duration_ms, a.error_kind is None, a.error_kind, a.decision
                    )
                )
            attempts = tuple(recs)
        return CallRecord(
            name,
            source,
            call_id,
            session_id,
            meta.started_at,
            meta.duration_ms,
            kind is None,
            kind,
            meta.replayed,
            meta.served_by,
            cancelled,
            attempts,
        )

    # ------------------------------------------------------------------ estimates
    def _estimate(self, tool: str, sig: str | None, min_samples: int) -> Estimate:
        key = (tool, sig, min_samples)
        acc = self._pending.get(tool)
        n = acc.count if acc is not None else 0
        hit = self._est_cache.get(key)
        if hit is not None:
            est, gen, at = hit
            # Valid until the stored figures change, or until this process has added
            # more than 5 % of the samples the estimate was computed on.
            if gen == self._gen and 0 <= n - at <= est.samples // 20:
                return est
        est = self._compute_estimate(tool, sig, min_samples)
        if len(self._est_cache) >= 10_000:
            self._est_cache.clear()
        self._est_cache[key] = (est, self._gen, n)
        return est

    def _compute_estimate(self, tool: str, sig: str | None, min_samples: int) -> Estimate:
        parts = [
            p
            for p in (
                self._stored.get(tool),
                self._inflight.get(tool),
                self._pending.get(tool),
                *(d for _, d in self._unsure.get(tool, ())),
            )
            if p is not None
        ]
        if sig is not None:
            sk = _merged(p.sigs.get(sig) for p in parts)
            if sk.count >= min_samples:
                return Estimate(sk.quantile(0.5) or 0.0, "similar", sk.count)
        ok = _merged(p.ok_sketch for p in parts)
        if ok.count >= min_samples:
            return Estimate(ok.quantile(0.5) or 0.0, "tool", ok.count)
        cfg = self.config
        return Estimate(cfg.default_estimates_ms.get(tool, cfg.default_estimate_ms), "default", 0)

    def _view(self, tool: str) -> ToolStats | None:
        parts = [
            p
            for p in (
                self._stored.get(tool),
                self._inflight.get(tool),
                self._pending.get(tool),
                *(d for _, d in self._unsure.get(tool, ())),
            )
            if p is not None
        ]
        if not parts:
            return None
        out = ToolStats()
        for p in parts:
            out.merge(p)
        return out

    # ----------------------------------------------------------------- the store
    def _key(self, tool: str) -> str:
        return self._prefix + tool

    def _get_lock(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    async def flush(self) -> None:
        """Write this process's new figures to the state store now.

        Shielded from cancellation (a half-written delta would be counted twice
        or lost). Figures that could not be written stay pending for the next flush.
        """
        if self._store is None or (not self._pending and not self._inflight and not self._unsure):
            return
        with anyio.CancelScope(shield=True):
            async with self._get_lock():
                await self._flush_locked()

    async def refresh(self) -> None:
        """Re-read every tool's stored figures (what other processes wrote)."""
        store = self._store
        if store is None:
            return
        async with self._get_lock():
            entries = await store.scan(self._prefix)
            seen = set()
            for e in entries:
                tool = e.key[len(self._prefix) :]
                seen.add(tool)
                self._stored[tool] = ToolStats.from_doc(e.value)
                self._settle(tool, e.value)
            for tool in set(self._stored) - seen:
                del self._stored[tool]
            self._gen += 1
            self._next_refresh = self._clock() + self.config.refresh_interval_s

    async def reset(self, tool: str | None = None) -> int:
        """Delete the stored and local figures of ``tool`` (None: every tool); returns keys deleted."""
        store = self._store
        async with self._get_lock():
            tools = (
                [tool]
                if tool is not None
                else sorted(set(self._stored) | set(self._pending) | set(self._unsure))
            )
            deleted = 0
            if store is not None:
                if tool is None:
                    tools = sorted(
                        set(tools)
                        | {e.key[len(self._prefix) :] for e in await store.scan(self._prefix)}
                    )
                for t in tools:
                    deleted += bool(await store.delete(self._key(t)))
            for t in tools:
                self._stored.pop(t, None)
                self._pending.pop(t, None)
                self._unsure.pop(t, None)
            self._gen += 1
            return deleted

    async def _flush_locked(self) -> None:
        store = self._store
        assert store is not None
        pending, self._pending = self._pending, {}
        for tool in self._unsure:
            if tool not in pending:  # an unsure write to check (and redo if it was lost)
                pending[tool] = ToolStats()
        if pending:
            # A copy: each tool leaves it the moment its merged figures are stored, so a
            # reader between two tools counts a stored delta once (not stored + in flight).
            self._inflight = dict(pending)
            self._gen += 1
            now = time.time()
            problem: BaseException | None = None
            try:
                for tool, delta in pending.items():
                    try:
                        merged = await self._cas_merge(store, tool, delta, now)
                    except _Unsure as exc:
                        # Kept apart (see _cas_merge), not pending: it may be stored already.
                        self._inflight.pop(tool, None)
                        problem = exc.__cause__ or exc
                        break
                    except (ValueError, StateDataError, _LostToWriters) as exc:
                        problem = exc  # this key only: the next tools may still be stored
                        continue
                    except Exception as exc:
                        # The store itself failed (down, or hung until its timeout): the
                        # next tools would wait as long each, so they wait for the next flush.
                        problem = exc
                        break
                    self._stored[tool] = merged
                    self._inflight.pop(tool, None)
                    self._gen += 1
            finally:
                # Every delta not stored (failed, not tried, or whatever left the loop)
                # goes back to pending, ahead of the figures recorded meanwhile.
                failed, self._inflight = self._inflight, {}
                self._gen += 1
                for tool, delta in failed.items():
                    if delta.is_empty():
                        continue  # only an unsure write to check: it stays where it is
                    cur = self._pending.get(tool)
                    if cur is not None:
                        delta.merge(cur)
                    self._pending[tool] = delta
            if problem is not None:
                self._warn(f"could not store the statistics of {sorted(failed)}: {problem}")

    async def _cas_merge(
        self, store: StateStore, tool: str, delta: ToolStats, now: float
    ) -> ToolStats:
        key = self._key(tool)
        ttl = self.config.retention_s
        for i in range(_CAS_TRIES):
            entry = await store.get_entry(key)
            if entry is not None and isinstance(entry.value, dict) and entry.value.get("v") != 1:
                raise ValueError(
                    f"state key {key!r} holds figures in another format "
                    f"(v={entry.value.get('v')!r}); upgrade toolwire-profiling or set another key_prefix"
                )
            value = entry.value if entry is not None else None
            self._settle(tool, value)
            merged = ToolStats.from_doc(value)
            if delta.is_empty() and tool not in self._unsure:
                return merged  # only an unsure write to check, and the document holds it
            merged.merge(delta, self._max_sigs)
            for _, lost in self._unsure.get(tool, ()):
                merged.merge(lost, self._max_sigs)  # not applied (yet): this write holds it
            merged.updated_at = now
            doc = merged.to_doc()
            self._seq += 1
            seq = self._seq
            doc["w"] = self._writers(value, seq)
            try:
                new = await store.compare_and_set(
                    key,
                    doc,
                    expected_version=entry.version if entry is not None else None,
                    ttl=ttl,
                )
            except (StateNotAppliedError, ValueError, StateDataError):
                raise  # nothing was written
            except Exception as exc:
                # Sent, no answer (a Redis timeout, a connection lost): the store may apply
                # it now or later. Kept apart under its write number, never pending again:
                # the next read tells whether the document holds it, and only a write that
                # did not happen is redone (a late one cannot happen after a newer write
                # of the key: its expected version is gone by then).
                if not delta.is_empty():
                    self._unsure.setdefault(tool, []).append((seq, delta))
                raise _Unsure(f"state key {key!r}: the write may or may not be applied") from exc
            if new is not None:
                self._unsure.pop(tool, None)
                return merged
            await anyio.sleep(random.uniform(0, 0.002 * (2 ** min(i, 6))))
        raise _LostToWriters(
            f"state key {key!r}: {_CAS_TRIES} compare-and-set attempts lost to concurrent writers"
        )

    def _writers(self, value: Any, seq: int) -> dict[str, int]:
        """The document's ``"w"``: the last write number of its most recent writers."""
        w = value.get("w") if isinstance(value, dict) else None
        out: dict[str, int] = {}
        if isinstance(w, dict):
            out = {k: n for k, n in w.items() if isinstance(k, str) and isinstance(n, int)}
        out.pop(self._writer, None)
        while len(out) >= _MAX_WRITERS:
            del out[next(iter(out))]  # the writer that has not written for the longest
        out[self._writer] = seq
        return out

    def _settle(self, tool: str, value: Any) -> None:
        """Drop the unsure writes of ``tool`` that the stored document ``value`` holds."""
        unsure = self._unsure.get(tool)
        if not unsure:
            return
        w = value.get("w") if isinstance(value, dict) else None
        last = w.get(self._writer) if isinstance(w, dict) else None
        if isinstance(last, int) and not isinstance(last, bool):
            unsure[:] = [(n, d) for n, d in unsure if n > last]
            self._gen += 1
        if not unsure:
            del self._unsure[tool]

    def _warn(self, message: str) -> None:
        now = self._clock()
        if now - self._warned_at >= 60.0 or self._warned_at == 0.0:
            self._warned_at = now
            log.warning("profiling: %s (will retry at the next flush)", message)

    # ----------------------------------------------------------------- the flusher
    def _spawn_flusher(self) -> None:
        """Start the background flusher (an asyncio task, or a trio system task)."""
        if self._stopping:
            return
        try:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._flusher_done = anyio.Event()
                self._flusher_active = True
                self._flusher_task = loop.create_task(self._flusher())
            elif "trio" in sys.modules:
                import trio

                try:
                    trio.lowlevel.current_task()
                except RuntimeError:
                    return  # no event loop here: the next call (or flush()) stores the figures
                self._flusher_done = anyio.Event()
                self._flusher_active = True
                trio.lowlevel.spawn_system_task(self._flusher)
        except Exception as exc:  # never fail a call for the statistics
            self._flusher_active = False
            self._warn(f"could not start the background flusher: {exc}")

    async def _flusher(self) -> None:
        done = self._flusher_done
        try:
            with anyio.CancelScope() as scope:
                self._flusher_scope = scope
                if self._stopping:
                    return
                while True:
                    await anyio.sleep(self.config.flush_interval_s)
                    await self.flush()
                    if self._clock() >= self._next_refresh:
                        with anyio.CancelScope(shield=True):
                            try:
                                await self.refresh()
                            except Exception as exc:
                                self._warn(f"could not re-read the stored statistics: {exc}")
                    if not self._pending and not self._unsure:
                        break
        except Exception as exc:
            self._warn(f"the background flusher failed: {exc}")
        finally:
            self._flusher_scope = None
            self._flusher_task = None
            self._flusher_active = False
            if done is not None:
                done.set()

    async def _stop_flusher(self) -> None:
        """Stop the flusher between two flushes (a flush in progress completes)."""
        self._stopping = True
        scope = self._flusher_scope
        if scope is not None:
            scope.cancel()
        done = self._flusher_done
        if self._flusher_active and done is not None:
            with anyio.move_on_after(10):
                await done.wait()


def _no_tracer(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("profiling: tracing is off")


def _no_span_base(tool: str) -> tuple[str, dict[str, Any]]:
    raise RuntimeError("profiling: tracing is off")


_attach = otel_context.attach
_set_span_in_context = otel_trace.set_span_in_context


def _merged(sketches: Any) -> Sketch:
    out = Sketch()
    for s in sketches:
        if s is not None:
            out.merge(s)
    return out


def _global_tracer_configured() -> bool:
    from opentelemetry import trace

    return provider_is_configured(trace.get_tracer_provider())


def _global_meter_configured() -> bool:
    from opentelemetry import metrics

    return provider_is_configured(metrics.get_meter_provider())
