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
async def _server(read_timeout_s: float) -> AsyncIterator[int]:
    config = uvicorn.Config(
        _app,
        host="127.0.0.1",
        port=0,
        http=timed_http_protocol(read_timeout_s),
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
