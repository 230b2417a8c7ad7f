"""An upstream on the MCP SDK's own ``MCPServer`` over Streamable HTTP (``--http PORT``).

Unlike FastMCP 4, it serves ``subscriptions/listen`` (2026-07-28): ``grow``
adds a tool and publishes ``tools/list_changed`` to every listening client,
not only on the stream of the call that made the change.
"""

from __future__ import annotations

import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer

server: MCPServer = MCPServer("sdk-upstream", log_level="WARNING")


@server.tool()
def forecast(city: str) -> str:
    """Get the forecast for a city."""
    return f"sunny in {city}"


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool called ``name`` and tells the listening clients."""

    def extra() -> str:
        return f"I am {name}"

    server.add_tool(extra, name=name, description="A tool added at runtime.")
    await ctx.notify_tools_changed()
    return f"added {name}"


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--http") + 1])
    anyio.run(lambda: server.run_streamable_http_async(host="127.0.0.1", port=port))
