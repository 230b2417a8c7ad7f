"""What the profiling plugin records from calls through the kernel, and its public API."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolwire import (
    CallContext,
    CallRejected,
    ErrorInfo,
    Fallback,
    Kernel,
    Retry,
    ToolCall,
    ToolError,
    ToolResult,
    hookimpl,
)
from toolwire.state import MemoryStore
from toolwire.testing import FakeTool, RecordingPlugin
from toolwire_profiling import ProfilingConfig, ProfilingPlugin, args_signature

pytestmark = pytest.mark.anyio


class Replay:
    """A stand-in for idempotency (order 200): replays calls whose id starts with 'dup'."""

    name, order = "replay", 200

    @hookimpl
    def before_call(self, call: ToolCall) -> ToolResult | None:
        if call.call_id and call.call_id.startswith("dup"):
            r = ToolResult.ok({"cached": True})
            r.meta.replayed = True
            return r
        return None


class Deny:
    """A stand-in for approval (order 300): denies the tool 'secret'."""

    name, order = "deny", 300

    @hookimpl
    def before_call(self, call: ToolCall) -> None:
        if call.name == "secret":
            raise CallRejected("denied", "tool 'secret' needs approval")


class Decide:
    """A stand-in for retry (order 500): retries `unavailable`, falls back on `quota`."""

    name, order = "decide", 500

    @hookimpl
    def on_error(self, error: ErrorInfo, ctx: CallContext) -> Retry | Fallback | None:
        if error.kind == "unavailable":
            return Retry()
        if error.kind == "quota":
            return Fallback("backup")
        return None


def make_kernel(
    *tools: FakeTool, config: ProfilingConfig | None = None
) -> tuple[Kernel, ProfilingPlugin]:
    p = ProfilingPlugin(config or ProfilingConfig(tracing="off", metrics="off"))
    k = Kernel(tools=[t.tool for t in tools], plugins=[p, Replay(), Deny(), Decide()])
    return k, p


async def test_successful_calls_and_statistics() -> None:
    k, p = make_kernel(FakeTool("search", script=[{"hits": 1}]))
    async with k:
        for i in range(10):
            r = await k.call("search", {"q": "x" * i}, call_id=f"c{i}", session_id="s1")
            assert not r.is_error
        s = p.get_statistics("search")
    assert s["count"] == 10 and s["calls"] == 10 and s["success_count"] == 10
    assert s["success_rate"] == 1.0 and s["call_success_rate"] == 1.0
    for key in ("avg_time_ms", "p50_time_ms", "p90_time_ms", "p99_time_ms"):
        assert isinstance(s[key], float) and s[key] > 0
    assert (
        s["min_time_ms"] <= s["p50_time_ms"] * 1.01 and s["p99_time_ms"] <= s["max_time_ms"] * 1.01
    )
    assert s["source"] == "test" and s["relative_accuracy"] == 0.01
    rec = p.recent_calls(limit=1)[0]
    assert rec.tool == "search" and rec.call_id == "c9" and rec.session_id == "s1"
    assert rec.success and not rec.replayed and rec.served_by == "search"
    assert [a.tool for a in rec.attempts] == ["search"] and rec.attempts[0].source == "test"
    assert rec.to_dict()["attempts"][0]["success"] is True


async def test_every_attempt_is_recorded_retries_and_fallbacks() -> None:
    flaky = FakeTool(
        "flaky",
        script=[
            ToolError("busy", kind="unavailable"),
            ToolError("busy", kind="unavailable"),
            {"ok": 1},
        ],
    )
    main = FakeTool("main", script=[ToolError("no credits", kind="quota")])
    backup = FakeTool("backup", script=[{"from": "backup"}], source="other")
    k, p = make_kernel(flaky, main, backup)
    async with k:
        r1 = await k.call("flaky", {})
        r2 = await k.call("main", {})
    assert not r1.is_error and len(r1.meta.attempts) == 3
    assert not r2.is_error and r2.meta.served_by == "backup"
    f = p.get_statistics("flaky")
    assert f["count"] == 3 and f["success_count"] == 1 and f["errors"] == {"unavailable": 2}
    assert f["calls"] == 1 and f["retries"] == 2 and f["call_success_rate"] == 1.0
    assert f["success_rate"] == pytest.approx(1 / 3)
    m = p.get_statistics("main")
    assert m["count"] == 1 and m["errors"] == {"quota": 1} and m["fallbacks"] == 1
    assert m["served_by"] == {"backup": 1} and m["calls"] == 1
    b = p.get_statistics("backup")  # the fallback tool's own execution counts for it
    assert b["count"] == 1 and b["calls"] == 0 and b["source"] == "other"
    rec = p.recent_calls(tool="main")[0]
    assert [(a.tool, a.source, a.success, a.error_kind, a.decision) for a in rec.attempts] == [
        ("main", "test", False, "quota", "fallback"),
        ("backup", "other", True, None, None),
    ]


async def test_replays_and_denials_are_calls_not_executions() -> None:
    tool = FakeTool("search")
    secret = FakeTool("secret")
    k, p = make_kernel(tool, secret)
    async with k:
        await k.call("search", {}, call_id="first")
        r = await k.call("search", {}, call_id="dup-1")
        d = await k.call("secret", {})
    assert r.meta.replayed and d.error is not None and d.error.kind == "denied"
    s = p.get_statistics("search")
    assert s["calls"] == 2 and s["replays"] == 1 and s["count"] == 1 and len(tool.calls) == 1
    x = p.get_statistics("secret")
    assert x["calls"] == 1 and x["count"] == 0 and x["call_errors"] == {"denied": 1}
    assert x["success_rate"] is None and x["call_success_rate"] == 0.0
    recs = p.recent_calls()
    assert recs[1].replayed and recs[1].attempts == ()
    assert recs[2].error_kind == "denied" and recs[2].attempts == ()


class AskOnce:
    """A stand-in for approval by MCP elicitation on a 2026-07-28 connection: the first
    round of each call id ends with ``input_required``; the client's retry runs."""

    name, order = "ask-once", 300

    def __init__(self) -> None:
        self.asked: set[str] = set()

    @hookimpl
    def before_call(self, call: ToolCall) -> None:
        if call.call_id not in self.asked:
            self.asked.add(str(call.call_id))
            raise CallRejected("input_required", "approval is being asked of the client")


async def test_an_input_required_round_is_not_a_call() -> None:
    """Before: each round counted as a call with an ``input_required`` error, so a call
    approved through elicitation counted twice, and its tool's call success rate halved."""
    tool = FakeTool("send")
    p = ProfilingPlugin(ProfilingConfig(tracing="off", metrics="off"))
    async with Kernel(tools=[tool.tool], plugins=[p, AskOnce()]) as k:
        first = await k.call("send", {}, call_id="c-1")
        again = await k.call("send", {}, call_id="c-1")  # the client's retry, answered
    assert first.error is not None and first.error.kind == "input_required"
    assert not again.is_error
    s = p.get_statistics("send")
    assert s["calls"] == 1 and s["call_errors"] == {} and s["call_success_rate"] == 1.0
    assert s["count"] == 1 and s["errors"] == {}
    assert [r.error_kind for r in p.recent_calls()] == ["input_required", None]


async def test_failed_call_counts_as_a_tool_failure() -> None:
    k, p = make_kernel(FakeTool("broken", script=[ValueError("boom")]))
    async with k:
        await k.call("broken", {})
    s = p.get_statistics("broken")
    assert s["count"] == 1 and s["success_rate"] == 0.0 and s["errors"] == {"tool_error": 1}
    assert s["call_errors"] == {"tool_error": 1} and s["call_success_rate"] == 0.0


async def test_cancelled_call_is_not_a_tool_failure() -> None:
    k, p = make_kernel(FakeTool("slow", delay=10))
    async with k:
        with anyio.move_on_after(0.05):
            await k.call("slow", {})
        s = p.get_statistics("slow")
    assert s["calls"] == 1 and s["cancelled"] == 1
    assert s["count"] == 0 and s["call_errors"] == {} and s["errors"] == {}
    assert s["call_success_rate"] is None  # nothing finished
    rec = p.recent_calls()[0]
    assert rec.cancelled and rec.error_kind == "cancelled"


async def test_unknown_tools_and_invalid_args() -> None:
    k, p = make_kernel(
        FakeTool(
            "real",
            input_schema={
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            },
        )
    )
    async with k:
        await k.call("nope", {})
        await k.call("real", {"n": "not a number"})
    assert "nope" not in p.tools()  # hallucinated names leave no stored figures
    s = p.get_statistics("real")
    assert s["calls"] == 1 and s["count"] == 0 and s["call_errors"] == {"invalid_args": 1}
    assert [r.error_kind for r in p.recent_calls()] == ["not_found", "invalid_args"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -5, "slow", None])
async def test_record_execution_refuses_a_time_that_is_no_duration(bad: Any) -> None:
    """Before: NaN was taken and every later flush of the tool failed (executions recorded
    after it were lost at restart); infinity raised OverflowError halfway through; -5 was
    stored as the minimum."""
    p = ProfilingPlugin(ProfilingConfig(min_samples=1))
    p.record_execution("search", 100)
    with pytest.raises(ValueError, match="execution_time_ms must be a finite number"):
        p.record_execution("search", bad)
    p.record_execution("search", 300)
    s = p.get_statistics("search")
    assert s["count"] == 2 and s["calls"] == 2 and s["min_time_ms"] == pytest.approx(100)


@pytest.mark.parametrize("bad", [("search", "v2"), 7, None, ""])
async def test_record_execution_refuses_a_name_that_is_no_tool_name(bad: Any) -> None:
    """Before: a tuple (or number) was taken as the tool's name; every later flush raised
    TypeError from building its store key and sorting the names, so no tool's figures
    reached the store again (they were lost at restart)."""
    store = MemoryStore()
    p = ProfilingPlugin(ProfilingConfig(tracing="off", metrics="off"), store=store)
    with pytest.raises(TypeError, match="tool_name must be a non-empty string"):
        p.record_execution(bad, 5)
    p.record_execution("other", 5)
    await p.flush()
    assert [e.key for e in await store.scan("profiling:")] == ["profiling:v1:other"]
    assert p.tools() == ["other"]


async def test_record_execution_estimate_time_and_get_statistics() -> None:
    p = ProfilingPlugin(ProfilingConfig(min_samples=3, default_estimate_ms=250))
    assert p.estimate_time("search") == 250.0
    assert p.estimate("search").basis == "default"
    for ms in (100, 110, 120):
        p.record_execution("search", ms, {"q": "short"}, session_id="s", success=True)
    for ms in (1000, 1100, 1200):
        p.record_execution("search", ms, {"q": "a much longer query string"})
    p.record_execution("search", 5, {"q": "x"}, success=False)
    # Similar calls first: same argument signature (string length class).
    near = p.estimate("search", {"q": "other"})
    assert near.basis == "similar" and near.samples == 3 and abs(near.ms - 110) <= 1.1
    far = p.estimate("search", {"q": "another long query string!"})
    assert far.basis == "similar" and abs(far.ms - 1100) <= 11
    # No similar history: the tool's p50 (of successful executions).
    tool = p.estimate("search", {"q": "x", "page": 2})
    assert tool.basis == "tool" and tool.samples == 6 and abs(tool.ms - 120) <= 1.2
    assert p.estimate_time("search") == tool.ms
    s = p.get_statistics("search")
    assert s["count"] == 7 and s["calls"] == 7 and s["success_rate"] == pytest.approx(6 / 7)
    assert s["errors"] == {"tool_error": 1}
    assert s["avg_time_ms"] == pytest.approx((330 + 3300 + 5) / 7)
    assert (
        abs(s["p50_time_ms"] - 120) <= 1.2 and abs(s["p99_time_ms"] - 1100) <= 11
    )  # rank floor(0.99 * 6)
    assert s["estimate_ms"] == tool.ms
    assert p.recent_calls()[0].session_id == "s"
    # Per-tool configured defaults.
    q = ProfilingPlugin(ProfilingConfig(default_estimates_ms={"slow": 9000}))
    assert q.estimate_time("slow") == 9000 and q.estimate_time("other") == 1000


async def test_estimates_follow_new_data() -> None:
    p = ProfilingPlugin(ProfilingConfig(min_samples=1))
    p.record_execution("t", 10)
    assert abs(p.estimate_time("t") - 10) <= 0.1
    for _ in range(100):
        p.record_execution("t", 50)
    assert abs(p.estimate_time("t") - 50) <= 0.5  # the cached estimate was refreshed


def test_args_signature() -> None:
    assert args_signature({}) == args_signature(None) == "-"
    assert args_signature({"q": "abcd", "n": 5}) == args_signature({"n": 7, "q": "wxyz"})
    assert args_signature({"q": "ab"}) != args_signature({"q": "abcdefgh"})
    assert args_signature({"n": 3}) != args_signature({"n": 3000})
    assert args_signature({"flag": True}) != args_signature({"flag": False})
    assert args_signature({"items": [1, 2, 3]}) == args_signature({"items": ["a", "b", "c"]})
    assert args_signature({"model": "a"}, exact={"model"}) != args_signature(
        {"model": "b"}, exact={"model"}
    )
    assert args_signature({"model": "a"}) == args_signature({"model": "b"})
    long = args_signature({f"argument_number_{i}": i for i in range(20)})
    assert long.startswith("#") and len(long) == 17
    assert args_signature({"x": float("nan"), "y": object(), "z": None, "w": -3.5})


async def test_signature_args_config() -> None:
    p = ProfilingPlugin(ProfilingConfig(min_samples=2, signature_args={"llm": ["model"]}))
    for _ in range(3):
        p.record_execution("llm", 100, {"model": "small", "prompt": "hi"})
        p.record_execution("llm", 900, {"model": "large", "prompt": "hi"})
    assert abs(p.estimate_time("llm", {"model": "small", "prompt": "yo"}) - 100) <= 1
    assert abs(p.estimate_time("llm", {"model": "large", "prompt": "yo"}) - 900) <= 9


async def test_ordering_profiling_sees_everything_first_and_last() -> None:
    log: list[tuple[str, str, str]] = []
    p = ProfilingPlugin(ProfilingConfig(tracing="off", metrics="off"))
    k = Kernel(
        tools=[FakeTool("t").tool],
        plugins=[p, RecordingPlugin("early", 50, log), RecordingPlugin("late", 900, log)],
    )
    assert [i.name for i in k.plugins.ordered()][:2] == ["early", "profiling"]
    async with k:
        await k.call("t", {})
    assert p.get_statistics("t")["calls"] == 1


async def test_config_loading_through_entry_point(tmp_path: Any) -> None:
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(
        'enabled_plugins = ["profiling"]\n'
        "[plugins.profiling]\n"
        "default_estimate_ms = 42\n"
        'tracing = "off"\n'
        "[plugins.profiling.adaptive_timeouts]\n"
        "enabled = true\nfactor = 3\n"
    )
    k = Kernel.from_config(str(cfg))
    info = k.plugins.plugins["profiling"]
    assert info.order == 100 and info.dist == "toolwire-profiling"
    plugin = info.plugin
    assert isinstance(plugin, ProfilingPlugin)
    assert plugin.estimate_time("x") == 42 and plugin.config.adaptive_timeouts.factor == 3
    assert set(info.hooks()) >= {"before_call", "after_call", "on_error", "startup", "shutdown"}


def test_config_errors_name_the_key(tmp_path: Any) -> None:
    from toolwire import ConfigError

    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(
        'enabled_plugins = ["profiling"]\n[plugins.profiling.adaptive_timeouts]\nmin_s = 10\nmax_s = 1\n'
    )
    with pytest.raises(ConfigError, match="adaptive_timeouts"):
        Kernel.from_config(str(cfg))
    cfg.write_text('enabled_plugins = ["profiling"]\n[plugins.profiling]\nflush_every = 1\n')
    with pytest.raises(ConfigError, match="flush_every: unknown key"):
        Kernel.from_config(str(cfg))


@pytest.mark.parametrize(
    ("line", "key"),
    [
        # a TTL of infinity: the store refused it, no figure was ever stored
        ("retention_s = inf", "plugins.profiling.retention_s"),
        ("flush_interval_s = inf", "plugins.profiling.flush_interval_s"),
        # estimate_time() answered nan or a negative time
        (
            "default_estimates_ms = { search = nan }",
            "plugins.profiling.default_estimates_ms.search",
        ),
        ("default_estimates_ms = { search = -5 }", "plugins.profiling.default_estimates_ms.search"),
    ],
)
def test_non_finite_or_negative_durations_are_config_errors(
    tmp_path: Any, line: str, key: str
) -> None:
    from toolwire import ConfigError

    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(f'enabled_plugins = ["profiling"]\n[plugins.profiling]\n{line}\n')
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        Kernel.from_config(str(cfg))
