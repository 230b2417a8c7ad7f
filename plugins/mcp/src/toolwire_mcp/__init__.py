"""toolwire-mcp: serve the kernel as an MCP server and consume remote MCP servers as tools.

- ``MCPPlugin`` (entry point ``mcp``): ``[plugins.mcp.servers.<name>]`` entries in
  the ``mcpServers`` shape contribute their tools to the kernel's catalog.
- ``create_server(kernel)``: a FastMCP server whose every ``tools/call`` goes
  through ``kernel.call``; ``run_server(kernel, ServeConfig(...))`` runs it over
  stdio or Streamable HTTP (what ``toolwire serve`` does).

FastMCP is imported only when a server is created or an upstream is configured,
so loading the plugin costs nothing when it is not used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._config import (
    DEFAULT_IMAGE_MAX_BYTES,
    BearerAuth,
    ClientConfig,
    MCPConfig,
    ServeConfig,
    ServerConfig,
    resolve_auth,
    resolve_auth_token,
)
from ._keys import CALL_ID_META_KEY, ERROR_META_KEY, RESULT_META_KEY
from ._plugin import MCPPlugin

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from starlette.applications import Starlette

    from toolwire import Kernel

__all__ = [
    "CALL_ID_META_KEY",
    "ERROR_META_KEY",
    "RESULT_META_KEY",
    "BearerAuth",
    "ClientConfig",
    "MCPConfig",
    "MCPPlugin",
    "ServeConfig",
    "ServerConfig",
    "__version__",
    "create_http_app",
    "create_server",
    "resolve_auth",
    "resolve_auth_token",
    "run_server",
    "timed_http_protocol",
]
__version__ = "0.1.0"


def create_server(
    kernel: Kernel,
    *,
    name: str = "toolwire",
    instructions: str | None = None,
    auth_token: str | BearerAuth | None = None,
    image_roots: Sequence[str | os.PathLike[str]] | None = None,
    image_max_bytes: int = DEFAULT_IMAGE_MAX_BYTES,
) -> FastMCP:
    """A FastMCP server offering ``kernel``'s live catalog; every call goes through ``kernel.call``.

    ``auth_token``: HTTP clients must send ``Authorization: Bearer <token>``
    (HTTP 401 otherwise; compared in constant time); a ``BearerAuth`` gives
    several, each client's calls running as its tenant. ``image_roots`` /
    ``image_max_bytes``: which image files ``{"img_path": ...}`` results may
    send (default: the system temp directory and the working directory; 10 MiB).
    The kernel starts on first use; closing it is the caller's job.
    """
    from ._calls import ServeGate
    from ._images import ImageFiles
    from ._serve import create_server as impl

    gate = ServeGate(images=ImageFiles(image_roots, max_bytes=image_max_bytes))
    return impl(kernel, name=name, instructions=instructions, auth_token=auth_token, gate=gate)


def create_http_app(
    kernel: Kernel,
    config: ServeConfig | None = None,
    *,
    auth_token: str | BearerAuth | None = None,
) -> Starlette:
    """The ASGI app ``toolwire serve --transport http`` runs, to mount in your own ASGI server.

    The MCP endpoint at ``config.path`` (default ``/mcp``), the plugins' HTTP
    routes and the Host/Origin guard, behind the bearer tokens: ``auth_token``
    (one token, or a ``BearerAuth``), else what ``config`` (``auth_token``,
    ``clients``) and ``TOOLS_AUTH_*`` say (as ``toolwire serve``).
    Run the app's lifespan (uvicorn and Starlette's ``Mount`` do).
    """
    from ._serve import create_http_app as impl

    config = config or ServeConfig(transport="http")
    token = auth_token if auth_token is not None else resolve_auth(config)
    return impl(kernel, config, auth_token=token)


async def run_server(
    kernel: Kernel,
    config: ServeConfig | None = None,
    *,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    handle_signals: bool = True,
) -> None:
    """Serve ``kernel`` over stdio or Streamable HTTP until stdin closes or SIGINT/SIGTERM.

    On a signal, new calls are refused, in-flight calls get
    ``config.shutdown_grace_s`` to finish, then the rest are cancelled. The
    caller closes the kernel (``async with kernel: await run_server(kernel)``).
    """
    from ._serve import run_server as impl

    await impl(kernel, config or ServeConfig(), on_ready=on_ready, handle_signals=handle_signals)


def timed_http_protocol(
    read_timeout_s: float = 30.0, max_head_bytes: int | None = 64 * 1024
) -> type[Any]:
    """uvicorn's HTTP protocol with ``[server] request_read_timeout_s`` and ``max_header_bytes``.

    For ``create_http_app`` run in your own uvicorn:
    ``uvicorn.run(app, http=timed_http_protocol(30))``. Each request must arrive
    whole (head and body) within ``read_timeout_s`` of its first byte, or of the
    connection's opening, else the connection is closed. A request whose line
    and headers are longer than ``max_head_bytes`` (None: no cap) gets a 431 and
    the connection is closed.
    """
    if not read_timeout_s > 0 or read_timeout_s == float("inf"):
        raise ValueError(
            f"read_timeout_s must be a finite number of seconds > 0, not {read_timeout_s!r}"
        )
    if max_head_bytes is not None and (
        isinstance(max_head_bytes, bool)
        or not isinstance(max_head_bytes, int)
        or max_head_bytes < 1
    ):
        raise ValueError(
            f"max_head_bytes must be a whole number >= 1 or None, not {max_head_bytes!r}"
        )
    from ._http import timed_http_protocol as impl

    return impl(read_timeout_s, max_head_bytes)
