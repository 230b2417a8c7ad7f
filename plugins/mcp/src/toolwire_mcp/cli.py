"""``toolwire serve``: the kernel, with the configured plugins, as an MCP gateway."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import sys
from typing import Any

import pydantic

from toolwire import ConfigError, ToolwireConfig, warn_plain_secrets
from toolwire.cli import add_config_option, build_cli_kernel, load_cli_config, unknown_key

from ._config import ServeConfig, auth_switched_off, resolve_auth

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``serve`` command to the ``toolwire`` CLI (entry point ``toolwire.cli``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve the tools as an MCP server (stdio or Streamable HTTP) with the configured plugins",
        description="Serve the kernel's tools as an MCP server. Settings come from the "
        "config's [server] table; these options override them.",
    )
    add_config_option(p)
    p.add_argument(
        "--transport", choices=["stdio", "http"], help="stdio (default) or http (Streamable HTTP)"
    )
    p.add_argument("--host", help="HTTP bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000; 0 picks a free port)")
    p.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop (default auto: uvloop where installed, else asyncio)",
    )
    p.set_defaults(fn=_serve, backend_options=_backend_options)


def serve_config(data: dict[str, Any], file: str | None, args: argparse.Namespace) -> ServeConfig:
    """``[server]`` validated, with the CLI options applied; errors name file and key."""
    merged = dict(data)
    flags: set[str] = set()
    for key in ("transport", "host", "port", "loop"):
        value = getattr(args, key, None)
        if value is not None:
            merged[key] = value
            flags.add(key)
    try:
        cfg = ServeConfig.model_validate(merged)
    except pydantic.ValidationError as exc:
        msgs = []
        for e in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in e.get("loc", ()))
            msg = (
                unknown_key(ServeConfig, e["loc"])
                if e.get("type") == "extra_forbidden"
                else e.get("msg", "invalid")
            )
            msg = msg.removeprefix("Value error, ")
            origin = f" (from the --{loc} option)" if loc in flags else ""
            msgs.append(f"server.{loc}: {msg}{origin}")
        keys = {str(e["loc"][0]) for e in exc.errors(include_url=False) if e.get("loc")}
        only_flags = bool(keys) and keys <= flags
        where = "<command line>" if only_flags else (file or "<defaults+env>")
        raise ConfigError("; ".join(msgs), file=where) from exc
    if cfg.transport == "http":
        try:
            resolve_auth(cfg)
        except ValueError as exc:
            key = "server.clients" if "[server.clients." in str(exc) else "server.auth_token"
            raise ConfigError(str(exc), file=file, key=key) from exc
    return cfg


def check_server_table(
    data: dict[str, Any], file: str | None, config: ToolwireConfig | None = None
) -> None:
    """``toolwire config check``'s check of ``[server]`` (entry point ``toolwire.server_config``):
    the errors and warnings ``toolwire serve`` would give at start. ``config``: the loaded
    config (a kernel older than this check passes none; a plain-text token then goes
    unmentioned)."""
    cfg = serve_config(data, file, argparse.Namespace())
    if config is not None:
        warn_plain_secrets(cfg, "server", config)  # a plain auth_token in the file
    loop_options(cfg.loop, file)
    if cfg.transport == "http" and resolve_auth(cfg) is None:
        switched_off = auth_switched_off(cfg)
        if switched_off is not None:
            logging.getLogger("toolwire.serve").warning("%s", switched_off)


def loop_options(choice: str, file: str | None = None) -> dict[str, Any]:
    """``anyio.run`` backend options for ``[server] loop`` (``auto``, ``asyncio``, ``uvloop``).

    ``auto`` takes uvloop where it is installed (a dependency of toolwire-mcp
    except on Windows): it lowers the gateway's CPU per call by about a tenth.
    """
    if choice == "asyncio":
        return {}
    if importlib.util.find_spec("uvloop") is None:
        if choice == "uvloop":
            raise ConfigError(
                "loop = 'uvloop' but uvloop is not installed: pip install uvloop, "
                "or set loop = 'auto'",
                file=file or "<defaults+env>",
                key="server.loop",
            )
        return {}
    return {"use_uvloop": True}


def _configs(args: argparse.Namespace) -> tuple[ToolwireConfig, ServeConfig]:
    """The config and ``[server]``, read once (the loop is chosen before the command runs)."""
    cached: tuple[ToolwireConfig, ServeConfig] | None = getattr(args, "_serve_configs", None)
    if cached is None:
        cfg = load_cli_config(args)
        cached = (cfg, serve_config(cfg.server, cfg.path, args))
        warn_plain_secrets(cached[1], "server", cfg)  # a plain auth_token in the file
        args._serve_configs = cached
    return cached


TERMINAL_HINT = (
    "stdin is a terminal: over stdio, `toolwire serve` waits for MCP JSON-RPC messages, "
    "one a line, from the MCP client that starts it (docs/cli.md shows the mcpServers "
    "entry); `--transport http` serves MCP clients over HTTP instead. Ctrl-C stops it"
)


def _stdin_is_a_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except ValueError:  # stdin closed
        return False


def _backend_options(args: argparse.Namespace) -> dict[str, Any]:
    cfg, scfg = _configs(args)
    return loop_options(scfg.loop, cfg.path)


async def _serve(args: argparse.Namespace) -> int:
    cfg, scfg = _configs(args)
    serve_log = logging.getLogger("toolwire.serve")
    if serve_log.getEffectiveLevel() > logging.INFO:
        serve_log.setLevel(logging.INFO)  # lifecycle lines (ready, draining) always show
    from ._serve import route_foreign_logs, run_server, stdout_for_frames

    route_foreign_logs()  # before the kernel starts: upstreams connect during its startup
    if scfg.transport == "stdio" and _stdin_is_a_terminal():
        # someone typed `toolwire serve` by hand: say why it sits there
        serve_log.info(TERMINAL_HINT)
    # Over stdio, stdout carries protocol frames only, from before the tool modules are
    # imported to after the kernel is closed: stray output meanwhile goes to stderr.
    with stdout_for_frames() if scfg.transport == "stdio" else contextlib.nullcontext():
        kernel = build_cli_kernel(cfg)
        async with kernel:
            try:
                await run_server(kernel, scfg)
            except ConfigError as exc:
                if exc.file is not None or not (exc.key or "").startswith("server."):
                    raise
                # a [server] key the server found wrong (the path a plugin's route clashes
                # with, a port taken): name where that value came from
                flag = str(exc.key).removeprefix("server.")
                where = "<command line>" if getattr(args, flag, None) is not None else cfg.path
                raise ConfigError(exc.detail, file=where or "<defaults+env>", key=exc.key) from exc
    serve_log.info("toolwire stopped; the kernel is closed")
    return 0
