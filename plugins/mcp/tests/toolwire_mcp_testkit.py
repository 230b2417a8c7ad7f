"""Helpers shared by the toolwire-mcp tests (imported by conftest.py and the test modules).

A plain module with a unique name (not a `tests` package): several distributions
in the workspace have a `tests/` directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream_server.py"
TS_CLIENT = HERE.parents[2] / "tests" / "ts_client"  # the Node project (TypeScript MCP SDK)
READY = re.compile(r"toolwire serving (\d+) tools (?:over stdio|at (http://\S+))")


@pytest.fixture
def anyio_backend() -> str:
    """The MCP client side runs on asyncio (FastMCP's client is asyncio-only)."""
    return "asyncio"


def upstream_entry(**extra: Any) -> dict[str, Any]:
    """A `[plugins.mcp.servers.<name>]` entry starting the test upstream over stdio."""
    return {"command": sys.executable, "args": [str(UPSTREAM)], **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without toolwire/auth settings, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TOOLWIRE_", "TOOLS_AUTH_", "FASTMCP_")) and k != "REDIS_URL"
    }
    env.update(extra)
    return env


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_value(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def write_config(path: Path, top: dict[str, Any], tables: dict[str, dict[str, Any]]) -> Path:
    """A toolwire.toml: top-level keys, then `[table]` sections (dotted names allowed)."""
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class ServeProcess:
    """`toolwire serve` in a subprocess; stderr is collected; waits for the ready line."""

    def __init__(
        self, args: Sequence[str], *, cwd: Path, env: dict[str, str], stdio: bool = False
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolwire.cli", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdio else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url: str | None = None
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            m = READY.search(line)
            if m:
                self.url = m.group(2)
                self._ready.set()
        self._ready.set()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = 30.0) -> ServeProcess:
        if not self._ready.wait(timeout) or (self.proc.poll() is not None and self.url is None):
            self.stop()
            raise AssertionError(f"toolwire serve did not become ready:\n{self.stderr}")
        return self

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 20.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(
                f"toolwire serve did not exit in {timeout}s:\n{self.stderr}"
            ) from None
        self._reader.join(5)
        return code

    def stop(self) -> int:
        self.signal(signal.SIGTERM)
        return self.wait()


class HttpUpstream:
    """upstream_server.py (or ``script``) over Streamable HTTP in a subprocess; restartable
    on the same port."""

    def __init__(
        self,
        port: int | None = None,
        env: dict[str, str] | None = None,
        script: Path = UPSTREAM,
        command: Sequence[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.env = env or clean_env()
        #: what runs the server (``--http PORT`` is added): the script under this Python
        self.command = list(command) if command is not None else [sys.executable, str(script)]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, timeout: float = 30.0) -> HttpUpstream:
        """Start the server (again) and wait until it accepts connections."""
        self.stop()
        self.proc = subprocess.Popen(
            [*self.command, "--http", str(self.port)],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the HTTP upstream exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"the HTTP upstream did not listen on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(5)


def _node_unavailable(why: str) -> None:
    if os.environ.get("TOOLWIRE_REQUIRE_NODE") == "1":
        pytest.fail(f"TOOLWIRE_REQUIRE_NODE=1 but {why}")
    pytest.skip(f"{why} (set TOOLWIRE_REQUIRE_NODE=1 to make this a failure)")


@pytest.fixture(scope="session")
def node() -> str:
    """``node``, with tests/ts_client's packages installed (``npm ci`` when missing).

    Without node (or npm) the test is skipped, unless TOOLWIRE_REQUIRE_NODE=1 (CI)."""
    import shutil

    exe = shutil.which("node")
    if exe is None:
        _node_unavailable("node is not installed")
    assert exe is not None
    if not (TS_CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        npm = shutil.which("npm")
        if npm is None:
            _node_unavailable("npm is not installed")
        assert npm is not None
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=TS_CLIENT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0:
            _node_unavailable(f"`npm ci` failed in {TS_CLIENT}: {proc.stderr[-2000:]}")
    return exe


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[Any]:
    """Start `toolwire serve` subprocesses; every one is stopped at the end of the test."""
    started: list[ServeProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, stdio: bool = False) -> ServeProcess:
        p = ServeProcess(args, cwd=tmp_path, env=env or clean_env(), stdio=stdio)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait(5)


async def eventually(predicate: Any, within: float = 10.0) -> None:
    """Await until ``predicate()`` is true; fail after ``within`` seconds."""
    import anyio

    with anyio.fail_after(within):
        while True:
            if predicate():
                return
            await anyio.sleep(0.02)


async def call_until_back(
    kernel: Any, tool: str, args: dict[str, Any], within: float = 20.0
) -> Any:
    """Call ``tool`` until it succeeds (it answers ``unavailable`` meanwhile); the result."""
    import anyio

    with anyio.fail_after(within):
        while True:
            r = await kernel.call(tool, args)
            if not r.is_error:
                return r
            assert r.error is not None and r.error.kind == "unavailable", r.error
            await anyio.sleep(0.05)


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` (sync) until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not met in time")


# ------------------------------------------------- scripted TCP servers
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


class Server:
    """A TCP server whose ``handler`` answers each connection; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.got_request = asyncio.Event()
        self.port = 0

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request (head and Content-Length body), or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        self.got_request.set()
        return body

    async def until_client_closes(self, reader: asyncio.StreamReader) -> None:
        """Wait (up to 30 s) for the client to drop the connection."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            if await asyncio.wait_for(reader.read(), 30) == b"":
                self.closed_by_client.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                if await reader.read() == b"":
                    self.closed_by_client.set()
            except ConnectionError:  # reset: the client closed with our answer unread
                self.closed_by_client.set()
            writer.close()


@asynccontextmanager
async def serving(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    srv = Server(handler)
    server = await asyncio.start_server(srv._serve, "127.0.0.1", 0, ssl=tls)
    srv.port = server.sockets[0].getsockname()[1]
    async with server:
        yield srv
        server.close()


def direct_caller(srv: Server, server: str = "up") -> Any:
    """A ``DirectCaller`` for a scripted server's ``/mcp`` (protocol 2026-07-28, no timeout)."""
    from toolwire_mcp._direct import DirectCaller

    return DirectCaller(
        server=server,
        url=f"http://127.0.0.1:{srv.port}/mcp",
        protocol_version="2026-07-28",
        headers={},
        auth=None,
        timeout_s=None,
        on_list_changed=lambda: None,
    )


# ------------------------------------------------- a scripted MCP upstream
#: Writes the answer to one ``tools/call`` (its request id given) as the case needs;
#: returns whether the connection serves the next request.
CallScript = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter, Server], Awaitable[bool]]

_PAGE = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
#: What the scripted upstream answers ``server/discover``: only the 2026-07-28 protocol.
DISCOVERED = {
    **_PAGE,
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "scripted", "version": "1"}},
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {"listChanged": False}},
}
#: Its one tool: ``probe``; the ``case`` argument names the script that answers the call.
PROBE = {
    "name": "probe",
    "inputSchema": {"type": "object", "properties": {"case": {"type": "string"}}},
}


def json_answer(msg: Any, *headers: str, status: str = "200 OK") -> bytes:
    """An HTTP answer with ``msg`` as its JSON body (bytes as they are)."""
    body = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
    head = "".join(f"{h}\r\n" for h in headers)
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{head}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def scripted_upstream(scripts: Mapping[str, CallScript]) -> Handler:
    """A Streamable-HTTP MCP server on the 2026-07-28 protocol whose ``tools/call`` answers
    are scripted byte for byte.

    ``server/discover`` and ``tools/list`` (one tool, ``probe``) are answered properly, so
    the FastMCP client connects and the direct path is taken; any other request (the
    ``subscriptions/listen`` stream, a GET) is refused. A call of ``probe`` with
    ``{"case": name}`` is answered by ``scripts[name]``.
    """

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, srv: Server) -> None:
        while (body := await srv.read_request(r)) is not None:
            if not srv.requests[-1].startswith(b"POST "):
                w.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                await w.drain()
                continue
            msg = json.loads(body)
            rid, method = msg.get("id"), msg.get("method")
            if method == "tools/call":
                case = msg["params"]["arguments"].get("case", "ok")
                if not await scripts[case](rid, r, w, srv):
                    return
                continue
            if method == "server/discover":
                w.write(json_answer({"jsonrpc": "2.0", "id": rid, "result": DISCOVERED}))
            elif method == "tools/list":
                page = {**_PAGE, "tools": [PROBE]}
                w.write(json_answer({"jsonrpc": "2.0", "id": rid, "result": page}))
            else:
                error = {"code": -32601, "message": f"no {method} here"}
                w.write(json_answer({"jsonrpc": "2.0", "id": rid, "error": error}))
            await w.drain()

    return handler


@dataclass
class Served:
    """A kernel served over HTTP in this process: its URL and its lean path (None: off)."""

    url: str
    fast: Any


@asynccontextmanager
async def serving_http(
    kernel: Any, *, token: Any = None, gate: Any = None, **cfg: Any
) -> AsyncIterator[Served]:
    """``kernel`` served by ``create_http_app`` under uvicorn on a free loopback port;
    ``cfg``: ``ServeConfig`` keys; ``token``: ``auth_token`` (a token or a ``BearerAuth``;
    None: from ``cfg``); ``gate``: a ``ServeGate`` of the test's own."""
    import uvicorn

    from toolwire_mcp import ServeConfig, create_http_app
    from toolwire_mcp._serve import _Uvicorn, bind_socket
    from toolwire_mcp._serve import create_http_app as create_app_with_gate

    config = ServeConfig(transport="http", port=0, **cfg)
    if gate is None:
        app = create_http_app(kernel, config, auth_token=token)
    else:
        app = create_app_with_gate(kernel, config, auth_token=token, gate=gate)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = _Uvicorn(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", ws="none")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await server.ready.wait()
        try:
            yield Served(f"http://127.0.0.1:{port}{config.path}", app.state.toolwire_fast_path)
        finally:
            server.should_exit = True
    sock.close()


@asynccontextmanager
async def running_server(kernel: Any, cfg: Any) -> AsyncIterator[dict[str, Any]]:
    """``run_server(kernel, cfg)`` in a task of this loop, no signal handlers; yields what
    it announces (``port``, ``url``, ...) once it serves, and stops it by cancellation."""
    from toolwire_mcp import run_server

    started = anyio.Event()
    info: dict[str, Any] = {}

    def on_ready(announced: dict[str, Any]) -> None:
        info.update(announced)
        started.set()

    async def serve() -> None:
        await run_server(kernel, cfg, on_ready=on_ready, handle_signals=False)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(30):
            await started.wait()
        yield info
        tg.cancel_scope.cancel()
