"""OpenTelemetry: execute_tool spans (GenAI conventions), attempt events, metrics."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from toolwire import CallContext, Kernel, ToolError, tool
from toolwire.testing import FakeTool
from toolwire_profiling import ProfilingConfig, ProfilingPlugin

from .test_plugin import Decide, Deny, Replay

pytestmark = pytest.mark.anyio


def kernel_with(otel: Any, *tools: Any, **cfg: Any) -> tuple[Kernel, ProfilingPlugin]:
    p = ProfilingPlugin(
        ProfilingConfig(**cfg),
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
    )
    k = Kernel(tools=list(tools), plugins=[p, Replay(), Deny(), Decide()])
    return k, p


async def test_one_execute_tool_span_per_call(otel: Any) -> None:
    k, _ = kernel_with(otel, FakeTool("search").tool)
    async with k:
        await k.call("search", {"q": "x"}, call_id="call-1", session_id="conv-9")
    (span,) = otel.spans()
    assert span.name == "execute_tool search" and span.kind == SpanKind.INTERNAL
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.id": "call-1",
        "gen_ai.conversation.id": "conv-9",
    }
    assert span.status.status_code == StatusCode.UNSET
    (event,) = span.events
    assert event.name == "toolwire.attempt"
    assert event.attributes["toolwire.attempt.duration_ms"] > 0
    assert "error.type" not in event.attributes
    assert span.start_time <= event.timestamp <= span.end_time


async def test_attempt_events_retries_fallbacks_and_errors(otel: Any) -> None:
    flaky = FakeTool("flaky", script=[ToolError("busy", kind="unavailable"), {"ok": 1}])
    main = FakeTool("main", script=[ToolError("no credits", kind="quota")])
    backup = FakeTool("backup", script=[ToolError("down too", kind="auth")])
    k, _ = kernel_with(otel, flaky.tool, main.tool, backup.tool)
    async with k:
        await k.call("flaky", {})
        await k.call("main", {})
    s1, s2 = otel.spans()
    assert [dict(e.attributes).get("error.type") for e in s1.events] == ["unavailable", None]
    assert s1.events[0].attributes["toolwire.attempt.decision"] == "retry"
    assert s1.events[0].timestamp <= s1.events[1].timestamp
    assert "error.type" not in s1.attributes and s1.status.status_code == StatusCode.UNSET
    e1, e2 = s2.events
    assert e1.attributes["toolwire.attempt.decision"] == "fallback"
    assert e2.attributes["gen_ai.tool.name"] == "backup" and e2.attributes["error.type"] == "auth"
    assert s2.attributes["error.type"] == "auth"
    assert s2.status.status_code == StatusCode.ERROR and "down too" in s2.status.description


async def test_replays_denials_unknown_tools_and_cancellation(otel: Any) -> None:
    k, _ = kernel_with(
        otel, FakeTool("search").tool, FakeTool("secret").tool, FakeTool("slow", delay=10).tool
    )
    async with k:
        await k.call("search", {}, call_id="dup-7")
        await k.call("secret", {})
        await k.call("nope", {}, call_id="c-x")
        with anyio.move_on_after(0.05):
            await k.call("slow", {})
    replay, denied, unknown, cancelled = otel.spans()
    assert replay.attributes["toolwire.replayed"] is True and not replay.events
    assert replay.attributes["gen_ai.tool.call.id"] == "dup-7"
    assert denied.attributes["error.type"] == "denied" and not denied.events
    # span names stay few: a model inventing tool names must not make them unbounded
    assert unknown.name == "execute_tool _unknown"
    assert unknown.attributes["gen_ai.tool.name"] == "nope"
    assert unknown.attributes["error.type"] == "not_found"
    assert unknown.attributes["gen_ai.tool.call.id"] == "c-x"
    assert unknown.start_time < unknown.end_time
    assert cancelled.attributes["error.type"] == "cancelled"
    assert cancelled.status.status_code == StatusCode.ERROR


async def test_spans_started_by_the_tool_are_children(otel: Any) -> None:
    tracer = otel.tracer_provider.get_tracer("my.tool")

    @tool
    async def fetch(url: str, ctx: CallContext) -> dict[str, str]:
        """Fetch a URL."""
        with tracer.start_as_current_span("GET"):
            await anyio.lowlevel.checkpoint()
        return {"url": url}

    k, _ = kernel_with(otel, fetch)
    async with k:
        with tracer.start_as_current_span("agent turn") as turn:
            await k.call("fetch", {"url": "http://example.invalid"})
    get, execute, agent = otel.spans()
    assert get.name == "GET" and execute.name == "execute_tool fetch" and agent is not None
    assert get.parent.span_id == execute.context.span_id
    assert execute.parent.span_id == turn.get_span_context().span_id
    assert get.context.trace_id == execute.context.trace_id == agent.context.trace_id


async def test_metrics(otel: Any) -> None:
    flaky = FakeTool("flaky", script=[ToolError("busy", kind="unavailable"), {"ok": 1}])
    k, _ = kernel_with(otel, FakeTool("search").tool, flaky.tool, FakeTool("secret").tool)
    async with k:
        for i in range(3):
            await k.call("search", {}, call_id=f"c{i}")
        await k.call("search", {}, call_id="dup-1")
        await k.call("flaky", {})
        await k.call("secret", {})
        await k.call("nope", {})
    m = otel.metrics()
    hist = {tuple(sorted(a.items())): dp for a, dp in m["toolwire.tool.duration"]}
    ok = hist[(("gen_ai.tool.name", "search"),)]
    assert ok.count == 3 and 0 < ok.sum < 1  # seconds
    assert hist[(("gen_ai.tool.name", "search"), ("toolwire.replayed", True))].count == 1
    assert hist[(("error.type", "denied"), ("gen_ai.tool.name", "secret"))].count == 1
    assert hist[(("error.type", "not_found"), ("gen_ai.tool.name", "_unknown"))].count == 1
    calls = {a["gen_ai.tool.name"]: dp.value for a, dp in m["toolwire.tool.calls"]}
    assert calls == {"search": 4, "flaky": 1, "secret": 1, "_unknown": 1}
    errors = {
        (a["gen_ai.tool.name"], a["error.type"]): dp.value for a, dp in m["toolwire.tool.errors"]
    }
    assert errors == {("secret", "denied"): 1, ("_unknown", "not_found"): 1}
    replays = {a["gen_ai.tool.name"]: dp.value for a, dp in m["toolwire.tool.replays"]}
    assert replays == {"search": 1}
    retries = {
        (a["gen_ai.tool.name"], a["toolwire.decision"]): dp.value
        for a, dp in m["toolwire.tool.retries"]
    }
    assert retries == {("flaky", "retry"): 1}
    # Counters are cumulative across collections.
    async with k:
        await k.call("search", {})
    calls = {a["gen_ai.tool.name"]: dp.value for a, dp in otel.metrics()["toolwire.tool.calls"]}
    assert calls["search"] == 5


async def test_two_kernels_on_one_meter_provider_both_count(otel: Any) -> None:
    # Two kernels in one process, each with its plugin, the application's one provider:
    # the SDK ignored the second plugin's observable counters (same names), so only the
    # first kernel's calls were ever counted.
    k1, _ = kernel_with(otel, FakeTool("a").tool, FakeTool("secret").tool)
    k2, _ = kernel_with(otel, FakeTool("b").tool, FakeTool("secret").tool)
    async with k1, k2:
        await k1.call("a", {})
        await k2.call("b", {})
        await k2.call("b", {})
        await k2.call("secret", {})
        await k1.call("secret", {})
    m = otel.metrics()
    calls = {a["gen_ai.tool.name"]: dp.value for a, dp in m["toolwire.tool.calls"]}
    assert calls == {"a": 1, "b": 2, "secret": 2}
    errors = {
        (a["gen_ai.tool.name"], a["error.type"]): dp.value for a, dp in m["toolwire.tool.errors"]
    }
    assert errors == {("secret", "denied"): 2}
    hist = {a["gen_ai.tool.name"]: dp.count for a, dp in m["toolwire.tool.duration"]}
    assert hist == {"a": 1, "b": 2, "secret": 2}


async def test_switches(otel: Any) -> None:
    k, p = kernel_with(otel, FakeTool("t").tool, tracing="off", metrics="off")
    async with k:
        await k.call("t", {})
    assert otel.spans() == [] and "toolwire.tool.calls" not in otel.metrics()
    assert p.get_statistics("t")["count"] == 1
    k, p = kernel_with(otel, FakeTool("t").tool, tracing="on", metrics="off")
    async with k:
        await k.call("t", {})
    assert len(otel.spans()) == 1 and "toolwire.tool.calls" not in otel.metrics()


async def test_auto_without_any_provider_is_off() -> None:
    # No provider passed, none set globally in this test process: nothing to export to.
    p = ProfilingPlugin()
    async with Kernel(tools=[FakeTool("t").tool], plugins=[p]) as k:
        await k.call("t", {})
    assert not p._tracing and not p._metrics and p._tel is None


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_spans_and_statistics_on_each_loop(otel: Any) -> None:
    flaky = FakeTool("flaky", script=[ToolError("busy", kind="unavailable"), {"ok": 1}])
    k, p = kernel_with(otel, flaky.tool)
    async with k:
        await k.call("flaky", {}, call_id="t-1")
    (span,) = otel.spans()
    assert span.attributes["gen_ai.tool.call.id"] == "t-1" and len(span.events) == 2
    assert p.get_statistics("flaky")["count"] == 2


async def test_an_exporter_or_span_processor_that_fails_never_costs_the_result() -> None:
    """Telemetry is best effort: a failing exporter (the collector is down) and a span
    processor that raises at span end leave the caller's result as the tool made it."""
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

    class Down(SpanExporter):
        def export(self, spans: Any) -> Any:
            raise ConnectionError("collector unreachable")

    class Broken(SpanProcessor):
        def on_end(self, span: Any) -> None:
            raise RuntimeError("processor bug")

    for processor in (SimpleSpanProcessor(Down()), Broken()):
        provider = TracerProvider()
        provider.add_span_processor(processor)
        p = ProfilingPlugin(ProfilingConfig(tracing="on"), tracer_provider=provider)
        async with Kernel(tools=[FakeTool("search", script=[{"hits": 3}]).tool], plugins=[p]) as k:
            r = await k.call("search", {"q": "x"})
        assert not r.is_error and r.content == {"hits": 3}, (processor, r)
        if isinstance(processor, Broken):  # the plugin's after_call raised: noted, not fatal
            assert [e["plugin"] for e in r.meta.plugin_errors] == ["profiling"]
        provider.shutdown()


def test_a_wrong_provider_or_config_type_is_a_typed_error_at_construction() -> None:
    """Not an AttributeError from deep inside the kernel's startup: the argument is named."""
    with pytest.raises(TypeError, match=r"tracer_provider must be an OpenTelemetry TracerProvider"):
        ProfilingPlugin(tracer_provider="http://collector:4318")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"meter_provider must be an OpenTelemetry MeterProvider"):
        ProfilingPlugin(meter_provider=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"config must be a ProfilingConfig, not dict"):
        ProfilingPlugin({"tracing": "on"})  # type: ignore[arg-type]
