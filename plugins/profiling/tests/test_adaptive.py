"""Opt-in adaptive timeouts: the first attempt runs under estimate x factor."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolwire import ErrorInfo, Kernel, Retry, hookimpl, tool
from toolwire_profiling import AdaptiveTimeoutsConfig, ProfilingConfig, ProfilingPlugin

pytestmark = pytest.mark.anyio

DELAYS: list[float] = []


@tool
async def fetch(page: int) -> dict[str, int]:
    """Sleep for the next scripted delay."""
    await anyio.sleep(DELAYS.pop(0) if DELAYS else 0.0)
    return {"page": page}


class RetryTimeouts:
    name, order = "retry-timeouts", 500

    @hookimpl
    def on_error(self, error: ErrorInfo) -> Retry | None:
        return Retry() if error.kind == "timeout" else None


def plugin(**adaptive: Any) -> ProfilingPlugin:
    ad = {"enabled": True, "factor": 3.0, "min_s": 0.05, "max_s": 5.0, "min_samples": 5, **adaptive}
    p = ProfilingPlugin(
        ProfilingConfig(
            tracing="off", metrics="off", adaptive_timeouts=AdaptiveTimeoutsConfig(**ad)
        )
    )
    for _ in range(10):
        p.record_execution("fetch", 10.0, {"page": 1})  # history: 10 ms
    return p


async def test_a_slow_call_is_cut_at_estimate_times_factor() -> None:
    p = plugin()
    DELAYS[:] = [1.0]
    async with Kernel(tools=[fetch], plugins=[p]) as k:
        with anyio.fail_after(0.8):
            r = await k.call("fetch", {"page": 1})
    assert r.error is not None and r.error.kind == "timeout"
    assert r.error.details["adaptive_timeout_s"] == 0.05  # 10 ms x 3 = 30 ms, raised to min_s
    extra = r.meta.extra["profiling"]
    assert extra["adaptive_timeout_s"] == 0.05 and extra["basis"] == "similar"
    assert abs(extra["estimate_ms"] - 10) <= 0.1 and extra["samples"] == 10
    assert r.meta.attempts[0].duration_ms < 500


async def test_fast_calls_are_untouched_and_the_estimate_bounds_apply() -> None:
    p = plugin(min_s=0.2, factor=100)
    DELAYS[:] = [0.0]
    async with Kernel(tools=[fetch], plugins=[p]) as k:
        r = await k.call("fetch", {"page": 1})
    assert not r.is_error
    # 10 ms x 100 (the estimate is within the sketch's 1 %)
    assert r.meta.extra["profiling"]["adaptive_timeout_s"] == pytest.approx(1.0, rel=0.01)
    q = plugin(max_s=0.07, factor=100)
    async with Kernel(tools=[fetch], plugins=[q]) as k:
        r = await k.call("fetch", {"page": 1})
    assert r.meta.extra["profiling"]["adaptive_timeout_s"] == 0.07


async def test_a_tighter_caller_deadline_wins() -> None:
    p = plugin(min_s=1.0)
    DELAYS[:] = [0.5]
    async with Kernel(tools=[fetch], plugins=[p]) as k:
        r = await k.call("fetch", {"page": 1}, timeout=0.05)
    assert r.error is not None and r.error.kind == "timeout"
    assert "profiling" not in r.meta.extra and "adaptive_timeout_s" not in r.error.details


async def test_retries_get_the_callers_deadline_back() -> None:
    p = plugin()
    DELAYS[:] = [1.0, 0.15]  # the retry is slower than the adaptive timeout, but succeeds
    async with Kernel(tools=[fetch], plugins=[p, RetryTimeouts()]) as k:
        r = await k.call("fetch", {"page": 1}, timeout=5)
    assert not r.is_error, r.error
    assert [a.error_kind for a in r.meta.attempts] == ["timeout", None]
    assert r.meta.attempts[1].duration_ms >= 140


async def test_no_adaptive_timeout_without_history_or_outside_the_tool_list() -> None:
    fresh = ProfilingPlugin(
        ProfilingConfig(
            tracing="off", metrics="off", adaptive_timeouts=AdaptiveTimeoutsConfig(enabled=True)
        )
    )
    DELAYS[:] = [0.0]
    async with Kernel(tools=[fetch], plugins=[fresh]) as k:
        r = await k.call("fetch", {"page": 1})
    assert "profiling" not in r.meta.extra
    other = plugin(tools=["something_else"])
    async with Kernel(tools=[fetch], plugins=[other]) as k:
        r = await k.call("fetch", {"page": 1})
    assert "profiling" not in r.meta.extra


async def test_disabled_by_default() -> None:
    p = ProfilingPlugin(ProfilingConfig(tracing="off", metrics="off"))
    for _ in range(50):
        p.record_execution("fetch", 1.0)
    DELAYS[:] = [0.1]
    async with Kernel(tools=[fetch], plugins=[p]) as k:
        r = await k.call("fetch", {"page": 1})
    assert not r.is_error and "profiling" not in r.meta.extra


@tool(timeout=0.05)
async def bounded(page: int) -> dict[str, int]:
    """Sleep for the next scripted delay; the operator allows it 50 ms."""
    await anyio.sleep(DELAYS.pop(0) if DELAYS else 0.0)
    return {"page": page}


@pytest.mark.parametrize("where", ["tool", "kernel"])
async def test_the_adaptive_timeout_never_loosens_a_configured_one(where: str) -> None:
    """Before: estimate x factor (bounded below by min_s) replaced the tool's own
    ``timeout`` or the kernel's ``default_timeout_s`` even when it was longer: a tool
    its operator allowed 50 ms ran for up to min_s (here 1 s), 20 times as long."""
    p = plugin(min_s=1.0)
    for _ in range(10):
        p.record_execution("bounded", 10.0, {"page": 1})
    DELAYS[:] = [3.0]
    if where == "tool":
        k = Kernel(tools=[bounded], plugins=[p])
    else:
        k = Kernel(tools=[fetch], plugins=[p], default_timeout_s=0.05)
    async with k:
        with anyio.fail_after(2.5):  # not cut at all: a hang, not a wrong timeout
            r = await k.call("bounded" if where == "tool" else "fetch", {"page": 1})
    assert r.error is not None and r.error.kind == "timeout"
    # Cut by the configured 50 ms, not by the 1 s adaptive timeout.
    assert "adaptive_timeout_s" not in r.error.details
    assert "profiling" not in r.meta.extra
