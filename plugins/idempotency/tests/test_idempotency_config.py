"""Configuration: the entry point, [plugins.idempotency], and the honoured environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from toolwire import ConfigError, Kernel, installed_plugins, load_config
from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

from .conftest import counting_tool

CLEAN = {"TOOLWIRE_LOAD_PLUGINS": "idempotency"}


def test_entry_point_resolves_to_the_plugin() -> None:
    assert installed_plugins()["idempotency"].load() is IdempotencyPlugin
    assert IdempotencyPlugin.order == 200 and IdempotencyPlugin.name == "idempotency"


def test_defaults() -> None:
    cfg = IdempotencyPlugin(env={}).config
    assert cfg.enabled is True
    assert cfg.ttl_secs == 3600
    assert cfg.prefix == "toolwire"
    assert cfg.on_in_flight == "wait" and cfg.wait_secs == 30
    assert cfg.on_store_error == "fail_closed"
    assert cfg.cache_errors is False and cfg.require_call_id is False
    assert cfg.exempt_tools == [] and cfg.exempt_read_only is False
    assert IdempotencyPlugin(env={}).key_for("t", "c").startswith("toolwire:idempotency:")


def test_kernel_from_config_file(tmp_path: Path) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        f'state = "sqlite:///{tmp_path}/state.db"\n'
        "[plugins.idempotency]\n"
        "ttl_secs = 60\n"
        'prefix = "acme"\n'
        'exempt_tools = ["ping"]\n'
        'on_store_error = "fail_open"\n'
    )
    cfg = load_config(path, env=CLEAN)
    kernel = Kernel.from_config(cfg)
    info = kernel.plugins.plugins["idempotency"]
    plugin = info.plugin
    assert isinstance(plugin, IdempotencyPlugin)
    assert info.order == 200
    assert plugin.config.ttl_secs == 60 and plugin.config.prefix == "acme"
    assert plugin.config.exempt_tools == ["ping"]
    assert plugin.config.on_store_error == "fail_open"


def test_unknown_or_bad_keys_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text('[plugins.idempotency]\nttl_sec = 60\non_in_flight = "panic"\n')
    with pytest.raises(ConfigError) as info:
        Kernel.from_config(load_config(path, env=CLEAN))
    assert "plugins.idempotency.ttl_sec: unknown key" in str(info.value)
    assert "plugins.idempotency.on_in_flight" in str(info.value)
    with pytest.raises(ValidationError):
        IdempotencyConfig(ttl_secs=0)


@pytest.mark.parametrize("key", ["ttl_secs", "lease_secs"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e16"])
def test_endless_or_overflowing_durations_are_config_errors(
    tmp_path: Path, key: str, value: str
) -> None:
    """TOML has ``inf``: it (and 1e16 s, a Redis expiry overflow) used to pass the config
    check and then fail every call with an ``internal`` / ``unavailable`` error."""
    path = tmp_path / "toolwire.toml"
    path.write_text(f"[plugins.idempotency]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=f"plugins.idempotency.{key}"):
        Kernel.from_config(load_config(path, env=CLEAN))


@pytest.mark.parametrize(
    ("env", "enabled", "ttl"),
    [
        ({"TOOL_IDEMPOTENCY_ENABLED": "false"}, False, 3600.0),
        ({"TOOL_IDEMPOTENCY_ENABLED": "0"}, False, 3600.0),
        ({"TOOL_IDEMPOTENCY_ENABLED": "TRUE"}, True, 3600.0),
        ({"TOOL_IDEMPOTENCY_TTL_SECS": "90"}, True, 90.0),
        ({"TOOL_IDEMPOTENCY_TTL_SECS": "0.5", "TOOL_IDEMPOTENCY_ENABLED": "yes"}, True, 0.5),
        ({"TOOL_IDEMPOTENCY_TTL_SECS": ""}, True, 3600.0),
    ],
)
def test_environment_variables_override_the_file(
    env: dict[str, str], enabled: bool, ttl: float
) -> None:
    plugin = IdempotencyPlugin(IdempotencyConfig(ttl_secs=3600), env=env)
    assert plugin.config.enabled is enabled
    assert plugin.config.ttl_secs == ttl


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("TOOL_IDEMPOTENCY_ENABLED", "maybe"),
        ("TOOL_IDEMPOTENCY_TTL_SECS", "soon"),
        ("TOOL_IDEMPOTENCY_TTL_SECS", "-5"),
        ("TOOL_IDEMPOTENCY_TTL_SECS", "inf"),
        ("TOOL_IDEMPOTENCY_TTL_SECS", "1e16"),
    ],
)
def test_malformed_environment_variables_name_themselves(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var):
        IdempotencyPlugin(env={var: raw})


def test_environment_reaches_plugins_loaded_from_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOL_IDEMPOTENCY_TTL_SECS", "42")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    cfg = load_config(
        tmp_path / "absent.toml",
        env={**CLEAN, "REDIS_URL": "redis://127.0.0.1:1/0"},
        required=False,
    )
    assert cfg.state == "redis://127.0.0.1:1/0"  # REDIS_URL selects the Redis store
    kernel = Kernel.from_config(cfg)
    plugin = kernel.plugins.plugins["idempotency"].plugin
    assert isinstance(plugin, IdempotencyPlugin) and plugin.config.ttl_secs == 42
    assert kernel.state.backend == "redis"


@pytest.mark.anyio
async def test_the_longest_lease_the_config_takes_still_runs_calls() -> None:
    """Before: a claim's TTL is twice the lease, so lease_secs past half of MAX_TTL_S (which
    the config accepts) made every call fail 'internal' on the store's TTL bound."""
    tool, runs = counting_tool("send")
    plugin = IdempotencyPlugin(IdempotencyConfig(lease_secs=1e9), env={})
    async with Kernel(tools=[tool], plugins=[plugin]) as kernel:
        first = await kernel.call("send", {}, call_id="c1")
        again = await kernel.call("send", {}, call_id="c1")
    assert first.error is None and again.error is None, (first.error, again.error)
    assert len(runs) == 1


@pytest.mark.anyio
async def test_per_tool_opt_out_setting() -> None:
    tool, runs = counting_tool("log_line")
    tool.settings["idempotency"] = False
    plugin = IdempotencyPlugin(env={})
    async with Kernel(tools=[tool], plugins=[plugin]) as kernel:
        await kernel.call("log_line", {}, call_id="same")
        await kernel.call("log_line", {}, call_id="same")
    assert len(runs) == 2 and plugin.counters.exempt == 2


def test_counters_as_dict_and_reset() -> None:
    plugin = IdempotencyPlugin(env={})
    plugin.counters.hits = 3
    assert plugin.counters.as_dict()["hits"] == 3
    assert {"hits", "misses", "conflicts", "fail_open", "no_call_id"} <= set(
        plugin.counters.as_dict()
    )
    plugin.counters.reset()
    assert set(plugin.counters.as_dict().values()) == {0}


def test_unknown_after_interrupt_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        f'state = "sqlite:///{tmp_path}/state.db"\n'
        "[plugins.idempotency]\n"
        'unknown_after_interrupt_tools = ["charge_card"]\n'
    )
    env = {**CLEAN, "TOOLWIRE_PLUGINS__IDEMPOTENCY__UNKNOWN_AFTER_INTERRUPT": "true"}
    plugin = Kernel.from_config(load_config(path, env=env)).plugins.plugins["idempotency"].plugin
    assert isinstance(plugin, IdempotencyPlugin)
    assert plugin.config.unknown_after_interrupt is True
    assert plugin.config.unknown_after_interrupt_tools == ["charge_card"]


@pytest.mark.parametrize(
    "line",
    ['unknown_after_interrupt = "sometimes"', 'unknown_after_interrupt_tools = "charge_card"'],
)
def test_a_malformed_unknown_after_interrupt_is_a_config_error(tmp_path: Path, line: str) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(f"[plugins.idempotency]\n{line}\n")
    key = line.split(" =")[0]
    with pytest.raises(ConfigError, match=f"plugins.idempotency.{key}"):
        Kernel.from_config(load_config(path, env=CLEAN))
