"""`toolwire stats`: the per-tool table and JSON from the configured state store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolwire import ConfigError
from toolwire_profiling.cli import profiling_config, render_table


def run(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_") and k != "REDIS_URL"
    }
    # Only this plugin: the CLI's embedded defaults load every installed plugin otherwise.
    base["TOOLWIRE_LOAD_PLUGINS"] = "profiling"
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "toolwire.cli", *args],
        cwd=cwd,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_stats_with_no_config(tmp_path: Path) -> None:
    empty = run(tmp_path, "stats")
    assert empty.returncode == 0, empty.stderr
    assert "no statistics recorded yet" in empty.stdout
    for args in ('{"a": 2, "b": 3}', '{"a": 2, "b": 4}', '{"a": 5, "b": 5}'):
        r = run(tmp_path, "call", "add", "--args", args)
        assert r.returncode == 0, r.stderr
    assert run(tmp_path, "call", "echo", "--args", '{"message": "hi"}').returncode == 0
    assert run(tmp_path, "call", "add", "--args", '{"a": "x"}').returncode == 1
    assert (tmp_path / ".toolwire" / "state.db").exists()

    out = run(tmp_path, "stats")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "tool",
        "count",
        "success",
        "p50",
        "ms",
        "p90",
        "ms",
        "p99",
        "ms",
        "estimate",
        "ms",
        "from",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"add", "echo"}
    assert rows["add"][1:3] == ["3", "100.0%"] and rows["add"][-1] == "default"

    js = run(tmp_path, "stats", "--json")
    data = json.loads(js.stdout)
    assert data["state"] == "sqlite" and data["key_prefix"] == "profiling"
    add = next(t for t in data["tools"] if t["tool"] == "add")
    assert add["count"] == 3 and add["calls"] == 4 and add["call_errors"] == {"invalid_args": 1}
    assert add["source"] == "toolwire.examples" and add["p50_time_ms"] > 0

    only = json.loads(run(tmp_path, "stats", "--json", "--tool", "echo", "--tool", "ghost").stdout)
    assert [t["tool"] for t in only["tools"]] == ["echo", "ghost"]
    assert only["tools"][1]["count"] == 0

    reset = run(tmp_path, "stats", "--reset", "--tool", "add")
    assert reset.returncode == 0 and reset.stdout == "deleted 1 entry\n"  # not "1 entries"
    assert [t["tool"] for t in json.loads(run(tmp_path, "stats", "--json").stdout)["tools"]] == [
        "echo"
    ]


def test_stats_reads_the_configured_store_and_prefix(tmp_path: Path) -> None:
    (tmp_path / "toolwire.toml").write_text(
        'state = "sqlite:///data/tw.db"\n'
        'enabled_plugins = ["profiling"]\n'
        '[tools]\nmodules = ["toolwire.examples"]\n'
        '[plugins.profiling]\nkey_prefix = "team-a"\nmin_samples = 1\n'
    )
    assert run(tmp_path, "call", "word_hash", "--args", '{"text": "abc"}').returncode == 0
    data = json.loads(run(tmp_path, "stats", "--json").stdout)
    assert data["key_prefix"] == "team-a"
    (row,) = data["tools"]
    assert row["tool"] == "word_hash" and row["estimate_basis"] == "tool"
    assert (tmp_path / "data" / "tw.db").exists()


def test_stats_reads_the_store_beside_the_config_file(tmp_path: Path) -> None:
    """A config file without `state` keeps the embedded store next to itself, where
    `toolwire call` wrote; before, `stats` read `.toolwire/` of the working directory
    and showed nothing."""
    conf, cwd = tmp_path / "conf", tmp_path / "cwd"
    conf.mkdir()
    cwd.mkdir()
    (conf / "toolwire.toml").write_text(
        'enabled_plugins = ["profiling"]\n[tools]\nmodules = ["toolwire.examples"]\n'
    )
    cfg = str(conf / "toolwire.toml")
    r = run(cwd, "--config", cfg, "call", "add", "--args", '{"a": 1, "b": 2}')
    assert r.returncode == 0, r.stderr
    out = run(cwd, "--config", cfg, "stats", "--json")
    assert out.returncode == 0, out.stderr
    assert [t["tool"] for t in json.loads(out.stdout)["tools"]] == ["add"]
    assert (conf / ".toolwire" / "state.db").exists() and not (cwd / ".toolwire").exists()


def test_stats_config_errors(tmp_path: Path) -> None:
    (tmp_path / "toolwire.toml").write_text("[plugins.profiling]\nflush_interval_s = -1\n")
    r = run(tmp_path, "stats")
    assert r.returncode == 2 and "plugins.profiling.flush_interval_s" in r.stderr


def test_stats_config_error_names_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad value set by TOOLWIRE_PLUGINS__PROFILING__<KEY> is blamed on the variable,
    not on the toml file that never held it (as the kernel's own config errors do)."""
    monkeypatch.delenv("TOOLWIRE_PLUGINS__PROFILING__FLUSH_INTERVAL_S", raising=False)
    with pytest.raises(ConfigError) as info:
        profiling_config({"flush_interval_s": -1}, "toolwire.toml")
    assert "environment variable" not in str(info.value)
    monkeypatch.setenv("TOOLWIRE_PLUGINS__PROFILING__FLUSH_INTERVAL_S", "-1")
    with pytest.raises(ConfigError) as info:
        profiling_config({"flush_interval_s": -1}, "toolwire.toml")
    assert "plugins.profiling.flush_interval_s" in str(info.value)
    assert "environment variable TOOLWIRE_PLUGINS__PROFILING__FLUSH_INTERVAL_S" in str(info.value)


def test_render_table() -> None:
    rows = [
        {
            "tool": "a",
            "count": 12,
            "success_rate": 0.75,
            "p50_time_ms": 1234.5,
            "p90_time_ms": 15.25,
            "p99_time_ms": 0.004,
            "estimate_ms": 3.5,
            "estimate_basis": "tool",
        },
        {
            "tool": "long_tool_name",
            "count": 0,
            "success_rate": None,
            "p50_time_ms": None,
            "p90_time_ms": None,
            "p99_time_ms": None,
            "estimate_ms": 1000.0,
            "estimate_basis": "default",
        },
    ]
    text = render_table(rows)
    assert text.splitlines()[1].split() == [
        "a",
        "12",
        "75.0%",
        "1234",
        "15.2",
        "0.0040",
        "3.50",
        "tool",
    ]
    assert text.splitlines()[2].split()[1:5] == ["0", "-", "-", "-"]
