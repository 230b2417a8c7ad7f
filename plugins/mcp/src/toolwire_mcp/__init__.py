"""toolwire-mcp (work in progress)."""

from __future__ import annotations


class MCPPlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "mcp"
    order = 900
