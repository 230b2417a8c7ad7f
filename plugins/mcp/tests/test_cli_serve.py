"""`toolwire serve` as a real subprocess: stdio framing, Streamable HTTP, bearer auth, shutdown."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from mcp.shared.exceptions import MCPError
from toolwire_mcp_testkit import clean_env, eventually, free_port, wait_until, write_config

from toolwire import ConfigError
from toolwire.cli import main
from toolwire_mcp import CALL_ID_META_KEY, ERROR_META_KEY, RESULT_META_KEY, ServeConfig
from toolwire_mcp.cli import TERMINAL_HINT, loop_options

pytestmark = pytest.mark.anyio

NO_PLUGINS = {"TOOLWIRE_LOAD_PLUGINS": ""}
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def rpc(id_: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


INIT = rpc(
    1,
    "initialize",
    {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
)


def sse_json(resp: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a Streamable HTTP response (JSON or one SSE event)."""
    if resp.headers.get("content-type", "").startswith("application/json"):
        return dict(resp.json())
    data = [line[5:].strip() for line in resp.text.splitlines() if line.startswith("data:")]
    return dict(json.loads(data[-1]))


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def test_stdio_stdout_carries_only_protocol_frames(tmp_path: Path) -> None:
    frames = [
        INIT,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        rpc(2, "tools/list"),
        "this is not json",
        {"jsonrpc": "2.0", "id": 9, "hello": "world"},
        rpc(3, "tools/call", {"name": "add", "arguments": {"a": 2, "b": 40}}),
        rpc(4, "tools/call", {"name": "add", "arguments": {"a": "x"}}),
        rpc(5, "no/such/method"),
        # Lines json.loads reads but the SDK's parser does not, or would take for a
        # notification: each gets an error reply (the SDK would drop them silently).
        "[" * 3000 + "]" * 3000,  # json.loads: RecursionError (it crashed the server)
        {"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": None, "method": "tools/list"},
        rpc(6, "tools/call", {"name": "echo", "arguments": {"message": "\ud800"}}),
        rpc(7, "tools/call", {"name": "echo", "arguments": {"message": nested(300)}}),
        rpc(8, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}}),
    ]
    payload = "".join((f if isinstance(f, str) else json.dumps(f)) + "\n" for f in frames)
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "serve"],
        input=payload.encode(),
        capture_output=True,
        cwd=tmp_path,
        env=clean_env(TOOLWIRE_LOAD_PLUGINS="audit"),  # audit logs each call to stderr
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]  # every line is JSON
    assert all(m.get("jsonrpc") == "2.0" for m in out)
    by_id = {m.get("id"): m for m in out}
    names = {t["name"] for t in by_id[2]["result"]["tools"]}
    assert {"add", "echo", "counter_increment"} <= names  # the bundled examples
    assert by_id[3]["result"]["structuredContent"] == {"result": 42.0}
    bad = by_id[4]["result"]
    assert bad["isError"] is True and bad["_meta"][ERROR_META_KEY]["kind"] == "invalid_args"
    assert by_id[5]["error"]["code"] == -32601
    parse_errors = [m for m in out if "error" in m and m["error"]["code"] == -32700]
    assert parse_errors and parse_errors[0]["id"] is None, out  # and serving went on
    assert by_id[9]["error"]["code"] == -32600  # JSON, but not a JSON-RPC message
    assert len(parse_errors) == 4, out  # not JSON, too deep (twice), a lone surrogate
    invalid = [m for m in out if "error" in m and m["error"]["code"] == -32600]
    assert [m["id"] for m in invalid].count(None) == 2, out  # ids 1.5 and null
    assert 6 not in by_id and 7 not in by_id  # answered as parse errors (id null)
    assert by_id[8]["result"]["structuredContent"] == {"result": 2.0}  # still serving
    err_lines = [line for line in proc.stderr.decode().splitlines() if line.strip()]
    logs = [json.loads(line) for line in err_lines]  # stderr: JSON lines only
    assert any("serving" in str(x.get("msg", "")) for x in logs)
    assert sum(1 for x in logs if x.get("tool") == "add") == 3  # the audit plugin saw every call
    assert (tmp_path / ".toolwire" / "state.db").exists()  # embedded defaults


CHATTY = """
import sys
from toolwire import tool

print("chatty: loading", flush=True)  # output while the kernel is built ...
print("chatty: buffered")  # ... and some still in stdout's buffer when serving starts
sys.stdout.write("chatty: no newline")


@tool
def hello(name: str) -> str:
    \"\"\"Say hello.\"\"\"
    return "hi " + name
"""


def test_stdio_output_while_the_kernel_is_built_goes_to_stderr(tmp_path: Path) -> None:
    """Before: stdout was kept for frames only while serving, so a tool module printing as
    it was imported (or a plugin as it started) wrote ahead of the first frame, and the
    client read a line that was no JSON-RPC message."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    write_config(
        tmp_path / "toolwire.toml", {"enabled_plugins": []}, {"tools": {"modules": ["chatty"]}}
    )
    frames = [
        INIT,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        rpc(2, "tools/call", {"name": "hello", "arguments": {"name": "x"}}),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "--config", "toolwire.toml", "serve"],
        input="".join(json.dumps(f) + "\n" for f in frames).encode(),
        capture_output=True,
        cwd=tmp_path,
        env=clean_env(TOOLWIRE_LOAD_PLUGINS=""),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert b"chatty" not in proc.stdout, proc.stdout.decode()
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]  # every line is JSON
    assert [m.get("id") for m in out] == [1, 2]
    assert out[1]["result"]["structuredContent"] == {"result": "hi x"}
    err = proc.stderr.decode()
    assert "chatty: loading" in err and "chatty: buffered" in err and "no newline" in err


def test_stdio_a_line_that_is_not_utf8_is_a_parse_error_not_a_call(tmp_path: Path) -> None:
    """Before: its bytes were replaced with U+FFFD and the call ran with arguments the
    client never sent ("caf\\xe9" became "caf\ufffd"); over HTTP such a body is -32700."""
    call = rpc(2, "tools/call", {"name": "echo", "arguments": {"message": "caf\u00e9"}})
    latin1 = json.dumps(call, ensure_ascii=False).encode("latin-1")  # not UTF-8
    note = b'{"jsonrpc": "2.0", "method": "notifications/\xff"}'
    frames = [
        json.dumps(INIT).encode(),
        b'{"jsonrpc": "2.0", "method": "notifications/initialized"}',
    ]
    frames += [latin1, note, json.dumps(rpc(3, "tools/call", {**call["params"]})).encode()]
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "serve"],
        input=b"".join(f + b"\n" for f in frames),
        capture_output=True,
        cwd=tmp_path,
        env=clean_env(TOOLWIRE_LOAD_PLUGINS=""),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    by_id = {m.get("id"): m for m in out}
    bad = by_id[2]  # answered under its own id: the client waiting for it hears back
    assert "result" not in bad and bad["error"]["code"] == -32700, bad
    assert "not valid UTF-8" in bad["error"]["message"]
    assert by_id[None]["error"]["code"] == -32700  # the notification: no id to answer
    assert by_id[3]["result"]["structuredContent"] == {"message": "caf\u00e9"}  # still serving


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_stdio_reads_requests_from_a_file_and_ends_at_its_end(tmp_path: Path, loop: str) -> None:
    """Before: stdin from a file or /dev/null aborted the process under uvloop (SIGABRT,
    exit 134), and under asyncio printed a PermissionError and hung."""
    requests = tmp_path / "requests.jsonl"
    frames = [
        INIT,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        rpc(2, "tools/call", {"name": "add", "arguments": {"a": 2, "b": 40}}),
    ]
    requests.write_text("".join(json.dumps(f) + "\n" for f in frames))
    cmd = [sys.executable, "-m", "toolwire.cli", "serve", "--loop", loop]
    env = clean_env(**NO_PLUGINS)
    with requests.open("rb") as stdin:
        proc = subprocess.run(
            cmd, stdin=stdin, capture_output=True, cwd=tmp_path, env=env, timeout=60, check=False
        )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    by_id = {m.get("id"): m for m in map(json.loads, proc.stdout.decode().splitlines())}
    assert by_id[2]["result"]["structuredContent"] == {"result": 42.0}
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.run(
            cmd, stdin=stdin, capture_output=True, cwd=tmp_path, env=env, timeout=60, check=False
        )
    assert proc.returncode == 0 and proc.stdout == b"", proc.stderr.decode()[-2000:]


def test_stdio_answers_every_request_read_before_the_end_of_input(tmp_path: Path) -> None:
    """Before: at the end of stdin the server waited a fixed 50 ms for the last requests
    to reach their handlers; a call piped right after a listing (`printf ... | toolwire
    serve`) was then dropped without an answer."""
    frames = [
        INIT,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        rpc(10, "tools/list"),
    ]
    frames += [rpc(2, "tools/call", {"name": "add", "arguments": {"a": 2, "b": 40}})]
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "serve"],
        input="".join(json.dumps(f) + "\n" for f in frames).encode(),
        capture_output=True,
        cwd=tmp_path,
        env=clean_env(),  # every installed plugin: the listings are the slow part
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    by_id = {m.get("id"): m for m in map(json.loads, proc.stdout.decode().splitlines())}
    assert 10 in by_id, sorted(by_id, key=str)
    assert by_id[2]["result"]["structuredContent"] == {"result": 42.0}, sorted(by_id, key=str)


def _serve_piped(tmp_path: Path, grace_s: float, calls: dict[int, float]) -> list[Any]:
    """`toolwire serve` fed ``nap`` calls (id -> seconds) on a pipe that then closes."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {"tools": {"modules": ["napping"]}, "server": {"shutdown_grace_s": grace_s}},
    )
    frames = [INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    frames += [
        rpc(i, "tools/call", {"name": "nap", "arguments": {"seconds": s}}) for i, s in calls.items()
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "--config", "toolwire.toml", "serve"],
        input="".join(json.dumps(f) + "\n" for f in frames).encode(),
        capture_output=True,
        cwd=tmp_path,
        env=clean_env(TOOLWIRE_LOAD_PLUGINS=""),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return list(map(json.loads, proc.stdout.decode().splitlines()))


def test_stdio_a_line_too_long_to_read_is_answered_and_skipped(tmp_path: Path) -> None:
    """Before: a line over the 64 MiB read limit ended the server with a traceback (exit
    1), leaving the requests after it unanswered."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml", {"enabled_plugins": []}, {"tools": {"modules": ["napping"]}}
    )
    nap = {"name": "nap", "arguments": {"seconds": 0}}
    huge = rpc(2, "tools/call", {**nap, "_meta": {"pad": "x" * (65 << 20)}})
    frames = [INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, huge]
    frames += [rpc(3, "tools/call", nap)]
    text = "".join(json.dumps(f) + "\n" for f in frames)
    for tail in ("", json.dumps(huge)):  # the huge line last, without its newline, too
        proc = subprocess.run(
            [sys.executable, "-m", "toolwire.cli", "--config", "toolwire.toml", "serve"],
            input=(text + tail).encode(),
            capture_output=True,
            cwd=tmp_path,
            env=clean_env(TOOLWIRE_LOAD_PLUGINS=""),
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        answers = list(map(json.loads, proc.stdout.decode().splitlines()))
        by_id = {m.get("id"): m for m in answers}
        assert len(answers) == 3 + bool(tail), answers
        assert by_id[3]["result"]["structuredContent"] == {"result": "rested"}
        assert by_id[None]["error"]["code"] == -32600
        assert "longer than 64 MiB" in by_id[None]["error"]["message"]


def test_stdio_a_call_outliving_the_grace_period_at_eof_is_answered_cancelled(
    tmp_path: Path,
) -> None:
    """Before: at the end of input it got the SDK's bare "Connection closed" error, where
    SIGTERM answers it `cancelled`."""
    by_id = {m.get("id"): m for m in _serve_piped(tmp_path, 0.5, {2: 60})}
    cut = by_id[2].get("result") or by_id[2]
    assert cut["_meta"][ERROR_META_KEY]["kind"] == "cancelled", cut


def test_stdio_every_request_read_is_answered_when_the_grace_period_ends_at_eof(
    tmp_path: Path,
) -> None:
    """Before: requests read but not answered when the grace period ended (a piped batch
    larger than the server gets through in it) got no answer at all: 95 of 300 here."""
    quick = range(100, 400)
    ids = [m.get("id") for m in _serve_piped(tmp_path, 0, dict.fromkeys(quick, 0.0))]
    assert len(ids) == len(set(ids))  # one answer each
    assert set(ids) == {1, *quick}, f"{len(set(quick) - set(ids))} unanswered"


async def test_stdio_client_lists_and_calls(tmp_path: Path) -> None:
    transport = StdioTransport(
        command=sys.executable,
        args=["-m", "toolwire.cli", "serve"],
        env=clean_env(**NO_PLUGINS),
        cwd=str(tmp_path),
        keep_alive=False,
    )
    async with Client(transport, timeout=30) as c:
        tools = {t.name for t in await c.list_tools()}
        assert "word_hash" in tools
        r = await c.call_tool("echo", {"message": "hi", "upper": True})
        assert r.structured_content == {"message": "HI"}


def test_stdio_sigterm_while_idle_exits_cleanly(tmp_path: Path, serve_process: Any) -> None:
    p = serve_process(
        "serve", "--loop", "asyncio", env=clean_env(**NO_PLUGINS), stdio=True
    ).wait_ready()
    assert "(loop: asyncio)" in p.stderr  # --loop overrides the default (auto: uvloop)
    p.signal(signal.SIGTERM)  # stdin stays open: the reader must not block the shutdown
    assert p.wait(15) == 0
    assert "kernel is closed" in p.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_stdio_on_a_terminal_says_what_it_waits_for(tmp_path: Path) -> None:
    """Before: `toolwire serve` typed at a terminal (the README's first command) logged
    its ready line and sat silent, as if hung."""
    import pty
    import select
    import time

    controller, terminal = pty.openpty()
    cmd = [sys.executable, "-m", "toolwire.cli", "serve", "--loop", "asyncio"]
    proc = subprocess.Popen(
        cmd,
        stdin=terminal,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=clean_env(**NO_PLUGINS),
    )
    os.close(terminal)
    err = b""
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while b"toolwire serving" not in err and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                err += os.read(proc.stderr.fileno(), 65536)
        assert b"toolwire serving" in err, err.decode()[-2000:]
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    hints = [json.loads(line)["msg"] for line in err.decode().splitlines() if "terminal" in line]
    assert hints == [TERMINAL_HINT]
    # not said to an MCP client: stdin from a pipe or a file gets no such line
    with open(os.devnull, "rb") as stdin:
        piped = subprocess.run(
            cmd,
            stdin=stdin,
            capture_output=True,
            cwd=tmp_path,
            env=clean_env(**NO_PLUGINS),
            timeout=60,
            check=False,
        )
    assert piped.returncode == 0 and b"stdin is a terminal" not in piped.stderr


async def test_http_serves_and_survives_bad_input(tmp_path: Path, serve_process: Any) -> None:
    p = serve_process(
        "serve", "--transport", "http", "--port", "0", env=clean_env(**NO_PLUGINS)
    ).wait_ready()
    assert p.url is not None and p.url.startswith("http://127.0.0.1:")
    assert "loop: uvloop)" in p.stderr  # [server] loop = "auto" and uvloop is installed
    async with httpx2.AsyncClient(timeout=10) as http:
        garbage = await http.post(p.url, content=b"{not json", headers=ACCEPT)
        assert garbage.status_code == 400
        assert garbage.json()["error"]["code"] == -32700
        not_rpc = await http.post(p.url, json={"hello": "world"}, headers=ACCEPT)
        assert not_rpc.status_code == 400
    async with Client(p.url, timeout=20) as c:
        assert "add" in {t.name for t in await c.list_tools()}
        r = await c.call_tool_mcp("add", {"a": 1.5, "b": 2})
        assert r.structured_content == {"result": 3.5}
        wrong = await c.call_tool_mcp("add", {"a": [], "b": 2})
        assert wrong.is_error and wrong.meta is not None
        assert wrong.meta[ERROR_META_KEY]["kind"] == "invalid_args"
        unknown = await c.call_tool_mcp("subtract", {})
        assert unknown.is_error and unknown.meta is not None
        assert unknown.meta[ERROR_META_KEY]["kind"] == "not_found"
    assert p.stop() == 0


async def test_http_bearer_token_from_a_secret_ref(tmp_path: Path, serve_process: Any) -> None:
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {
            "tools": {"modules": ["toolwire.examples"]},
            "server": {"transport": "http", "port": 0, "auth_token": {"$secretRef": "GW_TOKEN"}},
        },
    )
    p = serve_process("serve", env=clean_env(GW_TOKEN="s3cret-token")).wait_ready()
    assert p.url is not None
    async with httpx2.AsyncClient(timeout=10) as http:
        missing = await http.post(p.url, json=INIT, headers=ACCEPT)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].lower().startswith("bearer")
        wrong = await http.post(
            p.url, json=INIT, headers={**ACCEPT, "authorization": "Bearer s3cret-tokeX"}
        )
        assert wrong.status_code == 401
        ok = await http.post(
            p.url, json=INIT, headers={**ACCEPT, "authorization": "Bearer s3cret-token"}
        )
        assert ok.status_code == 200 and "result" in sse_json(ok)
    with pytest.raises((MCPError, RuntimeError)):
        async with Client(p.url, auth="wrong", timeout=10) as c:
            await c.list_tools()
    async with Client(p.url, auth="s3cret-token", timeout=20) as c:
        r = await c.call_tool("word_hash", {"text": "abc", "algorithm": "md5"})
        assert r.structured_content == {"result": "900150983cd24fb0d6963f7d28e17f72"}
    assert "s3cret-token" not in p.stderr
    assert p.stop() == 0


async def test_env_token_and_graceful_shutdown_with_a_call_in_flight(
    tmp_path: Path, serve_process: Any
) -> None:
    (tmp_path / "napping.py").write_text(
        "import anyio, pathlib\n"
        "from toolwire import tool\n\n"
        "@tool\n"
        "async def nap(seconds: float) -> str:\n"
        '    """Sleeps, then answers."""\n'
        "    pathlib.Path('started').write_text('x')\n"
        "    await anyio.sleep(seconds)\n"
        "    return 'rested'\n"
    )
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {"tools": {"modules": ["napping"]}, "server": {"shutdown_grace_s": 20}},
    )
    env = clean_env(TOOLS_AUTH_ENABLED="true", TOOLS_AUTH_TOKEN="tok-123")
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0", env=env
    )
    p.wait_ready()
    assert p.url is not None

    results: dict[str, Any] = {}
    c = Client(p.url, auth="tok-123", timeout=30)
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(c)
    try:
        assert [t.name for t in await c.list_tools()] == ["nap"]

        async def long_call() -> None:
            results["nap"] = await c.call_tool_mcp("nap", {"seconds": 1.5})

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            await eventually((tmp_path / "started").exists, 15)
            p.signal(signal.SIGTERM)
            await eventually(lambda: "draining" in p.stderr)
            results["late"] = await c.call_tool_mcp("nap", {"seconds": 0})
    finally:
        with contextlib.suppress(Exception):  # the server may already be gone
            await stack.aclose()
    assert results["nap"].structured_content == {"result": "rested"}  # finished, not cut
    late = results["late"]
    assert late.is_error and late.meta[ERROR_META_KEY]["kind"] == "unavailable"
    assert "shutting down" in late.meta[ERROR_META_KEY]["message"]
    assert p.wait(20) == 0
    assert "kernel is closed" in p.stderr


NAPPING = (
    "import anyio, pathlib\n"
    "from toolwire import tool\n\n"
    "@tool\n"
    "async def nap(seconds: float) -> str:\n"
    '    """Sleeps, then answers."""\n'
    "    with pathlib.Path('started').open('a') as f:\n"
    "        f.write('x')\n"
    "    await anyio.sleep(seconds)\n"
    "    return 'rested'\n"
)


def _started(tmp_path: Path, n: int) -> Any:
    return lambda: (tmp_path / "started").exists() and len((tmp_path / "started").read_text()) >= n


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean-path", "fastmcp-path"])
async def test_a_call_outliving_the_grace_period_is_answered_cancelled(
    tmp_path: Path, serve_process: Any, fast_path: bool
) -> None:
    """Before: the call was cut by uvicorn and its client got a bare HTTP 500."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": ["audit"]},
        {
            "tools": {"modules": ["napping"]},
            "server": {"shutdown_grace_s": 1.0, "fast_path": fast_path},
        },
    )
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert p.url is not None
    results: dict[str, Any] = {}
    async with Client(p.url, timeout=30) as c:

        async def call(key: str, seconds: float) -> None:
            meta = {CALL_ID_META_KEY: f"run-{key}"}
            results[key] = await c.call_tool_mcp("nap", {"seconds": seconds}, meta=meta)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "short", 0.3)
            tg.start_soon(call, "long", 60)
            await eventually(_started(tmp_path, 2), 15)
            p.signal(signal.SIGTERM)
    assert results["short"].structured_content == {"result": "rested"}  # within the grace
    cut = results["long"]
    assert cut.is_error and cut.meta is not None
    # before: {"call_id": null, "tool": null, ...}, unlike every other result
    assert cut.meta[RESULT_META_KEY]["call_id"] == "run-long"
    assert cut.meta[RESULT_META_KEY]["tool"] == "nap"
    info = cut.meta[ERROR_META_KEY]
    assert info["kind"] == "cancelled" and "shutdown grace period" in info["message"]
    assert "check whether it took effect" in info["message"]  # and what to do about it
    # before: "idempotency replays its result if it had one", read as "a replay is safe"
    assert "a replay with the same call id runs the tool again" in info["message"]
    assert p.wait(20) == 0
    assert "1 calls still running after 1.0s: cancelling them" in p.stderr
    assert "Exception in ASGI application" not in p.stderr


async def test_a_cut_call_kept_as_outcome_unknown_is_not_promised_a_rerun(
    tmp_path: Path, serve_process: Any
) -> None:
    """Before: with the idempotency plugin's ``unknown_after_interrupt`` on, the cut call's
    answer still said "a replay with the same call id runs the tool again", and the replay
    (after a restart) answered ``outcome_unknown`` instead."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": ["idempotency"]},
        {
            "tools": {"modules": ["napping"]},
            "server": {"shutdown_grace_s": 0.5},
            "plugins.idempotency": {"unknown_after_interrupt": True},
        },
    )
    meta = {CALL_ID_META_KEY: "run-cut"}
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert p.url is not None
    results: dict[str, Any] = {}
    async with Client(p.url, timeout=30) as c:

        async def call() -> None:
            results["cut"] = await c.call_tool_mcp("nap", {"seconds": 60}, meta=meta)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await eventually(_started(tmp_path, 1), 15)
            p.signal(signal.SIGTERM)
    assert p.wait(20) == 0
    message = results["cut"].meta[ERROR_META_KEY]["message"]
    assert "unknown_after_interrupt" in message and "outcome_unknown" in message
    again = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert again.url is not None
    async with Client(again.url, timeout=30) as c:
        replay = await c.call_tool_mcp("nap", {"seconds": 60}, meta=meta)
    error = replay.meta[ERROR_META_KEY]
    assert error["kind"] == "conflict" and error["details"]["reason"] == "outcome_unknown"
    assert (tmp_path / "started").read_text() == "x"  # the tool ran once


_CRASHING_AGENT = (
    "import asyncio, sys\n"
    "from fastmcp import Client\n\n"
    "async def main():\n"
    "    async with Client(sys.argv[1], timeout=60) as c:\n"
    "        await c.call_tool_mcp('nap', {'seconds': 3}, meta={sys.argv[2]: 'run-crash'})\n\n"
    "asyncio.run(main())\n"
)


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean_path", "fastmcp_handler"])
@pytest.mark.parametrize("keep", [False, True], ids=["default", "unknown_after_interrupt"])
async def test_an_agent_killed_mid_call_over_http_gets_the_result_when_it_replays(
    tmp_path: Path, serve_process: Any, keep: bool, fast_path: bool
) -> None:
    """The crash-and-resume case: an agent process killed while its call runs disconnects.
    Before, the disconnect cancelled the call (Streamable HTTP: a disconnect is the
    cancellation) and by default the agent's replay ran the tool a second time (with
    ``unknown_after_interrupt``: "outcome unknown"). A call with a call id now runs to
    its end and the replay gets its stored result, the tool having run once, on the
    lean path and on FastMCP's own handler alike."""
    (tmp_path / "napping.py").write_text(NAPPING)
    tables: dict[str, dict[str, Any]] = {
        "tools": {"modules": ["napping"]},
        "server": {"fast_path": fast_path},
    }
    if keep:
        tables["plugins.idempotency"] = {"unknown_after_interrupt": True}
    write_config(tmp_path / "toolwire.toml", {"enabled_plugins": ["idempotency"]}, tables)
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert p.url is not None
    agent = await anyio.open_process(
        [sys.executable, "-c", _CRASHING_AGENT, p.url, CALL_ID_META_KEY],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await eventually(_started(tmp_path, 1), 30)
        await anyio.sleep(1.0)  # past the lean path's 0.5 s before it watches for a disconnect
    finally:
        agent.kill()
        await agent.wait()
    async with Client(p.url, timeout=30) as c:
        replay = await c.call_tool_mcp("nap", {"seconds": 3}, meta={CALL_ID_META_KEY: "run-crash"})
    assert replay.structured_content == {"result": "rested"}, replay
    assert replay.meta[RESULT_META_KEY]["replayed"] is True
    assert (tmp_path / "started").read_text() == "x"  # the tool ran once


def test_stdio_a_client_that_stops_reading_ends_the_server_cleanly(tmp_path: Path) -> None:
    """Before: the next answer hit a broken pipe, and the server ended with exit code 1
    and a 60-line ExceptionGroup traceback on stderr (not JSON lines)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolwire.cli", "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=clean_env(TOOLWIRE_LOAD_PLUGINS=""),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write((json.dumps(INIT) + "\n").encode())
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        proc.stdout.close()  # the client stops reading; stdin stays open
        frames = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
        frames.append(rpc(2, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}}))
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write("".join(json.dumps(f) + "\n" for f in frames).encode())
            proc.stdin.flush()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()[-3000:]
    logs = [json.loads(line) for line in err.decode().splitlines() if line.strip()]  # JSON only
    assert any("the client stopped reading" in str(x.get("msg")) for x in logs), logs
    assert any("kernel is closed" in str(x.get("msg")) for x in logs), logs


def test_stdio_calls_finishing_within_the_grace_period_are_answered(tmp_path: Path) -> None:
    """Before: on SIGTERM the stdio transport stopped as soon as the last call left the
    kernel, before the SDK had written its answer: the client got the -32000 "still
    unanswered when the shutdown grace period ended" error for a call that had finished."""
    calls = [
        rpc(i, "tools/call", {"name": "nap", "arguments": {"seconds": 0.5}}) for i in range(2, 12)
    ]
    proc = _stdio_napping(tmp_path, 30, calls)
    try:
        wait_until(_started(tmp_path, 10), 20)
        proc.send_signal(signal.SIGTERM)  # stdin stays open
        wait_until(lambda: proc.poll() is not None, 30)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    by_id = {m.get("id"): m for m in map(json.loads, out.decode().splitlines())}
    for i in range(2, 12):
        assert by_id[i].get("result", {}).get("structuredContent") == {"result": "rested"}, by_id[i]


def test_stdio_a_call_outliving_the_grace_period_is_answered_cancelled(
    tmp_path: Path, serve_process: Any
) -> None:
    proc = _stdio_napping(
        tmp_path, 0.5, [rpc(2, "tools/call", {"name": "nap", "arguments": {"seconds": 60}})]
    )
    try:
        wait_until(_started(tmp_path, 1), 20)
        proc.send_signal(signal.SIGTERM)  # stdin stays open
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    by_id = {m.get("id"): m for m in map(json.loads, out.decode().splitlines())}
    cut = by_id[2]["result"]
    assert cut["isError"] is True, cut
    assert cut["_meta"][ERROR_META_KEY]["kind"] == "cancelled"


def test_a_second_signal_ends_the_grace_period_at_once(tmp_path: Path) -> None:
    """Before: a second Ctrl-C (or SIGTERM) during the shutdown grace period did nothing;
    with a long grace the server sat there until it ran out."""
    call = rpc(2, "tools/call", {"name": "nap", "arguments": {"seconds": 600}})
    proc = _stdio_napping(tmp_path, 600, [call])
    assert proc.stderr is not None
    try:
        wait_until(_started(tmp_path, 1), 20)
        proc.send_signal(signal.SIGINT)  # stdin stays open
        err = b""
        for line in proc.stderr:  # wait for the drain to begin
            err += line
            if b"draining" in line:
                break
        proc.send_signal(signal.SIGINT)  # Ctrl-C again
        out, rest = proc.communicate(timeout=30)
        err += rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"SIGINT again" in err, err.decode()
    by_id = {m.get("id"): m for m in map(json.loads, out.decode().splitlines())}
    cut = by_id[2]["result"]
    assert cut["isError"] is True, cut
    assert cut["_meta"][ERROR_META_KEY]["kind"] == "cancelled"


async def test_an_upstream_printing_noise_does_not_flood_the_log(
    tmp_path: Path, serve_process: Any
) -> None:
    """A stdio upstream writing non-protocol lines to stdout: the MCP SDK logs a traceback
    per line. Before, 230,000 plain-text lines in 20 s (the JSON handler was attached only
    once the upstreams had connected) and the gateway busy logging them."""
    (tmp_path / "noisy.py").write_text(
        "import sys, time\n"
        "for i in range(20000):\n"
        "    print(f'noise {i}', flush=(i % 1000 == 0))\n"
        "sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": ["mcp"]},
        {
            "plugins.mcp": {"connect_timeout_s": 2},
            "plugins.mcp.servers.noisy": {"command": sys.executable, "args": ["noisy.py"]},
        },
    )
    p = serve_process(
        "--config",
        "toolwire.toml",
        "serve",
        "--transport",
        "http",
        "--port",
        "0",
    ).wait_ready(60)
    await eventually(
        lambda: "more like this" in p.stderr or p.stderr.count("Failed to parse") >= 5, 30
    )
    await anyio.sleep(1.0)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert all(line.startswith("{") for line in lines), [x for x in lines if not x.startswith("{")][
        :3
    ]
    parse_logs = [line for line in lines if "Failed to parse JSONRPC message" in line]
    assert 1 <= len(parse_logs) <= 5, len(parse_logs)
    assert len(lines) < 200, len(lines)
    assert p.stop() == 0


def test_config_errors_exit_2_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith(("TOOLWIRE_", "TOOLS_AUTH_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    write_config(tmp_path / "bad.toml", {}, {"server": {"transport": "pigeon", "colour": 1}})
    assert main(["serve", "--config", "bad.toml"]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "server.transport" in err and "server.colour: unknown key" in err
    write_config(tmp_path / "typo.toml", {}, {"server": {"transprt": "http"}})
    assert main(["serve", "--config", "typo.toml"]) == 2
    err = capsys.readouterr().err
    assert "server.transprt: unknown key; did you mean 'transport'?" in err
    # `config check` checks [server] as `serve` would (before: "ok": true)
    assert main(["--config", "bad.toml", "config", "check"]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "server.transport" in err and "server.colour: unknown key" in err
    write_config(tmp_path / "good.toml", {}, {"server": {"port": 8123}})
    assert main(["--config", "good.toml", "config", "check"]) == 0
    assert json.loads(capsys.readouterr().out)["server"] == "ok"
    # an env override that lands in a table of its own (keys are read lower-case)
    write_config(
        tmp_path / "w.toml",
        {"enabled_plugins": ["mcp"]},
        {"plugins.mcp.servers.Weather": {"command": "true"}},
    )
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "mcp")
    monkeypatch.setenv("TOOLWIRE_PLUGINS__MCP__SERVERS__WEATHER__TIMEOUT", "500")
    assert main(["--config", "w.toml", "config", "check"]) == 2
    err = capsys.readouterr().err
    assert "plugins.mcp.servers.weather" in err
    assert "TOOLWIRE_PLUGINS__MCP__SERVERS__WEATHER__TIMEOUT" in err and "lower-case" in err
    monkeypatch.delenv("TOOLWIRE_PLUGINS__MCP__SERVERS__WEATHER__TIMEOUT")
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    monkeypatch.setenv("TOOLS_AUTH_ENABLED", "true")
    assert main(["serve", "--transport", "http"]) == 2
    err = capsys.readouterr().err
    assert "TOOLS_AUTH_TOKEN" in err
    monkeypatch.delenv("TOOLS_AUTH_ENABLED")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        assert main(["serve", "--transport", "http", "--port", port]) == 2
    err = capsys.readouterr().err
    assert f"<command line>: server.port: cannot listen on 127.0.0.1:{port}" in err
    assert "--port" in err
    assert main(["serve", "--transport", "http", "--host", "no-such-host.invalid"]) == 2
    err = capsys.readouterr().err
    assert "<command line>: server.host: cannot listen on no-such-host.invalid" in err
    assert "--host" in err
    with socket.socket() as busy:  # the port written in the file: the file's fault
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        write_config(
            tmp_path / "taken.toml",
            {},
            {"server": {"transport": "http", "port": busy.getsockname()[1]}},
        )
        assert main(["--config", "taken.toml", "serve"]) == 2
    err = capsys.readouterr().err
    assert "error: taken.toml: server.port: cannot listen" in err, err
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "approval")
    write_config(  # the approval plugin's routes live under /approvals
        tmp_path / "clash.toml",
        {"enabled_plugins": ["approval"]},
        {"server": {"transport": "http", "port": 0, "path": "/approvals"}},
    )
    assert main(["--config", "clash.toml", "serve"]) == 2
    err = capsys.readouterr().err
    assert "error: clash.toml: server.path: plugin 'approval' offers the HTTP route" in err, err
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    assert main(["--config", "good.toml", "serve", "--transport", "http", "--port", "99999"]) == 2
    err = capsys.readouterr().err  # a flag's fault is not the file's
    assert "<command line>: server.port:" in err and "(from the --port option)" in err
    assert "good.toml" not in err
    write_config(
        tmp_path / "up.toml", {}, {"plugins.mcp.servers.x": {"command": "a", "url": "http://b"}}
    )
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "mcp")
    assert main(["--config", "up.toml", "serve"]) == 2
    err = capsys.readouterr().err
    assert "plugins.mcp.servers.x" in err and "either `command`" in err
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    write_config(tmp_path / "loop.toml", {}, {"server": {"loop": "tokio"}})
    assert main(["--config", "loop.toml", "serve"]) == 2
    err = capsys.readouterr().err
    assert "loop.toml" in err and "server.loop" in err and "'uvloop'" in err


def test_an_empty_bearer_token_is_a_startup_error_not_an_open_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a $secretRef (or TOOLS_AUTH_TOKEN) set to "" served every tool without auth,
    saying only "auth: False" in the ready line."""
    cfg = {"transport": "http", "port": 0, "auth_token": {"$secretRef": "GATEWAY_TOKEN"}}
    write_config(tmp_path / "toolwire.toml", {}, {"server": cfg})
    # an empty secret: an unset ${VAR} in a compose file, an empty key in a k8s Secret
    env = clean_env(TOOLWIRE_LOAD_PLUGINS="", GATEWAY_TOKEN="")
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "--config", "toolwire.toml", "serve"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=tmp_path,
        env=env,
        timeout=30,  # before: it served, and never ended
        check=False,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "server.auth_token" in err and "set but empty" in err, err
    assert "TOOLS_AUTH_ENABLED=false" in err  # how to mean it
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith(("TOOLWIRE_", "TOOLS_AUTH_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    monkeypatch.setenv("GATEWAY_TOKEN", "")
    assert main(["--config", "toolwire.toml", "config", "check"]) == 2  # as serve would
    assert "set but empty" in capsys.readouterr().err
    write_config(tmp_path / "env.toml", {}, {"server": {"transport": "http"}})
    monkeypatch.setenv("TOOLS_AUTH_TOKEN", "")
    assert main(["--config", "env.toml", "config", "check"]) == 2
    err = capsys.readouterr().err
    assert "TOOLS_AUTH_TOKEN" in err and "set but empty" in err, err


def test_loop_uvloop_where_it_is_not_installed_names_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert loop_options("auto") == {}  # auto falls back to asyncio's loop
    assert loop_options("asyncio") == {}
    with pytest.raises(ConfigError, match=r"t.toml: server.loop: .*pip install uvloop"):
        loop_options("uvloop", "t.toml")
    monkeypatch.undo()
    assert loop_options("auto") == {"use_uvloop": True} == loop_options("uvloop")


def test_serve_is_documented_in_cli_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "toolwire.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0
    for flag in ("--transport", "--host", "--port", "--config", "--loop"):
        assert flag in proc.stdout


async def test_idle_sessions_end_and_connections_are_capped(
    tmp_path: Path, serve_process: Any
) -> None:
    """Before: abandoned handshake-era sessions lived 30 minutes (10,000 of them refused every
    such client), and connections had no cap (idle sockets could take every descriptor)."""
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {"server": {"session_idle_timeout_s": 1, "max_connections": 2}},
    )
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert p.url is not None
    async with httpx2.AsyncClient(timeout=10) as http:
        init = await http.post(p.url, json=INIT, headers=ACCEPT)
        sid = init.headers["mcp-session-id"]
        session = {**ACCEPT, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        ok = await http.post(p.url, json=rpc(2, "tools/list"), headers=session)
        assert ok.status_code == 200
        await anyio.sleep(2.5)
        gone = await http.post(p.url, json=rpc(3, "tools/list"), headers=session)
        assert gone.status_code == 404  # the client starts a new session, as MCP says
    host, port = p.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    async with httpx2.AsyncClient(timeout=10) as http:  # under the cap: served (was 503
        assert (await http.post(p.url, json=INIT, headers=ACCEPT)).status_code == 200  # at 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(2)]
    try:
        await anyio.sleep(0.3)
        async with httpx2.AsyncClient(timeout=10) as http:
            busy = await http.post(p.url, json=INIT, headers=ACCEPT)
        assert busy.status_code == 503
    finally:
        for s in idle:
            s.close()
    await anyio.sleep(0.3)
    async with httpx2.AsyncClient(timeout=10) as http:
        assert (await http.post(p.url, json=INIT, headers=ACCEPT)).status_code == 200
    assert p.stop() == 0


def _recv_all(s: socket.socket, limit: float = 5.0) -> bytes | None:
    """What the server sends on ``s`` until it closes the connection; None: still open
    after ``limit`` seconds."""
    s.settimeout(limit)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data


async def test_requests_must_arrive_within_request_read_timeout(
    tmp_path: Path, serve_process: Any
) -> None:
    """Before: a socket that sent nothing, or a head or body a byte at a time, was held for
    ever, and a client holding max_connections of them locked every other client out."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {
            "tools": {"modules": ["napping"]},
            "server": {"request_read_timeout_s": 1.0, "max_connections": 4},
        },
    )
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert p.url is not None
    host, port = p.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Length: 500\r\n"
    )
    lean = "Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: nap\r\n"
    held = [socket.create_connection((host, int(port))) for _ in range(4)]
    _silent, half_head, half_body, half_lean_body = held
    try:
        half_head.sendall(head[:40].encode())
        half_body.sendall((head + '\r\n{"jsonrpc":').encode())  # FastMCP's handler
        half_lean_body.sendall((head + lean + '\r\n{"jsonrpc":').encode())  # the lean path
        await anyio.sleep(0.3)
        async with httpx2.AsyncClient(timeout=10) as http:  # four sockets held: no room
            assert (await http.post(p.url, json=INIT, headers=ACCEPT)).status_code == 503
        got = await anyio.to_thread.run_sync(lambda: [_recv_all(s) for s in held])
    finally:
        for s in held:
            s.close()
    assert got[0] == b""  # never asked anything: closed without an answer
    assert got[1] is not None and got[1].startswith(b"HTTP/1.1 408 "), got[1]
    assert b"request_read_timeout_s" in got[1]
    assert got[2] == got[3] == b""  # their handlers were told the client left
    await anyio.sleep(0.3)
    # The deadline is per request: a keep-alive connection idle between requests for
    # longer than it, a head sent in pieces inside it, and an answer slower than it are fine.
    async with Client(p.url, timeout=20) as c:
        assert (await c.call_tool_mcp("nap", {"seconds": 1.5})).structured_content == {
            "result": "rested"
        }
        await anyio.sleep(1.3)
        assert (await c.call_tool_mcp("nap", {"seconds": 0})).structured_content == {
            "result": "rested"
        }
    body = json.dumps(INIT).encode()
    request = (
        f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port))) as s:
        for piece in (request[:30], request[30:90], request[90:]):
            s.sendall(piece)
            await anyio.sleep(0.25)
        answer = await anyio.to_thread.run_sync(_recv_all, s)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200 "), answer
    assert p.stop() == 0
    assert "Traceback" not in p.stderr, p.stderr[-3000:]


async def test_a_request_head_over_max_header_bytes_is_refused_before_auth(
    tmp_path: Path, serve_process: Any
) -> None:
    """Before: uvicorn kept a request's line and headers in memory whatever their length,
    before the token was checked (one client's 150 MB header took 300 MB of the server's)."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {
            "tools": {"modules": ["napping"]},
            "server": {"max_header_bytes": 4096},
        },
    )
    p = serve_process(
        "--config",
        "toolwire.toml",
        "serve",
        "--transport",
        "http",
        "--port",
        "0",
        env=clean_env(TOOLS_AUTH_TOKEN="tok-123456"),
    ).wait_ready()
    assert p.url is not None
    host, port = p.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    head = f"GET /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nX-Pad: ".encode()
    with socket.create_connection((host, int(port))) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(head + b"a" * 200_000 + b"\r\n\r\n")
        answer = await anyio.to_thread.run_sync(_recv_all, s)
    assert answer is not None and answer.startswith(b"HTTP/1.1 431 "), answer
    assert b"max_header_bytes" in answer
    headers = {**ACCEPT, "authorization": "Bearer tok-123456", "x-pad": "a" * 2000}
    async with httpx2.AsyncClient(timeout=10) as http:  # a head within the cap is served
        assert (await http.post(p.url, json=INIT, headers=headers)).status_code == 200
    assert p.stop() == 0


async def test_max_sessions_caps_handshake_era_sessions(tmp_path: Path, serve_process: Any) -> None:
    """Before: the MCP SDK's 10,000 could not be changed (FastMCP does not pass it on)."""
    write_config(
        tmp_path / "toolwire.toml", {"enabled_plugins": []}, {"server": {"max_sessions": 2}}
    )
    p = serve_process(
        "--config", "toolwire.toml", "serve", "--transport", "http", "--port", "0"
    ).wait_ready()
    assert p.url is not None
    async with httpx2.AsyncClient(timeout=10) as http:
        first = [await http.post(p.url, json=INIT, headers=ACCEPT) for _ in range(2)]
        assert [r.status_code for r in first] == [200, 200]
        refused = await http.post(p.url, json=INIT, headers=ACCEPT)
        assert refused.status_code == 503 and "Too many open sessions" in refused.text
        sid = first[0].headers["mcp-session-id"]
        gone = await http.delete(p.url, headers={**ACCEPT, "mcp-session-id": sid})
        assert gone.status_code == 200
        assert (await http.post(p.url, json=INIT, headers=ACCEPT)).status_code == 200
    assert p.stop() == 0


async def test_clients_cutting_their_request_bodies_short_do_not_flood_the_log(
    tmp_path: Path, serve_process: Any
) -> None:
    """Before: each such request logged a 4 KB traceback ("Exception in ASGI application")."""
    p = serve_process(
        "serve", "--transport", "http", "--port", "0", env=clean_env(**NO_PLUGINS)
    ).wait_ready()
    assert p.url is not None
    host, port = p.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2026-07-28\r\n"
        "Mcp-Method: tools/call\r\nMcp-Name: echo\r\nContent-Length: 500\r\n\r\n"
        '{"jsonrpc":"2.0"'
    )
    for _ in range(30):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(head.encode())
            await anyio.sleep(0.01)
    await anyio.sleep(1.0)
    async with Client(p.url, timeout=20) as c:  # still serving
        assert (await c.call_tool_mcp("add", {"a": 1, "b": 2})).structured_content == {
            "result": 3.0
        }
    assert p.stderr.count("Exception in ASGI application") == 0, p.stderr[-3000:]
    assert p.stop() == 0


def test_a_plain_text_auth_token_in_the_file_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the warning covered [plugins.*] tables only, not [server] auth_token."""
    import argparse

    from toolwire_mcp.cli import _configs

    monkeypatch.setenv("GW_REF_TOKEN", "from-the-environment")
    for var in ("TOOLWIRE_CONFIG", "TOOLS_AUTH_TOKEN", "TOOLS_AUTH_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    plain = tmp_path / "plain.toml"
    plain.write_text('enabled_plugins = []\n[server]\nauth_token = "s3cret-in-the-file"\n')
    ref = tmp_path / "ref.toml"
    ref.write_text('enabled_plugins = []\n[server]\nauth_token = {"$secretRef" = "GW_REF_TOKEN"}\n')
    for path, warned in ((plain, True), (ref, False)):
        caplog.clear()
        args = argparse.Namespace(config=str(path), transport=None, host=None, port=None, loop=None)
        with caplog.at_level("WARNING", logger="toolwire"):
            _configs(args)
        text = " ".join(r.getMessage() for r in caplog.records)
        assert ("server.auth_token holds a credential in plain text" in text) is warned, text
        assert "s3cret" not in text


def test_config_check_warns_what_serve_would_of_the_server_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `config check` said "ok" with no warning of a plain-text [server] auth_token
    or of auth switched off although a token is set; `serve` warned of both at start."""
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith(("TOOLWIRE_", "TOOLS_AUTH_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    monkeypatch.setenv("GW_REF_TOKEN", "from-the-environment")
    cases = {
        'auth_token = "s3cret-in-the-file"': "server.auth_token holds a credential in plain text",
        'auth_token = {"$secretRef" = "GW_REF_TOKEN"}\nauth_enabled = false': (
            "bearer auth is off ([server] auth_enabled = false) although a token is configured"
        ),
        'auth_token = {"$secretRef" = "GW_REF_TOKEN"}': None,
    }
    for table, warning in cases.items():
        (tmp_path / "gw.toml").write_text(
            f'enabled_plugins = []\n[server]\ntransport = "http"\n{table}\n'
        )
        assert main(["--config", "gw.toml", "config", "check", "--strict"]) == (
            0 if warning is None else 1
        )
        out = capsys.readouterr().out
        warnings = json.loads(out)["warnings"]
        if warning is None:
            assert warnings == []
        else:
            assert len(warnings) == 1 and warning in warnings[0], warnings
        assert "s3cret" not in out


def test_config_check_lists_an_unreachable_server_in_its_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/mcp.md: a server `config check` cannot reach is a warning, not a configuration
    error. Before: it showed only on stderr and the summary said "ok": true; now it is in
    `"warnings"`, and `--strict` fails the check on it (deploy pipelines)."""
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith(("TOOLWIRE_", "TOOLS_AUTH_")) or var == "REDIS_URL":
            monkeypatch.delenv(var)
    port = free_port()  # bound and released: nothing listens there
    write_config(
        tmp_path / "down.toml",
        {"enabled_plugins": ["mcp"]},
        {
            "plugins.mcp": {"connect_timeout_s": 0.5},
            "plugins.mcp.servers.down": {"url": f"http://127.0.0.1:{port}/mcp"},
        },
    )
    for strict, code in (([], 0), (["--strict"], 1)):
        assert main(["--config", "down.toml", "config", "check", *strict]) == code
        captured = capsys.readouterr()
        summary = json.loads(captured.out)
        assert summary["ok"] is (code == 0) and summary["plugins"] == ["mcp"]
        warnings = summary["warnings"]
        assert any(
            w.startswith("MCP server 'down' is not available at startup (") for w in warnings
        ), warnings
        assert all(w.startswith("MCP server 'down' ") for w in warnings), warnings
        logged = [json.loads(line) for line in captured.err.splitlines() if line.strip()]
        assert [r["msg"] for r in logged if r["level"] == "warning"] == warnings  # as before


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("localhost:8000", "holds a port"),
        ("http://127.0.0.1", "is a URL"),
        ("127.0.0.1/mcp", "is a URL"),
        ("", "is empty"),
    ],
)
def test_a_host_with_a_port_or_a_scheme_is_a_config_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    host: str,
    says: str,
) -> None:
    """Before: `[server] host = "localhost:8000"` passed `config check` ("server": "ok") and
    `toolwire serve` then failed on "cannot listen on localhost:8000:8000: Name or service
    not known"."""
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.startswith(("TOOLWIRE_", "TOOLS_AUTH_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("TOOLWIRE_LOAD_PLUGINS", "")
    write_config(tmp_path / "h.toml", {}, {"server": {"host": host}})
    assert main(["--config", "h.toml", "config", "check"]) == 2
    err = capsys.readouterr().err
    assert "server.host" in err and says in err, err
    assert main(["serve", "--transport", "http", "--host", host]) == 2
    err = capsys.readouterr().err
    assert "server.host" in err and says in err, err
    # addresses and names, IPv6 included, are fine
    for good in ("0.0.0.0", "::1", "localhost", "my-host.example"):
        ServeConfig(host=good)


def _stdio_napping(
    tmp_path: Path, grace_s: float, calls: list[dict[str, Any]]
) -> subprocess.Popen[bytes]:
    """`toolwire serve` over stdio with the ``nap`` tool and ``shutdown_grace_s``, sent the
    handshake and ``calls`` (stdin stays open)."""
    (tmp_path / "napping.py").write_text(NAPPING)
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": []},
        {"tools": {"modules": ["napping"]}, "server": {"shutdown_grace_s": grace_s}},
    )
    frames = [INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, *calls]
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolwire.cli", "--config", "toolwire.toml", "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=clean_env(TOOLWIRE_LOAD_PLUGINS=""),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(json.dumps(f) + "\n" for f in frames).encode())
    proc.stdin.flush()
    return proc
