"""``toolwire keys``: the state of every API-key pool, and lifting cooldowns and quarantines.

A quarantined key stays quarantined across restarts (it lives in the state
store) until its secret changes or an operator clears it; this is the
operator's way to see why calls answer ``unavailable`` and to clear a key once
its problem (a revoked key, an unpaid invoice) is fixed. It builds the kernel
from the configuration, so keys that plugins register from code (the search
backends') are included, and works on the same state store as every process
sharing it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolwire import Kernel
from toolwire.cli import add_config_option, cli_kernel_plugin

from ._plugin import RateLimitPlugin

__all__ = ["register", "render_status"]


def register(subparsers: Any) -> None:
    """Add ``keys`` to the ``toolwire`` CLI (entry point ``toolwire.cli``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "keys",
        help="API-key pools: every key's state (ok, cooling down, quarantined); clear them",
        description="The ratelimit plugin's key pools, as every process sharing the "
        "configured state store sees them. Secrets are never printed: keys go by alias.",
    )
    add_config_option(p)
    sub = p.add_subparsers(dest="keys_command", required=True)

    st = sub.add_parser("status", help="each provider's availability and each key's state")
    st.add_argument(
        "provider", metavar="PROVIDER", nargs="*", help="only these providers (default: all)"
    )
    st.add_argument(
        "--json", action="store_true", help="print JSON (KeyPool.status() per provider)"
    )
    add_config_option(st)
    st.set_defaults(fn=_cmd_status)

    cl = sub.add_parser(
        "clear",
        help="lift the cooldown and quarantine of one key (or of every key) of a provider",
    )
    cl.add_argument("provider", metavar="PROVIDER", help="the provider whose keys to clear")
    cl.add_argument(
        "alias", metavar="ALIAS", nargs="?", help="the key's alias (default: every key)"
    )
    cl.add_argument(
        "--keep-suspension",
        action="store_true",
        help="leave a suspended pool suspended (by default the suspension is lifted too)",
    )
    add_config_option(cl)
    cl.set_defaults(fn=_cmd_clear)


def _fmt_until(value: Any, now: float) -> str:
    if not isinstance(value, int | float) or value <= now:
        return ""
    return f"{value - now:.0f}s"


def render_status(status: dict[str, dict[str, Any]], now: float) -> str:
    """The ``toolwire keys status`` table."""
    lines: list[str] = []
    for provider, st in status.items():
        keys = st.get("keys") or {}
        if st.get("configured", True):
            avail = "available" if st.get("available") else "UNAVAILABLE"
            why = f" ({st['reason']})" if st.get("reason") else ""
            lines.append(f"{provider}: {avail}{why}")
        else:
            susp = st.get("suspended") or {}
            until = _fmt_until(susp.get("until") if isinstance(susp, dict) else None, now)
            lines.append(
                f"{provider}: not configured here (its stored pool is kept for replicas that "
                "may still list it; forgotten once none has used it for its "
                "removed_key_grace_seconds; `toolwire keys clear "
                f"{provider} [ALIAS]` lifts what it holds)"
                + (f"; suspended for {until}" if until else "")
            )
        if keys:
            lines.append(_HEADER)
            for alias, k in keys.items():
                lines.append(_row(alias, k, str(k.get("weight", 1)), _quarantine_text(k), now))
        elif st.get("configured", True):
            lines.append("  (no keys: health tracking only)")
        stored = [k for k in st.get("unconfigured") or [] if isinstance(k, dict)]
        if stored:
            if keys or st.get("configured", True):
                lines.append(
                    "  not configured here (stored for replicas that may still list them; "
                    f"`toolwire keys clear {provider} ALIAS` lifts them):"
                )
            if not keys:
                lines.append(_HEADER)
            for k in stored:
                alias = str(k.get("alias"))
                if k.get("configured"):
                    alias += " (other secret)"
                note = _quarantine_text(k)
                if isinstance(k.get("forget_at"), int | float):
                    note += (
                        f"{'; ' if note else ''}forgotten at {_iso(k['forget_at'])} unless listed"
                    )
                lines.append(_row(alias, k, "-", note, now))
    return "\n".join(lines) if lines else f"no providers are configured: {_CONFIGURE}"


_HEADER = (
    f"  {'key':<16}{'state':<14}{'weight':>7}{'picks':>8}{'strikes':>9}  {'cooling':>8}  quarantine"
)


def _row(alias: str, k: dict[str, Any], weight: str, note: str, now: float) -> str:
    name = alias if len(alias) < 16 else f"{alias} "
    return (
        f"  {name:<16}{k.get('state', ''):<14}{weight:>7}"
        f"{k.get('picks', 0):>8}{k.get('strikes', 0):>9}  "
        f"{_fmt_until(k.get('cool_until'), now):>8}  {note}"
    ).rstrip()


def _quarantine_text(k: dict[str, Any]) -> str:
    q = k.get("quarantine") or {}
    if not q:
        return ""
    text = str(q.get("reason") or "quarantined")
    if q.get("pattern"):
        text += f" [{q['pattern']}]"
    return text


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


_CONFIGURE = (
    "add [plugins.ratelimit.providers.<name>] to toolwire.toml (see docs/ratelimit.md), "
    "or give a search backend its key (e.g. BRAVE_API_KEY)"
)


def _known(known: list[str]) -> str:
    return f"known: {known}" if known else f"no providers are configured: {_CONFIGURE}"


async def _with_plugin(
    args: argparse.Namespace, action: Callable[[Kernel, RateLimitPlugin], Awaitable[int]]
) -> int:
    async with cli_kernel_plugin(args, "ratelimit", dist="toolwire-ratelimit") as (kernel, plugin):
        return await action(kernel, plugin)


async def _cmd_status(args: argparse.Namespace) -> int:
    async def show(kernel: Kernel, plugin: RateLimitPlugin) -> int:
        known = plugin.providers()
        stored: list[str] = []
        if not args.provider or not set(args.provider) <= set(known):  # a scan of the store
            stored = [p for p in await plugin.stored_providers() if p not in known]
        wanted = list(args.provider) or known + stored
        unknown = [p for p in wanted if p not in known and p not in stored]
        if unknown:
            sys.stderr.write(f"toolwire: error: unknown provider(s) {unknown}; {_known(known)}\n")
            return 2
        status = {p: {**await plugin.pool(p).status(), "configured": p in known} for p in wanted}
        if args.json:
            sys.stdout.write(json.dumps(status, indent=2, default=str) + "\n")
        else:
            sys.stdout.write(render_status(status, kernel.clock.time()) + "\n")
        return 0

    return await _with_plugin(args, show)


async def _cmd_clear(args: argparse.Namespace) -> int:
    async def clear(kernel: Kernel, plugin: RateLimitPlugin) -> int:
        known = plugin.providers()
        if args.provider not in known and args.provider not in await plugin.stored_providers():
            sys.stderr.write(
                f"toolwire: error: unknown provider {args.provider!r}; {_known(known)}\n"
            )
            return 2
        pool = plugin.pool(args.provider)
        try:
            await pool.clear(args.alias, suspension=not args.keep_suspension)
        except KeyError:
            stored = sorted(
                {
                    str(k["alias"])
                    for k in (await pool.status())["unconfigured"]
                    if isinstance(k, dict) and k.get("alias") not in (None, "?")
                }
                - set(pool.aliases)
            )
            which = [f"configured: {pool.aliases}"] if pool.aliases else []
            if stored:
                which.append(f"stored, not configured here: {stored}")
            sys.stderr.write(
                f"toolwire: error: provider {args.provider!r} has no key {args.alias!r}, "
                "configured or stored; "
                + (f"its keys: {'; '.join(which)}" if which else "it has none")
                + "\n"
            )
            return 2
        what = f"key {args.alias!r}" if args.alias else "every key"
        if not args.keep_suspension:
            what += " and the pool's suspension"
        sys.stdout.write(f"{args.provider}: cleared {what}\n")
        return 0

    return await _with_plugin(args, clear)
