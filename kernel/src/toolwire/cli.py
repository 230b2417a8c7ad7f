"""The ``toolwire`` command line.

Commands: ``plugins``, ``tools``, ``call``, ``config check``, plus the commands
plugin distributions register through the entry-point group ``toolwire.cli``
(``serve``, ``stats``...). Output is JSON on stdout; logs are JSON lines on
stderr. Exit codes: 0 ok, 1 the call returned an error result (or ``config check
--strict`` logged warnings), 2 bad usage or configuration.

A command entry point names a function ``register(subparsers)`` that adds an
``argparse`` sub-parser and sets ``fn`` to ``async def fn(args) -> int``; the
function builds its kernel with ``load_cli_config(args)`` and
``build_cli_kernel(cfg)`` so ``--config`` and the embedded defaults apply (a
command that opens the state store itself takes its URL from
``cli_state_url(cfg)``), and takes the plugin it works with from
``cli_plugin(kernel, name)``, which says what left the plugin out when it is
not loaded (``cli_kernel_plugin(args, name)`` does all three, starting and
closing the kernel with its output on stderr). A command may also set
``backend_options`` to ``def (args) -> dict``: the options ``anyio.run`` gets
for it (``toolwire serve`` picks its event loop there); a ``KernelError`` it
raises is reported like the command's own.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import inspect
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.abc

from ._config import (
    ToolwireConfig,
    check_unloaded_plugin_tables,
    load_config,
    plugin_not_loaded,
    sqlite_beside,
    unknown_key,
)
from ._errors import KernelError
from ._kernel import Kernel
from ._logging import configure_logging
from ._terminal import TERMINAL_EXTENSION, Terminal
from ._types import ToolResult
from .state import StateStoreError, redact_url

__all__ = [
    "CLI_ENTRY_POINT_GROUP",
    "add_config_option",
    "build_cli_kernel",
    "cli_kernel_plugin",
    "cli_plugin",
    "cli_state_url",
    "load_cli_config",
    "main",
    "unknown_key",
]

CLI_ENTRY_POINT_GROUP = "toolwire.cli"
log = logging.getLogger("toolwire.cli")

#: The commands of the first-party distributions: named when one is not installed.
FIRST_PARTY_COMMANDS = {
    "serve": "toolwire-mcp",
    "stats": "toolwire-profiling",
    "keys": "toolwire-ratelimit",
    "approvals": "toolwire-approval",
    "idempotency": "toolwire-idempotency",
}

EMBEDDED_STATE = "sqlite:///.toolwire/state.db"
EXAMPLES_MODULE = "toolwire.examples"
#: ``toolwire tools --query`` returns at most this many tools unless ``--limit`` says otherwise.
SEARCH_LIMIT = 10


def _print(obj: Any) -> None:
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n"
    try:
        text.encode(sys.stdout.encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        # a lone surrogate (text cut mid-character upstream) or a terminal that cannot
        # show a character: \u escapes are the same JSON, and the result is not lost
        text = json.dumps(obj, indent=2, ensure_ascii=True, default=str) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What tools, tool modules and plugins write to stdout while the block runs goes to
    stderr, so the command's JSON on stdout stays parseable.

    A ``print()`` (``sys.stdout``) and a write to file descriptor 1 (a C library, a
    subprocess a tool starts) alike: fd 1 points at stderr meanwhile, as in
    ``toolwire serve`` over stdio. The command prints its JSON after the block.
    """
    saved_stream = sys.stdout
    with contextlib.suppress(AttributeError, OSError, ValueError):
        saved_stream.flush()  # what was written before stays on stdout
    try:
        saved_fd: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no fd 1 or 2 (a closed stream): only sys.stdout is swapped
        saved_fd = None
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            sys.stdout.flush()
        sys.stdout = saved_stream
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"toolwire: error: {message}\n")
    return code


def load_cli_config(args: argparse.Namespace) -> ToolwireConfig:
    """The config for a CLI command: ``--config``, else the usual lookup, else defaults.

    With no config file, the bundled example tools are served.
    """
    cfg = load_config(args.config)
    if cfg.path is None and not cfg.tools.modules:
        # No config file: the embedded defaults serve the bundled example tools.
        cfg.tools.modules = [EXAMPLES_MODULE]
    return cfg


def cli_state_url(cfg: ToolwireConfig) -> str:
    """The state store URL of a CLI command: ``state``, else the embedded SQLite file.

    The embedded file lies next to the config file, if there is one, else in the
    working directory. Commands that open the store themselves (``stats``,
    ``approvals``) use this too, so they read the store ``call`` and ``serve`` write.
    """
    if cfg.state is not None:
        return cfg.state
    return sqlite_beside(EMBEDDED_STATE, Path(cfg.path).parent) if cfg.path else EMBEDDED_STATE


def build_cli_kernel(cfg: ToolwireConfig) -> Kernel:
    """A kernel for the CLI: the embedded SQLite state unless configured otherwise."""
    overrides: dict[str, Any] = {}
    if cfg.state is None:
        overrides["state"] = cli_state_url(cfg)
    return Kernel.from_config(cfg, **overrides)


def cli_plugin(kernel: Kernel, name: str, *, dist: str | None = None) -> Any:
    """The plugin ``name`` of a kernel from ``build_cli_kernel``, for a command that needs it.

    When it is not loaded, a ``ConfigError`` (exit 2) names what left it out -
    ``disabled_plugins``, ``enabled_plugins``, ``TOOLWIRE_DISABLE_PLUGINS``,
    ``TOOLWIRE_LOAD_PLUGINS``, or its not being installed - and what to change.
    """
    try:
        return kernel.get_plugin(name)
    except KeyError:
        cfg = kernel.config if kernel.config is not None else ToolwireConfig()
        raise plugin_not_loaded(cfg, name, dist=dist) from None


@contextlib.asynccontextmanager
async def cli_kernel_plugin(
    args: argparse.Namespace, name: str, *, dist: str | None = None
) -> AsyncIterator[tuple[Kernel, Any]]:
    """The kernel of ``--config`` (``build_cli_kernel``), started, and its plugin ``name``
    (``cli_plugin``: a ``ConfigError`` naming what left it out); closed on exit.

    What tool modules and plugins print while the kernel starts and closes goes to
    stderr (``stdout_to_stderr``), so a command's JSON on stdout parses.
    """
    with stdout_to_stderr():
        kernel = build_cli_kernel(load_cli_config(args))
        await kernel.start()
    try:
        yield kernel, cli_plugin(kernel, name, dist=dist)
    finally:
        with stdout_to_stderr():
            await kernel.close()


async def _cmd_plugins(args: argparse.Namespace) -> int:
    with stdout_to_stderr():
        kernel = build_cli_kernel(load_cli_config(args))
    _print(
        [
            {
                "name": p.name,
                "version": p.version,
                "distribution": p.dist,
                "order": p.order,
                "hooks": p.hooks(),
            }
            for p in kernel.plugins.ordered()
        ]
    )
    return 0


async def _cmd_tools(args: argparse.Namespace) -> int:
    if args.mode is not None and not args.query:
        return _fail(
            f"--mode {args.mode} ranks the results of a search: give --query Q too "
            "(without a query every tool is listed, in catalog order)"
        )
    with stdout_to_stderr():
        kernel = build_cli_kernel(load_cli_config(args))
        async with kernel:
            if args.query:
                tools = kernel.find_tools(
                    args.query,
                    mode=args.mode or "hybrid",
                    limit=args.limit or SEARCH_LIMIT,
                    format=args.format,
                )
            else:
                tools = kernel.list_tools(format=args.format)[: args.limit]
    if args.format == "tool":
        tools = [t.definition() for t in tools]
    _print(tools)
    return 0


async def _cmd_call(args: argparse.Namespace) -> int:
    try:
        call_args = json.loads(args.args) if args.args else {}
    except json.JSONDecodeError as exc:
        return _fail(
            f"--args is not valid JSON ({exc}): give a JSON object in single quotes, "
            "e.g. --args '{\"a\": 1}'"
        )
    except RecursionError:
        return _fail(
            "--args is nested too deeply to read (arrays or objects inside each other "
            "hundreds of levels deep): give a flatter JSON object"
        )
    if not isinstance(call_args, dict):
        return _fail("--args must be a JSON object, e.g. --args '{\"a\": 1}'")
    for option, value in (
        ("--call-id", args.call_id),
        ("--session-id", args.session_id),
        ("--tenant", args.tenant),
    ):
        if value is not None and not value.strip():
            # most likely an unset shell variable: every such call would share one id
            return _fail(f"{option} is empty: give a value, or leave the option out")
    # Someone at the keyboard: plugins may ask there (approval prompts).
    extensions = {TERMINAL_EXTENSION: Terminal.stdio()} if Terminal.interactive() else None
    results: list[ToolResult] = []
    with stdout_to_stderr():
        kernel = build_cli_kernel(load_cli_config(args))
        async with kernel, anyio.create_task_group() as tg:
            # SIGTERM (a supervisor stopping us, `timeout`) cancels the call as Ctrl-C does:
            # plugins release what they hold (an idempotency claim, a lease) and the kernel
            # closes, rather than the process dying mid-call.
            await tg.start(_cancel_on_sigterm, tg.cancel_scope)
            results.append(
                await kernel.call(
                    args.name,
                    call_args,
                    call_id=args.call_id,
                    session_id=args.session_id,
                    tenant=args.tenant,
                    extensions=extensions,
                )
            )
            tg.cancel_scope.cancel()
    if not results:
        sys.stderr.write(
            f"toolwire: terminated (SIGTERM) while calling {args.name!r}; the call was "
            "cancelled and the kernel closed\n"
        )
        return 128 + signal.SIGTERM
    _print(results[0].to_dict())
    return 1 if results[0].is_error else 0


async def _cancel_on_sigterm(
    scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Cancel ``scope`` on SIGTERM, listening from ``started()`` on; then put back the
    handler found (leaving the default action would drop a host's own handler)."""
    if threading.current_thread() is not threading.main_thread():
        # Signals reach only the main thread, whose owner handles them; no handler can
        # be installed from here.
        task_status.started()
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            task_status.started()
            async for _ in signals:
                scope.cancel()
                return
    finally:
        if previous is not None:  # None: installed outside Python, cannot be put back
            signal.signal(signal.SIGTERM, previous)


#: Entry points ``(server_table, file, config) -> None`` that validate ``[server]`` (raise
#: ConfigError, log warnings).
SERVER_CONFIG_GROUP = "toolwire.server_config"


def _check_server_table(cfg: ToolwireConfig) -> str | None:
    """Validate ``[server]`` with the installed ``toolwire serve`` (None: no such table)."""
    if not cfg.server:
        return None
    checkers = sorted(md.entry_points(group=SERVER_CONFIG_GROUP), key=lambda e: e.name)
    if not checkers:
        return "not checked: `toolwire serve` (pip install toolwire-mcp) is not installed"
    for ep in checkers:
        check = ep.load()
        try:  # a checker written before the config was passed takes two arguments
            inspect.signature(check).bind(cfg.server, cfg.path, cfg)
        except TypeError:
            check(cfg.server, cfg.path)
        except ValueError:  # no signature to read (a builtin): the current form
            check(cfg.server, cfg.path, cfg)
        else:
            check(cfg.server, cfg.path, cfg)
    return "ok"


def _origin(record: logging.LogRecord) -> logging.Logger:
    """The logger that made ``record`` (the root logger for a name it does not know)."""
    lg = logging.Logger.manager.loggerDict.get(record.name)
    return lg if isinstance(lg, logging.Logger) else logging.getLogger()


class _Warnings(logging.Handler):
    """Keeps the WARNING+ records that reach it (each once, however many loggers it is on).

    ``shown(record)``: whether the record would have been made without the check's
    lowered levels. Such a record that no other handler takes goes to
    ``logging.lastResort`` (stderr), as it would have without this handler: a
    third-party warning still shows on stderr.
    """

    def __init__(self, shown: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.shown = shown

    def emit(self, record: logging.LogRecord) -> None:
        if any(r is record for r in self.records):
            return
        self.records.append(record)
        last = logging.lastResort
        if last is not None and record.levelno >= last.level and self.shown(record):
            lg: logging.Logger | None = _origin(record)
            while lg is not None:  # as Logger.callHandlers counts handlers
                if any(h is not self for h in lg.handlers):
                    return
                lg = lg.parent if lg.propagate else None
            last.handle(record)


@contextlib.contextmanager
def _collect_warnings() -> Iterator[_Warnings]:
    """The WARNING+ log records of every logger while the block runs.

    The handler goes on the root logger and on each logger that does not pass its
    records up (``toolwire``, once ``configure_logging`` ran). A logger set above
    WARNING (``--log-level ERROR``) is lowered to WARNING meanwhile, and every
    handler drops the records that only the lowering let through: what stderr
    shows does not change (the ``toolwire.trace`` lines included).
    """
    loggers = [logging.getLogger()] + [
        lg
        for lg in list(logging.Logger.manager.loggerDict.values())
        if isinstance(lg, logging.Logger) and not lg.propagate
    ]
    lowered = {lg: lg.level for lg in loggers if lg.level > logging.WARNING}

    def shown(record: logging.LogRecord) -> bool:
        lg: logging.Logger | None = _origin(record)
        while lg is not None:  # its effective level with the levels it had
            level = lowered.get(lg, lg.level)
            if level:
                return record.levelno >= level
            lg = lg.parent
        return True

    collector = _Warnings(shown)
    handlers: list[logging.Handler] = []
    if lowered:
        every = [logging.getLogger()] + [
            lg
            for lg in list(logging.Logger.manager.loggerDict.values())
            if isinstance(lg, logging.Logger)
        ]
        handlers = list({id(h): h for lg in every for h in lg.handlers}.values())
    for h in handlers:
        h.addFilter(shown)
    for lg in lowered:
        lg.setLevel(logging.WARNING)
    for lg in loggers:
        lg.addHandler(collector)
    try:
        yield collector
    finally:
        for lg in loggers:
            lg.removeHandler(collector)
        for lg, level in lowered.items():
            lg.setLevel(level)
        for h in handlers:
            h.removeFilter(shown)


async def _cmd_config_check(args: argparse.Namespace) -> int:
    with stdout_to_stderr(), _collect_warnings() as collected:
        cfg = load_cli_config(args)
        server = _check_server_table(cfg)
        kernel = build_cli_kernel(cfg)
        check_unloaded_plugin_tables(cfg)
        async with kernel:
            summary: dict[str, Any] = {
                "ok": True,
                "config_file": cfg.path,
                "state": kernel.state.backend,
                # which file or server: the embedded SQLite file's place depends on the config
                "state_url": redact_url(cli_state_url(cfg)),
                "plugins": [p.name for p in kernel.plugins.ordered()],
                "tools": len(kernel.list_tools()),
            }
            if server is not None:
                summary["server"] = server
    warnings = [r.getMessage() for r in collected.records]
    summary["warnings"] = warnings
    failed = bool(args.strict and warnings)
    summary["ok"] = not failed
    _print(summary)
    return 1 if failed else 0


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (for plugin commands too)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return n


def _sentence(text: str, more: str = "") -> str:
    """A subcommand's one-line help as the description its --help shows."""
    return text[:1].upper() + text[1:] + more + "."


def add_config_option(parser: argparse.ArgumentParser, note: str = "") -> None:
    """``--config PATH`` (``-c``) on a subcommand: the same as the global option, so it may
    follow the command. ``note`` ends its help (e.g. where to give it)."""
    parser.add_argument(
        "--config",
        "-c",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help=f"path to toolwire.toml (same as the global --config{note})",
    )


class _TopParser(argparse.ArgumentParser):
    """Says which distribution brings a first-party command that is not installed.

    (argparse said only "invalid choice: 'serve' (choose from 'plugins', ...)".)
    """

    def error(self, message: str) -> NoReturn:
        for command, dist in FIRST_PARTY_COMMANDS.items():
            if f"invalid choice: {command!r}" in message:
                try:
                    md.distribution(dist)
                except md.PackageNotFoundError:
                    message = (
                        f"`toolwire {command}` comes from {dist}, which is not installed in "
                        f"this environment: pip install {dist} (or uv pip install {dist})"
                    )
                else:  # installed, its registration failed: the warning above says why
                    message = (
                        f"`toolwire {command}` comes from {dist}, which is installed but could "
                        "not register the command (see the warning above; reinstall it)"
                    )
                break
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    p = _TopParser(
        prog="toolwire",
        description="toolwire: middleware for agent tool calls. Output is JSON on stdout, "
        "logs are JSON lines on stderr.",
        epilog="Exit codes: 0 ok, 1 the call returned an error result (or `config check "
        "--strict` logged warnings), 2 bad usage or configuration. `toolwire COMMAND --help` "
        "shows the options of a command.",
    )
    p.add_argument(
        "--config",
        "-c",
        metavar="PATH",
        help="path to toolwire.toml (default: $TOOLWIRE_CONFIG, else ./toolwire.toml, "
        "else the embedded defaults)",
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="log level for stderr JSON logs, any case (default WARNING)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=argparse.ArgumentParser)

    help_ = "list the loaded plugins as JSON (name, version, distribution, order, hooks)"
    sp = sub.add_parser("plugins", help=help_, description=_sentence(help_))
    add_config_option(sp)
    sp.set_defaults(fn=_cmd_plugins)

    help_ = "list the tools (JSON), or search them with --query"
    st = sub.add_parser("tools", help=help_, description=_sentence(help_))
    add_config_option(st)
    st.add_argument(
        "--query",
        "-q",
        metavar="Q",
        help="search for Q: a tool name, a glob, tag:<tag>, source:<source> or free text",
    )
    st.add_argument(
        "--mode",
        choices=["explicit", "semantic", "hybrid"],
        help="how --query selects tools (default hybrid); only with --query",
    )
    st.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help=f"at most N tools, N >= 1 (default: {SEARCH_LIMIT} with --query, all without)",
    )
    st.add_argument(
        "--format",
        choices=["tool", "openai", "anthropic", "mcp"],
        default="tool",
        help="the shape of each tool (default tool: toolwire's own definition)",
    )
    st.set_defaults(fn=_cmd_tools)

    help_ = "call a tool and print the normalized result as JSON"
    sc = sub.add_parser(
        "call",
        help=help_,
        description=_sentence(help_, " (exit code 1 when the result is an error)"),
    )
    add_config_option(sc)
    sc.add_argument("name", metavar="NAME", help="the tool's name (see `toolwire tools`)")
    sc.add_argument(
        "--args",
        "-a",
        metavar="JSON",
        default="{}",
        help='the arguments, a JSON object, e.g. \'{"a": 2, "b": 3}\' (default {})',
    )
    sc.add_argument(
        "--call-id",
        metavar="ID",
        help="the call's id (default: a new one); a replay with the same id and arguments "
        "is served once by the idempotency plugin",
    )
    sc.add_argument("--session-id", metavar="S", help="groups calls (approval, audit, profiling)")
    sc.add_argument(
        "--tenant", metavar="T", help="whose call it is (stores and quotas keep tenants apart)"
    )
    sc.set_defaults(fn=_cmd_call)

    scfg = sub.add_parser("config", help="configuration commands", description="Configuration.")
    cfg_sub = scfg.add_subparsers(dest="config_command", required=True)
    help_ = "load and validate the config, load the plugins, print a summary"
    chk = cfg_sub.add_parser(
        "check",
        help=help_,
        description=_sentence(
            help_,
            ' (with the warnings logged meanwhile in "warnings"; exit code 1 with '
            "--strict when there are any)",
        ),
    )
    add_config_option(chk)
    chk.add_argument(
        "--strict",
        action="store_true",
        help='exit with code 1 (and "ok": false) when the check logged warnings: a skipped '
        "plugin, an unreachable MCP server, a table of a plugin that is not enabled "
        "(for deploy pipelines)",
    )
    chk.set_defaults(fn=_cmd_config_check)
    _plugin_commands(sub)
    _name_subcommands(p, top=True)
    return p


def _name_subcommands(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """A missing subcommand is named by its choices, not by its ``dest``.

    (argparse said "the following arguments are required: keys_command".)
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            if not top and action.metavar is None and action.choices:
                action.metavar = "{" + ",".join(action.choices) + "}"
            for child in action.choices.values():
                _name_subcommands(child)


def _plugin_commands(sub: Any) -> None:
    """Commands contributed by installed distributions (entry points ``toolwire.cli``)."""
    for ep in sorted(md.entry_points(group=CLI_ENTRY_POINT_GROUP), key=lambda e: e.name):
        names = dict(sub.choices)
        shown = list(sub._choices_actions)
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken add-on must not break the whole CLI
            # nor leave half a command: one whose parser was added before `register`
            # raised was listed by --help and, run, had no function (a traceback)
            sub.choices.clear()
            sub.choices.update(names)
            sub._choices_actions[:] = shown
            log.warning(
                "CLI command %r from %r could not be registered: %s", ep.name, ep.value, exc
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolwire`` command."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level.upper())
    if not callable(getattr(args, "fn", None)):  # a plugin's command that sets none
        return _fail(
            f"the command {args.command!r} has nothing to run: the register() function "
            "that adds it must call set_defaults(fn=...) on its parser (see "
            "docs/writing-plugins.md, 'A command of its own')"
        )
    try:
        options = getattr(args, "backend_options", None)
        code: int = anyio.run(args.fn, args, backend_options=options(args) if options else None)
    except (KernelError, StateStoreError) as exc:  # a store error says what to start or fix
        # the one line names the plugin and the exception; where a plugin's startup,
        # discover or import raised it is in the traceback, at --log-level DEBUG
        log.debug("the traceback of the error below", exc_info=exc)
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
