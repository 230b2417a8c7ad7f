"""The docs keep up with the code: every hook, config key, env var and CLI command
is documented, and relative links resolve (the Python examples: test_doc_python_examples.py)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from toolwire import hookspecs
from toolwire._config import ToolsConfig, ToolwireConfig
from toolwire.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_every_hookspec_is_in_the_hook_reference() -> None:
    text = (DOCS / "hooks.md").read_text()
    names = hookspecs.all_hook_names()
    assert set(names) == {
        "startup",
        "shutdown",
        "discover",
        "before_call",
        "before_fallback",
        "on_error",
        "after_call",
    }
    missing = [n for n in names if not re.search(rf"^## `{n}\(", text, re.M)]
    assert not missing, f"hooks missing from docs/hooks.md: {missing}"


def test_every_config_key_is_documented() -> None:
    text = (DOCS / "config.md").read_text()
    keys = [k for k in ToolwireConfig.model_fields if k not in ("path", "tools", "plugins")]
    keys += list(ToolsConfig.model_fields)
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"config keys missing from docs/config.md: {missing}"


def test_every_env_var_read_by_the_kernel_is_documented() -> None:
    src = "\n".join(p.read_text() for p in (ROOT / "kernel/src/toolwire").rglob("*.py"))
    tests = "\n".join(p.read_text() for p in (ROOT / "kernel/tests").rglob("*.py"))
    found = set(re.findall(r'"((?:TOOLWIRE|REDIS)_[A-Z_]+)', src + tests))
    text = (DOCS / "config.md").read_text()
    missing = sorted(v for v in found if v not in text)
    assert not missing, f"environment variables missing from docs/config.md: {missing}"


def test_every_cli_command_is_documented() -> None:
    text = (DOCS / "cli.md").read_text()
    sub = next(a for a in _parser()._actions if a.dest == "command")
    commands = list(sub.choices)  # type: ignore[union-attr]
    assert commands
    missing = [c for c in commands if f"## `toolwire {c}" not in text]
    assert not missing, f"CLI commands missing from docs/cli.md: {missing}"


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str]]:
    """(command path, option string) of every option of ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}".strip())
        elif not isinstance(action, argparse._HelpAction):
            yield from ((path, opt) for opt in action.option_strings)


def test_every_cli_option_is_documented_under_its_command() -> None:
    """Every option string (long and short) of every command appears in a code span of
    that command's section of docs/cli.md (global options: before the first section).
    Before: --config/-c of stats, keys and approvals, and tools -q, call -a, stats -t,
    approvals reject -r were missing."""
    text = (DOCS / "cli.md").read_text()
    sections = {"": text.split("\n## ", 1)[0]}
    for part in text.split("\n## ")[1:]:
        m = re.match(r"`toolwire (\S+)", part)
        if m:
            sections[m.group(1).rstrip("`")] = part
    missing = []
    for path, opt in _options(_parser(), ""):
        section = sections.get(path.split(" ", 1)[0], "")
        spans = re.findall(r"`([^`\n]+)`", section)
        if not any(re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", sp) for sp in spans):
            missing.append(f"toolwire {path} {opt}".replace("  ", " "))
    assert not missing, f"CLI options missing from docs/cli.md: {missing}"


def _markdown_files() -> list[Path]:
    skip = {"node_modules", "build", "dist"}
    return sorted(
        p
        for p in ROOT.rglob("*.md")
        if not any(part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts)
    )


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of ``path`` (lower-cased, punctuation dropped, spaces -> -)."""
    out: set[str] = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in out:
            n += 1
            unique = f"{slug}-{n}"
        out.add(unique)
    return out


def test_relative_links_in_the_markdown_resolve() -> None:
    """Every relative link of the READMEs and docs names an existing file (and heading).
    Before: plugins/ratelimit/README.md linked retry.md, which is not beside it."""
    files = _markdown_files()
    assert ROOT / "plugins/ratelimit/README.md" in files and DOCS / "cli.md" in files
    broken = []
    for md in files:
        text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:, ...
            file, _, frag = target.partition("#")
            dest = (md.parent / file) if file else md
            where = f"{md.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif frag and dest.suffix == ".md" and frag not in _anchors(dest):
                broken.append(f"{where}: no heading #{frag} in {dest.name}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_the_hook_order_table_lists_every_first_party_plugin() -> None:
    """hooks.md's table of orders is what a plugin author picks an `order` from. Before:
    it listed only the plugins at 50..500 and said "the first-party plugins use 100..500",
    while mcp and search are at 900 and a2a at 910 (whose after_call then runs after a
    plugin at 950, not before)."""
    from toolwire import installed_plugins

    text = (DOCS / "hooks.md").read_text()
    table = {
        name.strip().split(" ")[0]: int(order)
        for order, names in re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
        for name in names.split(",")
    }
    ours = {d.name for d in (ROOT / "plugins").iterdir()} | {"audit"}
    for name, ep in installed_plugins().items():
        if name not in ours:
            continue
        declared = ep.load().order
        assert table.get(name) == declared, (name, declared, table.get(name))


def test_the_hookspecs_docstring_orders_every_hook_and_names_every_rejected_option() -> None:
    """hooks.md calls hookspecs.py the source of truth. Before: its module docstring left
    before_fallback out of the order and named firstresult, wrapper and hookwrapper as
    rejected, not tryfirst and trylast, which the kernel rejects too."""
    doc = " ".join((hookspecs.__doc__ or "").split())
    ordered = re.search(r"ascending for (.+?); descending for (.+?)\.", doc)
    assert ordered is not None
    named = set(re.findall(r"``(\w+)``", ordered.group(1) + ordered.group(2)))
    assert named == set(hookspecs.all_hook_names())
    for option in ("wrapper", "hookwrapper", "tryfirst", "trylast"):
        assert f"``{option}``" in doc.split("rejects")[0], option
