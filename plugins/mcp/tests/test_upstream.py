"""Remote MCP servers as tool sources: a real upstream FastMCP server over stdio."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from toolwire_mcp_testkit import (
    call_until_back,
    clean_env,
    eventually,
    upstream_entry,
    write_config,
)

from toolwire import ErrorInfo, Kernel, ToolCall, ToolError, hookimpl
from toolwire_mcp import MCPConfig, MCPPlugin

pytestmark = pytest.mark.anyio


class Classifier:
    """What a ratelimit/retry plugin sees in on_error."""

    name, order = "classifier", 400

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any], bool]] = []

    @hookimpl
    def on_error(self, call: ToolCall, error: ErrorInfo) -> None:
        self.seen.append(
            (
                call.name,
                str(error.kind),
                dict(error.details),
                isinstance(error.exception, ToolError),
            )
        )


def plugin(servers: dict[str, Any], **extra: Any) -> MCPPlugin:
    cfg = {"servers": servers, "reconnect_initial_s": 0.05, "reconnect_max_s": 0.2, **extra}
    return MCPPlugin(MCPConfig.model_validate(cfg))


@pytest.fixture
async def kernel() -> AsyncIterator[Kernel]:
    k = Kernel(plugins=[plugin({"up": upstream_entry()}), Classifier()])
    async with k:
        yield k


async def test_one_server_is_namespaced_and_its_schemas_pass_through(kernel: Kernel) -> None:
    names = {t.name for t in kernel.list_tools()}
    assert {"up_forecast", "up_stats", "up_fail", "up_steps", "up_crash"} <= names
    forecast = kernel.get_tool("up_forecast")
    assert forecast is not None and forecast.source == "mcp:up"
    assert forecast.input_schema["required"] == ["city"]
    assert forecast.annotations.readOnlyHint is True
    assert forecast.annotations.idempotentHint is True
    assert {"mcp", "mcp:up"} <= forecast.tags
    r = await kernel.call("up_forecast", {"city": "Lyon"})
    assert r.content == {"result": "sunny in Lyon"} and not r.is_error
    r = await kernel.call("up_stats", {"text": "a b c", "times": 2})
    assert r.content == {"words": 6, "chars": 10}
    r = await kernel.call("up_seen_meta", {}, call_id="order-17")
    assert r.content == {"call_id": "order-17"}  # the call id travels on upstream


async def test_arguments_are_validated_against_the_remote_schema(kernel: Kernel) -> None:
    r = await kernel.call("up_stats", {"text": 5, "times": "x", "extra": 1})
    assert r.is_error and r.error is not None and r.error.kind == "invalid_args"
    problems = {p["field"]: p["message"] for p in r.error.details["problems"]}
    assert problems["text"].startswith("expected string")
    assert problems["times"].startswith("expected integer")
    assert problems["extra"] == "unexpected argument"
    assert not r.meta.attempts  # the remote tool never ran


async def test_remote_errors_become_classifiable_tool_errors(kernel: Kernel) -> None:
    classifier = kernel.plugins.plugins["classifier"].plugin
    assert isinstance(classifier, Classifier)
    r = await kernel.call("up_fail", {"message": "disk on fire"})
    assert r.is_error and r.error is not None
    assert r.error.kind == "tool_error" and "disk on fire" in r.error.message
    assert r.error.details["server"] == "up" and r.error.details["remote_tool"] == "fail"
    r = await kernel.call("up_limited", {})
    assert r.error is not None and r.error.kind == "rate_limit"
    assert [(n, k) for n, k, _, _ in classifier.seen] == [
        ("up_fail", "tool_error"),
        ("up_limited", "rate_limit"),
    ]
    assert all(is_tool_error for *_, is_tool_error in classifier.seen)


async def test_progress_is_forwarded_from_the_remote_tool(kernel: Kernel) -> None:
    got: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        got.append((progress, total, message))

    r = await kernel.call("up_steps", {"n": 2}, progress=on_progress)
    assert r.content == {"steps": 2}
    assert got == [(1, 2, "step 1 of 2"), (2, 2, "step 2 of 2")]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_list_changed_re_lists_the_server(protocol: str) -> None:
    async with Kernel(plugins=[plugin({"up": upstream_entry()}, protocol=protocol)]) as kernel:
        assert kernel.get_tool("up_fresh") is None
        r = await kernel.call("up_grow", {"name": "fresh"})
        assert r.content == {"result": "added fresh"}
        await eventually(lambda: kernel.get_tool("up_fresh") is not None)
        r = await kernel.call("up_fresh", {})
        assert r.content == {"result": "I am fresh"}


async def test_a_clash_appearing_while_serving_does_not_freeze_the_catalog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: once a refreshed listing clashed with a local tool's name, every refresh
    failed (only logged), and later changes of any server never reached the catalog."""
    from toolwire import tool

    @tool(name="up_clash")
    def local_clash() -> str:
        """A local tool whose name the upstream will also claim."""
        return "local"

    async with Kernel(tools=[local_clash], plugins=[plugin({"up": upstream_entry()})]) as k:
        with caplog.at_level(logging.WARNING, logger="toolwire"):
            await k.call("up_grow", {"name": "clash"})  # now "up" also lists up_clash
            await k.call("up_grow", {"name": "fresh"})
            await eventually(lambda: k.get_tool("up_fresh") is not None)
        r = await k.call("up_clash", {})
        assert r.content == {"result": "local"}  # the local tool keeps its name
        assert any(
            "tool name 'up_clash' is claimed by local and mcp:up: keeping local's"
            in rec.getMessage()
            for rec in caplog.records
        )


async def test_a_crash_mid_call_answers_unavailable_then_reconnects(kernel: Kernel) -> None:
    r = await kernel.call("up_crash", {})
    assert r.is_error and r.error is not None and r.error.kind == "unavailable"
    assert "connection was lost during the call to 'crash'" in r.error.message
    assert "simulated crash" in r.error.message  # the server's last stderr lines
    assert r.error.details["in_flight"] is True
    assert "_ConnectionLost" not in r.error.message  # before: a private class name, quoted
    down = await kernel.call("up_forecast", {"city": "Oslo"})  # reconnecting, most likely
    if down.error is not None:
        assert "_ConnectionLost" not in down.error.message, down.error.message
    r = await call_until_back(kernel, "up_forecast", {"city": "Oslo"})
    assert r.content == {"result": "sunny in Oslo"}


def _children_running(script: str) -> list[int]:
    """PIDs of this process's children whose command line names ``script``."""
    me, pids = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == me and script in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_a_server_that_dies_while_idle_is_noticed_without_a_call() -> None:
    """Before: ``Client.is_connected()`` stays true once a stdio server has exited,
    so the health watch never noticed; the server showed ``up`` and the next call
    failed on the dead session (as "lost during the call", the outcome unknown)."""
    mcp = plugin({"up": upstream_entry()})
    async with Kernel(plugins=[mcp]) as k:
        await eventually(lambda: mcp.servers()["up"]["status"] == "up", 60)
        await call_until_back(k, "up_forecast", {"city": "Oslo"})
        (pid,) = _children_running("upstream_server.py")
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: mcp.servers()["up"]["status"] != "up", 10)
        # and it comes back by itself, a new process
        await eventually(lambda: mcp.servers()["up"]["status"] == "up", 60)
        r = await call_until_back(k, "up_forecast", {"city": "Oslo"})
        assert r.content == {"result": "sunny in Oslo"}
        assert pid not in _children_running("upstream_server.py")


class SlowSource:
    """A tool source whose full listing waits while ``gate`` is set (a search plugin
    re-indexing a large collection, say): it holds up ``kernel.refresh_tools``."""

    name, order = "slowsource", 950

    def __init__(self) -> None:
        self.gate: anyio.Event | None = None
        self.entered = anyio.Event()

    @hookimpl
    async def discover(self, query: str | None) -> None:
        if query is None and self.gate is not None:
            self.entered.set()
            await self.gate.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_a_slow_catalog_refresh_does_not_fail_the_connection_nor_leave_it_stale() -> None:
    """Before: ``connect_timeout_s`` bounded the catalog refresh after a (re)connection's
    listing too. A refresh held up by another tool source failed an attempt whose server
    had answered ("no answer within connect_timeout_s"), and the next attempt, finding
    the listing already adopted, refreshed nothing: the catalog kept the tools of the
    server before it restarted for good."""
    slow = SlowSource()
    mcp = plugin({"up": upstream_entry()}, connect_timeout_s=5)
    async with Kernel(plugins=[mcp, slow]) as k:
        await call_until_back(k, "up_forecast", {"city": "Oslo"}, within=60)
        assert (await k.call("up_grow", {"name": "extra"})).content == {"result": "added extra"}
        await eventually(lambda: k.get_tool("up_extra") is not None)
        slow.gate = anyio.Event()
        (pid,) = _children_running("upstream_server.py")
        os.kill(pid, signal.SIGKILL)  # it restarts without the tool it added
        with anyio.fail_after(60):
            await slow.entered.wait()  # the new session listed; its refresh waits
        await anyio.sleep(6)  # past connect_timeout_s
        slow.gate.set()
        await eventually(lambda: k.get_tool("up_extra") is None, 30)
        await eventually(lambda: mcp.servers()["up"]["status"] == "up", 30)
        r = await k.call("up_forecast", {"city": "Oslo"})
        assert r.content == {"result": "sunny in Oslo"}


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_a_cancelled_start_leaves_no_server_process_or_supervisor(tmp_path: Path) -> None:
    """The kernel does not run the shutdown of a plugin whose startup was cancelled (or
    failed). Before: the plugin's supervisors went on (an `async with` around a start
    cut by a timeout, say), and with them the servers they started: a stdio process
    that outlived the kernel, restarted with backoff for as long as the loop ran."""
    script = tmp_path / "mute_server.py"
    script.write_text("import time\ntime.sleep(600)\n")
    entry = {"command": sys.executable, "args": [str(script)], "include": ["forecast"]}
    k = Kernel(plugins=[plugin({"mute": entry}, connect_timeout_s=60)])
    with anyio.move_on_after(3) as scope:
        await k.start()  # waits for the first connection attempt: cut short
    assert scope.cancelled_caught
    await eventually(lambda: not _children_running("mute_server.py"), 30)
    await anyio.sleep(1)  # no supervisor left to start it again
    assert not _children_running("mute_server.py")
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "toolwire-mcp:mute"]


async def test_a_tools_list_that_goes_unanswered_keeps_the_session_and_its_tools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the re-listing after tools/list_changed had no time limit; a server
    that never answered it left the session's health watch stuck for good."""
    # a generous limit to start: on a busy machine the server may take over 1.5 s to
    # start, and every attempt starts a new one
    mcp = plugin({"up": upstream_entry()}, connect_timeout_s=60)
    async with Kernel(plugins=[mcp]) as k:
        await eventually(lambda: mcp.servers()["up"]["status"] == "up", 60)
        await call_until_back(k, "up_forecast", {"city": "Oslo"})
        before = {t.name for t in k.list_tools()}
        mcp.config.connect_timeout_s = 1.5  # read when the re-listing starts
        with caplog.at_level(logging.WARNING, logger="toolwire"):
            # the server stalls 5 s: its answer misses the 1.5 s limit even when the re-listing
            # request reaches it late on a busy machine (with 2.5 s, over 1 s late made it flake)
            r = await k.call("up_stall_listing", {"seconds": 5})
            assert r.content == {"result": "stalling 5.0"}
            warning = (
                "re-listing it failed (no answer within connect_timeout_s=1.5s); the catalog keeps"
            )
            await eventually(lambda: any(warning in x.getMessage() for x in caplog.records))
        assert {t.name for t in k.list_tools()} == before
        assert mcp.servers()["up"]["status"] == "up"  # the session was not torn down
        r = await k.call("up_forecast", {"city": "Oslo"})
        assert r.content == {"result": "sunny in Oslo"}


async def test_a_call_while_the_server_is_connecting_says_for_how_long_and_why(
    tmp_path: Path,
) -> None:
    """Before: "MCP server 'x' (...) is connecting", with no hint of what it waits for."""
    script = tmp_path / "mute.py"
    script.write_text(
        "import sys, time\n"
        "print('loading the model weights', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    entry = {"command": sys.executable, "args": [str(script)], "include": ["forecast"]}
    mcp = plugin({"mute": entry}, connect_timeout_s=1.0)
    async with Kernel(plugins=[mcp]) as k:
        msg = ""
        for _ in range(200):  # the first attempt failed at startup; catch a later one live
            r = await k.call("mute_forecast", {"city": "Oslo"})
            assert r.error is not None and r.error.kind == "unavailable"
            msg = r.error.message
            if "is connecting (for" in msg and "previous attempt" in msg:
                break
            await anyio.sleep(0.05)
        assert "is connecting (for " in msg and "of connect_timeout_s=1.0s" in msg, msg
        assert "no answer to initialize and tools/list yet" in msg
        assert "server stderr: loading the model weights" in msg
        assert "the previous attempt failed: no answer within connect_timeout_s=1.0s" in msg


async def test_a_secret_an_upstream_prints_on_stderr_is_hidden_in_logs_and_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: each stderr line was logged as is (INFO, toolwire.mcp.stderr.<server>), a
    $secretRef value the server printed included, and kept for the errors' last lines."""
    script = tmp_path / "chatty.py"
    script.write_text(
        "import os, sys\n"
        "print('starting with key ' + os.environ['API_KEY'], file=sys.stderr, flush=True)\n"
        "sys.exit(1)\n"
    )
    secret = "sk-live-7f3a9c2e"
    entry = {
        "command": sys.executable,
        "args": [str(script)],
        "env": {"API_KEY": secret},
        "include": ["forecast"],
    }
    mcp = plugin({"chatty": entry}, connect_timeout_s=2.0)
    k = Kernel(plugins=[mcp])
    k.add_secret(secret, "UPSTREAM_KEY")  # as Kernel.from_config does for a $secretRef
    with caplog.at_level(logging.INFO, logger="toolwire.mcp"):
        async with k:
            r = await k.call("chatty_forecast", {"city": "Oslo"})
    logged = [rec.getMessage() for rec in caplog.records]
    assert any("starting with key [secret:UPSTREAM_KEY]" in m for m in logged), logged
    assert not any(secret in m for m in logged), logged
    assert r.error is not None and secret not in r.error.message


async def test_unknown_names_in_include_or_exclude_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a misspelled name was ignored without a word."""
    servers = {"up": upstream_entry(include=["forcast", "stats"], exclude=["nope"])}
    with caplog.at_level(logging.WARNING, logger="toolwire.mcp"):
        async with Kernel(plugins=[plugin(servers)]) as k:
            assert {t.name for t in k.list_tools()} == {"up_stats"}
    warned = [r.getMessage() for r in caplog.records if "has no tool named" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "'forcast', 'nope'" in warned[0] and "forecast" in warned[0]
    assert "[plugins.mcp.servers.up]" in warned[0]


def test_a_name_template_or_namespace_making_names_mcp_refuses_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"makes tool names like 's/t', which MCP does not allow"):
        MCPConfig.model_validate({"name_template": "{server}/{tool}"})
    with pytest.raises(ValueError, match=r"namespace 'my ns'"):
        MCPConfig.model_validate({"servers": {"a": {"command": "x", "namespace": "my ns"}}})


async def test_a_remote_tool_whose_name_mcp_refuses_is_left_out_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: it was adopted, and every MCP / OpenAI export of the catalog then raised."""
    server = tmp_path / "odd_names.py"
    server.write_text(
        "from fastmcp import FastMCP\n"
        "mcp = FastMCP('odd')\n"
        "@mcp.tool(name='bad name/with space')\n"
        "def bad() -> str:\n"
        "    return 'x'\n"
        "@mcp.tool\n"
        "def good() -> str:\n"
        "    return 'ok'\n"
        "mcp.run(show_banner=False)\n"
    )
    entry = {"command": sys.executable, "args": [str(server)], "env": clean_env()}
    with caplog.at_level(logging.WARNING, logger="toolwire.mcp"):
        async with Kernel(plugins=[plugin({"odd": entry})]) as k:
            assert {t.name for t in k.list_tools()} == {"odd_good"}
            assert [t["name"] for t in k.list_tools(format="mcp")] == ["odd_good"]
    assert any("'bad name/with space'" in r.getMessage() for r in caplog.records)


#: A raw stdio MCP server (the handshake era) listing ``TOOLS``; tools/call echoes the tool's
#: description, so a test sees which of two same-named tools answered.
RAW_SERVER = """
import json, sys
TOOLS = %s
for line in sys.stdin:
    msg = json.loads(line)
    if 'id' not in msg:
        continue
    method, out = msg['method'], {'jsonrpc': '2.0', 'id': msg['id']}
    if method == 'initialize':
        out['result'] = {'protocolVersion': msg['params']['protocolVersion'], 'capabilities':
                         {'tools': {}}, 'serverInfo': {'name': 'raw', 'version': '1'}}
    elif method == 'tools/list':
        out['result'] = {'tools': TOOLS}
    elif method == 'tools/call':
        said = next(t['description'] for t in TOOLS if t['name'] == msg['params']['name'])
        out['result'] = {'content': [{'type': 'text', 'text': said}]}
    else:
        out['error'] = {'code': -32601, 'message': 'Method not found'}
    print(json.dumps(out), flush=True)
"""


async def test_a_tool_name_listed_twice_by_one_server_keeps_the_first_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: both were adopted, and the kernel refused to start ("tool name 'dup_echo' is
    provided by both source 'mcp:dup' and source 'mcp:dup'"): one upstream's bad listing
    stopped every other tool."""
    schema = {"type": "object"}
    tools = [
        {"name": "echo", "description": "first", "inputSchema": schema},
        {"name": "echo", "description": "second", "inputSchema": schema},
        {"name": "other", "description": "other", "inputSchema": schema},
    ]
    server = tmp_path / "twice.py"
    server.write_text(RAW_SERVER % repr(tools))
    entry = {"command": sys.executable, "args": [str(server)], "env": clean_env()}
    with caplog.at_level(logging.WARNING, logger="toolwire.mcp"):
        async with Kernel(plugins=[plugin({"dup": entry})]) as k:
            assert [(t.name, t.description) for t in k.list_tools()] == [
                ("dup_echo", "first"),
                ("dup_other", "other"),
            ]
            r = await k.call("dup_echo", {})
            assert r.content == {"result": "first"}
    warned = [r.getMessage() for r in caplog.records if "more than one tool" in r.getMessage()]
    assert len(warned) == 1 and "'dup'" in warned[0] and "'echo'" in warned[0], warned


async def test_a_stdio_answer_with_a_lone_surrogate_is_read_not_dropped(tmp_path: Path) -> None:
    """Before: the MCP SDK's stdio reader refused the line ("\\udce9" is valid JSON text, but an
    unpaired surrogate), logged it and dropped it: the listing failed, and a call waited for
    its timeout (for ever without one)."""
    mangled = b"caf\xe9".decode("utf-8", "surrogateescape")  # text cut mid-character
    tools = [{"name": "echo", "description": mangled, "inputSchema": {"type": "object"}}]
    server = tmp_path / "mangled.py"
    server.write_text(RAW_SERVER % repr(tools))
    entry = {"command": sys.executable, "args": [str(server)], "env": clean_env()}
    entry["timeout"] = 20_000
    async with Kernel(plugins=[plugin({"raw": entry})]) as k:
        assert [t.name for t in k.list_tools()] == ["raw_echo"]
        with anyio.fail_after(30):
            r = await k.call("raw_echo", {})
    assert not r.is_error, r.error
    assert r.content == {"result": mangled}


async def test_naming_include_exclude_and_many_servers() -> None:
    servers = {
        "a": upstream_entry(include=["forecast", "stats"], namespace="weather"),
        "b": upstream_entry(exclude=["crash", "grow", "hidden"]),
    }
    async with Kernel(plugins=[plugin(servers)]) as k:
        names = {t.name for t in k.list_tools()}
        assert {"weather_forecast", "weather_stats"} <= names
        assert not any(
            n.startswith("weather_") and n not in ("weather_forecast", "weather_stats")
            for n in names
        )
        assert "b_forecast" in names and "b_fail" in names
        assert not {"b_crash", "b_grow", "b_hidden"} & names
        r = await k.call("weather_forecast", {"city": "Rome"})
        assert r.content == {"result": "sunny in Rome"}
    async with Kernel(
        plugins=[plugin({"a": upstream_entry()}, name_template="mcp.{server}.{tool}")]
    ) as k:
        assert k.get_tool("mcp.a.forecast") is not None


async def test_a_server_that_cannot_start_does_not_stop_the_kernel(tmp_path: Path) -> None:
    servers = {
        "ghost": {"command": str(tmp_path / "no-such-server"), "include": ["forecast"]},
        "up": upstream_entry(include=["forecast"]),
    }
    mcp = plugin(servers, connect_timeout_s=5)
    async with Kernel(plugins=[mcp]) as k:
        assert {t.name for t in k.list_tools()} == {"ghost_forecast", "up_forecast"}
        r = await k.call("ghost_forecast", {"city": "Paris"})
        assert r.is_error and r.error is not None and r.error.kind == "unavailable"
        assert "MCP server 'ghost'" in r.error.message and "no-such-server" in r.error.message
        assert r.error.retry_after_s is not None
        ok = await k.call("up_forecast", {"city": "Paris"})
        assert ok.content == {"result": "sunny in Paris"}
        status = mcp.servers()
        assert status["ghost"]["status"] in ("down", "connecting")
        assert status["up"]["status"] == "up"


_ODD_OUTPUT_SCHEMAS = """
from typing import Any
from fastmcp import FastMCP
from fastmcp.tools import Tool, ToolResult
from mcp_types import TextContent

class Fixed(Tool):
    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(
            content=[TextContent(type="text", text='{"ok": true}')],
            structured_content={"ok": True},
        )

mcp = FastMCP("odd")
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
for name, schema in {
    "untyped": {"properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    "anyof": {"anyOf": [OK, {"type": "object", "properties": {"err": {"type": "string"}}}]},
    "nullable": {**OK, "type": ["object", "null"]},
}.items():
    mcp.add_tool(Fixed(name=name, description="d", parameters={"type": "object"},
                       output_schema=schema))
mcp.run(transport="stdio", show_banner=False)
"""


async def test_output_schemas_without_type_object_describe_what_the_tool_returns(
    tmp_path: Path,
) -> None:
    """An output schema that may describe an object without saying ``"type": "object"``
    at its top (``properties`` alone, ``anyOf``, a list of types). Before: the kernel's
    tool got it wrapped in ``{"result": ...}`` (or, for ``properties`` alone, the MCP
    export wrapped it), though the result is the structured content itself: through
    the gateway every call failed "'result' is a required property"."""
    from fastmcp import Client

    from toolwire_mcp import create_server

    script = tmp_path / "odd.py"
    script.write_text(_ODD_OUTPUT_SCHEMAS)
    entry = {"command": sys.executable, "args": [str(script)]}
    async with (
        Kernel(plugins=[plugin({"odd": entry})]) as k,
        Client(create_server(k)) as c,
    ):
        listed = {t.name: t for t in await c.list_tools()}
        for name in ("odd_untyped", "odd_anyof", "odd_nullable"):
            assert (await k.call(name, {})).content == {"ok": True}
            schema = listed[name].output_schema
            assert schema is not None and schema["type"] == "object", schema
            assert "result" not in schema.get("properties", {}), schema
            r = await c.call_tool_mcp(name, {})
            assert not r.is_error, r.content
            assert r.structured_content == {"ok": True}


_RAW_STDIO_SERVER = """
import json, sys
ANSWERS = {
    "fine": {"result": {"content": [{"type": "text", "text": "fine"}]}},
    "null_result": {"result": None},
    "no_result": {},
    "bad_error": {"error": {"message": "no code"}},
}
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}}})
    elif method == "tools/list":
        tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ANSWERS]
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": rid, **ANSWERS[msg["params"]["name"]]})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
"""


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        ("null_result", "result: Input should be a valid dictionary"),
        ("no_result", "result: Field required"),
        ("bad_error", "error.code: Field required"),
    ],
)
async def test_a_stdio_answer_that_is_no_valid_response_fails_the_call(
    tmp_path: Path, tool: str, problem: str
) -> None:
    """Before: the MCP SDK's stdio reader dropped such a line (logging it), so the call
    waited for its answer for ever (there is no `timeout` by default). Over HTTP the
    same answers failed the call at once, as docs/mcp.md says."""
    script = tmp_path / "raw.py"
    script.write_text(_RAW_STDIO_SERVER)
    entry = {"command": sys.executable, "args": [str(script)]}
    async with Kernel(plugins=[plugin({"raw": entry})]) as k:
        with anyio.fail_after(30):  # a guard against the hang, not a measure of speed
            r = await k.call(f"raw_{tool}", {})
            assert r.error is not None and r.error.kind == "tool_error", r.error
            assert f"MCP server 'raw', tool {tool!r}: Failed to parse JSON response" in (
                r.error.message
            )
            assert problem in r.error.message
            assert r.error.details["invalid_answer"] is True
            ok = await k.call("raw_fine", {})  # the session goes on
            assert ok.content == {"result": "fine"}


async def test_no_stderr_reader_thread_outlives_the_kernel() -> None:
    """Before: the thread reading a stdio server's stderr was still running when the kernel
    had shut down (it ended some time later, once the child's end of the pipe closed)."""
    import threading

    def readers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("toolwire-mcp-stderr-")]

    async with Kernel(plugins=[plugin({"up": upstream_entry()})]) as k:
        assert (await k.call("up_forecast", {"city": "Oslo"})).content == {
            "result": "sunny in Oslo"
        }
        assert readers() == ["toolwire-mcp-stderr-up"]  # the thread looked for below exists
    assert readers() == []


async def test_known_tools_are_remembered_across_restarts(tmp_path: Path) -> None:
    state = f"sqlite:///{tmp_path / 'state.db'}"
    async with Kernel(state=state, plugins=[plugin({"srv": upstream_entry()})]) as k:
        schema = k.get_tool("srv_stats").input_schema  # type: ignore[union-attr]
    down = {"srv": {"command": sys.executable, "args": [str(tmp_path / "missing.py")]}}
    async with Kernel(state=state, plugins=[plugin(down, connect_timeout_s=5)]) as k:
        stats = k.get_tool("srv_stats")
        assert stats is not None and stats.input_schema == schema
        bad = await k.call("srv_stats", {"text": 1})
        assert bad.error is not None and bad.error.kind == "invalid_args"  # real schema, locally
        r = await k.call("srv_stats", {"text": "a"})
        assert r.error is not None and r.error.kind == "unavailable"
        assert "missing.py" in r.error.message


def test_the_client_side_needs_asyncio() -> None:
    trio = pytest.importorskip("trio")

    async def run() -> str:
        async with Kernel(plugins=[plugin({})]) as idle:  # no servers: nothing to refuse
            assert idle.list_tools() == []
        k = Kernel(plugins=[plugin({"up": upstream_entry()})])
        try:
            await k.start()
        except Exception as exc:
            return str(exc)
        await k.close()
        return "started"

    msg = trio.run(run)
    assert msg.startswith("plugin 'mcp': startup failed") and "need an asyncio event loop" in msg
    assert "remove [plugins.mcp.servers]" in msg


async def test_an_http_upstream_with_bearer_auth(tmp_path: Path, serve_process: Any) -> None:
    """Another toolwire gateway over Streamable HTTP: its error kinds come through as they are."""
    (tmp_path / "quota_tools.py").write_text(
        "from toolwire import ToolError, tool\n\n"
        "@tool\n"
        "def spend(amount: int) -> int:\n"
        '    """Spends from a budget of 10."""\n'
        "    if amount > 10:\n"
        "        raise ToolError('monthly budget exceeded', kind='quota', retry_after_s=30)\n"
        "    return 10 - amount\n"
    )
    write_config(
        tmp_path / "upstream.toml",
        {"state": "memory://", "enabled_plugins": []},
        {"tools": {"modules": ["quota_tools"]}, "server": {"transport": "http", "port": 0}},
    )
    env = clean_env(TOOLS_AUTH_TOKEN="up-token")
    p = serve_process("--config", "upstream.toml", "serve", env=env).wait_ready()
    assert p.url is not None
    good = plugin({"budget": {"url": p.url, "auth": "up-token", "headers": {"X-Tenant": "t1"}}})
    async with Kernel(plugins=[good]) as k:
        assert k.get_tool("budget_spend") is not None
        r = await k.call("budget_spend", {"amount": 4})
        assert r.content == {"result": 6}
        r = await k.call("budget_spend", {"amount": 40})
        assert r.error is not None and r.error.kind == "quota"
        assert r.error.retry_after_s == 30 and "monthly budget exceeded" in r.error.message
    bad = plugin(
        {"budget": {"url": p.url, "auth": "wrong", "include": ["spend"]}}, connect_timeout_s=5
    )
    async with Kernel(plugins=[bad]) as k:
        r = await k.call("budget_spend", {"amount": 1})
        assert r.error is not None and r.error.kind == "auth", r.error
        assert "HTTP 401" in r.error.message and "[plugins.mcp.servers.budget]" in r.error.message


async def test_an_upstream_image_reaches_the_gateways_client_as_an_image(kernel: Kernel) -> None:
    from fastmcp import Client

    from toolwire_mcp import create_server

    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC"
    r = await kernel.call("up_snapshot", {})
    assert r.content == {"content": [{"type": "image", "data": pixel, "mimeType": "image/png"}]}
    async with Client(create_server(kernel)) as c:
        res = await c.call_tool_mcp("up_snapshot", {})
    assert not res.is_error
    assert [type(b).__name__ for b in res.content] == ["ImageContent"]
    assert res.content[0].data == pixel and res.content[0].mime_type == "image/png"


@pytest.mark.parametrize(
    "text", ["payment backend answered 503 Service Unavailable", "connection reset by peer"]
)
async def test_a_remote_tool_that_failed_in_words_of_an_outage_is_not_called_again(
    text: str,
) -> None:
    """The remote tool ran and reported a failure (isError): the server had the call.
    Before: the ratelimit plugin read the text as an outage (`unavailable`, retryable)
    and the retry plugin called the tool again — a tool with side effects (``fail`` has
    no read-only or idempotent hint) ran twice. The error now says the call reached the
    tool (``in_flight``), which the retry plugin does not repeat."""
    from toolwire_ratelimit import RateLimitPlugin
    from toolwire_retry import RetryConfig, RetryPlugin

    plugins = [
        plugin({"up": upstream_entry()}),
        RateLimitPlugin(),
        RetryPlugin(RetryConfig(base_s=0.01)),
    ]
    async with Kernel(plugins=plugins) as kernel:
        r = await kernel.call("up_fail", {"message": text})
    assert [a.tool for a in r.meta.attempts] == ["up_fail"]
    assert r.error is not None and r.error.kind == "unavailable"
    assert r.error.details["in_flight"] is True and not r.error.retryable
    assert "may have side effects" in r.error.details["gave_up"]
