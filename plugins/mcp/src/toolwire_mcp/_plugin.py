"""The ``mcp`` plugin: upstream MCP servers contribute their tools through ``discover``."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

import anyio

from toolwire import Kernel, Tool, hookimpl

from ._config import MCPConfig, ServerConfig

if TYPE_CHECKING:
    from ._upstream import Upstream

__all__ = ["MCPPlugin"]

log = logging.getLogger("toolwire.mcp")


def _cwd_beside(cfg: ServerConfig, cfg_file: str | None) -> ServerConfig:
    """``cfg`` with a relative ``cwd`` made absolute under the config file's directory.

    Like every path in toolwire.toml: relative to the file, not to wherever the gateway
    was started (an MCP client spawning ``toolwire serve --config`` picks that directory,
    often / or the home directory). Without a config file it stays as written.
    """
    if cfg.cwd is None or not cfg_file:
        return cfg
    cwd = os.path.expanduser(cfg.cwd)
    if os.path.isabs(cwd):
        return cfg
    base = os.path.dirname(os.path.abspath(cfg_file))
    return cfg.model_copy(update={"cwd": os.path.join(base, cwd)})


class MCPPlugin:
    """Offers the tools of the MCP servers in ``[plugins.mcp.servers.<name>]``.

    One client per server. Tools are named ``<server>_<tool>`` by default
    (``name_template``), whether one or many servers are configured. A server
    that is down at start does not stop the kernel: its known tools (cached
    from an earlier run, or its ``include`` list) answer ``unavailable`` while
    the client reconnects with backoff. ``tools/list_changed`` re-lists the
    server and refreshes the kernel's catalog.
    """

    name = "mcp"
    order = 900
    Config = MCPConfig

    def __init__(self, config: MCPConfig | None = None) -> None:
        self.config = config or MCPConfig()
        self._upstreams: dict[str, Upstream] = {}
        self._kernel: Kernel | None = None
        self._refresh_lock: anyio.Lock | None = None

    @hookimpl
    async def startup(self, kernel: Kernel) -> None:
        servers = {n: c for n, c in self.config.servers.items() if c.enabled}
        if not servers:
            return
        if asyncio._get_running_loop() is None:
            raise RuntimeError(
                "MCP upstream servers need an asyncio event loop (the FastMCP client runs on "
                "asyncio); run the kernel under asyncio or remove [plugins.mcp.servers]"
            )
        from ._upstream import Upstream

        self._kernel = kernel
        self._refresh_lock = anyio.Lock()
        cfg_file = kernel.config.path if kernel.config is not None else None
        for name, cfg in servers.items():
            cfg = _cwd_beside(cfg, cfg_file)
            up = Upstream(name, cfg, self.config, kernel, self._refresh)
            await up.load_known_tools()
            self._upstreams[name] = up
        try:
            for up in self._upstreams.values():
                up.start()
            with anyio.move_on_after(self.config.connect_timeout_s + 1.0):
                for up in self._upstreams.values():
                    await up.first_attempt.wait()
        except BaseException:
            # Cancelled (or failed) here, the kernel does not run this plugin's shutdown:
            # the supervisors and the servers they started would outlive the kernel.
            await self.shutdown()
            raise
        for up in self._upstreams.values():
            if up.status != "up":
                log.warning(
                    "MCP server %r is not available at startup (%s); its %d known tools answer "
                    "'unavailable' until it connects",
                    up.name,
                    up.last_error or up.status,
                    len(up.tools),
                )

    @hookimpl
    async def shutdown(self) -> None:
        ups = list(self._upstreams.values())
        self._upstreams.clear()
        async with anyio.create_task_group() as tg:
            for up in ups:
                tg.start_soon(up.stop)
        self._kernel = None

    @hookimpl
    def discover(self, query: str | None) -> list[Tool] | None:
        if query is not None:
            return None
        return [t for up in self._upstreams.values() for t in up.tools]

    async def _refresh(self) -> None:
        kernel, lock = self._kernel, self._refresh_lock
        if kernel is None or lock is None:
            return
        async with lock:
            try:
                await kernel.refresh_tools(keep_on_collision=True)
            except Exception as exc:
                log.error("plugin 'mcp': refreshing the catalog failed: %s", exc)

    def servers(self) -> dict[str, dict[str, Any]]:
        """Status of every upstream server: status, target, tools, last error."""
        return {
            name: {
                "status": up.status,
                "transport": up.cfg.kind,
                "target": up.target,
                "tools": [t.name for t in up.tools],
                "last_error": up.last_error,
            }
            for name, up in self._upstreams.items()
        }
