"""A third-party plugin, proven: built and installed as a package into a fresh
virtualenv, then enabled and configured from toolwire.toml with no code change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.timeout(600)
def test_audit_plugin_installed_as_a_package_is_loaded_from_config(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv, "uv is required (the workspace is managed by uv)"
    dist = tmp_path / "dist"
    sh(uv, "build", "--wheel", "--package", "toolwire", "-o", dist, cwd=ROOT)
    sh(uv, "build", "--wheel", "--package", "toolwire-audit", "-o", dist, cwd=ROOT)
    venv = tmp_path / "venv"
    sh(uv, "venv", "--python", sys.executable, venv)
    py = venv / "bin" / "python"
    wheels = sorted(dist.glob("*.whl"))
    assert {w.name.split("-")[0] for w in wheels} == {"toolwire", "toolwire_audit"}
    sh(uv, "pip", "install", "--python", py, *wheels)

    work = tmp_path / "app"
    work.mkdir()
    log = work / "audit.jsonl"
    (work / "toolwire.toml").write_text(
        'enabled_plugins = ["audit"]\n'
        'state = "memory://"\n'
        "[tools]\n"
        'modules = ["toolwire.examples"]\n'
        "[plugins.audit]\n"
        f'path = "{log}"\n'
        "include_args = true\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWIRE_", "VIRTUAL_ENV"))}
    toolwire = venv / "bin" / "toolwire"
    plugins = json.loads(sh(toolwire, "plugins", cwd=work, env=env))
    assert [(p["name"], p["distribution"], p["order"]) for p in plugins] == [
        ("audit", "toolwire-audit", 50)
    ]
    out = json.loads(
        sh(
            toolwire,
            "call",
            "add",
            "--args",
            '{"a": 1, "b": 2}',
            "--call-id",
            "x1",
            cwd=work,
            env=env,
        )
    )
    assert out["content"] == {"result": 3.0}
    [line] = [json.loads(x) for x in log.read_text().splitlines()]
    assert (
        line["tool"] == "add" and line["call_id"] == "x1" and line["args"] == {"a": 1.0, "b": 2.0}
    )


def run(*cmd: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.timeout(600)
def test_the_template_built_on_its_own_is_loaded_called_and_its_entry_point_checked(
    tmp_path: Path,
) -> None:
    """contrib/_template as a third-party author gets it: copied out of the workspace, built
    with `uv build`, installed beside the kernel in a fresh venv, enabled and configured as
    its README shows; `toolwire call` shows its effect. A misspelt entry point, built and
    installed, is reported quoting the entry point and its distribution (before: "cannot
    be loaded: AttributeError: module 'toolwire_stamp' has no attribute 'StampPlugn'")."""
    uv = shutil.which("uv")
    assert uv, "uv is required (the workspace is managed by uv)"
    src = tmp_path / "toolwire-stamp"
    shutil.copytree(ROOT / "contrib/_template", src, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    sh(uv, "build", "--wheel", "--package", "toolwire", "-o", dist, cwd=ROOT)
    sh(uv, "build", "--wheel", "-o", dist, cwd=src)
    wheels = sorted(dist.glob("*.whl"))
    assert {w.name.split("-")[0] for w in wheels} == {"toolwire", "toolwire_stamp"}
    venv = tmp_path / "venv"
    sh(uv, "venv", "--python", sys.executable, venv)
    py = venv / "bin" / "python"
    sh(uv, "pip", "install", "--python", py, *wheels)

    work = tmp_path / "app"
    work.mkdir()
    (work / "toolwire.toml").write_text(
        'enabled_plugins = ["stamp"]\n'
        'state = "memory://"\n'
        "[plugins.stamp]\n"
        'label = "reviewed"\n'
        'refuse = ["echo"]\n'
        "[tools]\n"
        'modules = ["toolwire.examples"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWIRE_", "VIRTUAL_ENV"))}
    toolwire = venv / "bin" / "toolwire"
    plugins = json.loads(sh(toolwire, "plugins", cwd=work, env=env))
    assert [(p["name"], p["distribution"], p["order"], p["hooks"]) for p in plugins] == [
        ("stamp", "toolwire-stamp", 600, ["after_call", "before_call"])
    ]
    out = json.loads(sh(toolwire, "call", "add", "--args", '{"a": 1, "b": 2}', cwd=work, env=env))
    assert out["content"] == {"result": 3.0} and out["meta"]["extra"]["stamp"] == "reviewed"
    refused = run(toolwire, "call", "echo", "--args", '{"message": "hi"}', cwd=work, env=env)
    assert refused.returncode == 1, refused.stderr
    assert json.loads(refused.stdout)["error"]["kind"] == "denied"

    pyproject = src / "pyproject.toml"
    text = pyproject.read_text()
    assert 'stamp = "toolwire_stamp:StampPlugin"' in text
    pyproject.write_text(text.replace("toolwire_stamp:StampPlugin", "toolwire_stamp:StampPlugn"))
    broken = tmp_path / "broken"
    sh(uv, "build", "--wheel", "-o", broken, cwd=src)
    sh(
        uv,
        "pip",
        "install",
        "--python",
        py,
        "--reinstall-package",
        "toolwire-stamp",
        *broken.glob("*.whl"),
    )
    bad = run(toolwire, "plugins", cwd=work, env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (
        "toolwire: error: plugin 'stamp': cannot be loaded: entry point stamp = "
        "\"toolwire_stamp:StampPlugn\" of toolwire-stamp names 'StampPlugn', which "
        "'toolwire_stamp' does not define (did you mean 'StampPlugin'?); fix "
        "[project.entry-points.toolwire] in the plugin's pyproject.toml and reinstall it\n"
    )
