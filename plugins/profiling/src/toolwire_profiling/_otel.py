"""OpenTelemetry: one ``execute_tool {tool}`` span per call, and tool metrics.

Spans follow the GenAI semantic conventions for tool execution
(``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``error.type``, kind INTERNAL); every attempt is a
span event. Metrics: the histogram ``toolwire.tool.duration`` (seconds) and
the counters ``toolwire.tool.calls``, ``toolwire.tool.errors``,
``toolwire.tool.replays`` and ``toolwire.tool.retries``. The counters are
observable: the plugin counts in plain dicts and the SDK reads them when it
collects, so they cost nothing per call.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind

if TYPE_CHECKING:
    from toolwire import Attempt

__all__ = ["Telemetry", "provider_is_configured"]

SCOPE = "toolwire_profiling"
OPERATION = "execute_tool"
#: The tool name of spans and metrics for calls of tools that do not exist.
UNKNOWN_TOOL = "_unknown"
#: Histogram buckets (seconds): 1 ms to ~80 s, doubling from 10 ms like the GenAI conventions.
DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)

_UNSET_PROVIDERS = {
    "ProxyTracerProvider",
    "NoOpTracerProvider",
    "_ProxyMeterProvider",
    "NoOpMeterProvider",
}


def provider_is_configured(provider: object) -> bool:
    """Whether a global provider was set by the application (not the API's default)."""
    return type(provider).__name__ not in _UNSET_PROVIDERS


class Telemetry:
    """Spans and metrics for the profiling plugin (tracing and metrics each optional)."""

    def __init__(
        self,
        *,
        tracing: bool,
        metrics_on: bool,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        version: str | None = None,
    ) -> None:
        self.tracing = tracing
        self.metrics = metrics_on
        self.tracer: Any = None
        self.hist_attrs: dict[tuple[str, str | None, bool], dict[str, Any]] = {}
        self.span_bases: dict[str, tuple[str, dict[str, Any]]] = {}
        self.hist: Any = None
        # cumulative counts read by the observable counters: key -> count (with metrics on,
        # those of every plugin on the same meter provider: see _Instruments)
        self.calls: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.replays: dict[str, int] = {}
        self.retries: dict[tuple[str, str], int] = {}
        if tracing:
            tp = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
            self.tracer = tp.get_tracer(SCOPE, version)
        if metrics_on:
            mp = meter_provider if meter_provider is not None else metrics.get_meter_provider()
            shared = _instruments(mp, version)
            self.hist = shared.hist
            self.calls = shared.calls
            self.errors = shared.errors
            self.replays = shared.replays
            self.retries = shared.retries

    # -- spans -------------------------------------------------------------------
    def span_base(self, tool: str) -> tuple[str, dict[str, Any]]:
        """The span name and base attributes of ``tool`` (cached)."""
        base = self.span_bases.get(tool)
        if base is None:
            base = (
                f"{OPERATION} {tool}",
                {"gen_ai.operation.name": OPERATION, "gen_ai.tool.name": tool},
            )
            if len(self.span_bases) < 10_000:
                self.span_bases[tool] = base
        return base

    def start_late(
        self,
        tool: str,
        call_id: str | None,
        session_id: str | None,
        started_at: float | None,
        *,
        unknown: bool = False,
    ) -> Any:
        """A span for a call this plugin saw only at its end (not started in before_call).

        ``unknown``: no such tool. Its span is named ``execute_tool _unknown`` (span
        names must stay few; a model inventing names would make them unbounded), the
        requested name kept in ``gen_ai.tool.name``.
        """
        if unknown:
            name = f"{OPERATION} {UNKNOWN_TOOL}"
            attrs = {"gen_ai.operation.name": OPERATION, "gen_ai.tool.name": tool}
        else:
            name, base = self.span_base(tool)
            attrs = dict(base)
        if call_id is not None:
            attrs["gen_ai.tool.call.id"] = call_id
        if session_id is not None:
            attrs["gen_ai.conversation.id"] = session_id
        start = int(started_at * 1e9) if started_at else None
        return self.tracer.start_span(
            name, kind=SpanKind.INTERNAL, attributes=attrs, start_time=start
        )

    # -- metrics -----------------------------------------------------------------
    def make_hist_attrs(self, key: tuple[str, str | None, bool]) -> dict[str, Any]:
        """The histogram attributes for (tool, error kind, replayed), cached."""
        tool, error_kind, replayed = key
        attrs: dict[str, Any] = {"gen_ai.tool.name": tool}
        if error_kind is not None:
            attrs["error.type"] = error_kind
        if replayed:
            attrs["toolwire.replayed"] = True
        if len(self.hist_attrs) < 10_000:
            self.hist_attrs[key] = attrs
        return attrs

    def count(
        self, tool: str, error_kind: str | None, replayed: bool, attempts: Sequence[Attempt]
    ) -> None:
        """The error, replay and retry counts of one call (``calls`` is counted by the caller)."""
        if error_kind is not None:
            ek = (tool, error_kind)
            self.errors[ek] = self.errors.get(ek, 0) + 1
        if replayed:
            self.replays[tool] = self.replays.get(tool, 0) + 1
        elif len(attempts) > 1:
            for a in attempts[:-1]:
                rk = (tool, a.decision or "retry")
                self.retries[rk] = self.retries.get(rk, 0) + 1


class _Instruments:
    """The tool metrics' instruments on one meter provider, and the counts they report.

    One per provider, shared by every plugin instance that uses it (two kernels in
    one process): the SDK keeps the first instrument of a name and ignores the
    callbacks of a second, so each plugin registering its own observable counters
    left the calls of every kernel but the first out of the metrics.
    """

    def __init__(self, meter: Any) -> None:
        # cumulative counts read by the observable counters: key -> count
        self.calls: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.replays: dict[str, int] = {}
        self.retries: dict[tuple[str, str], int] = {}
        try:
            self.hist: Any = meter.create_histogram(
                "toolwire.tool.duration",
                unit="s",
                description="Duration of tool calls through the toolwire kernel",
                explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
            )
        except TypeError:  # an API without bucket advice
            self.hist = meter.create_histogram(
                "toolwire.tool.duration",
                unit="s",
                description="Duration of tool calls through the toolwire kernel",
            )
        meter.create_observable_counter(
            "toolwire.tool.calls",
            callbacks=[self._observe_calls],
            unit="{call}",
            description="Tool calls through the toolwire kernel, by tool",
        )
        meter.create_observable_counter(
            "toolwire.tool.errors",
            callbacks=[self._observe_errors],
            unit="{call}",
            description="Tool calls that ended in an error, by tool and error.type",
        )
        meter.create_observable_counter(
            "toolwire.tool.replays",
            callbacks=[self._observe_replays],
            unit="{call}",
            description="Tool calls answered by an idempotent replay",
        )
        meter.create_observable_counter(
            "toolwire.tool.retries",
            callbacks=[self._observe_retries],
            unit="{attempt}",
            description="Attempts after the first one (retries and fallbacks)",
        )

    @staticmethod
    def _base(tool: str) -> dict[str, Any]:
        return {"gen_ai.tool.name": tool}

    def _observe_calls(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, self._base(tool)) for tool, n in list(self.calls.items())]

    def _observe_errors(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {**self._base(tool), "error.type": kind})
            for (tool, kind), n in list(self.errors.items())
        ]

    def _observe_replays(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, self._base(tool)) for tool, n in list(self.replays.items())]

    def _observe_retries(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {**self._base(tool), "toolwire.decision": decision})
            for (tool, decision), n in list(self.retries.items())
        ]


#: meter provider -> its instruments (weak: a provider dropped takes them along).
_SHARED: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _instruments(provider: Any, version: str | None) -> _Instruments:
    """The instruments of ``provider``, made on first use."""
    with _SHARED_LOCK:
        try:
            found = _SHARED.get(provider)
        except TypeError:  # not weakly referenceable: instruments of its own
            return _Instruments(provider.get_meter(SCOPE, version))
        if found is None:
            found = _SHARED[provider] = _Instruments(provider.get_meter(SCOPE, version))
        return found
