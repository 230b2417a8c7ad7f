"""``toolwire stats``: per-tool statistics from the configured state store."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import pydantic

from toolwire import ConfigError
from toolwire.cli import add_config_option, cli_state_url, load_cli_config, unknown_key
from toolwire.state import open_store

from ._config import ProfilingConfig
from ._plugin import ProfilingPlugin

__all__ = ["register", "render_table"]


def register(subparsers: Any) -> None:
    """Add the ``stats`` command to the ``toolwire`` CLI (entry point ``toolwire.cli``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "stats",
        help="per-tool call statistics (count, success, p50/p90/p99, estimate) from the state store",
        description="Print the profiling plugin's per-tool statistics, as every process "
        "sharing the configured state store recorded them (figures reach the store "
        "within plugins.profiling.flush_interval_s of a call, and at shutdown).",
    )
    add_config_option(p)
    p.add_argument(
        "--json", action="store_true", help="print JSON (every figure per tool) instead of a table"
    )
    p.add_argument(
        "--tool", "-t", metavar="NAME", action="append", help="only this tool (repeat for several)"
    )
    p.add_argument(
        "--reset",
        action="store_true",
        help="delete the stored statistics (of the --tool ones, else of every tool) and print "
        "how many entries were deleted",
    )
    p.set_defaults(fn=_cmd_stats)


def profiling_config(data: dict[str, Any], file: str | None) -> ProfilingConfig:
    """``[plugins.profiling]`` validated; errors name the file and the key."""
    section = {k: v for k, v in data.items() if k != "order"}
    try:
        return ProfilingConfig.model_validate(section)
    except pydantic.ValidationError as exc:
        msgs = []
        for e in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in e.get("loc", ()))
            msg = (
                unknown_key(ProfilingConfig, e["loc"])
                if e.get("type") == "extra_forbidden"
                else e.get("msg", "invalid")
            )
            var = "TOOLWIRE_PLUGINS__PROFILING__" + "__".join(
                str(p).upper() for p in e.get("loc", ())
            )
            if var in os.environ:
                msg = f"{msg} (the value comes from the environment variable {var})"
            msgs.append(f"plugins.profiling.{loc}: {msg}")
        raise ConfigError("; ".join(msgs), file=file or "<defaults+env>") from exc


async def _cmd_stats(args: argparse.Namespace) -> int:
    cfg = load_cli_config(args)
    pcfg = profiling_config(cfg.plugins.get("profiling", {}), cfg.path)
    url = cli_state_url(cfg)
    try:
        store = open_store(url)
    except ValueError as exc:
        raise ConfigError(str(exc), file=cfg.path, key="state") from exc
    plugin = ProfilingPlugin(pcfg, store=store)
    async with store:
        if args.reset:
            deleted = 0
            for t in args.tool or [None]:
                deleted += await plugin.reset(t)
            if args.json:
                _out_json({"deleted": deleted})
            else:
                _out(f"deleted {deleted} {'entry' if deleted == 1 else 'entries'}\n")
            return 0
        await plugin.refresh()
    rows = plugin.all_statistics()
    if args.tool:
        wanted = set(args.tool)
        known = {r["tool"] for r in rows}
        rows = [r for r in rows if r["tool"] in wanted]
        rows += [plugin.get_statistics(t) for t in args.tool if t not in known]
    if args.json:
        _out_json({"state": store.backend, "key_prefix": pcfg.key_prefix, "tools": rows})
    elif not rows:
        _out(
            f"no statistics recorded yet in the {store.backend} state store "
            f"(key prefix {pcfg.key_prefix!r}); they appear once the profiling plugin has "
            'seen calls (e.g. `toolwire call add --args \'{"a": 1, "b": 2}\'`)\n'
        )
    else:
        _out(render_table(rows))
    return 0


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _out_json(obj: Any) -> None:
    _out(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if v >= 0.01 else f"{v:.4f}"


def render_table(rows: list[dict[str, Any]]) -> str:
    """The text table of ``toolwire stats`` (times in ms)."""
    head = ["tool", "count", "success", "p50 ms", "p90 ms", "p99 ms", "estimate ms", "from"]
    body = []
    for r in rows:
        rate = r["success_rate"]
        body.append(
            [
                str(r["tool"]),
                str(r["count"]),
                "-" if rate is None else f"{rate * 100:.1f}%",
                _ms(r["p50_time_ms"]),
                _ms(r["p90_time_ms"]),
                _ms(r["p99_time_ms"]),
                _ms(r["estimate_ms"]),
                str(r.get("estimate_basis", "")),
            ]
        )
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = []
    for row in [head, *body]:
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:-1], widths[1:-1], strict=True)]
        cells.append(row[-1])
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
