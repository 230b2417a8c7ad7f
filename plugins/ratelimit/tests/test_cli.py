"""`toolwire keys`: pool status and clearing a quarantine, on the configured state store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolwire import Kernel
from toolwire_ratelimit import RateLimitPlugin

pytestmark = pytest.mark.anyio

SECRET_A = "sk-alpha-0123456789"
SECRET_B = "sk-bravo-9876543210"


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        f'state = "sqlite:///{tmp_path / "state.db"}"\n'
        'enabled_plugins = ["ratelimit"]\n'
        "[plugins.ratelimit.providers.acme]\n"
        "keys = [\n"
        f'  {{alias = "a", secret = "{SECRET_A}", weight = 3}},\n'
        f'  {{alias = "b", secret = "{SECRET_B}"}},\n'
        "]\n"
    )
    return path


def run(tmp_path: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "--config", str(tmp_path / "toolwire.toml"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_status_shows_a_quarantine_and_clear_lifts_it(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    async with Kernel.from_config(path) as kernel:
        plugin: RateLimitPlugin = kernel.get_plugin("ratelimit")
        await plugin.pool("acme").report("a", "auth", pattern="default.status.401")

    r = run(tmp_path, "keys", "status")
    assert r.returncode == 0, r.stderr
    assert "acme: available" in r.stdout
    line_a = next(line for line in r.stdout.splitlines() if line.strip().startswith("a "))
    assert "quarantined" in line_a and "default.status.401" in line_a
    assert SECRET_A not in r.stdout and SECRET_B not in r.stdout

    r = run(tmp_path, "keys", "status", "acme", "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)["acme"]
    assert status["keys"]["a"]["state"] == "quarantined"
    assert status["keys"]["b"]["state"] == "ok"

    r = run(tmp_path, "keys", "clear", "acme", "a")
    assert r.returncode == 0, r.stderr
    assert "cleared key 'a' and the pool's suspension" in r.stdout
    async with Kernel.from_config(path) as kernel:  # that clear lifted a's quarantine
        plugin = kernel.get_plugin("ratelimit")
        assert (await plugin.pool("acme").status())["keys"]["a"]["state"] == "ok"
        await plugin.pool("acme").report("a", "auth", pattern="default.status.401")
    r = run(tmp_path, "keys", "clear", "acme", "--keep-suspension")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "acme: cleared every key"
    async with Kernel.from_config(path) as kernel:  # and so did clearing every key
        plugin = kernel.get_plugin("ratelimit")
        assert (await plugin.pool("acme").status())["keys"]["a"]["state"] == "ok"


async def test_a_key_no_longer_configured_is_shown_and_cleared(tmp_path: Path) -> None:
    """Before: `keys clear acme b` after b left the configuration exited 2 ("has no key
    'b'") and `keys status` did not show b, though its quarantine stayed stored (for the
    replicas still listing b) until removed_key_grace_seconds had passed."""
    path = write_config(tmp_path)
    async with Kernel.from_config(path) as kernel:
        plugin: RateLimitPlugin = kernel.get_plugin("ratelimit")
        await plugin.pool("acme").report("b", "auth", pattern="default.status.401")
        await plugin.pool("acme").report("a", "rate_limit", retry_after_s=600)
    only_a = path.read_text().replace(f'  {{alias = "b", secret = "{SECRET_B}"}},\n', "")
    assert only_a != path.read_text()
    path.write_text(only_a.replace('alias = "a"', 'alias = "a2"'))  # b removed, a renamed

    r = run(tmp_path, "keys", "status", "acme", "--json")
    assert r.returncode == 0, r.stderr
    stored = {k["alias"]: k for k in json.loads(r.stdout)["acme"]["unconfigured"]}
    assert set(stored) == {"a", "b"}
    assert stored["b"]["state"] == "quarantined" and not stored["b"]["configured"]
    assert stored["b"]["quarantine"]["pattern"] == "default.status.401"
    assert stored["a"]["state"] == "cooling"
    r = run(tmp_path, "keys", "status")
    assert r.returncode == 0, r.stderr
    assert "not configured here" in r.stdout
    line_b = next(line for line in r.stdout.splitlines() if line.strip().startswith("b "))
    assert "quarantined" in line_b and "default.status.401" in line_b
    assert SECRET_A not in r.stdout and SECRET_B not in r.stdout

    r = run(tmp_path, "keys", "clear", "acme", "b")
    assert r.returncode == 0, r.stderr
    assert "cleared key 'b'" in r.stdout
    r = run(tmp_path, "keys", "clear", "acme", "a", "--keep-suspension")
    assert r.returncode == 0, r.stderr
    r = run(tmp_path, "keys", "clear", "acme", "zz")  # neither configured nor stored
    assert r.returncode == 2 and "has no key 'zz'" in r.stderr
    r = run(tmp_path, "keys", "status", "acme", "--json")
    assert json.loads(r.stdout)["acme"]["unconfigured"] == []  # nothing of a or b is left

    write_config(tmp_path)  # b back (within the grace): its quarantine was lifted
    async with Kernel.from_config(path) as kernel:
        plugin = kernel.get_plugin("ratelimit")
        assert (await plugin.pool("acme").availability()).keys == {"a": "ok", "b": "ok"}


async def test_a_provider_no_longer_configured_is_shown_and_cleared(tmp_path: Path) -> None:
    """Before: its stored pool (kept for removed_key_grace_seconds, for replicas still
    listing it) was "unknown provider" to `keys status` and `keys clear`."""
    path = write_config(tmp_path)
    async with Kernel.from_config(path) as kernel:
        plugin: RateLimitPlugin = kernel.get_plugin("ratelimit")
        await plugin.pool("acme").report("b", "auth", pattern="default.status.401")
    path.write_text(path.read_text().replace("providers.acme]", "providers.other]"))

    r = run(tmp_path, "keys", "status")
    assert r.returncode == 0, r.stderr
    assert "acme: not configured here" in r.stdout
    acme = r.stdout[r.stdout.index("acme: not configured here") :].splitlines()
    line_b = next(line for line in acme if line.strip().startswith("b "))
    assert "quarantined" in line_b and "default.status.401" in line_b
    r = run(tmp_path, "keys", "status", "acme", "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)["acme"]
    assert status["configured"] is False and status["keys"] == {}
    assert [(k["alias"], k["state"]) for k in status["unconfigured"]] == [("b", "quarantined")]

    r = run(tmp_path, "keys", "clear", "acme", "b")
    assert r.returncode == 0, r.stderr
    r = run(tmp_path, "keys", "status", "acme", "--json")
    assert json.loads(r.stdout)["acme"]["unconfigured"] == []
    r = run(tmp_path, "keys", "clear", "gone")
    assert r.returncode == 2 and "unknown provider 'gone'" in r.stderr


def test_unknown_names_and_a_missing_plugin_are_named(tmp_path: Path) -> None:
    write_config(tmp_path)
    r = run(tmp_path, "keys", "status", "nope")
    assert r.returncode == 2 and "unknown provider(s) ['nope']" in r.stderr
    assert "known: ['acme']" in r.stderr
    r = run(tmp_path, "keys", "clear", "acme", "zz")
    assert r.returncode == 2 and "has no key 'zz'" in r.stderr and "['a', 'b']" in r.stderr
    (tmp_path / "toolwire.toml").write_text(
        f'state = "sqlite:///{tmp_path / "state.db"}"\nenabled_plugins = []\n'
    )
    r = run(tmp_path, "keys", "status")
    assert r.returncode == 2 and "ratelimit plugin is not loaded" in r.stderr


def test_with_no_providers_the_error_says_how_to_configure_one(tmp_path: Path) -> None:
    """Before: "unknown provider(s) ['brave']; known: []", with no word on where
    providers come from."""
    (tmp_path / "toolwire.toml").write_text(
        f'state = "sqlite:///{tmp_path / "state.db"}"\nenabled_plugins = ["ratelimit"]\n'
    )
    for argv in (("keys", "status", "brave"), ("keys", "clear", "brave")):
        r = run(tmp_path, *argv)
        assert r.returncode == 2, r.stderr
        assert "no providers are configured: add [plugins.ratelimit.providers.<name>]" in (
            error_line(r)
        )
        assert "known: []" not in r.stderr
    r = run(tmp_path, "keys", "status")
    assert r.returncode == 0 and r.stdout.startswith("no providers are configured: add ")


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one ``toolwire: error:`` line (other plugins may log warnings before it)."""
    lines = [line for line in r.stderr.splitlines() if line.startswith("toolwire: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_a_plugin_left_out_says_what_left_it_out(tmp_path: Path) -> None:
    """Before: "add it to enabled_plugins or give it a [plugins.ratelimit] table", even
    with the table there and the plugin excluded by disabled_plugins or a variable."""
    path = write_config(tmp_path)
    with_table = path.read_text().replace('enabled_plugins = ["ratelimit"]\n', "")
    path.write_text('disabled_plugins = ["ratelimit"]\n' + with_table)
    r = run(tmp_path, "keys", "status")
    assert r.returncode == 2
    assert error_line(r) == (
        f"toolwire: error: {path}: the ratelimit plugin is not loaded: disabled_plugins lists "
        "it (remove 'ratelimit' from that list)"
    )
    assert "[plugins.ratelimit] table" not in r.stderr

    path.write_text('enabled_plugins = ["audit"]\n' + with_table)
    r = run(tmp_path, "keys", "status")
    assert r.returncode == 2
    assert "enabled_plugins = [\"audit\"] leaves it out (add 'ratelimit' to that list" in r.stderr

    path.write_text(with_table)
    r = run(tmp_path, "keys", "clear", "acme", TOOLWIRE_DISABLE_PLUGINS="ratelimit")
    assert r.returncode == 2
    assert error_line(r) == (
        "toolwire: error: the ratelimit plugin is not loaded: the environment variable "
        "TOOLWIRE_DISABLE_PLUGINS disables it (remove ratelimit from it)"
    )
    r = run(tmp_path, "keys", "status", TOOLWIRE_LOAD_PLUGINS="audit,retry")
    assert r.returncode == 2
    assert "the environment variable TOOLWIRE_LOAD_PLUGINS loads only audit, retry" in r.stderr
    r = run(tmp_path, "keys", "status")  # nothing excludes it: it works
    assert r.returncode == 0 and "acme: available" in r.stdout, r.stderr


def test_what_a_tool_module_prints_does_not_break_the_json(tmp_path: Path) -> None:
    """Before: a tool module's print() at import came before `keys status --json`'s JSON
    on stdout, so it no longer parsed (the kernel's own commands already moved it)."""
    write_config(tmp_path)
    (tmp_path / "noisy_tools.py").write_text(
        "from toolwire import tool\n"
        "print('noisy module loaded')\n"
        "@tool\n"
        "def ping() -> str:\n"
        "    '''Ping.'''\n"
        "    return 'pong'\n"
    )
    with (tmp_path / "toolwire.toml").open("a") as f:
        f.write('[tools]\nmodules = ["noisy_tools"]\n')
    out = run(tmp_path, "keys", "status", "--json", PYTHONPATH=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)) == {"acme"}
    assert "noisy module loaded" in out.stderr


def test_config_may_follow_the_subcommand(tmp_path: Path) -> None:
    """Before: `toolwire keys status --config PATH` (where `toolwire call`, `tools` and
    `stats` take it) was argparse's "unrecognized arguments: --config PATH"."""
    path = write_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    for argv in (
        ["keys", "status", "--config", str(path)],
        ["keys", "clear", "acme", "-c", str(path)],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "toolwire.cli", *argv],
            cwd=tmp_path.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        assert "acme" in r.stdout


async def test_clearing_an_unknown_alias_names_the_stored_ones_too(tmp_path: Path) -> None:
    """Before: `keys clear acme zz` of a provider no longer configured said "its keys: []",
    though `keys clear acme b` would have worked: the aliases it can clear were not named."""
    path = write_config(tmp_path)
    async with Kernel.from_config(path) as kernel:
        plugin: RateLimitPlugin = kernel.get_plugin("ratelimit")
        await plugin.pool("acme").report("b", "auth", pattern="default.status.401")
    path.write_text(path.read_text().replace("providers.acme]", "providers.other]"))
    r = run(tmp_path, "keys", "clear", "acme", "zz")
    assert r.returncode == 2 and "has no key 'zz'" in r.stderr
    assert "'b'" in r.stderr, r.stderr
    assert "[]" not in r.stderr, r.stderr
