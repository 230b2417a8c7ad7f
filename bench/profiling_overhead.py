"""Overhead of the profiling plugin per call, against the bare kernel in the same run.

Prints µs per call (best of several rounds), the plugin's overhead (the
difference to the bare kernel) and the ratio to the bare kernel, for:

- the bare kernel (no plugins)
- the kernel with the profiling plugin, OpenTelemetry off (statistics only)
- the same with adaptive timeouts on (adds the kernel's timeout scope)
- the profiling plugin with OpenTelemetry spans recorded (SDK tracer provider,
  always-on sampling, a simple span processor and an exporter that keeps
  nothing), without and with SDK metrics (in-memory reader)
- for reference, what the OpenTelemetry SDK alone costs for the same work
  (one span with its attributes, made current, one attempt event, and one
  histogram record), without any kernel

Targets (issue #7, 2-core machine): overhead <= 5 µs per call without
OpenTelemetry and <= 30 µs with spans recorded. The background flusher runs
as in production (memory:// state, the default 5 s interval).

Run: ``uv run python bench/profiling_overhead.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from toolwire import Kernel, tool
from toolwire_profiling import AdaptiveTimeoutsConfig, ProfilingConfig, ProfilingPlugin


@tool
async def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


class CountingExporter(SpanExporter):
    """Receives every finished span, keeps a count only."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


async def measure(fn: Callable[[], Awaitable[Any]], calls: int, rounds: int) -> float:
    """Best-of-rounds µs per call."""
    for _ in range(min(2000, calls)):
        await fn()
    best = float("inf")
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                await fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    finally:
        gc.enable()
    return best


async def main(calls: int, rounds: int) -> int:
    args = {"a": 1, "b": 2}
    off = ProfilingConfig(tracing="off", metrics="off")
    adaptive = ProfilingConfig(
        tracing="off",
        metrics="off",
        adaptive_timeouts=AdaptiveTimeoutsConfig(enabled=True, min_samples=5),
    )
    exporter = CountingExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    spans = ProfilingPlugin(
        ProfilingConfig(tracing="on", metrics="off"), tracer_provider=tp, meter_provider=mp
    )
    otel = ProfilingPlugin(
        ProfilingConfig(tracing="on", metrics="on"), tracer_provider=tp, meter_provider=mp
    )

    kernels = {
        "bare": Kernel(tools=[add]),
        "off": Kernel(tools=[add], plugins=[ProfilingPlugin(off)]),
        "adaptive": Kernel(tools=[add], plugins=[ProfilingPlugin(adaptive)]),
        "spans": Kernel(tools=[add], plugins=[spans]),
        "otel": Kernel(tools=[add], plugins=[otel]),
    }
    tracer = tp.get_tracer("bench")
    hist = mp.get_meter("bench").create_histogram("bench.duration", unit="s")
    span_attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add"}
    hist_attrs = {"gen_ai.tool.name": "add"}

    async def sdk_alone() -> None:
        span = tracer.start_span("execute_tool add", attributes=span_attrs)
        token = otel_context.attach(trace.set_span_in_context(span))
        otel_context.detach(token)
        span.add_event("toolwire.attempt", {"toolwire.attempt.duration_ms": 0.01})
        span.end()
        hist.record(0.00001, hist_attrs)

    for k in kernels.values():
        await k.start()
        r = await k.call("add", args)
        assert r.content == {"sum": 3}, r

    # Interleave the cases round by round so that drift affects them alike.
    best = dict.fromkeys([*kernels, "sdk"], float("inf"))
    for _ in range(rounds):
        for name, k in kernels.items():
            us = await measure(lambda k=k: k.call("add", args), calls, 1)
            best[name] = min(best[name], us)
        best["sdk"] = min(best["sdk"], await measure(sdk_alone, calls, 1))
    for k in kernels.values():
        await k.close()
    assert exporter.spans > 0, "no span was exported"

    base = best["bare"]
    rows = [
        ("bare kernel (no plugins)", best["bare"], None),
        ("profiling, OpenTelemetry off", best["off"], 5.0),
        ("profiling, OpenTelemetry off, adaptive timeouts", best["adaptive"], None),
        ("profiling, spans recorded", best["spans"], 30.0),
        ("profiling, spans recorded + metrics", best["otel"], 30.0),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  {'µs/call':>8}  {'overhead':>8}  {'x bare':>6}  target")
    for label, us, target in rows:
        over = us - base
        verdict = ""
        if target is not None:
            ok = over <= target
            verdict = f"overhead <= {target:g} µs " + ("OK" if ok else "MISSED")
        print(f"{label:<{width}}  {us:8.2f}  {over:8.2f}  {us / base:6.2f}  {verdict}")
    sdk = best["sdk"]
    print(
        f"for reference, the OpenTelemetry SDK alone (span + event + histogram record, "
        f"no kernel): {sdk:.2f} µs; toolwire's own share of the full OpenTelemetry case: "
        f"{best['otel'] - base - sdk:.2f} µs (spans exported: {exporter.spans})"
    )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ns = ap.parse_args()
    raise SystemExit(asyncio.run(main(ns.calls, ns.rounds)))
