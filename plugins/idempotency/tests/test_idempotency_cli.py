"""``toolwire idempotency show|forget``: the record of one call, from the command line,
in the embedded SQLite state another process (the gateway) shares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolwire import Kernel, Tool
from toolwire.state import open_store
from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def toolwire(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "--config", "toolwire.toml", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def counting() -> tuple[Tool, list[dict[str, Any]]]:
    runs: list[dict[str, Any]] = []

    async def executor(args: dict[str, Any], ctx: Any) -> Any:
        runs.append(args)
        return {"charged": args.get("amount")}

    schema = {"type": "object", "properties": {"amount": {"type": "integer"}}}
    return Tool(name="charge", description="t", input_schema=schema, executor=executor), runs


def state(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


async def test_show_and_forget_an_outcome_unknown_then_the_call_runs_again(
    tmp_path: Path,
) -> None:
    (tmp_path / "toolwire.toml").write_text(
        f'state = "{state(tmp_path)}"\nenabled_plugins = ["idempotency"]\n'
    )
    tool, runs = counting()
    cfg = IdempotencyConfig(lease_secs=1)
    plugin = IdempotencyPlugin(cfg, env={})
    async with Kernel(tools=[tool], plugins=[plugin], state=open_store(state(tmp_path))) as k:
        # a claim whose owner died: pending, its lease lapsed
        key = plugin.key_for("charge", "pay-1", tenant="acme")
        await k.state.set(
            key, {"s": "pending", "req": "x", "lease": k.clock.time() - 5, "at": 1.0, "ro": False}
        )
        done = await k.call("charge", {"amount": 3}, call_id="paid", tenant="acme")
    assert not done.is_error

    shown = toolwire(tmp_path, "idempotency", "show", "charge", "pay-1", "--tenant", "acme")
    assert shown.returncode == 0, shown.stderr
    assert "outcome_unknown" in shown.stdout and "until the record is forgotten" in shown.stdout
    as_json = toolwire(
        tmp_path, "idempotency", "show", "charge", "paid", "--tenant", "acme", "--json"
    )
    info = json.loads(as_json.stdout)
    assert info["state"] == "done" and info["is_error"] is False
    assert "charged" not in as_json.stdout  # the result is never printed
    none = toolwire(tmp_path, "idempotency", "show", "charge", "pay-1")  # no tenant: not it
    assert "none" in none.stdout

    forgot = toolwire(tmp_path, "idempotency", "forget", "charge", "pay-1", "--tenant", "acme")
    assert forgot.returncode == 0, forgot.stderr
    assert "forgot its record (outcome_unknown)" in forgot.stdout

    plugin = IdempotencyPlugin(cfg, env={})
    async with Kernel(tools=[tool], plugins=[plugin], state=open_store(state(tmp_path))) as k:
        again = await k.call("charge", {"amount": 5}, call_id="pay-1", tenant="acme")
    assert again.content == {"charged": 5} and len(runs) == 2


async def test_a_running_call_is_not_forgotten_without_force(tmp_path: Path) -> None:
    (tmp_path / "toolwire.toml").write_text(
        f'state = "{state(tmp_path)}"\nenabled_plugins = ["idempotency"]\n'
    )
    plugin = IdempotencyPlugin(IdempotencyConfig(), env={})
    async with Kernel(plugins=[plugin], state=open_store(state(tmp_path))) as k:
        key = plugin.key_for("charge", "live")
        value = {"s": "pending", "req": "x", "lease": k.clock.time() + 600, "at": 1.0}
        await k.state.set(key, value)
    refused = toolwire(tmp_path, "idempotency", "forget", "charge", "live")
    assert refused.returncode == 2
    assert "still running" in refused.stderr and "--force" in refused.stderr
    forced = toolwire(tmp_path, "idempotency", "forget", "charge", "live", "--force")
    assert forced.returncode == 0 and "forgot its record (running)" in forced.stdout
    gone = toolwire(tmp_path, "idempotency", "forget", "charge", "live")
    assert gone.returncode == 0 and "no record to forget" in gone.stdout


def test_without_the_plugin_loaded_it_says_what_left_it_out(tmp_path: Path) -> None:
    (tmp_path / "toolwire.toml").write_text(f'state = "{state(tmp_path)}"\nenabled_plugins = []\n')
    r = toolwire(tmp_path, "idempotency", "show", "charge", "x")
    assert r.returncode == 2 and "idempotency plugin is not loaded" in r.stderr, r.stderr


def test_the_outcome_unknown_answer_names_the_command_to_forget_the_record() -> None:
    from toolwire import ToolCall

    plugin = IdempotencyPlugin(IdempotencyConfig(), env={})
    call = ToolCall(name="charge", args={}, call_id="run 1", tenant="acme")
    err = plugin._outcome_unknown(call, {"s": "pending", "at": 1.0}, 2.0)
    assert "`toolwire idempotency forget charge 'run 1' --tenant acme`" in str(err)


def test_show_says_a_replay_runs_a_lapsed_claim_marked_nothing_applied() -> None:
    """A claim lapsed while its call waited for an approval or backed off after a rate
    limit: the replay takes it over and runs the call, so it is no outcome unknown."""
    from toolwire_idempotency.cli import describe

    pending = {"s": "pending", "req": "x", "lease": 10.0, "at": 1.0, "ro": False}
    assert describe(pending, 20.0)["state"] == "outcome_unknown"
    shown = describe({**pending, "w": True}, 20.0)
    assert shown["state"] == "lapsed" and "a replay runs it" in shown["message"]
    assert describe({**pending, "w": True}, 5.0)["state"] == "running"
