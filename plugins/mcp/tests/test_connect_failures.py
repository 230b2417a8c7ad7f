"""A server that cannot be reached because of its configuration: the error says what to change.

Real servers: stdio children (a raw JSON-RPC server speaking one protocol era), the
FastMCP test upstream over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from toolwire_mcp_testkit import UPSTREAM, HttpUpstream, clean_env, write_config

from toolwire import Kernel
from toolwire_mcp import MCPConfig, MCPPlugin

pytestmark = pytest.mark.anyio

#: A raw stdio server speaking only the 2026-07-28 protocol (``server/discover``);
#: ``initialize`` gets -32022 naming the versions it speaks. ``SUPPORTED`` is filled in.
MODERN_ONLY = """
import json, sys
SUPPORTED = %s
EXTRA = {'resultType': 'complete', 'ttlMs': 0, 'cacheScope': 'private'}
for line in sys.stdin:
    msg = json.loads(line)
    if 'id' not in msg:
        continue
    method, out = msg['method'], {'jsonrpc': '2.0', 'id': msg['id']}
    unsupported = {'code': -32022, 'message': 'Unsupported protocol version',
                   'data': {'supported': SUPPORTED, 'requested': '?'}}
    if method == 'server/discover':
        if '2026-07-28' in SUPPORTED:
            out['result'] = {'supportedVersions': SUPPORTED, 'capabilities': {'tools': {}}, **EXTRA}
        else:
            out['error'] = unsupported
    elif method == 'initialize':
        out['error'] = unsupported
    elif method == 'tools/list':
        out['result'] = {'tools': [{'name': 'echo', 'inputSchema': {'type': 'object'}}], **EXTRA}
    elif method == 'tools/call':
        out['result'] = {'content': [{'type': 'text', 'text': 'echoed'}], **EXTRA}
    else:
        out['error'] = {'code': -32601, 'message': 'Method not found'}
    print(json.dumps(out), flush=True)
"""


def plugin(entry: dict[str, Any], **extra: Any) -> MCPPlugin:
    cfg = {
        "servers": {"s": {"include": ["echo"], **entry}},
        "reconnect_initial_s": 0.05,
        "reconnect_max_s": 0.2,
        "connect_timeout_s": 5,
        **extra,
    }
    return MCPPlugin(MCPConfig.model_validate(cfg))


async def down_message(mcp: MCPPlugin) -> str:
    """The error a call of the server's tool gets (the server being down)."""
    async with Kernel(plugins=[mcp]) as k:
        r = await k.call("s_echo", {})
        assert r.error is not None, r.content
        assert "MCP server 's'" in r.error.message
        status = mcp.servers()["s"]
        assert status["status"] == "down"
        assert status["last_error"] in r.error.message
        return r.error.message


def modern_only(tmp_path: Path, supported: list[str]) -> dict[str, Any]:
    server = tmp_path / "modern.py"
    server.write_text(MODERN_ONLY % json.dumps(supported))
    return {"command": sys.executable, "args": [str(server)], "env": clean_env()}


async def test_a_server_speaking_only_the_new_protocol_works_with_auto(tmp_path: Path) -> None:
    async with Kernel(plugins=[plugin(modern_only(tmp_path, ["2026-07-28"]))]) as k:
        r = await k.call("s_echo", {})
        assert r.content == {"result": "echoed"}, r.error


async def test_protocol_legacy_against_a_new_only_server_names_the_setting(
    tmp_path: Path,
) -> None:
    """Before: "MCP error -32022: Unsupported protocol version", nothing more."""
    msg = await down_message(plugin(modern_only(tmp_path, ["2026-07-28"]), protocol="legacy"))
    assert 'set protocol = "auto"' in msg and "[plugins.mcp]" in msg, msg


async def test_no_protocol_version_in_common_says_so(tmp_path: Path) -> None:
    msg = await down_message(plugin(modern_only(tmp_path, ["2099-01-01"])))
    assert "no protocol version in common" in msg and "2099-01-01" in msg, msg
    assert "2026-07-28" in msg, msg


async def test_a_cwd_that_does_not_exist_is_named_as_the_cwd(tmp_path: Path) -> None:
    """Before: "[Errno 2] No such file or directory: '/.../gone'", which reads as if the
    command were missing."""
    entry = {"command": sys.executable, "args": ["-c", "pass"], "cwd": str(tmp_path / "gone")}
    msg = await down_message(plugin(entry))
    assert f"`cwd` {str(tmp_path / 'gone')!r} of [plugins.mcp.servers.s] does not exist" in msg


async def test_a_relative_cwd_is_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: relative to the gateway's working directory, unlike every other path in
    toolwire.toml; an MCP client spawning `toolwire serve --config /abs/toolwire.toml` from
    its own directory got "`cwd` 'work' ... does not exist"."""
    conf = tmp_path / "conf"
    (conf / "work").mkdir(parents=True)
    # Found only from the right directory: the relative script path proves the child's cwd.
    (conf / "work" / "server.py").write_text(
        f"import runpy\nrunpy.run_path({str(UPSTREAM)!r}, run_name='__main__')\n"
    )
    write_config(
        conf / "toolwire.toml",
        {"state": "memory://", "enabled_plugins": ["mcp"]},
        {
            "plugins.mcp.servers.s": {
                "command": sys.executable,
                "args": ["server.py"],
                "cwd": "work",
            }
        },
    )
    monkeypatch.chdir(tmp_path)  # not the config file's directory
    async with Kernel.from_config(conf / "toolwire.toml") as k:
        status = k.get_plugin("mcp").servers()["s"]
        assert status["status"] == "up", status
        r = await k.call("s_forecast", {"city": "Lyon"})
    assert r.error is None and r.content == {"result": "sunny in Lyon"}, r


async def test_a_command_that_is_a_directory_or_not_on_path_says_what_to_fix(
    tmp_path: Path,
) -> None:
    """Before: "[Errno 13] Permission denied" for a directory."""
    msg = await down_message(plugin({"command": str(tmp_path)}))
    assert "is a directory, not a program" in msg and "[plugins.mcp.servers.s]" in msg, msg
    msg = await down_message(plugin({"command": "toolwire-no-such-program"}))
    assert "is not found on PATH" in msg, msg
    script = tmp_path / "server.py"
    script.write_text("print('hi')\n")
    msg = await down_message(plugin({"command": str(script)}))
    assert "is not executable" in msg, msg


async def test_http_path_transport_and_scheme_mistakes_say_what_to_fix() -> None:
    up = HttpUpstream().start()
    try:
        msg = await down_message(plugin({"url": up.url.replace("/mcp", "/nope")}))
        assert "nothing answers MCP at the path '/nope'" in msg, msg
        msg = await down_message(plugin({"url": up.url, "transport": "sse"}))
        assert "check `transport` of [plugins.mcp.servers.s]" in msg, msg
        msg = await down_message(plugin({"url": up.url.replace("http://", "https://")}))
        assert "write `url` of [plugins.mcp.servers.s] with http://" in msg, msg
    finally:
        up.stop()


async def test_a_secret_in_args_or_the_url_stays_out_of_logs_status_and_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `--token <value of a $secretRef>` was in every "is unavailable" warning and in
    servers()' target (only the call's error was scrubbed, by the kernel), and a URL query
    secret in the text of an HTTP status error ("Client error '400 Bad Request' for url
    'http://...?key=<secret>'"): in the warning, the status and the error."""
    up = HttpUpstream().start()
    write_config(
        tmp_path / "toolwire.toml",
        {"state": "memory://", "enabled_plugins": ["mcp"]},
        {
            "plugins.mcp": {"connect_timeout_s": 5, "reconnect_initial_s": 0.05},
            "plugins.mcp.servers.s": {
                "command": str(tmp_path / "no-such-server"),
                "args": ["--token", {"$secretRef": "S_TOKEN"}],
                "include": ["echo"],
            },
            "plugins.mcp.servers.h": {
                "url": f"{up.url}?key=url-secret-1234",
                "transport": "sse",  # the server speaks Streamable HTTP: 400
                "include": ["echo"],
            },
        },
    )
    monkeypatch.setenv("S_TOKEN", "args-secret-5678")
    try:
        with caplog.at_level(logging.INFO, logger="toolwire.mcp"):
            async with Kernel.from_config(tmp_path / "toolwire.toml") as k:
                for name in ("s_echo", "h_echo"):
                    r = await k.call(name, {})
                    assert r.error is not None and r.error.kind == "unavailable"
                    assert "secret-" not in r.error.message, r.error.message
                status = k.get_plugin("mcp").servers()
    finally:
        up.stop()
    assert "--token [secret:S_TOKEN]" in status["s"]["target"]
    assert "key=***" in status["h"]["target"] and "HTTP 400" in status["h"]["last_error"]
    assert "secret-" not in json.dumps(status), status
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("toolwire")]
    assert any("is unavailable" in m for m in logged), logged
    assert not [m for m in logged if "secret-" in m]


async def test_two_servers_claiming_one_name_at_startup_point_at_the_mcp_settings() -> None:
    """Before: the startup error advised `tools.modules = [{module = ..., namespace = ...}]`,
    a setting of local tool modules, for two MCP servers."""
    from toolwire import ToolCollisionError

    up = HttpUpstream().start()
    try:
        entry = {"url": up.url, "include": ["forecast"]}
        cfg = {"servers": {"a": entry, "b": entry}, "name_template": "{tool}"}
        mcp = MCPPlugin(MCPConfig.model_validate(cfg))
        with pytest.raises(ToolCollisionError) as ei:
            async with Kernel(plugins=[mcp]):
                pass
    finally:
        up.stop()
    msg = str(ei.value)
    assert "`namespace` of [plugins.mcp.servers.a]" in msg, msg
    assert "tools.modules" not in msg, msg
