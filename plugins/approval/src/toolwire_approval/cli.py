"""``toolwire approvals ...``: list and decide approval requests from a terminal.

Works on the configured state store (``state``, else the embedded
``.toolwire/state.db`` that ``toolwire call`` and ``toolwire serve`` use), so a
decision taken here releases a call waiting in any process sharing that store.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic

from toolwire import ConfigError
from toolwire.cli import (
    add_config_option,
    cli_state_url,
    load_cli_config,
    positive_int,
    unknown_key,
)
from toolwire.state import open_store

from ._config import ApprovalConfig
from ._plugin import ApprovalPlugin
from ._types import ApprovalError

__all__ = ["approval_config", "register"]


def register(subparsers: Any) -> None:
    """Add ``approvals`` to the ``toolwire`` CLI (entry point ``toolwire.cli``).

    (``toolwire call`` prompts for approvals by itself: on a terminal it offers
    the kernel's ``Terminal`` to the call, which the plugin asks on.)
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "approvals",
        help="list, show, approve and reject tool-call approval requests",
        description="Approval requests of the approval plugin, in the configured state store.",
    )
    add_config_option(p)
    sub = p.add_subparsers(dest="approvals_command", required=True)

    ls = sub.add_parser("list", help="requests, oldest first (JSON; default: the pending ones)")
    ls.add_argument(
        "--status",
        choices=["pending", "approved", "rejected", "expired", "all"],
        default="pending",
        help="which requests (default pending)",
    )
    ls.add_argument("--tool", metavar="NAME", help="only requests for this tool")
    add_config_option(ls)
    ls.set_defaults(fn=_cmd_list)

    show = sub.add_parser("show", help="one request with its audit trail (JSON)")
    show.add_argument("id", metavar="ID", help=_ID_HELP)
    add_config_option(show)
    show.set_defaults(fn=_cmd_show)

    ap = sub.add_parser("approve", help="approve a pending request")
    ap.add_argument("id", metavar="ID", help=_ID_HELP)
    ap.add_argument(
        "--args", "-a", metavar="JSON", help="run with these arguments instead (a JSON object)"
    )
    ap.add_argument("--comment", metavar="TEXT", help="recorded in the audit log")
    ap.add_argument("--by", metavar="WHO", help="who decides (default: your user name)")
    ap.add_argument("--fingerprint", metavar="FP", help=_FP_HELP)
    add_config_option(ap)
    ap.set_defaults(fn=_cmd_approve)

    rj = sub.add_parser("reject", help="reject a pending request (the call ends 'denied')")
    rj.add_argument("id", metavar="ID", help=_ID_HELP)
    rj.add_argument(
        "--reason",
        "-r",
        metavar="TEXT",
        default="rejected from the command line",
        help="why; the call's error says it (default: rejected from the command line)",
    )
    rj.add_argument("--by", metavar="WHO", help="who decides (default: your user name)")
    rj.add_argument("--fingerprint", metavar="FP", help=_FP_HELP)
    add_config_option(rj)
    rj.set_defaults(fn=_cmd_reject)

    au = sub.add_parser("audit", help="the audit log (JSON), of one request or all")
    au.add_argument("id", metavar="ID", nargs="?", help="only this request's entries")
    au.add_argument(
        "--limit", metavar="N", type=positive_int, help="only the most recent N entries (N >= 1)"
    )
    add_config_option(au)
    au.set_defaults(fn=_cmd_audit)


_ID_HELP = "the request's id (from `toolwire approvals list` or the call's log line)"
_FP_HELP = "refuse unless the request is for the arguments of this fingerprint (the one shown)"


def approval_config(data: dict[str, Any], file: str | None) -> ApprovalConfig:
    """``[plugins.approval]`` validated; errors name the file and the key."""
    section = {k: v for k, v in data.items() if k != "order"}
    try:
        return ApprovalConfig.model_validate(section)
    except pydantic.ValidationError as exc:
        msgs = []
        for e in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in e.get("loc", ()))
            msg = (
                unknown_key(ApprovalConfig, e["loc"])
                if e.get("type") == "extra_forbidden"
                else e.get("msg", "invalid")
            )
            msgs.append(f"plugins.approval.{loc}: {msg}")
        raise ConfigError("; ".join(msgs), file=file or "<defaults+env>") from exc


async def _run(args: argparse.Namespace, action: Callable[[ApprovalPlugin], Awaitable[Any]]) -> int:
    cfg = load_cli_config(args)
    pcfg = approval_config(cfg.plugins.get("approval", {}), cfg.path)
    url = cli_state_url(cfg)
    try:
        store = open_store(url)
    except ValueError as exc:
        raise ConfigError(str(exc), file=cfg.path, key="state") from exc
    async with store:
        plugin = ApprovalPlugin(pcfg, store=store)
        try:
            out = await action(plugin)
        except ApprovalError as exc:
            _print({"error": exc.to_dict()})
            return 1
    _print(out)
    return 0


def _who(args: argparse.Namespace) -> str:
    if args.by:
        return str(args.by)
    try:
        return getpass.getuser()
    except Exception:
        return "cli"


async def _cmd_list(args: argparse.Namespace) -> int:
    status = None if args.status == "all" else args.status

    async def action(p: ApprovalPlugin) -> Any:
        return [r.to_dict() for r in await p.requests(status=status, tool=args.tool)]

    return await _run(args, action)


async def _cmd_show(args: argparse.Namespace) -> int:
    async def action(p: ApprovalPlugin) -> Any:
        req = await p.get(args.id)
        return {**req.to_dict(), "audit": await p.audit_log(args.id)}

    return await _run(args, action)


async def _cmd_approve(args: argparse.Namespace) -> int:
    edited: dict[str, Any] | None = None
    if args.args is not None:
        try:
            edited = json.loads(args.args)
        except ValueError as exc:
            sys.stderr.write(f"toolwire: error: --args is not valid JSON: {exc}\n")
            return 2
        if not isinstance(edited, dict):
            sys.stderr.write("toolwire: error: --args must be a JSON object\n")
            return 2

    async def action(p: ApprovalPlugin) -> Any:
        done = await p.approve(
            args.id,
            by=_who(args),
            args=edited,
            comment=args.comment,
            fingerprint=args.fingerprint,
            via="cli",
        )
        return done.to_dict()

    return await _run(args, action)


async def _cmd_reject(args: argparse.Namespace) -> int:
    async def action(p: ApprovalPlugin) -> Any:
        done = await p.reject(
            args.id, args.reason, by=_who(args), fingerprint=args.fingerprint, via="cli"
        )
        return done.to_dict()

    return await _run(args, action)


async def _cmd_audit(args: argparse.Namespace) -> int:
    async def action(p: ApprovalPlugin) -> Any:
        return await p.audit_log(args.id, limit=args.limit)

    return await _run(args, action)


def _print(obj: Any) -> None:
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an id given with undecodable bytes: escaped, still JSON
        text = json.dumps(obj, indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
