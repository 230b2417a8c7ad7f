"""Exceptions the kernel raises (as opposed to error *results*)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._types import ToolResult

__all__ = [
    "ConfigError",
    "KernelError",
    "PluginError",
    "ToolCallError",
    "ToolCollisionError",
]


class KernelError(Exception):
    """Base class of the exceptions the kernel raises."""


class ConfigError(KernelError):
    """Invalid configuration. The message names the file and the key."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        where = ""
        if file and key:
            where = f"{file}: {key}: "
        elif file:
            where = f"{file}: "
        elif key:
            where = f"{key}: "
        super().__init__(where + message)
        self.file = file
        self.key = key
        #: The message without its ``file: key:`` prefix.
        self.detail = message


class PluginError(KernelError):
    """A plugin could not be loaded or configured. The message names the plugin."""

    def __init__(self, plugin: str, message: str) -> None:
        super().__init__(f"plugin {plugin!r}: {message}")
        self.plugin = plugin


class ToolCollisionError(KernelError):
    """Two tool sources contributed the same tool name."""

    def __init__(self, name: str, first: str, second: str, *, hint: str | None = None) -> None:
        self.name = name
        self.sources = (first, second)
        if hint is not None:  # the caller knows better what to do (e.g. add_tool)
            super().__init__(f"tool name {name!r}: {hint}")
            return
        hints = []
        for source in (first, second):
            kind, _, rest = source.partition(":")
            if kind == "mcp" and rest:  # an upstream MCP server of the mcp plugin
                hint = (
                    f"`namespace` of [plugins.mcp.servers.{rest}] (or [plugins.mcp] name_template)"
                )
            else:
                hint = "tools.modules = [{module = ..., namespace = ...}]"
            if hint not in hints:
                hints.append(hint)
        super().__init__(
            f"tool name {name!r} is provided by both source {first!r} and source {second!r}; "
            f"give one of them a namespace (e.g. {' or '.join(hints)}) "
            f"or exclude the tool from one source"
        )
        self.name = name
        self.sources = (first, second)


class ToolCallError(KernelError):
    """Raised by ``ToolResult.raise_for_error()`` for an error result."""

    def __init__(self, result: ToolResult) -> None:
        err = result.error
        kind = err.kind if err else "internal"
        msg = err.message if err else "error result"
        super().__init__(f"{kind}: {msg}")
        self.result = result
        self.kind = kind
