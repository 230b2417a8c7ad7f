"""Exceptions the kernel raises (as opposed to error *results*)."""

from __future__ import annotations

import sys
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
    """Two tool sources contributed the same tool name.

    ``plugins`` pairs with ``sources``: the plugin whose ``discover`` listed each
    tool, None for a local tool (``add_tool``, ``[tools] modules``). The message
    says, for each source, how that source can give the tool another name. Built
    without ``plugins`` (None), the advice goes by the source strings alone.
    """

    def __init__(
        self,
        name: str,
        first: str,
        second: str,
        *,
        hint: str | None = None,
        plugins: tuple[str | None, str | None] | None = None,
    ) -> None:
        self.name = name
        self.sources = (first, second)
        self.plugins = plugins
        if hint is not None:  # the caller knows better what to do (e.g. add_tool)
            super().__init__(f"tool name {name!r}: {hint}")
            return
        super().__init__(
            f"tool name {name!r} is provided by both source {first!r} and source {second!r}; "
            "give it another name in one of them, or leave it out of one: "
            + collision_advice(name, self.sources, plugins)
        )


_UNKNOWN = object()  # who listed a tool is not known: go by its source alone


def collision_advice(
    name: str, sources: tuple[str, str], plugins: tuple[str | None, str | None] | None = None
) -> str:
    """For each of two sources claiming ``name``: how that source can rename its tool.

    ``plugins`` as in ``ToolCollisionError``. One clause per source,
    ``for source 'x', ...``, joined with ``; `` (one when both read the same).
    """
    parts: list[str] = []
    for i, source in enumerate(sources):
        by: object = _UNKNOWN if plugins is None else plugins[i]
        part = f"for source {source!r}, {_source_advice(name, source, by)}"
        if part not in parts:
            parts.append(part)
    return "; ".join(parts)


def _source_advice(name: str, source: str, by: object) -> str:
    """How ``source`` can give its tool ``name`` another name (``by``: the listing plugin,
    None for a local tool, ``_UNKNOWN``)."""
    kind, _, rest = source.partition(":")
    if by is None or (by is _UNKNOWN and source == "local"):
        if source in sys.modules:  # a module's tools carry its name
            return (
                f'give the module a namespace: tools.modules = [{{module = "{source}", '
                "namespace = ...}] (in code: add_tool(module, namespace=...))"
            )
        return "add it under another name: add_tool(..., name=...) or add_tool(..., namespace=...)"
    if kind == "mcp" and rest:  # an upstream MCP server of the mcp plugin
        return (
            f"set `namespace` of [plugins.mcp.servers.{rest}] (or [plugins.mcp] name_template), "
            "or leave the tool out with that server's `exclude`"
        )
    if kind == "a2a" and rest:  # an agent of the a2a plugin: its tools are agent_<nickname>
        return (
            f"give agent {rest!r} another `nickname` in [plugins.a2a] agents (its tools are "
            "agent_<nickname> and agent_<nickname>_task), or drop that agent"
        )
    if source == "search":
        return _search_advice(name)
    if isinstance(by, str):
        return (
            f"configure the tool names of plugin {by!r} (see its documentation), "
            "or remove one of the two"
        )
    return (
        "rename or namespace it where that source is set up (a tool module: tools.modules = "
        "[{module = ..., namespace = ...}]; a plugin: its tool-name settings), "
        "or remove one of the two"
    )


def _search_advice(name: str) -> str:
    """The search plugin's tool names are fixed: web_search, web_search_<backend>,
    search_<collection>."""
    if name.startswith("search_"):
        collection = name.removeprefix("search_")
        return (
            f"rename [plugins.search.collections.{collection}] "
            "(its tool is search_<collection name>)"
        )
    if name.startswith("web_search_"):
        backend = name.removeprefix("web_search_")
        table = backend if backend in ("brave", "exa", "searxng") else f"backends.{backend}"
        return (
            f"its name is fixed: turn backend {backend!r} off with "
            f"[plugins.search.{table}] enabled = false"
        )
    return "web_search is a fixed name of the search plugin: rename the other tool"


class ToolCallError(KernelError):
    """Raised by ``ToolResult.raise_for_error()`` for an error result."""

    def __init__(self, result: ToolResult) -> None:
        err = result.error
        kind = err.kind if err else "internal"
        msg = err.message if err else "error result"
        super().__init__(f"{kind}: {msg}")
        self.result = result
        self.kind = kind
