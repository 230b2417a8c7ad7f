"""``toolwire idempotency``: look at, and forget, the record of one call.

A replay of a side-effecting call whose first run left no result (its process
died, or ``unknown_after_interrupt`` kept an interrupted call) answers
``outcome_unknown`` for as long as the record lives (``ttl_secs``). Once an
operator has checked whether the call took effect, ``forget`` deletes the
record, so the next call with that call id runs the tool. A record whose call
is still running (its lease is live) is not forgotten without ``--force``: a
replay would then run the tool beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from toolwire import Kernel
from toolwire.cli import add_config_option, cli_kernel_plugin

from ._plugin import DONE, OVERSIZED, PENDING, IdempotencyPlugin

__all__ = ["describe", "register"]


def register(subparsers: Any) -> None:
    """Add ``idempotency`` to the ``toolwire`` CLI (entry point ``toolwire.cli``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "idempotency",
        help="the record of one call: show it, or forget it after an 'outcome unknown'",
        description="The idempotency plugin's record of one call (tool, call id, tenant), "
        "in the configured state store. Results and arguments are never printed.",
    )
    add_config_option(p)
    sub = p.add_subparsers(dest="idempotency_command", required=True)
    for name, fn, help_text in (
        ("show", _cmd_show, "what the record of a call says (running, done, outcome unknown)"),
        (
            "forget",
            _cmd_forget,
            "delete the record of a call, so the next call with its call id runs the tool",
        ),
    ):
        c = sub.add_parser(name, help=help_text)
        c.add_argument("tool", metavar="TOOL", help="the tool's name, as called")
        c.add_argument("call_id", metavar="CALL_ID", help="the call id")
        c.add_argument("--tenant", help="the call's tenant (default: none)")
        if name == "show":
            c.add_argument("--json", action="store_true", help="print JSON")
        else:
            c.add_argument(
                "--force",
                action="store_true",
                help="forget a record whose call is still running (its lease is live)",
            )
        add_config_option(c)
        c.set_defaults(fn=fn)


def describe(value: Any, now: float) -> dict[str, Any]:
    """What a stored record says, without its result or arguments."""
    if not isinstance(value, dict):
        return {"state": "unreadable", "message": "the record is not one this plugin wrote"}
    status = value.get("s")
    out: dict[str, Any] = {"started_at": value.get("at")}
    if status == DONE:
        out.update(state="done", finished_at=value.get("end"), is_error=value.get("e") is not None)
        out["message"] = "a replay gets the stored result"
    elif status == OVERSIZED:
        out.update(state="oversized", finished_at=value.get("end"))
        out["message"] = "the call finished; its result was too large to keep"
    elif status == PENDING:
        lease = value.get("lease")
        out["lease_until"] = lease
        if isinstance(lease, int | float) and lease > now:
            out["state"] = "running"
            out["message"] = f"its caller holds the claim for {lease - now:.0f}s more"
        elif value.get("ro") is True:
            out["state"] = "lapsed"
            out["message"] = "a read-only call's lapsed claim: a replay runs it again"
        elif value.get("w") is True:
            out["state"] = "lapsed"
            out["message"] = (
                "its caller stopped while the call waited with nothing applied (for an "
                "approval, or between attempts after a refusal): a replay runs it"
            )
        else:
            out["state"] = "outcome_unknown"
            out["message"] = (
                "its caller stopped before recording a result; a replay answers "
                "'outcome unknown' until the record is forgotten"
            )
    else:
        out = {"state": "unreadable", "message": "the record is not one this plugin wrote"}
    return out


async def _with_plugin(
    args: argparse.Namespace, action: Callable[[Kernel, IdempotencyPlugin], Awaitable[int]]
) -> int:
    async with cli_kernel_plugin(args, "idempotency", dist="toolwire-idempotency") as (
        kernel,
        plugin,
    ):
        return await action(kernel, plugin)


def _what(args: argparse.Namespace) -> str:
    tenant = f" (tenant {args.tenant!r})" if args.tenant is not None else ""
    return f"tool {args.tool!r} call {args.call_id!r}{tenant}"


async def _cmd_show(args: argparse.Namespace) -> int:
    async def show(kernel: Kernel, plugin: IdempotencyPlugin) -> int:
        key = plugin.key_for(args.tool, args.call_id, tenant=args.tenant)
        entry = await kernel.state.get_entry(key)
        if entry is None:
            info: dict[str, Any] = {
                "state": "none",
                "message": "no record: the next call with this call id runs the tool",
            }
        else:
            info = describe(entry.value, kernel.clock.time())
        if args.json:
            sys.stdout.write(json.dumps(info, indent=2) + "\n")
        else:
            sys.stdout.write(f"{_what(args)}: {info['state']}: {info['message']}\n")
        return 0

    return await _with_plugin(args, show)


async def _cmd_forget(args: argparse.Namespace) -> int:
    async def forget(kernel: Kernel, plugin: IdempotencyPlugin) -> int:
        key = plugin.key_for(args.tool, args.call_id, tenant=args.tenant)
        entry = await kernel.state.get_entry(key)
        if entry is None:
            sys.stdout.write(f"{_what(args)}: no record to forget\n")
            return 0
        info = describe(entry.value, kernel.clock.time())
        if info["state"] == "running" and not args.force:
            sys.stderr.write(
                f"toolwire: error: {_what(args)} is still running ({info['message']}); "
                "forgetting it now would let a replay run the tool beside it: wait for it, "
                "or pass --force\n"
            )
            return 2
        deleted = await kernel.state.compare_and_delete(key, expected_version=entry.version)
        if not deleted:
            sys.stderr.write(
                f"toolwire: error: the record of {_what(args)} changed while it was read; "
                "look again with `toolwire idempotency show`\n"
            )
            return 1
        sys.stdout.write(
            f"{_what(args)}: forgot its record ({info['state']}); the next call with this "
            "call id runs the tool\n"
        )
        return 0

    return await _with_plugin(args, forget)
