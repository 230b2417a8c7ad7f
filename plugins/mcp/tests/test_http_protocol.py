"""``timed_http_protocol`` in an in-process uvicorn: what it times and what it does not."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import uvicorn
from toolwire_mcp_testkit import eventually

from toolwire_mcp import timed_http_protocol

pytestmark = pytest.mark.anyio


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body; ``/slow`` then takes 1.5 s to answer."""
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":
        await asyncio.sleep(1.5)
    body = scope["path"].encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _server(
    read_timeout_s: float, max_head_bytes: int | None = 64 * 1024
) -> AsyncIterator[int]:
    config = uvicorn.Config(
        _app,
        host="127.0.0.1",
        port=0,
        http=timed_http_protocol(read_timeout_s, max_head_bytes),
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


def _exchange(port: int, first: bytes, then: bytes, limit: float = 8.0) -> bytes:
    """Send ``first``, 0.2 s later ``then``; what comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(first)
        s.settimeout(limit)
        time.sleep(0.2)
        s.sendall(then)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return data


async def test_a_request_pipelined_behind_a_slow_one_is_timed_from_its_answer() -> None:
    """Before: its clock ran while uvicorn held its body unread (a body over 64 KiB, queued
    behind a call slower than the deadline), and the connection was closed under the slow
    call: its answer was lost, and the client's next request with it."""
    slow = b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    size = 200_000
    queued = (
        b"POST /queued HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        % size
    )
    async with _server(1.0) as port:
        whole = await anyio.to_thread.run_sync(_exchange, port, slow + queued, b"x" * size, 5.0)
        assert whole.count(b"HTTP/1.1 200 OK") == 2, whole
        assert whole.endswith(b"/queued"), whole
        # still timed once the slow answer is out: half a body is closed a deadline later
        half = await anyio.to_thread.run_sync(
            _exchange, port, slow + queued, b"x" * (size // 2), 8.0
        )
        assert half.count(b"HTTP/1.1 200 OK") == 1 and half.endswith(b"/slow"), half


def _send_all(port: int, data: bytes, limit: float = 8.0) -> bytes:
    """Send ``data`` (what the server reads of it), then what comes back until it closes."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(limit)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed under a head it refused: its answer was sent first
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


async def test_a_head_over_max_head_bytes_gets_431_and_the_connection_closes() -> None:
    """Before: uvicorn held a request's line and headers whatever their length (a header of
    150 MB took as much memory, before any auth); now the read stops at the cap."""
    big_header = b"GET /h HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    big_url = b"GET /" + b"u" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    async with _server(5.0, max_head_bytes=16 * 1024) as port:
        for request in (big_header, big_url):
            answer = await anyio.to_thread.run_sync(_send_all, port, request)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
            assert b"max_header_bytes" in answer and b"200 OK" not in answer
        # a head within the cap, and a body of any size behind it, are served
        fits = b"GET /fits HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 12_000 + b"\r\n"
        answer = await anyio.to_thread.run_sync(
            _send_all, port, fits + b"Connection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"/fits"), answer[:200]
        body = 300_000
        post = b"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % body
        last = b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        answer = await anyio.to_thread.run_sync(_send_all, port, post + b"x" * body + last)
        assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"/last"), answer[:300]


async def test_no_head_cap_when_max_head_bytes_is_none() -> None:
    request = b"GET /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + b"a" * 200_000
    async with _server(5.0, max_head_bytes=None) as port:
        answer = await anyio.to_thread.run_sync(_send_all, port, request + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
