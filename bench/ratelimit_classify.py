"""Rate-limit classification on hostile input, KeyPool leases, and the plugins' happy-path cost.

Prints, per input, the median and worst time of ``RateLimitPlugin.classify``
(issue #5 target: every input, hostile ones included, under 10 ms); the cost
of a KeyPool lease (acquire + success) on the memory and SQLite stores; and
the per-call overhead of the ratelimit + retry plugins on a call that
succeeds, against the bare kernel.

Run: ``uv run python bench/ratelimit_classify.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from toolwire import Kernel, ToolError, tool
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin, key_pool
from toolwire_retry import RetryPlugin

TARGET_MS = 10.0


def inputs() -> dict[str, BaseException]:
    nested: dict[str, Any] = {"error": "too many requests"}
    for _ in range(50_000):
        nested = {"n": nested}
    brave = {
        "type": "ErrorResponse",
        "error": {
            "status": 429,
            "detail": "Request rate limit exceeded for plan",
            "meta": {"quota_limit": 2000, "quota_current": 2000},
            "code": "RATE_LIMITED",
        },
    }
    html = (
        b"<html><body>"
        + b"<div class='x'>temporarily unavailable</div>" * 120_000
        + b"</body></html>"
    )
    return {
        "429 JSON (Brave quota)": ToolError("rate limited", status=429, details={"body": brave}),
        "401 text": ToolError("Invalid API key", status=401, details={"body": "Invalid API key"}),
        "unmatched 500": ToolError("boom", status=500, details={"body": "internal error"}),
        "5 MB HTML page": ToolError("bad gateway", status=502, details={"body": html}),
        "invalid UTF-8 (1 MB)": ToolError(
            "x", status=503, details={"body": b"\xff\xfe\x80rate" * 250_000}
        ),
        "nested JSON text (400 KB)": ToolError(
            "x", status=503, details={"body": b"[" * 200_000 + b"]" * 200_000}
        ),
        "nested dict (50k levels)": ToolError("x", status=429, details={"body": nested}),
        "ReDoS 'aaaa...!' (1 MB)": ToolError(
            "a" * 1_000_000 + "!", status=400, details={"body": "a" * 1_000_000 + "!"}
        ),
        "ReDoS 'rate rate ...' (1 MB)": ToolError(
            "x", status=400, details={"body": "rate " * 200_000}
        ),
        "5 MB message": ToolError("x" * 5_000_000 + " too many requests", status=500),
    }


def bench_classify(runs: int) -> bool:
    plugin = RateLimitPlugin()
    ok = True
    print(f"classify (median / worst of {runs} runs, ms; target < {TARGET_MS} ms)")
    for name, exc in inputs().items():
        times = []
        first = plugin.classify(exc)
        for _ in range(runs):
            t0 = time.perf_counter()
            c = plugin.classify(exc)
            times.append((time.perf_counter() - t0) * 1000)
            assert c == first, "classification is not deterministic"
        worst = max(times)
        ok &= worst < TARGET_MS
        flag = "" if worst < TARGET_MS else "  <-- over target"
        print(
            f"  {name:28s} {statistics.median(times):7.3f} / {worst:7.3f}   -> {first.kind} ({first.pattern}){flag}"
        )
    return ok


async def bench_pool(n: int) -> None:
    cfg = RateLimitConfig.model_validate(
        {
            "providers": {
                "p": {
                    "keys": [
                        {"alias": "a", "secret": "secret-aaaaaa", "weight": 3},
                        {"alias": "b", "secret": "secret-bbbbbb"},
                    ]
                }
            }
        }
    )
    with tempfile.TemporaryDirectory() as d:
        for url in ("memory://", f"sqlite:///{Path(d) / 's.db'}"):
            async with Kernel(state=url, plugins=[RateLimitPlugin(cfg)]) as k:
                pool = key_pool(k, "p")
                t0 = time.perf_counter()
                for _ in range(n):
                    lease = await pool.acquire()
                    await lease.success()
                us = (time.perf_counter() - t0) / n * 1e6
            print(f"  KeyPool lease on {url.split(':')[0]:6s}: {us:8.1f} µs per acquire + success")


@tool
async def add(a: int, b: int) -> dict[str, int]:
    """Add."""
    return {"sum": a + b}


async def per_call(kernel: Kernel, n: int) -> float:
    async with kernel:
        for _ in range(200):
            await kernel.call("add", {"a": 1, "b": 2})
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                await kernel.call("add", {"a": 1, "b": 2})
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


async def bench_overhead(n: int) -> None:
    bare = await per_call(Kernel(tools=[add]), n)
    both = await per_call(Kernel(tools=[add], plugins=[RateLimitPlugin(), RetryPlugin()]), n)
    print(f"  kernel.call, no plugins:        {bare:6.2f} µs")
    print(f"  kernel.call, ratelimit + retry: {both:6.2f} µs  (+{both - bare:.2f} µs on a success)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args()
    ok = bench_classify(args.runs)
    print("key pools")
    asyncio.run(bench_pool(2_000))
    print("happy-path overhead (best of 5)")
    asyncio.run(bench_overhead(args.calls))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
