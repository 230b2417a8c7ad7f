"""Client-side CPU per ``tools/call`` of an upstream MCP server: the FastMCP client vs the direct path.

One bare FastMCP server with the ``echo`` tool (``bench/mcp_gateway.py``'s
(a)) runs in a subprocess; this process calls it, sequentially, with:

- the FastMCP client (``Client.call_tool_mcp``),
- the direct caller alone (``_direct.DirectCaller.call_tool``),
- ``Kernel.call`` of the upstream tool through the ``mcp`` plugin, with
  ``direct_http_calls`` false (the FastMCP client) and true (the direct path).

Each figure is this process's CPU (``time.process_time``) per call over
``--calls`` sequential calls, best of ``--rounds`` rounds: the server's CPU
is not in it, so the machine's load moves it less than latency. Prints the
figures and the ratio of the direct path to the FastMCP client.

Run: ``uv run python bench/mcp_client_cpu.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastmcp import Client
from mcp_gateway import ARGS, EXPECTED, free_port, start_bare, stop, wait_http

from toolwire import Kernel
from toolwire_mcp import MCPConfig, MCPPlugin
from toolwire_mcp._direct import DirectCaller


async def cpu_per_call(call: Callable[[], Awaitable[Any]], calls: int, rounds: int) -> float:
    """Best-of-``rounds`` CPU seconds per call, after a warm-up."""
    for _ in range(50):
        await call()
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            await call()
        best = min(best, (time.process_time() - start) / calls)
    return best


async def measure(url: str, calls: int, rounds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with Client(url, timeout=30) as client:

        async def fastmcp_call() -> None:
            r = await client.call_tool_mcp("echo", ARGS)
            assert r.structured_content == EXPECTED, r

        out["FastMCP Client.call_tool_mcp"] = await cpu_per_call(fastmcp_call, calls, rounds)

    caller = DirectCaller(
        server="bare",
        url=url,
        protocol_version="2026-07-28",
        headers={},
        auth=None,
        timeout_s=None,
        on_list_changed=lambda: None,
    )
    try:

        async def direct_call() -> None:
            r = await caller.call_tool("echo", ARGS, meta=None, progress=None)
            assert getattr(r, "structuredContent", None) == EXPECTED, r

        out["DirectCaller.call_tool"] = await cpu_per_call(direct_call, calls, rounds)
    finally:
        await caller.close()

    for direct in (False, True):
        cfg = MCPConfig.model_validate(
            {
                "servers": {"bare": {"url": url}},
                "name_template": "{tool}",
                "direct_http_calls": direct,
            }
        )
        async with Kernel(plugins=[MCPPlugin(cfg)]) as kernel:

            async def kernel_call() -> None:
                r = await kernel.call("echo", ARGS)
                assert r.content == EXPECTED, r.error

            key = f"Kernel.call, direct_http_calls = {str(direct).lower()}"
            out[key] = await cpu_per_call(kernel_call, calls, rounds)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000, help="calls per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the best counts")
    args = p.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = start_bare(port)
    try:
        asyncio.run(wait_http(url))
        figures = asyncio.run(measure(url, args.calls, args.rounds))
    finally:
        stop(server)
    print(f"{'caller':<44}{'CPU ms/call':>12}")
    for name, s in figures.items():
        print(f"{name:<44}{s * 1e3:>12.3f}")
    slow = figures["FastMCP Client.call_tool_mcp"]
    fast = figures["DirectCaller.call_tool"]
    print(f"direct caller / FastMCP client: {fast / slow:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
