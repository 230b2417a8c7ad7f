"""End to end: MCP client -> `toolwire serve` (stdio) -> upstream MCP server (stdio) and back.

The gateway runs with the `mcp` and `audit` plugins from a toolwire.toml, like
examples/toolwire.toml; one gateway process serves every test of this module.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.client.subscriptions import ToolsListChanged, listen
from toolwire_mcp_testkit import UPSTREAM, clean_env, eventually, write_config

from toolwire_mcp import CALL_ID_META_KEY, ERROR_META_KEY

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("gateway")
    write_config(
        d / "toolwire.toml",
        {"state": f"sqlite:///{d / 'state.db'}", "enabled_plugins": ["mcp", "audit"]},
        {
            "plugins.audit": {"path": str(d / "audit.jsonl"), "include_args": True},
            "plugins.mcp": {"reconnect_initial_s": 0.1, "reconnect_max_s": 0.5},
            "plugins.mcp.servers.weather": {"command": sys.executable, "args": [str(UPSTREAM)]},
            "plugins.mcp.servers.ghost": {
                "command": str(d / "no-such-mcp-server"),
                "include": ["forecast"],
            },
        },
    )
    return d


@pytest.fixture(scope="module")
async def gateway(workdir: Path) -> AsyncIterator[Client[Any]]:
    transport = StdioTransport(
        command=sys.executable,
        args=["-m", "toolwire.cli", "serve", "--config", str(workdir / "toolwire.toml")],
        env=clean_env(),
        cwd=str(workdir),
        keep_alive=False,
    )
    async with Client(transport, timeout=60) as c:
        await c.list_tools()
        yield c


def audit_lines(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_upstream_tools_are_listed_namespaced(gateway: Client[Any]) -> None:
    tools = {t.name: t for t in await gateway.list_tools()}
    assert {"weather_forecast", "weather_stats", "weather_steps", "ghost_forecast"} <= set(tools)
    fc = tools["weather_forecast"]
    assert fc.input_schema["required"] == ["city"]
    assert fc.annotations is not None and fc.annotations.read_only_hint is True


async def test_a_call_flows_through_with_the_call_id_and_the_audit_plugin_sees_it(
    gateway: Client[Any], workdir: Path
) -> None:
    r = await gateway.call_tool_mcp(
        "weather_forecast", {"city": "Nantes"}, meta={CALL_ID_META_KEY: "trip-42"}
    )
    assert not r.is_error and r.structured_content == {"result": "sunny in Nantes"}
    text = r.content[0]
    assert isinstance(text, mcp_types.TextContent) and text.text == "sunny in Nantes"
    hop = await gateway.call_tool_mcp("weather_seen_meta", {}, meta={CALL_ID_META_KEY: "trip-43"})
    assert hop.structured_content == {"call_id": "trip-43"}  # two hops, same call id
    await eventually(lambda: any(x["call_id"] == "trip-42" for x in audit_lines(workdir)))
    line = next(x for x in audit_lines(workdir) if x["call_id"] == "trip-42")
    assert line["tool"] == "weather_forecast" and line["ok"] is True
    assert line["args"] == {"city": "Nantes"}


async def test_remote_errors_come_back_as_error_results_with_their_kind(
    gateway: Client[Any], workdir: Path
) -> None:
    r = await gateway.call_tool_mcp("weather_fail", {"message": "sensor offline"})
    assert r.is_error and r.meta is not None
    err = r.meta[ERROR_META_KEY]
    assert err["kind"] == "tool_error" and "sensor offline" in err["message"]
    assert err["source"] == "mcp:weather"
    limited = await gateway.call_tool_mcp("weather_limited", {})
    assert limited.meta is not None and limited.meta[ERROR_META_KEY]["kind"] == "rate_limit"
    await eventually(lambda: any(x["error_kind"] == "rate_limit" for x in audit_lines(workdir)))


async def test_upstream_progress_reaches_the_client(gateway: Client[Any]) -> None:
    got: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        got.append((progress, total, message))

    r = await gateway.call_tool_mcp("weather_steps", {"n": 3}, progress_handler=on_progress)
    assert r.structured_content == {"steps": 3}
    assert got == [(1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3")]


async def test_bad_arguments_and_unknown_tools_name_the_problem(gateway: Client[Any]) -> None:
    r = await gateway.call_tool_mcp("weather_stats", {"text": ["not", "a", "string"]})
    assert r.is_error and r.meta is not None
    err = r.meta[ERROR_META_KEY]
    assert err["kind"] == "invalid_args" and "'text'" in err["message"]
    r = await gateway.call_tool_mcp("weather_forecastt", {"city": "x"})
    assert r.meta is not None and r.meta[ERROR_META_KEY]["kind"] == "not_found"
    assert "weather_forecast" in r.meta[ERROR_META_KEY]["message"]


async def test_a_server_whose_command_does_not_exist_answers_unavailable(
    gateway: Client[Any], workdir: Path
) -> None:
    r = await gateway.call_tool_mcp("ghost_forecast", {"city": "Lima"})
    assert r.is_error and r.meta is not None
    err = r.meta[ERROR_META_KEY]
    assert err["kind"] == "unavailable"
    assert "ghost" in err["message"] and "no-such-mcp-server" in err["message"]


async def test_an_upstream_crash_mid_call_is_reported_and_the_gateway_recovers(
    gateway: Client[Any],
) -> None:
    r = await gateway.call_tool_mcp("weather_crash", {})
    assert r.is_error and r.meta is not None
    err = r.meta[ERROR_META_KEY]
    assert err["kind"] == "unavailable" and "'crash'" in err["message"]
    assert "simulated crash" in err["message"]

    import anyio

    with anyio.fail_after(30):
        while True:
            again = await gateway.call_tool_mcp("weather_forecast", {"city": "Brest"})
            if not again.is_error:
                break
            assert again.meta is not None
            assert again.meta[ERROR_META_KEY]["kind"] == "unavailable"
            await anyio.sleep(0.1)
    assert again.structured_content == {"result": "sunny in Brest"}


async def test_a_changed_upstream_list_reaches_the_gateways_clients(gateway: Client[Any]) -> None:
    """Upstream announces tools/list_changed -> the gateway re-lists -> its clients hear it."""
    name = f"sprout_{uuid.uuid4().hex[:8]}"

    async def listed() -> bool:
        return f"weather_{name}" in {t.name for t in await gateway.list_tools()}

    async with listen(gateway.session, tools_list_changed=True) as sub:
        r = await gateway.call_tool_mcp("weather_grow", {"name": name})
        assert not r.is_error, r
        with anyio.fail_after(20):
            while True:  # other upstreams (the reconnecting ghost) may announce too
                assert isinstance(await sub.__anext__(), ToolsListChanged)
                if await listed():
                    break


async def test_a_chain_of_gateways_keeps_replayed_and_the_remote_details(tmp_path: Path) -> None:
    """A kernel -> gateway B (toolwire serve over stdio, idempotency on) -> the upstream.

    Before: B replayed the repeated call id but A's caller saw ``replayed: false``, and
    B's error details (``in_flight`` for a lost connection) were dropped on the way.
    """
    from toolwire import Kernel
    from toolwire_mcp import MCPConfig, MCPPlugin

    write_config(
        tmp_path / "b.toml",
        {"state": f"sqlite:///{tmp_path / 'b.db'}", "enabled_plugins": ["mcp", "idempotency"]},
        {
            "plugins.mcp": {"reconnect_initial_s": 0.1, "reconnect_max_s": 0.5},
            "plugins.mcp.servers.weather": {"command": sys.executable, "args": [str(UPSTREAM)]},
        },
    )
    b = {
        "command": sys.executable,
        "args": ["-m", "toolwire.cli", "serve", "--config", str(tmp_path / "b.toml")],
        "env": clean_env(),
        "cwd": str(tmp_path),
    }
    plugin = MCPPlugin(MCPConfig.model_validate({"servers": {"b": b}, "connect_timeout_s": 60}))
    async with Kernel(plugins=[plugin]) as k:
        first = await k.call("b_weather_forecast", {"city": "Oslo"}, call_id="chain-1")
        again = await k.call("b_weather_forecast", {"city": "Oslo"}, call_id="chain-1")
        assert first.content == again.content == {"result": "sunny in Oslo"}
        assert not first.meta.replayed and again.meta.replayed
        lost = await k.call("b_weather_crash", {})
        assert lost.error is not None and lost.error.kind == "unavailable", lost.error
        assert lost.error.details["in_flight"] is True  # lifted from B's details
        assert lost.error.details["remote_details"]["server"] == "weather"
