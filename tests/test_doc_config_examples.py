"""Every ```toml block of the docs is checked the way `toolwire config check` checks a file.

Users copy these blocks into their toolwire.toml, so each one must load: the kernel's
model (``load_config``), the ``[server]`` table (the installed ``toolwire serve``'s
check) and every ``[plugins.<name>]`` table (the plugin's own model, by building the
kernel with the plugin loaded). The kernel is built, never started: no server is
spawned and nothing is fetched.

A block that is only a fragment (``[plugins.retry]``, say) is checked with the plugins
it configures enabled. A block that names ``enabled_plugins`` must enable every plugin
it configures (a table of a plugin that is not loaded does nothing). ``$secretRef``
names get dummy values.

A marker comment on the line before the fence says what else a block is:

- ``<!-- toml: invalid "text" -->``: it shows a mistake on purpose; checking it must
  fail with a configuration error containing ``text``.
- ``<!-- toml: pyproject -->``: a ``pyproject.toml`` excerpt; its ``toolwire`` entry
  points must load and name plugins by their own name.

Each block is a test case with the id ``file:line`` (the line of its opening fence).
So is each ``TOOLWIRE_PLUGINS__...=value`` variable the docs show in a code span.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import toolwire._config as config_module
import toolwire.examples
from toolwire import Kernel, KernelError, load_config
from toolwire.cli import _check_server_table, build_cli_kernel
from toolwire_ratelimit import with_config_file

ROOT = Path(__file__).resolve().parents[1]
DOC_GLOBS = ("*.md", "docs/*.md", "kernel/*.md", "plugins/*/*.md", "contrib/*/*.md")
EXAMPLE = ROOT / "examples" / "toolwire.toml"

#: Modules the docs use as stand-ins for the reader's own code; a module with one tool
#: is put in their place so the rest of the block is still checked.
PLACEHOLDER_MODULES = ("myapp.tools",)
#: Plugins the docs configure that are not installed in this workspace, with the entry
#: point they would have once installed (contrib/_template is tested from its sources).
UNINSTALLED_PLUGINS = {"stamp": "toolwire_stamp:StampPlugin"}
#: Variables that would change what a block means (the suite's own, a developer's).
_ENV_PREFIXES = ("TOOLWIRE_", "TOOLS_AUTH_", "TOOL_IDEMPOTENCY_", "FASTMCP_")

_FENCE = re.compile(r"^(```|~~~)\s*toml\s*$", re.IGNORECASE)
_ANY_FENCE = re.compile(r"^(```|~~~)\s*\w*\s*$")
_FILE_HEADER = re.compile(r"^#\s*(?P<name>[\w.-]+\.(?:ya?ml|toml|json))\b")
_ENV_REFS = re.compile(r"\$\{([A-Za-z_]\w*)\}|\"\$secretRef\"\s*[:=]\s*\"?([A-Za-z_]\w*)")
_MARKER = re.compile(r"^<!--\s*toml:\s*(?P<kind>[a-z]+)\s*(?P<arg>.*?)\s*-->$")
_KINDS = ("config", "invalid", "pyproject")


@dataclass(frozen=True)
class Block:
    """One ```toml block: where it is, what its marker says it is, and its text."""

    where: str  # file:line of the opening fence
    kind: str  # config | invalid | pyproject
    expect: str  # for invalid: text the error must contain
    text: str
    #: file name -> text of the blocks of the same page that show a file a `config_file`
    #: key may name (their first line is ``# <name>``: ``# providers.yaml``)
    files: tuple[tuple[str, str], ...] = ()


def shown_files(markdown: str) -> tuple[tuple[str, str], ...]:
    """(name, text) of the fenced blocks of ``markdown`` that begin with ``# <name>``."""
    out: list[tuple[str, str]] = []
    lines = markdown.splitlines()
    start: int | None = None
    for i, line in enumerate(lines):
        if not line.strip().startswith(("```", "~~~")):
            continue
        if start is None:
            start = i if _ANY_FENCE.match(line.strip()) else None
            continue
        body = lines[start + 1 : i]
        header = _FILE_HEADER.match(body[0].strip()) if body else None
        if header and header["name"] not in ("toolwire.toml", "pyproject.toml"):
            out.append((header["name"], "\n".join(body) + "\n"))
        start = None
    return tuple(out)


def toml_blocks(markdown: str, name: str) -> Iterator[Block]:
    """The ```toml blocks of ``markdown`` (``name`` is its path, for ``Block.where``)."""
    files = shown_files(markdown)
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i].strip())
        if fence is None:
            i += 1
            continue
        start = i
        prev = next((x.strip() for x in reversed(lines[:start]) if x.strip()), "")
        marker = _MARKER.match(prev)
        kind, expect = ("config", "") if marker is None else (marker["kind"], marker["arg"])
        where = f"{name}:{start + 1}"
        if kind not in _KINDS:
            raise ValueError(f"{where}: unknown marker kind {kind!r}; use one of {_KINDS}")
        if kind == "invalid":
            if not (len(expect) >= 2 and expect[0] == expect[-1] == '"'):
                raise ValueError(
                    f'{where}: write <!-- toml: invalid "text of the error" --> so the test '
                    "knows which mistake the block shows"
                )
            expect = expect[1:-1]
        end = start + 1
        while end < len(lines) and not lines[end].strip().startswith(fence.group(1)):
            end += 1
        if end == len(lines):
            raise ValueError(f"{where}: the ```toml block is never closed")
        yield Block(where, kind, expect, "\n".join(lines[start + 1 : end]) + "\n", files)
        i = end + 1


def doc_blocks() -> list[Block]:
    files = sorted({p for g in DOC_GLOBS for p in ROOT.glob(g)})
    return [
        b
        for f in files
        for b in toml_blocks(f.read_text(encoding="utf-8"), f.relative_to(ROOT).as_posix())
    ]


def secret_names(value: Any) -> set[str]:
    """Every NAME of a ``{"$secretRef" = "NAME"}`` in ``value``."""
    if isinstance(value, dict):
        if isinstance(value.get("$secretRef"), str):
            return {value["$secretRef"]}
        return set().union(*(secret_names(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(secret_names(v) for v in value))
    return set()


def _module_names(data: dict[str, Any]) -> list[str]:
    tools = data.get("tools")
    modules = tools.get("modules", []) if isinstance(tools, dict) else []
    return [m["module"] if isinstance(m, dict) else m for m in modules if isinstance(m, str | dict)]


def check_config_block(
    block: Block,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Check ``block`` as `toolwire config check` checks a file (without starting the kernel),
    in an environment of only ``env`` as far as toolwire's variables go.

    Raises ``KernelError`` (a ``ConfigError``/``PluginError``) for what the check
    would report, ``AssertionError`` for a block that loads but cannot be what the
    docs mean. Returns a summary like `toolwire config check`'s.
    """
    text = block.text
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        data = {}  # load_config names the TOML error below
    for var in list(os.environ):
        if var.startswith(_ENV_PREFIXES) or var == "REDIS_URL":
            monkeypatch.delenv(var)
    shown = [t for _, t in block.files]
    refs = {n for m in _ENV_REFS.finditer("".join(shown)) for n in m.groups() if n}
    for name in sorted(secret_names(data) | refs):
        monkeypatch.setenv(name, f"dummy-{name.lower()}-value")
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    configured = sorted(data["plugins"]) if isinstance(data.get("plugins"), dict) else []
    if "enabled_plugins" in data:
        left_out = [p for p in configured if p not in data["enabled_plugins"]]
        assert not left_out, (
            f"{block.where}: enabled_plugins = {data['enabled_plugins']} leaves out "
            f"{left_out}, whose table the block configures (it would do nothing)"
        )
    elif not isinstance(data.get("plugins"), list):
        # a fragment: load exactly the plugins it configures (top-level keys come first)
        text = f"enabled_plugins = {json.dumps(configured)}\n{text}"
    placeholders = [m for m in _module_names(data) if m in PLACEHOLDER_MODULES]
    for module in placeholders:
        path = tmp_path / "src" / Path(*module.split("."))
        path.mkdir(parents=True)
        (path / "__init__.py").write_text(
            "from toolwire import tool\n\n\n@tool\ndef ping() -> str:\n"
            '    """A stand-in tool."""\n    return "pong"\n',
            encoding="utf-8",
        )
    if placeholders:
        monkeypatch.syspath_prepend(str(tmp_path / "src"))
    installed = config_module.installed_plugins()
    extra = {
        n: md.EntryPoint(n, v, config_module.ENTRY_POINT_GROUP)
        for n, v in UNINSTALLED_PLUGINS.items()
        if n not in installed
    }
    monkeypatch.setattr(config_module, "installed_plugins", lambda: {**installed, **extra})
    file = tmp_path / "toolwire.toml"
    file.write_text(text, encoding="utf-8")
    for name, content in block.files:
        (tmp_path / name).write_text(content, encoding="utf-8")
    cfg = load_config(file)
    server = _check_server_table(cfg)
    kernel = build_cli_kernel(cfg)
    plugins = [p.name for p in kernel.plugins.ordered()]
    assert sorted(plugins) == sorted(set(cfg.enabled_plugins or [])), (
        f"{block.where}: loaded {plugins}, not the enabled plugins {cfg.enabled_plugins}"
    )
    for info in kernel.plugins.ordered():
        # a file the page shows for `config_file` is read as the plugin reads it at startup
        included = getattr(info.config, "config_file", None)
        if included and included in dict(block.files):
            with_config_file(info.config, kernel, f"plugins.{info.name}")
    return {
        "state": kernel.state.backend,
        "plugins": plugins,
        "tools": len(kernel.list_tools()),
        "server": server,
    }


def check_pyproject_block(block: Block) -> list[str]:
    """The ``toolwire`` entry points of a pyproject excerpt load and name their plugin."""
    data = tomllib.loads(block.text)
    points = data.get("project", {}).get("entry-points", {}).get("toolwire", {})
    assert points, f"{block.where}: no [project.entry-points.toolwire] table"
    for name, value in points.items():
        plugin = md.EntryPoint(name, value, config_module.ENTRY_POINT_GROUP).load()
        assert getattr(plugin, "name", name) == name, (
            f"{block.where}: entry point {name!r} loads a plugin that calls itself "
            f"{plugin.name!r}; the kernel registers it as {name!r}"
        )
    return sorted(points)


BLOCKS = doc_blocks()


def test_the_docs_hold_toml_blocks() -> None:
    assert len(BLOCKS) >= 20, [b.where for b in BLOCKS]
    assert {b.kind for b in BLOCKS} >= {"config", "pyproject"}
    # docs/ratelimit.md shows the file its `config_file` example names
    assert any("providers.yaml" in dict(b.files) for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_doc_toml_block(
    block: Block,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if block.kind == "pyproject":
        check_pyproject_block(block)
        return
    if block.kind == "invalid":
        with pytest.raises(KernelError) as err:
            check_config_block(block, tmp_path, monkeypatch)
        assert block.expect in str(err.value), (
            f"{block.where}: the error does not say {block.expect!r}: {err.value}"
        )
        return
    with caplog.at_level(logging.WARNING, logger="toolwire"):
        check_config_block(block, tmp_path, monkeypatch)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, f"{block.where}: loading it logs warnings: {warnings}"


# ------------------------------------------------- TOOLWIRE_PLUGINS__ variables
_ENV_EXAMPLE = re.compile(r"`(TOOLWIRE_PLUGINS__[A-Z0-9_]+)=([^`]+)`")


def env_examples() -> list[tuple[str, str, str]]:
    """(file:line, variable, value) of every `TOOLWIRE_PLUGINS__...=value` the docs show."""
    out = []
    for f in sorted({p for g in DOC_GLOBS for p in ROOT.glob(g)}):
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for m in _ENV_EXAMPLE.finditer(line):
                [value] = shlex.split(m[2])  # '["http://research:8000"]' as a shell reads it
                out.append((f"{f.relative_to(ROOT).as_posix()}:{n}", m[1], value))
    return out


ENV_EXAMPLES = env_examples()


def test_the_docs_show_plugin_variables() -> None:
    assert len(ENV_EXAMPLES) >= 5, ENV_EXAMPLES


@pytest.mark.parametrize(
    ("where", "var", "value"), ENV_EXAMPLES, ids=[w for w, _, _ in ENV_EXAMPLES]
)
def test_doc_plugin_variable(
    where: str, var: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable the docs show loads, and its plugin validates the value it sets."""
    plugin = var.removeprefix("TOOLWIRE_PLUGINS__").split("__")[0].lower()
    block = Block(where, "config", "", f"enabled_plugins = [{json.dumps(plugin)}]\n")
    summary = check_config_block(block, tmp_path, monkeypatch, env={var: value})
    assert summary["plugins"] == [plugin]


# ------------------------------------------------------------- the checker itself
def _one_block(markdown: str) -> Block:
    [block] = toml_blocks(markdown, "x.md")
    return block


def test_a_wrong_key_in_a_fragment_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = _one_block("```toml\n[plugins.retry]\nmax_attempt = 4\n```\n")
    assert (block.where, block.kind) == ("x.md:1", "config")
    with pytest.raises(KernelError, match=r"plugins\.retry\.max_attempt: unknown key"):
        check_config_block(block, tmp_path, monkeypatch)


def test_a_value_the_model_refuses_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = _one_block("```toml\n[plugins.mcp.servers.x]\nurl = 'ftp://x'\n```\n")
    with pytest.raises(KernelError, match=r"plugins\.mcp\.servers\.x"):
        check_config_block(block, tmp_path, monkeypatch)


def test_a_bad_server_table_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = _one_block('```toml\n[server]\ntransport = "carrier-pigeon"\n```\n')
    with pytest.raises(KernelError, match=r"server\.transport"):
        check_config_block(block, tmp_path, monkeypatch)


def test_a_table_of_a_plugin_left_out_of_enabled_plugins_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = _one_block(
        '```toml\nenabled_plugins = ["audit"]\n[plugins.retry]\nmax_attempts = 4\n```\n'
    )
    with pytest.raises(AssertionError, match=r"leaves out \['retry'\]"):
        check_config_block(block, tmp_path, monkeypatch)


def test_a_fragment_loads_only_the_plugins_it_configures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "search")  # ignored: the block decides
    block = _one_block(
        '```toml\n[plugins.approval]\ndefault = "LAZY"\n'
        '[plugins.a2a.agents.x]\nurl = "http://x:1"\nbearer_token = {"$secretRef" = "X_TOKEN"}\n'
        "```\n"
    )
    summary = check_config_block(block, tmp_path, monkeypatch)
    assert sorted(summary["plugins"]) == ["a2a", "approval"]
    assert os.environ["X_TOKEN"]  # the secret got a dummy value


def test_a_block_that_logs_a_warning_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A credential written in plain text is warned about: the docs must not teach it."""
    block = _one_block(
        '```toml\n[plugins.a2a.agents.x]\nurl = "http://x:1"\nbearer_token = "s3cr3t"\n```\n'
    )
    with pytest.raises(AssertionError, match=r"plugins\.a2a\.agents.* in plain text"):
        test_doc_toml_block(block, tmp_path, monkeypatch, caplog)


def test_an_invalid_marker_needs_the_error_text() -> None:
    with pytest.raises(ValueError, match="toml: invalid"):
        _one_block("<!-- toml: invalid -->\n```toml\nx = 1\n```\n")
    with pytest.raises(ValueError, match="unknown marker kind"):
        _one_block("<!-- toml: valid -->\n```toml\nx = 1\n```\n")
    block = _one_block('text\n\n<!-- toml: invalid "unknown key" -->\n\n```toml\nx = 1\n```\n')
    assert (block.where, block.kind, block.expect) == ("x.md:5", "invalid", "unknown key")


def test_an_invalid_block_that_loads_fails_the_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    good = _one_block('<!-- toml: invalid "x" -->\n```toml\n[plugins.retry]\ncap_s = 5\n```\n')
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        test_doc_toml_block(good, tmp_path, monkeypatch, caplog)
    bad = _one_block(
        '<!-- toml: invalid "max_attempts" -->\n```toml\n[plugins.retry]\ncap_s = -1\n```\n'
    )
    (tmp_path / "2").mkdir()
    with pytest.raises(AssertionError, match="does not say 'max_attempts'"):
        test_doc_toml_block(bad, tmp_path / "2", monkeypatch, caplog)


def test_a_pyproject_entry_point_must_load() -> None:
    block = _one_block(
        "<!-- toml: pyproject -->\n```toml\n[project.entry-points.toolwire]\n"
        'audit = "toolwire_audit:NoSuchPlugin"\n```\n'
    )
    with pytest.raises(AttributeError, match="NoSuchPlugin"):
        check_pyproject_block(block)
    misnamed = _one_block(
        "<!-- toml: pyproject -->\n```toml\n[project.entry-points.toolwire]\n"
        'audit2 = "toolwire_audit:AuditPlugin"\n```\n'
    )
    with pytest.raises(AssertionError, match="calls itself 'audit'"):
        check_pyproject_block(misnamed)


# ------------------------------------------------------------ examples/toolwire.toml
@pytest.mark.timeout(120)
def test_the_example_config_passes_toolwire_config_check(tmp_path: Path) -> None:
    """`toolwire config check` on examples/toolwire.toml: it loads, starts the demo
    upstream over stdio (local, no network) and lists its tools; nothing is served."""
    if shutil.which("python") is None:
        pytest.skip("the example starts `python` from PATH")
    example = tmp_path / "toolwire.toml"  # its state and audit log go next to it
    shutil.copy(EXAMPLE, example)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
    env.pop("REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "--config", str(example), "config", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True and summary["server"] == "ok"
    assert sorted(summary["plugins"]) == ["audit", "mcp"]
    local = Kernel()
    local.add_tool(toolwire.examples)
    assert summary["tools"] > len(local.list_tools()), "the upstream's tools are missing"
