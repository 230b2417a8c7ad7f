"""One process of a fleet: N calls through a kernel with the profiling plugin, then exit.

Usage: python _fleet_worker.py STATE_URL KEY_PREFIX CALLS
"""

from __future__ import annotations

import sys

import anyio

from toolwire import Kernel, ToolError, tool
from toolwire_profiling import ProfilingConfig, ProfilingPlugin


@tool
async def work(n: int) -> dict[str, int]:
    """Pretend to work; every 10th call fails."""
    if n % 10 == 9:
        raise ToolError("busy", kind="unavailable")
    return {"n": n}


async def main(url: str, prefix: str, calls: int) -> None:
    p = ProfilingPlugin(
        ProfilingConfig(key_prefix=prefix, flush_interval_s=0.01, tracing="off", metrics="off")
    )
    async with Kernel(tools=[work], plugins=[p], state=url) as k:
        for i in range(calls):
            await k.call("work", {"n": i})
            if i % 50 == 0:
                await anyio.sleep(0.005)  # let the background flusher run now and then


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
