"""A small, real FastMCP server the tests use as an upstream (stdio, or HTTP with --http PORT).

Tools: ``forecast`` (text), ``stats`` (structured), ``fail`` (ToolError),
``limited`` (a rate-limit error in words), ``steps`` (progress notifications),
``crash`` (the process dies mid-call), ``grow`` (adds a tool and announces
``tools/list_changed``), ``seen_meta`` (echoes the request ``_meta``) and
``hidden`` (for include/exclude tests).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp_types import ToolAnnotations

mcp = FastMCP("upstream")


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def forecast(city: str) -> str:
    """Get the forecast for a city."""
    return f"sunny in {city}"


@mcp.tool
def stats(text: str, times: int = 1) -> dict[str, Any]:
    """Count words."""
    return {"words": len(text.split()) * times, "chars": len(text) * times}


@mcp.tool
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@mcp.tool
def limited() -> str:
    """Fails like a rate-limited API."""
    raise ToolError("Rate limit exceeded, slow down")


@mcp.tool
async def steps(n: int, ctx: Context) -> dict[str, int]:
    """Reports n progress steps."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1} of {n}")
    return {"steps": n}


@mcp.tool
def crash() -> str:
    """Kills the server process in the middle of the call."""
    sys.stderr.write("upstream: fatal: simulated crash\n")
    sys.stderr.flush()
    os._exit(3)


@mcp.tool
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool called ``name`` and tells the client the list changed."""

    def extra() -> str:
        return f"I am {name}"

    from fastmcp.tools import Tool

    mcp.add_tool(Tool.from_function(extra, name=name, description="A tool added at runtime."))
    await ctx.send_notification(mcp_types.ToolListChangedNotification())
    return f"added {name}"


@mcp.tool
def seen_meta(ctx: Context) -> dict[str, Any]:
    """Returns the request's _meta keys from toolwire."""
    rc = ctx.request_context
    meta = dict(rc.meta or {}) if rc is not None else {}
    return {"call_id": meta.get("io.toolwire/call-id")}


@mcp.tool
def hidden() -> str:
    """Excluded by some configs."""
    return "hidden"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False)
    else:
        mcp.run(transport="stdio", show_banner=False)
