"""Kernel overhead per call, measured against baselines run in the same process.

Prints µs per call (best of several rounds) and the ratio to a direct ``await``
of the tool, for:

- direct: ``await tool(a=1, b=2)``
- floor: a hand-written minimal pipeline (dict lookup, a context object, await)
- kernel, no plugins (argument validation included), without / with a timeout
- kernel with 5 and 10 no-op plugins, sync hooks and async hooks

Targets (issue #2, 2-core machine): no plugins <= 4 µs without a timeout and
<= 10 µs with one; 10 no-op async plugins <= 8 µs without a timeout.

Run: ``uv run python bench/kernel_overhead.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolwire import Kernel, ToolCall, ToolResult, hookimpl, tool


@tool
async def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


def make_plugin(i: int, asynchronous: bool) -> object:
    if asynchronous:

        class AsyncNoop:
            name = f"noop{i}"
            order = i

            @hookimpl
            async def before_call(self, call: ToolCall) -> None:
                return None

            @hookimpl
            async def after_call(self, result: ToolResult) -> None:
                return None

        return AsyncNoop()

    class SyncNoop:
        name = f"noop{i}"
        order = i

        @hookimpl
        def before_call(self, call: ToolCall) -> None:
            return None

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            return None

    return SyncNoop()


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


class _Ctx:
    __slots__ = ("args", "name")

    def __init__(self, name: str, args: dict[str, Any]) -> None:
        self.name = name
        self.args = args


async def main(calls: int, rounds: int) -> None:
    args = {"a": 1, "b": 2}
    registry = {"add": add}

    async def direct() -> Any:
        return await add(a=1, b=2)

    async def floor() -> Any:
        fn = registry["add"]
        ctx = _Ctx("add", dict(args))
        return await fn(**ctx.args)

    rows: list[tuple[str, float, float | None]] = []
    base = await measure(direct, calls, rounds)
    rows.append(("direct await of the tool", base, None))
    rows.append(("floor: minimal hand-written pipeline", await measure(floor, calls, rounds), None))

    k = Kernel(tools=[add])
    await k.start()
    r = await k.call("add", args)
    assert r.content == {"sum": 3}, r
    rows.append(
        ("kernel, no plugins", await measure(lambda: k.call("add", args), calls, rounds), 4.0)
    )

    kt = Kernel(tools=[add], default_timeout_s=30)
    await kt.start()
    rows.append(
        (
            "kernel, no plugins, with timeout",
            await measure(lambda: kt.call("add", args), calls, rounds),
            10.0,
        )
    )

    for n in (5, 10):
        for asynchronous in (False, True):
            kp = Kernel(tools=[add], plugins=[make_plugin(i, asynchronous) for i in range(n)])
            await kp.start()
            label = f"kernel, {n} no-op {'async' if asynchronous else 'sync'} plugins"
            target = 8.0 if (n == 10 and asynchronous) else None
            rows.append(
                (label, await measure(lambda kp=kp: kp.call("add", args), calls, rounds), target)
            )

    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  {'µs/call':>8}  {'x direct':>8}  target")
    for label, us, target in rows:
        verdict = (
            "" if target is None else (f"<= {target:g} µs " + ("OK" if us <= target else "MISSED"))
        )
        print(f"{label:<{width}}  {us:8.2f}  {us / base:8.2f}  {verdict}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ns = ap.parse_args()
    asyncio.run(main(ns.calls, ns.rounds))
