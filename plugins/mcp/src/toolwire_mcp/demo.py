"""A tiny upstream MCP server for trying the gateway: ``python -m toolwire_mcp.demo``.

It speaks MCP over stdio (or Streamable HTTP with ``--http PORT``) and offers
three tools: ``forecast`` (structured result), ``report`` (progress
notifications) and ``alert`` (always fails, to show error results).
``examples/toolwire.toml`` fronts it.
"""

from __future__ import annotations

import sys

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp_types import ToolAnnotations

__all__ = ["mcp"]

mcp = FastMCP("toolwire-demo-weather")

_SKIES = ("clear", "cloudy", "rain", "snow", "fog")


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def forecast(city: str, days: int = 1) -> dict[str, object]:
    """Weather forecast for a city (made up, deterministic).

    Args:
        city: City name, e.g. "Lyon".
        days: How many days ahead (1-7).
    """
    if not 1 <= days <= 7:
        raise ToolError("days must be between 1 and 7")
    sky = [_SKIES[(sum(map(ord, city)) + d) % len(_SKIES)] for d in range(days)]
    return {"city": city, "days": days, "sky": sky}


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
async def report(city: str, ctx: Context) -> str:
    """A weather report built in three steps (sends progress notifications).

    Args:
        city: City name.
    """
    for i, step in enumerate(("fetching", "analysing", "writing"), 1):
        await ctx.report_progress(i, 3, f"{step} ({city})")
    return f"Report for {city}: mild, light wind."


@mcp.tool
def alert(region: str) -> str:
    """Weather alerts for a region (this demo service is always down).

    Args:
        region: Region name.
    """
    raise ToolError(f"alert service unavailable for {region!r}; try again later")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False)
    else:
        mcp.run(transport="stdio", show_banner=False)
