"""The `toolwire` command line, run in-process (and once as a real subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from importlib import metadata as md
from pathlib import Path

import pytest

from toolwire import Kernel
from toolwire import _config as config_mod
from toolwire.cli import main


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith("TOOLWIRE_") or var == "REDIS_URL":
            monkeypatch.delenv(var)
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")  # no installed plugins unless a test says so


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_tools_lists_bundled_examples_on_embedded_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "tools")
    assert code == 0
    assert isinstance(out, list)
    names = [t["name"] for t in out]
    assert "add" in names and "counter_increment" in names
    add = next(t for t in out if t["name"] == "add")
    assert add["input_schema"]["required"] == ["a", "b"]
    assert (tmp_path / ".toolwire" / "state.db").exists()  # embedded SQLite state


def test_tools_query_and_formats(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "tools", "--query", "hash a text", "--format", "openai", "--limit", "2"
    )
    assert code == 0 and isinstance(out, list)
    assert out[0]["type"] == "function" and out[0]["function"]["name"] == "word_hash"


def test_tools_limit_must_be_a_whole_number_of_at_least_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: --limit 0 / -1 ended in a ValueError traceback from find_tools."""
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exc:
            main(["tools", "--query", "add", "--limit", bad])
        err = capsys.readouterr().err
        assert exc.value.code == 2, bad
        assert f"argument --limit: {bad!r}: give a whole number >= 1" in err
        assert "Traceback" not in err


def test_tools_limit_applies_to_the_listing_and_mode_needs_a_query(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: without --query, --limit and --mode were silently ignored."""
    code, everything, _ = run(capsys, "tools")
    assert code == 0 and isinstance(everything, list) and len(everything) > 2
    code, out, _ = run(capsys, "tools", "--limit", "2")
    assert code == 0 and isinstance(out, list)
    assert [t["name"] for t in out] == [t["name"] for t in everything[:2]]
    code, out, err = run(capsys, "tools", "--mode", "semantic")
    assert code == 2 and out is None
    assert err.startswith("toolwire: error: --mode semantic ranks the results of a search")
    assert "give --query Q too" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run(capsys, "tools", "--query", "", "--mode", "hybrid")
    assert code == 2 and out is None  # an empty query is no search either
    code, out, _ = run(capsys, "tools", "--query", "")
    assert code == 0 and out == everything
    code, out, _ = run(capsys, "tools", "-q", "add", "--mode", "explicit")
    assert code == 0 and isinstance(out, list) and [t["name"] for t in out] == ["add"]


def test_call_prints_result_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "call", "add", "--args", '{"a": 2, "b": 3}', "--call-id", "c1")
    assert code == 0 and isinstance(out, dict)
    assert out["content"] == {"result": 5.0} and out["meta"]["call_id"] == "c1"
    code, out, _ = run(capsys, "call", "add", "--args", '{"a": "x", "b": 3}')
    assert code == 1 and isinstance(out, dict)
    assert out["error"]["kind"] == "invalid_args" and "field 'a'" in out["error"]["message"]
    code, out, _ = run(capsys, "call", "nope")
    assert code == 1 and isinstance(out, dict) and out["error"]["kind"] == "not_found"


def test_call_with_bad_json_args(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "call", "add", "--args", "{not json")
    assert code == 2 and "--args is not valid JSON" in err
    assert "give a JSON object in single quotes, e.g. --args '{\"a\": 1}'" in err
    code, _, err = run(capsys, "call", "add", "--args", "[1]")
    assert code == 2 and "must be a JSON object" in err


def test_call_with_args_nested_too_deep(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: json.loads' RecursionError escaped: a traceback and exit code 1."""
    deep = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"
    code, out, err = run(capsys, "call", "add", "--args", deep)
    assert code == 2 and out is None
    assert "--args is nested too deeply to read" in err and "Traceback" not in err


def test_call_refuses_an_empty_id(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `--call-id "$UNSET"` gave every call the id '', so the idempotency plugin
    replayed the first call's result, or refused other arguments as a conflict."""
    for option in ("--call-id", "--session-id", "--tenant"):
        code, out, err = run(capsys, "call", "add", "--args", '{"a": 1, "b": 2}', option, "")
        assert code == 2 and out is None
        assert err == f"toolwire: error: {option} is empty: give a value, or leave the option out\n"
    code, out, _ = run(capsys, "call", "add", "--args", '{"a": 1, "b": 2}', "--call-id", "c-1")
    assert code == 0 and isinstance(out, dict) and out["meta"]["call_id"] == "c-1"


def test_config_check_ok_and_broken(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "config", "check")
    assert code == 0 and isinstance(out, dict) and out["ok"] and out["state"] == "sqlite"
    assert out["state_url"] == "sqlite:///.toolwire/state.db"  # in the working directory
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "toolwire.toml").write_text("enabled_plugins = []\n")
    code, out, _ = run(capsys, "--config", str(conf / "toolwire.toml"), "config", "check")
    assert code == 0 and isinstance(out, dict)
    assert out["state_url"].endswith(f"{conf}/.toolwire/state.db")  # beside the config file
    bad = tmp_path / "bad.toml"
    bad.write_text('state = "memory://"\nunknown_key = 1\n')
    code, out, err = run(capsys, "--config", str(bad), "config", "check")
    assert code == 2 and out is None
    assert str(bad) in err and "unknown_key: unknown key" in err


_PLUGINS_MODULE = """
from pydantic import BaseModel, ConfigDict

CONSTRUCTED = []


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    greeting: str = "hello"


class DemoPlugin:
    Config = DemoConfig

    def __init__(self, config):
        CONSTRUCTED.append(config)


class Plain:
    pass
"""


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``install(name="module:attr", ...)``: the installed plugins, as entry points, of a
    module ``twcli_plugins`` written for the test (``DemoPlugin``, ``Plain``); and
    ``twcli_needsdep``, whose third-party dependency is not installed."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "twcli_plugins.py").write_text(_PLUGINS_MODULE)
    (mods / "twcli_needsdep.py").write_text("import twcli_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delenv("TOOLWIRE_LOAD_PLUGINS")  # the file says which plugins to load

    def install(**targets: str) -> None:
        eps = {n: md.EntryPoint(n, v, "toolwire") for n, v in targets.items()}
        monkeypatch.setattr(config_mod, "installed_plugins", lambda: eps)

    yield install
    for name in ("twcli_plugins", "twcli_needsdep"):
        sys.modules.pop(name, None)


def warning_lines(err: str) -> list[str]:
    """The messages of the WARNING lines logged on stderr (JSON lines)."""
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [r["msg"] for r in logs if r["level"] == "warning"]


def test_server_table_checkers_of_both_forms_are_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``toolwire.server_config`` checkers get the loaded config as a third argument; one
    written before that (two arguments) is still called, not a TypeError traceback."""
    from toolwire import ToolwireConfig
    from toolwire import cli as cli_mod

    seen: list[tuple[object, ...]] = []

    def old(table: dict[str, object], file: str | None) -> None:
        seen.append(("old", table, file))

    def new(table: dict[str, object], file: str | None, config: ToolwireConfig) -> None:
        seen.append(("new", table, file, config))

    class EP:
        def __init__(self, name: str, fn: Callable[..., None]) -> None:
            self.name, self._fn = name, fn

        def load(self) -> Callable[..., None]:
            return self._fn

    def entry_points(*, group: str) -> list[EP]:
        assert group == cli_mod.SERVER_CONFIG_GROUP
        return [EP("a", old), EP("b", new)]

    monkeypatch.setattr(cli_mod.md, "entry_points", entry_points)
    cfg = ToolwireConfig.model_validate({"server": {"port": 8123}})
    assert cli_mod._check_server_table(cfg) == "ok"
    assert seen == [("old", {"port": 8123}, None), ("new", {"port": 8123}, None, cfg)]


def test_config_check_lists_the_warnings_and_strict_fails_on_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_plugins: Callable[..., None]
) -> None:
    """Before: a plugin skipped for a missing dependency showed only as a WARNING line on
    stderr and the summary said "ok": true; nothing let a deploy pipeline fail on it."""
    fake_plugins(plain="twcli_plugins:Plain", needsdep="twcli_needsdep:Plugin")
    conf = tmp_path / "tw.toml"
    conf.write_text("")
    code, out, err = run(capsys, "--config", str(conf), "config", "check")
    assert code == 0 and isinstance(out, dict) and out["ok"] is True
    assert out["plugins"] == ["plain"]
    [warning] = out["warnings"]
    assert warning.startswith("plugin 'needsdep' skipped: No module named")
    assert "install the distribution that provides module 'twcli_missing_dependency_xyz'" in warning
    assert warning_lines(err) == [warning]  # stderr logs as it did
    code, out, err = run(capsys, "--config", str(conf), "config", "check", "--strict")
    assert code == 1 and isinstance(out, dict) and out["ok"] is False
    assert out["warnings"] == [warning] and warning_lines(err) == [warning]
    # a level above WARNING hides the line on stderr, not the warning from the check
    code, out, err = run(capsys, "--log-level", "error", "--config", str(conf), "config", "check")
    assert code == 0 and isinstance(out, dict) and out["warnings"] == [warning]
    assert err == ""
    # nothing to say: an empty list, and --strict passes
    fake_plugins(plain="twcli_plugins:Plain")
    code, out, err = run(capsys, "--config", str(conf), "config", "check", "--strict")
    assert code == 0 and isinstance(out, dict) and out["ok"] is True
    assert out["warnings"] == [] and err == ""


def test_config_check_collecting_warnings_changes_nothing_stderr_shows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: to collect the warnings under ``--log-level error``, the check raised the
    stderr handler to ERROR, which hid the trace lines TOOLWIRE_TRACE_PLUGINS asks for
    (INFO, shown at any level)."""
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "audit")
    monkeypatch.setenv("TOOLWIRE_TRACE_PLUGINS", "audit")
    code, out, err = run(capsys, "--log-level", "error", "config", "check")
    assert code == 0 and isinstance(out, dict) and out["plugins"] == ["audit"], err
    logs = [json.loads(line) for line in err.splitlines()]
    traced = [r["msg"] for r in logs if r.get("logger") == "toolwire.trace"]
    assert any(m.startswith("audit.startup() -> None in ") for m in traced), err
    assert all(r["level"] == "info" for r in logs), err  # and no warning let through


def test_config_check_leaves_a_third_party_warning_on_stderr(tmp_path: Path) -> None:
    """Before: the collecting handler on the root logger stood in for logging's last
    resort (stderr, for a logger with no handler), so a library's warning was only in
    "warnings" and no longer on stderr. A real process: pytest puts its own handlers on
    the root logger."""
    (tmp_path / "noisy_tools.py").write_text(
        "import logging\n\nlogging.getLogger('thirdparty').warning('the library warns')\n"
    )
    (tmp_path / "toolwire.toml").write_text(
        'enabled_plugins = []\n[tools]\nmodules = ["noisy_tools"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "config", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["warnings"] == ["the library warns"]
    assert proc.stderr.splitlines() == ["the library warns"]


def test_config_check_validates_the_table_of_a_plugin_that_is_not_enabled(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_plugins: Callable[..., None],
) -> None:
    """Before: `[plugins.demo]` of an installed plugin left out by enabled_plugins was
    never read, so a broken table passed `config check` and failed the day the plugin
    was enabled. Now the check says so; normal startup neither imports nor builds it."""
    fake_plugins(demo="twcli_plugins:DemoPlugin", plain="twcli_plugins:Plain")
    conf = tmp_path / "tw.toml"
    left_out = (
        f"{conf}: plugin 'demo' is not enabled: enabled_plugins = [\"plain\"] leaves it out "
        "(add 'demo' to that list, or remove the list to load every installed plugin); "
        "its table [plugins.demo]"
    )
    for table, expected in (
        (
            "greting = 'hi'",
            "would fail: plugins.demo.greting: unknown key; did you mean 'greeting'?",
        ),
        ("greeting = 1", "would fail: plugins.demo.greeting: Input should be a valid string"),
        ("order = 'first'", "would fail: plugins.demo.order: must be an integer"),
        ("greeting = 'hi'\norder = 5", "is not used"),
    ):
        conf.write_text(f'enabled_plugins = ["plain"]\n[plugins.demo]\n{table}\n')
        code, out, err = run(capsys, "--config", str(conf), "config", "check", "--strict")
        assert code == 1 and isinstance(out, dict) and out["ok"] is False, table
        assert out["plugins"] == ["plain"]
        assert out["warnings"] == [f"{left_out} {expected}"], table
        assert warning_lines(err) == out["warnings"]
    assert sys.modules["twcli_plugins"].CONSTRUCTED == []  # validated, never built
    # disabled from the environment: the variable is named
    conf.write_text("[plugins.demo]\ngreting = 'hi'\n")
    monkeypatch.setenv("TOOLWIRE_DISABLE_PLUGINS", "demo")
    code, out, _ = run(capsys, "--config", str(conf), "config", "check")
    assert code == 0 and isinstance(out, dict) and out["ok"] is True
    assert out["warnings"] == [
        f"{conf}: plugin 'demo' is not enabled: the environment variable "
        "TOOLWIRE_DISABLE_PLUGINS disables it (remove demo from it); its table "
        "[plugins.demo] would fail: plugins.demo.greting: unknown key; did you mean "
        "'greeting'?"
    ]
    # a valid table of a plugin switched off on purpose is kept for later: no warning
    conf.write_text("[plugins.demo]\ngreeting = 'hi'\n")
    code, out, _ = run(capsys, "--config", str(conf), "config", "check", "--strict")
    assert code == 0 and isinstance(out, dict) and out["warnings"] == [], out
    conf.write_text("disabled_plugins = [\"demo\"]\n[plugins.demo]\ngreeting = 'hi'\n")
    monkeypatch.delenv("TOOLWIRE_DISABLE_PLUGINS")
    code, out, _ = run(capsys, "--config", str(conf), "config", "check", "--strict")
    assert code == 0 and isinstance(out, dict) and out["warnings"] == [], out
    conf.write_text("[plugins.demo]\ngreting = 'hi'\n")
    monkeypatch.setenv("TOOLWIRE_DISABLE_PLUGINS", "demo")
    # at normal startup the plugin's module is not even imported
    sys.modules.pop("twcli_plugins")
    kernel = Kernel.from_config(str(conf))
    assert [p.name for p in kernel.plugins.ordered()] == ["plain"]
    assert "twcli_plugins" in sys.modules  # by `plain`, which is enabled
    monkeypatch.setenv("TOOLWIRE_DISABLE_PLUGINS", "demo,plain")
    sys.modules.pop("twcli_plugins")
    assert Kernel.from_config(str(conf)).plugins.ordered() == []
    assert "twcli_plugins" not in sys.modules


def test_a_misspelt_key_is_answered_with_the_key_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "enabled_plugin: unknown key", with no word on what the table takes."""
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "audit")
    conf = tmp_path / "tw.toml"
    for text, expected in (
        (
            'enabled_plugin = ["audit"]\n',
            "enabled_plugin: unknown key; did you mean 'enabled_plugins'?",
        ),
        ('[tools]\nmodule = ["toolwire.examples"]\n', "did you mean 'modules'?"),
        (
            "[plugins.audit]\ninclude_arg = true\n",
            "plugins.audit.include_arg: unknown key; did you mean 'include_args'?",
        ),
        ("colour = 1\n", "colour: unknown key (known keys: close_grace_s, deadline_s,"),
    ):
        conf.write_text(text)
        code, out, err = run(capsys, "--config", str(conf), "config", "check")
        assert code == 2 and out is None, text
        assert expected in err and len(err.strip().splitlines()) == 1, err
    assert "path" not in err  # not a key of the file


def test_a_misspelt_plugin_name_is_answered_with_the_plugin_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "unknown plugin 'audti'; ... (pip install toolwire-audti?)"."""
    monkeypatch.delenv("TOOLWIRE_LOAD_PLUGINS")  # the file says which plugins to load
    conf = tmp_path / "tw.toml"
    for text, key in (
        ('enabled_plugins = ["audti"]\n', "enabled_plugins: unknown plugin 'audti'"),
        ('disabled_plugins = ["audti"]\n', "disabled_plugins: unknown plugin 'audti'"),
        ("[plugins.audti]\npath = '-'\n", "plugins.audti: configuration for unknown plugin"),
    ):
        conf.write_text(text)
        code, out, err = run(capsys, "--config", str(conf), "config", "check")
        assert code == 2 and out is None
        assert key in err and err.endswith("(did you mean 'audit'?)\n"), err
    conf.write_text('enabled_plugins = ["zzz"]\n')  # nothing close: where to get it
    code, _, err = run(capsys, "--config", str(conf), "config", "check")
    assert code == 2 and err.endswith("(pip install toolwire-zzz?)\n"), err
    # a name from a variable names the variable, not the file (before: "enabled_plugins")
    for var, key in (
        ("TOOLWIRE_LOAD_PLUGINS", "enabled_plugins"),
        ("TOOLWIRE_DISABLE_PLUGINS", "disabled_plugins"),
    ):
        monkeypatch.setenv(var, "audti")
        code, _, err = run(capsys, "config", "check")
        assert code == 2 and err.startswith(f"toolwire: error: {key}: unknown plugin 'audti'")
        assert err.endswith(
            f"(did you mean 'audit'?) (the name comes from the environment variable {var})\n"
        ), err
        monkeypatch.delenv(var)


def test_a_missing_config_file_says_where_a_relative_path_was_looked_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before: "nope.toml: config file not found", not saying from which directory (an
    MCP client starting `toolwire serve --config ...` picks the working directory)."""
    for argv in (("config", "check"), ("call", "add"), ("tools",)):
        code, out, err = run(capsys, "--config", "nope.toml", *argv)
        assert code == 2 and out is None
        assert err == (
            "toolwire: error: nope.toml: config file not found; check the path "
            f"(a relative path is read from {tmp_path})\n"
        )
    code, _, err = run(capsys, "--config", str(tmp_path / "nope.toml"), "config", "check")
    assert code == 2 and err.endswith("config file not found; check the path\n")


def test_a_config_path_that_is_a_directory_or_empty_says_what_to_give(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "conf: cannot read: [Errno 21] Is a directory", and `--config ''` read
    the working directory the same way."""
    (tmp_path / "conf").mkdir()
    code, out, err = run(capsys, "--config", "conf", "config", "check")
    assert code == 2 and out is None
    assert err == (
        "toolwire: error: conf: is a directory, not a config file: give the file's path, "
        "e.g. 'conf/toolwire.toml'\n"
    )
    monkeypatch.setenv("TOOLWIRE_CONFIG", "conf")
    code, _, err = run(capsys, "config", "check")
    assert code == 2 and "(named by the environment variable TOOLWIRE_CONFIG)" in err
    monkeypatch.delenv("TOOLWIRE_CONFIG")
    code, _, err = run(capsys, "--config", "", "tools")
    assert code == 2 and err.startswith("toolwire: error: the config path is empty: give")


def test_config_may_follow_the_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before: `toolwire config check --config x.toml` was "unrecognized arguments",
    though `toolwire serve --config x.toml` worked."""
    conf = tmp_path / "conf" / "tw.toml"
    conf.parent.mkdir()
    conf.write_text('enabled_plugins = []\n[tools]\nmodules = ["toolwire.examples"]\n')
    code, out, err = run(capsys, "config", "check", "--config", str(conf))
    assert code == 0 and isinstance(out, dict) and out["config_file"] == str(conf), err
    code, out, _ = run(capsys, "call", "add", "-c", str(conf), "--args", '{"a": 1, "b": 2}')
    assert code == 0 and isinstance(out, dict) and out["content"] == {"result": 3.0}
    assert (conf.parent / ".toolwire" / "state.db").exists()
    assert not (tmp_path / ".toolwire").exists()  # the working directory's store is not used
    conf.write_text("enabled_plugins = []\n")  # no tools: the file is the one read
    code, out, _ = run(capsys, "tools", "--config", str(conf))
    assert code == 0 and out == []
    code, out, _ = run(capsys, "plugins", "-c", str(conf))
    assert code == 0 and out == []


def test_a_missing_subcommand_is_named_by_its_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: "the following arguments are required: config_command"."""
    with pytest.raises(SystemExit) as exc:
        main(["config"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "toolwire config: error: the following arguments are required: {check}" in err
    assert "config_command" not in err


def test_bad_state_and_log_level_are_one_line_errors_with_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each of these ended in a Python traceback and exit code 1."""
    bad = tmp_path / "bs.toml"
    bad.write_text('state = "bogus://x"\n')
    for argv in (("config", "check"), ("tools",), ("call", "add", "--args", "{}")):
        code, out, err = run(capsys, "--config", str(bad), *argv)
        assert code == 2 and out is None, (argv, err)
        assert "state: unknown state store URL 'bogus://x'" in err
        assert "Traceback" not in err
    monkeypatch.setenv("TOOLWIRE_STATE", "bogus://x")
    code, _, err = run(capsys, "tools")
    assert code == 2 and "environment variable TOOLWIRE_STATE" in err
    for url, problem in (  # the whole URL is checked when the config is read
        ("sqlite:///x.db?busy_timeout=abc", "busy_timeout must be a number of seconds"),
        ("sqlite:///x.db?bogus=1", "unknown option 'bogus'"),
        ("sqlite:///", "has no database path"),
    ):
        monkeypatch.setenv("TOOLWIRE_STATE", url)
        code, _, err = run(capsys, "config", "check")
        assert code == 2 and problem in err and "Traceback" not in err, err
    monkeypatch.delenv("TOOLWIRE_STATE")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    code, _, err = run(capsys, "config", "check")
    assert code == 2 and "unreachable" in err and "start redis-server" in err
    monkeypatch.delenv("REDIS_URL")
    with pytest.raises(SystemExit) as exc:
        main(["--log-level", "LOUD", "plugins"])
    assert exc.value.code == 2 and "invalid choice: 'LOUD'" in capsys.readouterr().err
    assert main(["--log-level", "info", "plugins"]) == 0  # any case


def test_plugins_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "audit")
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert out == [
        {
            "name": "audit",
            "version": "0.1.0",
            "distribution": "toolwire-audit",
            "order": 50,
            "hooks": ["after_call", "before_call", "shutdown", "startup"],
        }
    ]


def test_trace_plugins_shows_hook_calls_at_the_default_log_level(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the trace lines (INFO) were hidden by the default WARNING level, and a
    misspelt plugin name in TOOLWIRE_TRACE_PLUGINS traced nothing without a word."""
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "audit")
    monkeypatch.setenv("TOOLWIRE_TRACE_PLUGINS", "audit,audti")
    code, _, err = run(capsys, "call", "add", "--args", '{"a": 1, "b": 2}')
    assert code == 0
    logs = [json.loads(line) for line in err.splitlines()]
    traced = [r["msg"] for r in logs if r.get("logger") == "toolwire.trace"]
    assert any(m.startswith("audit.before_call(add) -> None in ") for m in traced), err
    assert any(m.startswith("audit.after_call(add) -> None in ") for m in traced), err
    warned = [r["msg"] for r in logs if r.get("level") == "warning"]
    assert len(warned) == 1, warned
    assert warned[0].startswith(
        "TOOLWIRE_TRACE_PLUGINS names 'audti', which is not registered (loaded plugins: audit)"
    )
    monkeypatch.delenv("TOOLWIRE_TRACE_PLUGINS")
    code, _, err = run(capsys, "call", "add", "--args", '{"a": 1, "b": 2}')
    assert code == 0 and "toolwire.trace" not in err and '"level": "warning"' not in err


def test_real_subprocess_keeps_stdout_for_json_and_logs_on_stderr(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env["TOOLWIRE_LOAD_PLUGINS"] = ""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolwire.cli",
            "--log-level",
            "debug",
            "call",
            "echo",
            "--args",
            '{"message": "hi"}',
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["content"] == {"message": "hi"}
    for line in proc.stderr.splitlines():
        json.loads(line)  # every log line is JSON


NOISY_TOOLS = """
import os
import subprocess
import sys

from toolwire import tool

print("noisy_tools imported")


@tool
def noisy(x: int) -> int:
    \"\"\"Return x, printing on the way.\"\"\"
    print("debug: computing", x)
    os.write(1, b"raw fd write\\n")
    subprocess.run([sys.executable, "-c", "print('child process output')"], check=True)
    return x
"""


@pytest.mark.parametrize(
    "command",
    [["call", "noisy", "--args", '{"x": 7}'], ["tools"], ["plugins"], ["config", "check"]],
    ids=["call", "tools", "plugins", "config check"],
)
def test_what_tools_print_goes_to_stderr_not_into_the_json(
    tmp_path: Path, command: list[str]
) -> None:
    """Before: a print() in a tool or a tool module, a write to fd 1, a child process's
    output all landed on stdout before the JSON, which no longer parsed."""
    (tmp_path / "noisy_tools.py").write_text(NOISY_TOOLS)
    (tmp_path / "toolwire.toml").write_text('[tools]\nmodules = ["noisy_tools"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env["TOOLWIRE_LOAD_PLUGINS"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "noisy_tools imported" in proc.stderr
    if command[0] == "call":
        assert out["content"] == {"result": 7}
        for text in ("debug: computing 7", "raw fd write", "child process output"):
            assert text in proc.stderr


def test_the_embedded_state_goes_beside_the_config_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MCP client may start `toolwire serve --config ...` in any directory."""
    for var in ("TOOLWIRE_STATE", "REDIS_URL", "TOOLWIRE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    conf_dir, cwd = tmp_path / "conf", tmp_path / "cwd"
    conf_dir.mkdir()
    cwd.mkdir()
    (conf_dir / "toolwire.toml").write_text("enabled_plugins = []\n")
    monkeypatch.chdir(cwd)
    code, _, err = run(capsys, "--config", str(conf_dir / "toolwire.toml"), "config", "check")
    assert code == 0, err
    assert (conf_dir / ".toolwire" / "state.db").exists()
    assert not (cwd / ".toolwire").exists()


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_call_prints_a_result_its_terminal_cannot_encode(tmp_path: Path, encoding: str) -> None:
    """Before: a lone surrogate in a result (text cut mid-character upstream) crashed the
    print with UnicodeEncodeError, and the computed result was lost."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env |= {"TOOLWIRE_LOAD_PLUGINS": "", "PYTHONIOENCODING": encoding}
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "call", "echo", "--args", '{"message": "é\\ud800"}'],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["content"] == {"message": "é\ud800"}


def test_call_keeps_the_sigterm_handler_it_found(capsys: pytest.CaptureFixture[str]) -> None:
    """`toolwire call` run in-process (an embedding, a test) listens for SIGTERM only while
    it calls. Before, it left SIGTERM at the default action: the host's handler was lost."""

    def host_handler(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    previous = signal.signal(signal.SIGTERM, host_handler)
    try:
        code, out, err = run(capsys, "call", "add", "--args", '{"a": 1, "b": 2}')
        assert code == 0, err
        assert isinstance(out, dict) and out["content"] == {"result": 3.0}
        assert signal.getsignal(signal.SIGTERM) is host_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_call_works_outside_the_main_thread(capsys: pytest.CaptureFixture[str]) -> None:
    """Signals reach only the main thread: there the host owns SIGTERM and the call runs
    without a listener. Before, `toolwire call` failed there (no signal handler can be
    installed outside the main thread)."""
    codes: list[object] = []

    def target() -> None:
        try:
            codes.append(main(["call", "add", "--args", '{"a": 1, "b": 2}']))
        except BaseException as exc:  # reported below, not lost in the thread
            codes.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    out, err = capsys.readouterr()
    assert codes == [0], err
    assert json.loads(out)["content"] == {"result": 3.0}


def test_sigterm_before_the_calls_first_pause_cancels_it(tmp_path: Path) -> None:
    """The SIGTERM listener is in place before the call starts. Before, it started at the
    call's first pause: a SIGTERM before that (here sent by the tool itself, before its
    first await) killed the process mid-call, no hook releasing what it held."""
    (tmp_path / "termmod.py").write_text(
        "import os, signal, anyio\n"
        "from toolwire import tool\n"
        "@tool\n"
        "async def term() -> dict:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    await anyio.sleep(60)\n"
        "    return {}\n"
    )
    (tmp_path / "toolwire.toml").write_text('[tools]\nmodules = ["termmod"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env["TOOLWIRE_LOAD_PLUGINS"] = ""
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "call", "term"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr)
    assert "terminated (SIGTERM) while calling 'term'" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "dist"),
    [
        (["serve", "--transport", "http"], "toolwire-mcp"),
        (["--log-level", "info", "stats"], "toolwire-profiling"),
        (["-c", "x.toml", "keys", "status"], "toolwire-ratelimit"),
        (["approvals", "list"], "toolwire-approval"),
    ],
)
def test_a_command_of_a_distribution_not_installed_says_what_to_install(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    dist: str,
) -> None:
    """Before: with only the kernel installed, `toolwire serve` (the README's first command)
    answered argparse's "invalid choice: 'serve' (choose from 'plugins', ...)", which does not
    say that the command comes from toolwire-mcp."""
    from toolwire import cli as cli_mod

    real = md.entry_points

    def entry_points(*, group: str) -> object:
        return [] if group == cli_mod.CLI_ENTRY_POINT_GROUP else real(group=group)

    def distribution(name: str) -> object:
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(cli_mod.md, "entry_points", entry_points)
    monkeypatch.setattr(cli_mod.md, "distribution", distribution)
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    command = next(a for a in argv if a in ("serve", "stats", "keys", "approvals"))
    assert f"`toolwire {command}` comes from {dist}, which is not installed" in err
    assert f"pip install {dist}" in err and "Traceback" not in err
    # a command nobody provides is still argparse's usage error
    with pytest.raises(SystemExit) as ei:
        main(["serv"])
    assert ei.value.code == 2 and "invalid choice: 'serv'" in capsys.readouterr().err


def test_a_first_party_command_that_failed_to_register_is_not_called_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The distribution is installed but its command could not be registered (a warning says
    why): "pip install" would be the wrong fix."""
    from toolwire import cli as cli_mod

    real = md.entry_points

    def entry_points(*, group: str) -> object:
        return [] if group == cli_mod.CLI_ENTRY_POINT_GROUP else real(group=group)

    monkeypatch.setattr(cli_mod.md, "entry_points", entry_points)
    monkeypatch.setattr(cli_mod.md, "distribution", lambda name: object())
    with pytest.raises(SystemExit) as ei:
        main(["serve"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "toolwire-mcp, which is installed but could not register" in err


_FAILING_STARTUP = """
from toolwire import hookimpl


def where_it_broke():
    raise KeyError("region")


class Broken:
    @hookimpl
    def startup(self, kernel):
        where_it_broke()
"""


def test_log_level_debug_shows_where_a_plugin_failed_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `toolwire: error: plugin 'broken': startup failed: KeyError: 'region'` was
    all a plugin author ever saw, at any --log-level: no file, no line, no traceback.
    At DEBUG the traceback is logged now; at the default level the one line stays alone."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "twcli_broken.py").write_text(_FAILING_STARTUP)
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delenv("TOOLWIRE_LOAD_PLUGINS", raising=False)
    eps = {"broken": md.EntryPoint("broken", "twcli_broken:Broken", "toolwire")}
    monkeypatch.setattr(config_mod, "installed_plugins", lambda: eps)
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text('state = "memory://"\nenabled_plugins = ["broken"]\n')
    try:
        assert main(["-c", str(cfg), "call", "add"]) == 2
        err = capsys.readouterr().err
        assert "toolwire: error: plugin 'broken': startup failed: KeyError: 'region'" in err
        assert "Traceback" not in err
        assert main(["--log-level", "DEBUG", "-c", str(cfg), "call", "add"]) == 2
        err = capsys.readouterr().err
        [rec] = [json.loads(x) for x in err.splitlines() if "the traceback of the error" in x]
        assert "twcli_broken.py" in rec["exc"] and "in where_it_broke" in rec["exc"]
        assert err.rstrip().endswith("startup failed: KeyError: 'region'")
    finally:
        sys.modules.pop("twcli_broken", None)


_HALF_REGISTERED = """
def register(subparsers):
    p = subparsers.add_parser("half", help="a command whose register fails after adding it")
    p.add_argument("tool")
    raise RuntimeError("register failed after add_parser")


def register_no_fn(subparsers):
    subparsers.add_parser("nofn", help="a command that sets no function")
"""


def test_a_plugin_command_whose_register_fails_half_way_is_left_out_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """writing-plugins.md: "A register that raises is logged as a warning and the rest of
    the CLI works". Before: one that raised after add_parser left the command listed by
    --help, and `toolwire half x` died with "AttributeError: 'Namespace' object has no
    attribute 'fn'" (a traceback, exit 1); so did a command that never set fn."""
    from toolwire import cli as cli_mod

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "twcli_half.py").write_text(_HALF_REGISTERED)
    monkeypatch.syspath_prepend(str(mods))
    real = md.entry_points
    ours = [
        md.EntryPoint("half", "twcli_half:register", cli_mod.CLI_ENTRY_POINT_GROUP),
        md.EntryPoint("nofn", "twcli_half:register_no_fn", cli_mod.CLI_ENTRY_POINT_GROUP),
    ]

    def entry_points(*, group: str) -> object:
        return ours if group == cli_mod.CLI_ENTRY_POINT_GROUP else real(group=group)

    monkeypatch.setattr(cli_mod.md, "entry_points", entry_points)
    cli_mod.configure_logging("WARNING")  # stderr as this test captures it
    try:
        with pytest.raises(SystemExit) as ei:
            main(["--help"])
        out = capsys.readouterr().out
        assert ei.value.code == 0 and "nofn" in out and "half" not in out
        with pytest.raises(SystemExit) as ei:
            main(["half", "x"])
        err = capsys.readouterr().err
        assert ei.value.code == 2 and "invalid choice: 'half'" in err
        assert "'half' from 'twcli_half:register' could not be registered" in err
        assert main(["nofn"]) == 2
        err = capsys.readouterr().err
        assert "toolwire: error: the command 'nofn' has nothing to run" in err
        assert "set_defaults(fn=...)" in err and "Traceback" not in err
    finally:
        sys.modules.pop("twcli_half", None)
