"""Retry policy: backoff with full jitter, caps, side effects, budget, chains, empty results, config."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolwire import (
    CallContext,
    Kernel,
    Tool,
    ToolAnnotations,
    ToolError,
    build_tool,
    hookimpl,
    load_config,
    tool,
)
from toolwire.state import StateStoreError
from toolwire.testing import FakeClock, FakeTool
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin, key_pool, lease_key
from toolwire_retry import RetryBudget, RetryConfig, RetryPlugin, is_empty

pytestmark = pytest.mark.anyio

BUSY = ToolError("Service Unavailable", status=503)


def fake(
    name: str, script: list[Any], provider: str | None = None, **kw: Any
) -> tuple[FakeTool, Tool]:
    ft = FakeTool(name, script=script, **kw)
    t = ft.tool
    if provider:
        t.settings["provider"] = provider
    return ft, t


def kernel(
    tools: list[Tool],
    retry: dict[str, Any] | None = None,
    rl: dict[str, Any] | None = None,
    clock: FakeClock | None = None,
    **kw: Any,
) -> Kernel:
    return Kernel(
        clock=clock or FakeClock(),
        tools=tools,
        plugins=[
            RateLimitPlugin(RateLimitConfig.model_validate(rl or {})),
            RetryPlugin(RetryConfig.model_validate({"seed": 3, **(retry or {})})),
        ],
        **kw,
    )


async def test_exponential_backoff_with_full_jitter() -> None:
    clock = FakeClock()
    ft, t = fake("busy", [BUSY], read_only=True)
    pol = {"base_s": 1.0, "cap_s": 3.0, "max_attempts": 5, "max_provider_attempts": 5}
    async with kernel([t], retry=pol, clock=clock, max_attempts=10) as k:
        res = await k.call("busy", {})
    assert res.error is not None and res.error.kind == "unavailable"
    assert len(ft.calls) == 5 and len(clock.sleeps) == 4
    # full jitter: attempt n sleeps uniform(0, min(cap_s, base_s * 2**(n-1))), from the seeded rng
    rng = random.Random(3)
    assert clock.sleeps == pytest.approx(
        [rng.uniform(0, min(3.0, 2.0 ** (n - 1))) for n in (1, 2, 3, 4)]
    )
    assert res.error.details["gave_up"] == "max_attempts (5, the retry policy's) reached"
    slept = [d.get("slept_ms") for d in res.meta.extra["attempt_details"]]
    assert slept[:4] == [round(s * 1000, 3) for s in clock.sleeps]


async def test_retry_after_is_honoured_and_bounded_by_cap_and_elapsed_budget() -> None:
    clock = FakeClock()
    ft, t = fake(
        "busy", [ToolError("busy", status=503, retry_after_s=1.5), {"ok": 1}], read_only=True
    )
    async with kernel([t], clock=clock) as k:
        assert not (await k.call("busy", {})).is_error
    assert clock.sleeps == [1.5]

    clock = FakeClock()
    ft, t = fake("busy", [ToolError("busy", status=503, retry_after_s=30)], read_only=True)
    async with kernel([t], retry={"cap_s": 60, "max_elapsed_s": 10}, clock=clock) as k:
        res = await k.call("busy", {})
    assert clock.sleeps == [] and len(ft.calls) == 1
    assert res.error is not None and "time left" in res.error.details["gave_up"]


class MarkRetryable:
    """An on_error hook of a user's own, in place of the classifier (see docs/retry.md)."""

    name = "mark"
    order = 450

    @hookimpl
    def on_error(self, error: Any) -> None:
        error.retryable = True


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -5.0])
@pytest.mark.parametrize("classifier", ["ratelimit", "own hook"])
async def test_a_tools_garbage_retry_after_is_ignored(garbage: float, classifier: str) -> None:
    """Before: a tool's ``retry_after_s`` of nan became ``Retry(after_s=nan)``, which the
    kernel refused (the call ended after one attempt, the caller told to wait nan
    seconds); -5 retried at once with no backoff."""
    clock = FakeClock()
    err = ToolError("busy", status=503, retry_after_s=garbage)
    ft, t = fake("busy", [err, err, err], read_only=True)
    plugins: list[Any] = [
        RetryPlugin(RetryConfig(seed=3, base_s=1.0, max_attempts=3, max_provider_attempts=3))
    ]
    plugins.insert(0, RateLimitPlugin() if classifier == "ratelimit" else MarkRetryable())
    async with Kernel(clock=clock, tools=[t], plugins=plugins, max_attempts=3) as k:
        res = await k.call("busy", {})
    assert res.meta.plugin_errors == [] and len(ft.calls) == 3
    # the usual full-jitter backoff: uniform(0, base_s * 2**(n-1))
    rng = random.Random(3)
    assert clock.sleeps == pytest.approx([rng.uniform(0, 2.0 ** (n - 1)) for n in (1, 2)])
    assert res.error is not None
    if classifier == "ratelimit":  # nor is the caller told to wait that long
        assert res.error.retry_after_s is None


async def test_a_spent_max_elapsed_budget_is_named_as_the_reason() -> None:
    clock = FakeClock()

    def slow_503(args: dict[str, Any]) -> Any:
        clock.advance(11)  # the retry alone outlasts max_elapsed_s
        raise BUSY

    ft, t = fake("busy", [BUSY, slow_503], read_only=True)
    async with kernel([t], retry={"max_elapsed_s": 10}, clock=clock) as k:
        res = await k.call("busy", {})
    assert len(clock.sleeps) == 1 and len(ft.calls) == 2
    assert res.error is not None and res.error.details["gave_up"] == "max_elapsed_s reached"


async def test_a_timed_out_side_effecting_tool_is_never_retried() -> None:
    cases = [(None, None, 1), (True, None, 2), (None, "config", 2), (None, "hint", 2)]
    for read_only, idempotent, expected in cases:
        ft, t = fake("slow", [{"ok": 1}], read_only=read_only, delay=0.2, timeout_s=0.02)
        if idempotent == "hint":  # the tool's own MCP annotation
            t = dataclasses.replace(t, annotations=ToolAnnotations(idempotentHint=True))
        retry = {"tools": {"slow": {"idempotent": True}}} if idempotent == "config" else {}
        async with kernel([t], retry=retry) as k:
            res = await k.call("slow", {})
        assert res.error is not None and res.error.kind == "timeout"
        assert len(ft.calls) == expected, (read_only, idempotent)
        if expected == 1:
            assert "may have side effects" in res.error.details["retry"]
            assert not res.error.retryable  # nor should the caller retry it
            assert res.error.details["gave_up"] == res.error.details["retry"]


async def test_a_side_effecting_call_whose_connection_broke_off_is_never_retried() -> None:
    """Before: an ``unavailable`` error with ``details.in_flight`` (an upstream MCP server
    that crashed mid-call, an answer that broke off) was retried like any outage, so a
    tool that had done its work before the connection dropped could run twice."""
    lost = ToolError(
        "the connection was lost during the call; the outcome is unknown",
        kind="unavailable",
        details={"in_flight": True},
    )
    cases = [(None, None, 1), (True, None, 2), (None, "config", 2), (None, "hint", 2)]
    for read_only, idempotent, expected in cases:
        ft, t = fake("send", [lost, {"ok": 1}], read_only=read_only)
        if idempotent == "hint":  # the tool's own MCP annotation
            t = dataclasses.replace(t, annotations=ToolAnnotations(idempotentHint=True))
        retry = {"tools": {"send": {"idempotent": True}}} if idempotent == "config" else {}
        async with kernel([t], retry=retry) as k:
            res = await k.call("send", {})
        assert len(ft.calls) == expected, (read_only, idempotent)
        if expected == 1:
            assert res.error is not None and res.error.kind == "unavailable"
            assert "lost its connection during the call" in res.error.details["retry"]
            assert not res.error.retryable  # nor should the caller retry it
            assert res.error.details["gave_up"] == res.error.details["retry"]
        else:
            assert res.content == {"ok": 1}
    # nothing was sent (in_flight false): an outage like any other, retried
    refused = ToolError("connection refused", kind="unavailable", details={"in_flight": False})
    ft, t = fake("send", [refused, {"ok": 1}])
    async with kernel([t]) as k:
        res = await k.call("send", {})
    assert len(ft.calls) == 2 and res.content == {"ok": 1}


async def test_a_timeout_before_anything_was_sent_is_retried() -> None:
    """Before: every timeout counted as an unknown outcome, even one saying the request was
    never sent (the MCP plugin's "timed out waiting for a connection", in_flight false),
    so a side-effecting tool was not retried, against docs/retry.md."""
    unsent = ToolError(
        "timed out waiting for a connection; the request was not sent",
        kind="timeout",
        details={"in_flight": False},
    )
    ft, t = fake("send", [unsent, {"ok": 1}])
    async with kernel([t]) as k:
        res = await k.call("send", {})
    assert len(ft.calls) == 2 and res.content == {"ok": 1}
    # a timeout saying nothing of it is still an unknown outcome
    silent = ToolError("timed out", kind="timeout")
    ft, t = fake("send", [silent, {"ok": 1}])
    async with kernel([t]) as k:
        res = await k.call("send", {})
    assert len(ft.calls) == 1 and res.error is not None
    assert "may have side effects" in res.error.details["retry"]


async def test_only_classified_errors_are_retried() -> None:
    ft, t = fake("boom", [RuntimeError("division by zero")], read_only=True)
    async with kernel([t]) as k:
        res = await k.call("boom", {})
    assert len(ft.calls) == 1 and res.error is not None and not res.error.retryable
    # without the classifier, nothing is retryable at all
    ft, t = fake("busy", [BUSY], read_only=True)
    async with Kernel(clock=FakeClock(), tools=[t], plugins=[RetryPlugin()]) as k:
        await k.call("busy", {})
    assert len(ft.calls) == 1


async def test_the_retry_budget_stops_a_retry_storm() -> None:
    clock = FakeClock()
    ft, t = fake("busy", [BUSY], read_only=True)
    budget = {"burst": 3, "ratio": 0.0, "min_per_s": 0.0}
    async with kernel([t], retry={"budget": budget, "base_s": 0}, clock=clock) as k:
        for _ in range(10):
            await k.call("busy", {})
    assert len(ft.calls) == 10 + 3
    b = RetryBudget(RetryConfig(budget={"burst": 2, "ratio": 0.5, "min_per_s": 1.0}).budget)  # type: ignore[arg-type]
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    b.deposit()
    b.deposit()
    assert b.take(0.0) and not b.take(0.0)
    assert b.take(1.0)  # one token per second


async def test_explicit_fallbacks_with_different_args() -> None:
    _a, ta = fake("a", [BUSY], read_only=True)
    _b, tb = fake("b", [lambda args: {"b": args}], read_only=True)
    retry = {
        "fallbacks": {"a": [{"tool": "b", "args": {"mode": "lite"}}]},
        "max_provider_attempts": 1,
    }
    async with kernel([ta, tb], retry=retry) as k:
        res = await k.call("a", {"q": "x"})
    assert res.content == {"b": {"q": "x", "mode": "lite"}}
    assert res.meta.served_by == "b"
    assert res.meta.extra["attempt_details"][0]["to"] == "b"


async def test_a_fallback_that_names_no_tool_is_named_in_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a fallback naming no tool (a typo) was dropped at DEBUG level; the call
    ended with the first tool's error and nothing said why no fallback was tried."""
    _a, ta = fake("a", [BUSY], read_only=True)
    _b, tb = fake("b", [BUSY], read_only=True)
    for chain, tried in ((["a_backup_typo"], ["a"]), (["a_backup_typo", "b"], ["a", "b"])):
        retry = {"fallbacks": {"a": chain}, "max_provider_attempts": 1}
        async with kernel([ta, tb], retry=retry) as k:
            res = await k.call("a", {})
        assert [x.tool for x in res.meta.attempts] == tried
        assert res.error is not None and res.error.kind == "unavailable"
        typo = res.error.details["providers"]["a_backup_typo"]
        assert typo["retry_at"] is None and "neither a tool nor a provider" in typo["reason"]
        assert "a_backup_typo: skipped: neither a tool" in res.error.message
    assert "fallback 'a_backup_typo' of tool 'a' is neither a tool" in caplog.text


async def test_chain_order_by_provider_from_tool_settings() -> None:
    _a, ta = fake("s_alpha", [BUSY], provider="alpha", read_only=True)
    _b, tb = fake("s_beta", [ToolError("nope", status=429)], provider="beta", read_only=True)
    _c, tc = fake("s_gamma", [{"ok": "gamma"}], provider="gamma", read_only=True)
    retry = {"chain_order": ["alpha", "beta", "gamma"], "max_provider_attempts": 1}
    async with kernel([ta, tb, tc], retry=retry) as k:
        res = await k.call("s_alpha", {})
        from_beta = await k.call("s_beta", {})
    assert res.meta.served_by == "s_gamma"
    assert [x.tool for x in res.meta.attempts] == ["s_alpha", "s_beta", "s_gamma"]
    assert [d["provider"] for d in res.meta.extra["attempt_details"]] == ["alpha", "beta", "gamma"]
    # the chain follows the requested tool's position: after beta comes gamma. (A tool that
    # does not lease from its pool is not gated: it runs once more although beta is cooling.)
    assert from_beta.meta.served_by == "s_gamma"
    assert [x.tool for x in from_beta.meta.attempts] == ["s_beta", "s_gamma"]


async def test_fallback_on_empty() -> None:
    a, ta = fake("a", [{"results": []}], provider="pa", read_only=True)
    _, tb = fake("b", [{"results": [1]}], provider="pb", read_only=True)
    retry = {"chain_order": ["pa", "pb"], "fallback_on_empty": True}
    async with kernel([ta, tb], retry=retry) as k:
        res = await k.call("a", {})
    assert res.content == {"results": [1]} and res.meta.served_by == "b"
    assert [x.error_kind for x in res.meta.attempts] == ["unavailable", None]
    assert len(a.calls) == 1  # an empty result is not retried on the same provider

    a, ta = fake("a", [{"results": []}], provider="pa", read_only=True)
    _b, tb = fake("b", [{"results": []}], provider="pb", read_only=True)
    async with kernel([ta, tb], retry=retry) as k:
        res = await k.call("a", {})
    assert not res.is_error and res.content == {"results": []}
    assert res.meta.served_by == "a" and res.meta.extra["recovered"] == "fallback_on_empty"
    # the recovered result is a's: b's attempt keeps its own provider, served_by names a's
    assert [d["provider"] for d in res.meta.extra["attempt_details"]] == ["pa", "pb"]
    assert res.meta.extra["served_by"] == {"tool": "a", "provider": "pa"}

    assert (
        is_empty(None)
        and is_empty({})
        and is_empty({"results": [], "x": 1})
        and not is_empty({"x": 0})
    )


async def test_an_empty_result_stands_when_the_retry_budget_is_spent() -> None:
    # The budget stops the fallback, but the empty answer the tool computed is returned
    # (before: the call failed with "returned an empty result", the result dropped).
    _a, ta = fake("a", [{"results": []}], provider="pa", read_only=True)
    b, tb = fake("b", [{"results": [1]}], provider="pb", read_only=True)
    retry = {
        "chain_order": ["pa", "pb"],
        "fallback_on_empty": True,
        "budget": {"burst": 1, "ratio": 0.0, "min_per_s": 0.0},
    }
    async with kernel([ta, tb], retry=retry) as k:
        first = await k.call("a", {})
        second = await k.call("a", {})
    assert first.meta.served_by == "b" and len(b.calls) == 1  # the one token
    assert not second.is_error and second.content == {"results": []}
    assert second.meta.served_by == "a" and second.meta.extra["recovered"] == "fallback_on_empty"
    assert second.meta.extra["attempt_details"][0]["decision"] == "recover"
    assert "to" not in second.meta.extra["attempt_details"][0]


async def test_fallback_on_empty_is_off_by_default() -> None:
    _a, ta = fake("a", [{"results": []}], provider="pa", read_only=True)
    b, tb = fake("b", [{"results": [1]}], provider="pb", read_only=True)
    async with kernel([ta, tb], retry={"chain_order": ["pa", "pb"]}) as k:
        res = await k.call("a", {})
    assert res.content == {"results": []} and len(b.calls) == 0


async def test_request_timeout_applies_to_tools_without_their_own() -> None:
    @tool(read_only=True)
    async def a(ctx: CallContext) -> dict[str, Any]:
        """Reports the attempt timeout it runs under."""
        return {"timeout": ctx.attempt_timeout_s}

    @tool(read_only=True, timeout=9.0)
    async def b(ctx: CallContext) -> dict[str, Any]:
        """Has its own timeout."""
        return {"timeout": ctx.attempt_timeout_s}

    ta, tb = build_tool(a), build_tool(b)
    async with kernel([ta, tb], retry={"request_timeout_seconds": 2.5}) as k:
        assert (await k.call("a", {})).content == {"timeout": 2.5}
        assert (await k.call("b", {})).content == {"timeout": None}  # its own 9 s applies
    # The Tool objects are not changed: another kernel sharing them sees no retry timeout.
    assert ta.timeout_s is None and tb.timeout_s == 9.0
    async with Kernel(tools=[ta]) as other:
        assert (await other.call("a", {})).content == {"timeout": None}


class FirstAttemptTimeout:
    """Like profiling's adaptive timeouts: a timeout for the first attempt only."""

    name, order = "first-attempt-timeout", 100

    @hookimpl
    def before_call(self, ctx: CallContext) -> None:
        ctx.attempt_timeout_s = 0.05

    @hookimpl
    def on_error(self, ctx: CallContext) -> None:
        ctx.attempt_timeout_s = None  # retries: back to the tool's own timeout


async def test_a_retry_runs_under_request_timeout_after_another_plugins_timeout() -> None:
    # Before: the plugin that set the first attempt's timeout dropped it, and the retry
    # ran with no timeout at all (a provider that never answers hung the call).
    seen: list[float | None] = []

    @tool(read_only=True)
    async def hangs(ctx: CallContext) -> dict[str, Any]:
        """Never answers."""
        seen.append(ctx.attempt_timeout_s)
        await anyio.sleep(3600)
        return {}

    k = Kernel(
        tools=[hangs],
        plugins=[
            FirstAttemptTimeout(),
            RateLimitPlugin(),
            RetryPlugin(RetryConfig(request_timeout_seconds=0.1, base_s=0.0, seed=1)),
        ],
    )
    async with k:
        with anyio.fail_after(5):
            res = await k.call("hangs", {})
    assert res.error is not None and res.error.kind == "timeout"
    assert seen == [0.05, 0.1]
    assert [a.error_kind for a in res.meta.attempts] == ["timeout", "timeout"]


async def test_fallback_on_empty_leaves_shared_tools_alone() -> None:
    """Another kernel using the same Tool objects without retry gets the empty result."""
    _a, ta = fake("a", [{"results": []}, {"results": []}], provider="pa", read_only=True)
    _b, tb = fake("b", [{"results": [1]}], provider="pb", read_only=True)
    executor = ta.executor
    async with kernel(
        [ta, tb], retry={"chain_order": ["pa", "pb"], "fallback_on_empty": True}
    ) as k:
        assert (await k.call("a", {})).content == {"results": [1]}
    assert ta.executor is executor
    async with Kernel(tools=[ta]) as other:
        res = await other.call("a", {})
    assert not res.is_error and res.content == {"results": []}


async def test_retries_can_be_switched_off_per_tool_and_the_kernel_caps_attempts() -> None:
    ft, t = fake("busy", [BUSY], read_only=True)
    async with kernel([t], retry={"tools": {"busy": {"retry": False}}}) as k:
        res = await k.call("busy", {})
    assert len(ft.calls) == 1
    # the error says why it was not retried, as every give-up does
    assert res.error is not None and res.error.details["gave_up"] == "retries are off for this tool"
    ft, t = fake("busy", [BUSY], read_only=True)
    async with kernel(
        [t], retry={"max_provider_attempts": 10, "max_attempts": 10}, max_attempts=3
    ) as k:
        res = await k.call("busy", {})
    assert len(ft.calls) == 3 and res.error is not None


async def test_policy_layers() -> None:
    rl = RateLimitPlugin(
        RateLimitConfig.model_validate(
            {
                "max_provider_attempts": 5,
                "request_timeout_seconds": 4,
                "providers": {"p": {"tools": ["t"], "max_provider_attempts": 3}},
            }
        )
    )
    plugin = RetryPlugin(
        RetryConfig.model_validate({"request_timeout_seconds": 6, "tools": {"t": {"cap_s": 1}}})
    )
    pol = plugin.policy("t", "p", rl)
    assert (pol["max_provider_attempts"], pol["request_timeout_seconds"], pol["cap_s"]) == (3, 6, 1)
    assert plugin.policy("u", None, rl)["max_provider_attempts"] == 5
    assert plugin.policy("u", None, None)["max_provider_attempts"] == 2


async def test_defaults_from_entry_points_with_no_config(tmp_path: Path) -> None:
    cfg = load_config(
        tmp_path / "none.toml", env={"TOOLWIRE_LOAD_PLUGINS": "ratelimit,retry"}, required=False
    )
    k = Kernel.from_config(cfg, clock=FakeClock())
    busy, tb = fake("busy", [BUSY], read_only=True)
    boom, tx = fake("boom", [ToolError("bad request", status=500)], read_only=True)
    k.add_tool(tb)
    k.add_tool(tx)
    async with k:
        assert [p.name for p in k.plugins.ordered()] == ["ratelimit", "retry"]
        r1 = await k.call("busy", {})
        r2 = await k.call("boom", {})
    assert len(busy.calls) == 2 and r1.error is not None and r1.error.kind == "unavailable"
    assert len(boom.calls) == 1 and r2.error is not None and r2.error.kind == "tool_error"


async def test_retry_config_file_and_aggregation_keys_from_ratelimit(tmp_path: Path) -> None:
    (tmp_path / "resilience.yaml").write_text(
        "chain_order: [pa, pb]\nmax_provider_attempts: 1\nbackends:\n"
        "  pa: {tools: [a]}\n  pb: {tools: [b]}\n"
    )
    (tmp_path / "retry.yaml").write_text("base_s: 0\ntools:\n  a: {cap_s: 5}\n")
    (tmp_path / "toolwire.toml").write_text(
        '[plugins.ratelimit]\nconfig_file = "resilience.yaml"\n'
        '[plugins.retry]\nconfig_file = "retry.yaml"\nseed = 1\n'
    )
    cfg = load_config(tmp_path / "toolwire.toml", env={"TOOLWIRE_LOAD_PLUGINS": "ratelimit,retry"})
    k = Kernel.from_config(cfg, clock=FakeClock())
    a, ta = fake("a", [BUSY], read_only=True)
    _b, tb = fake("b", [{"ok": "b"}], read_only=True)
    k.add_tool(ta)
    k.add_tool(tb)
    async with k:
        retry = next(p.plugin for p in k.plugins.ordered() if p.name == "retry")
        assert isinstance(retry, RetryPlugin) and retry.config.tools["a"].cap_s == 5
        res = await k.call("a", {})
    assert res.meta.served_by == "b" and len(a.calls) == 1

    (tmp_path / "retry.yaml").write_text("base: 0\n")
    k2 = Kernel.from_config(
        load_config(tmp_path / "toolwire.toml", env={"TOOLWIRE_LOAD_PLUGINS": "ratelimit,retry"})
    )
    from toolwire import ConfigError

    with pytest.raises(ConfigError, match=r"retry\.yaml.*base: unknown key"):
        await k2.start()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_backoff_and_retry_on_each_loop(state: str, tmp_path: Path) -> None:
    clock = FakeClock()
    ft, t = fake("busy", [BUSY, BUSY, {"ok": 1}], read_only=True, provider="p")
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    pol = {"base_s": 1.0, "cap_s": 3.0, "max_provider_attempts": 3}
    async with kernel([t], retry=pol, clock=clock, state=url) as k:
        res = await k.call("busy", {})
    assert not res.is_error and res.content == {"ok": 1} and len(ft.calls) == 3
    rng = random.Random(3)  # the policy's seed: full jitter, uniform(0, min(cap, base * 2**n))
    assert clock.sleeps == pytest.approx([rng.uniform(0, min(3.0, 2.0**n)) for n in (0, 1)])
    assert [a.decision for a in res.meta.attempts] == ["retry", "retry", None]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(free_tcp_port: int) -> None:
    """redis.asyncio runs on asyncio only: the kernel says so when it starts (no hang, no
    traceback from inside redis-py), and nothing runs."""
    ft, t = fake("busy", [{"ok": 1}], read_only=True, provider="p")
    k = kernel([t], state=f"redis://127.0.0.1:{free_tcp_port}/0")
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await k.call("busy", {})
    assert ft.calls == []


async def test_our_own_outbound_rate_is_waited_out_not_rotated() -> None:

    calls: list[str | None] = []

    @tool(read_only=True, provider="p")
    async def limited(ctx: CallContext) -> dict[str, Any]:
        """Limited."""
        async with lease_key(ctx, "p") as key:
            calls.append(key.alias)
            return {"ok": True}

    clock = FakeClock()
    rl = {
        "providers": {
            "p": {
                "keys": [
                    {"alias": "k1", "secret": "secret-k1-0000"},
                    {"alias": "k2", "secret": "secret-k2-0000"},
                ],
                "rate": {"requests": 1, "per_seconds": 2, "mode": "fail_fast"},
            }
        }
    }
    async with kernel([], rl=rl, clock=clock) as k:
        k.add_tool(limited)
        assert not (await k.call("limited", {})).is_error
        res = await k.call("limited", {})
    assert not res.is_error and calls == ["k1", "k2"]
    assert clock.sleeps == [pytest.approx(2.0)]
    assert res.meta.extra["attempt_details"][0]["pattern"] == "outbound.providers.p"


async def test_a_kind_the_tool_chose_is_left_alone_and_does_not_hurt_the_key() -> None:

    @tool(read_only=True, provider="p")
    async def misconfigured(ctx: CallContext) -> dict[str, Any]:
        """Fails with a config error on a 403."""
        async with lease_key(ctx, "p"):
            raise ToolError(
                "JSON output is disabled on this instance", kind="config_error", status=403
            )

    rl = {"providers": {"p": {"keys": [{"alias": "k1", "secret": "secret-k1-0000"}]}}}
    async with kernel([], rl=rl) as k:
        k.add_tool(misconfigured)
        res = await k.call("misconfigured", {})
        av = await key_pool(k, "p").availability()
    assert res.error is not None and res.error.kind == "config_error" and not res.error.retryable
    assert len(res.meta.attempts) == 1 and av.available


@pytest.mark.parametrize("where", ["global", "tool"])
def test_an_infinite_first_backoff_step_is_refused(where: str) -> None:
    """Before: base_s = inf passed; every retry then slept cap_s, and with cap_s = inf no
    retry ran at all, silently. (cap_s, max_elapsed_s and the timeouts may be inf: no cap.)"""
    import pydantic

    raw: dict[str, Any] = {"base_s": float("inf")}
    with pytest.raises(pydantic.ValidationError, match="base_s"):
        RetryConfig(**raw) if where == "global" else RetryConfig(tools={"a": raw})
    RetryConfig(cap_s=float("inf"), max_elapsed_s=float("inf"), request_timeout_seconds=1e300)
