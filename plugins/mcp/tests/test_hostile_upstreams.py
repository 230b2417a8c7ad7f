"""Broken and hostile Streamable-HTTP upstreams: what a caller gets, on both call paths.

A scripted upstream (``toolwire_mcp_testkit.scripted_upstream``) connects properly
(``server/discover``, ``tools/list``: the 2026-07-28 protocol, so the direct path
applies), then answers each ``tools/call`` with exactly the bytes a case needs:
answers to another request, two answers, event streams cut at every byte or with
odd line ends, lying lengths, odd statuses, silence, resets. Every case runs with
``direct_http_calls`` true and false. The promise checked: a typed ``ToolError``
naming the server and the problem (and that the call may have run, where it may
have), never a hang, a wrong result, or a pool slot, connection or task left behind;
the gateway keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import json
import socket
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from toolwire_mcp_testkit import (
    CallScript,
    Server,
    eventually,
    json_answer,
    scripted_upstream,
    serving,
)

from toolwire import Kernel, ToolResult
from toolwire_mcp import MCPConfig, MCPPlugin
from toolwire_mcp._upstream import Upstream

pytestmark = pytest.mark.anyio

PATHS = pytest.mark.parametrize("direct", [True, False], ids=["direct", "fastmcp-client"])


# ------------------------------------------------------------------ answers
def result(rid: Any, text: str = "ok") -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"jsonrpc": "2.0", "id": rid, "result": {"resultType": "complete", "content": content}}


def error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def event(msg: Any, nl: bytes = b"\n") -> bytes:
    """One SSE event carrying ``msg``, its lines ended by ``nl``."""
    return b"event: message" + nl + b"data: " + json.dumps(msg).encode() + nl + nl


def events(*frames: bytes) -> bytes:
    """An HTTP answer: the frames as an event stream of known length."""
    body = b"".join(frames)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


def chunked(*parts: bytes, ctype: bytes = b"text/event-stream", end: bytes = b"0\r\n\r\n") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n" % ctype
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + end


def send(answer: Any, *, keep: bool = True) -> CallScript:
    """A script writing ``answer(rid)`` at once; ``keep`` false then ends the connection."""

    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        w.write(answer(rid))
        await w.drain()
        if not keep:
            w.close()
        return keep

    return script


def reset(w: asyncio.StreamWriter) -> None:
    """End the connection with a TCP reset (RST), not a close."""
    with contextlib.suppress(OSError):  # the client may have gone first
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


def reset_after(answer: Any) -> CallScript:
    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        if data := answer(rid):
            w.write(data)
            await w.drain()
            await asyncio.sleep(0.05)  # the bytes arrive before the reset
        reset(w)
        return False

    return script


def stall_after(answer: Any) -> CallScript:
    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        w.write(answer(rid))
        await w.drain()
        await s.until_client_closes(r)
        return False

    return script


def bytewise(answer: Any) -> CallScript:
    """The answer one byte at a time, each in its own chunk and TCP segment."""

    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        w.write(b"transfer-encoding: chunked\r\n\r\n")
        for byte in answer(rid):
            w.write(b"1\r\n%c\r\n" % byte)
            await w.drain()
            await asyncio.sleep(0.001)
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    return script


def pings_after(answer: Any) -> CallScript:
    """The answer, then keep-alive comments for ever (until the client goes)."""

    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        w.write(chunked(answer(rid), end=b""))
        while True:
            w.write(b"3\r\n:\n\n\r\n")
            await w.drain()
            await asyncio.sleep(0.01)

    return script


def ok(rid: int) -> bytes:
    return json_answer(result(rid))


def short_length(rid: int) -> bytes:
    """A JSON answer whose Content-Length is 5 bytes short of its body."""
    body = json.dumps(result(rid)).encode()
    return JSON_HEAD.replace(b"100", b"%d" % (len(body) - 5)) + body


def encoded(ctype: bytes, coding: bytes, body: bytes, status: bytes = b"200 OK") -> bytes:
    """An HTTP answer whose body is ``body`` as it stands, declared in ``coding``."""
    head = b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-encoding: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (status, ctype, coding, len(body)) + body


def encoded_chunks(ctype: bytes, coding: bytes, *parts: bytes) -> bytes:
    """A chunked HTTP answer in ``coding``, its chunks ``parts`` (each read apart)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-encoding: %s\r\n" % (ctype, coding)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return head + b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def split_at(data: bytes, *cuts: int) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


LOG = json.dumps(
    {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
).encode()
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"


# ------------------------------------------------------------------ the gateway
@asynccontextmanager
async def gateway(
    srv: Server, *, direct: bool, **entry: Any
) -> AsyncIterator[tuple[Kernel, Upstream]]:
    """A kernel with the mcp plugin and the scripted server as ``up``."""
    cfg = {
        "servers": {"up": {"url": f"http://127.0.0.1:{srv.port}/mcp", **entry}},
        "reconnect_initial_s": 0.05,
        "reconnect_max_s": 0.2,
        "direct_http_calls": direct,
    }
    mcp = MCPPlugin(MCPConfig.model_validate(cfg))
    async with Kernel(plugins=[mcp]) as kernel:
        up = mcp._upstreams["up"]
        assert up.status == "up", up.last_error
        assert (up._direct is not None) == direct
        yield kernel, up


async def call(k: Kernel, case: str, within: float = 10.0) -> ToolResult:
    """Call ``probe`` with ``case``; a call that takes longer than ``within`` hangs: a failure."""
    with anyio.fail_after(within):
        return await k.call("up_probe", {"case": case})


async def still_serving(k: Kernel, up: Upstream) -> None:
    """The server answers the next calls (after a reconnect, if the case caused one), and
    the direct path's pool has every slot back, no connection busy, no stream draining."""
    with anyio.fail_after(10):
        while True:
            r = await call(k, "ok")
            if not r.is_error:
                break
            assert r.error is not None and r.error.kind == "unavailable", r.error
            await anyio.sleep(0.05)
    assert r.content == {"result": "ok"}
    caller = up._http
    if caller is not None:
        pool = caller._pool
        await eventually(lambda: not caller._drains and pool._limit._value == 100)
        assert not [c for c in pool._all if c.busy]
        assert len(pool._all) == len(pool._idle)  # the connections left are idle ones


SCRIPTS: dict[str, CallScript] = {"ok": send(ok)}


@dataclass
class Case:
    """A scripted answer and what the caller must get on both paths: a result text
    (``kind`` None), or an error of ``kind`` whose message says ``says``, with ``details``.
    ``lost``: the case is a lost connection (the server is then reconnected)."""

    script: CallScript
    kind: str | None = None
    says: str = "ok"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def lost(self) -> bool:
        return self.details.get("in_flight") is True


#: ``details`` of an answer the client could not read as one (the call may have run).
UNREADABLE = {"invalid_answer": True}
LOST = {"in_flight": True}

CASES: dict[str, Case] = {
    # --- whose answer is it
    "answer-to-another-request": Case(
        send(lambda rid: json_answer(result(rid + 1000))),
        "tool_error",
        "an answer to request id",
        UNREADABLE,
    ),
    "id-echoed-as-a-string": Case(send(lambda rid: json_answer(result(str(rid))))),
    "error-for-no-request": Case(  # id null: JSON-RPC's answer when the id could not be read
        send(lambda rid: json_answer(error(None, -32602, "bad arguments"))),
        "invalid_args",
        "bad arguments",
        {"mcp_code": -32602},
    ),
    "a-notification-instead": Case(
        send(lambda rid: json_answer(LOG)), "tool_error", "not a JSON-RPC response", UNREADABLE
    ),
    "two-answers-in-one-read": Case(
        send(lambda rid: json_answer(result(rid, "first")) + json_answer(result(rid, "second"))),
        says="first",
    ),
    "a-500-then-a-200-in-one-read": Case(
        send(
            lambda rid: (
                b"HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\noops"
                + json_answer(result(rid, "second"))
            )
        ),
        "unavailable",
        "HTTP 500",
        {"status": 500},
    ),
    "result-and-error": Case(
        send(
            lambda rid: json_answer({**result(rid), "error": {"code": -32603, "message": "boom"}})
        ),
        "tool_error",
        "boom (MCP error -32603)",
        {"mcp_code": -32603},
    ),
    "a-server-error-coded-32000": Case(  # JSON-RPC's first "server error" code: an answer
        send(lambda rid: json_answer(error(rid, -32000, "database down"))),
        "tool_error",
        "database down (MCP error -32000)",
        {"mcp_code": -32000},
    ),
    "two-answers-in-one-stream": Case(
        send(lambda rid: events(event(result(rid, "first")), event(result(rid, "second")))),
        says="first",
    ),
    "input-required-for-ever": Case(  # a server that never lets the call complete
        send(
            lambda rid: json_answer(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {"resultType": "input_required", "requestState": "again"},
                }
            )
        ),
        "tool_error",
        "input_required for more than 10 rounds; the call did not complete",
        {"input_required_rounds": 10},
    ),
    # --- event streams
    "events-cut-at-every-byte": Case(bytewise(lambda rid: event(result(rid)))),
    "events-with-a-bom-cut-at-every-byte": Case(
        bytewise(lambda rid: b"\xef\xbb\xbf" + event(result(rid)))
    ),
    "events-with-cr-line-ends": Case(send(lambda rid: events(event(result(rid), b"\r")))),
    "events-with-crlf-line-ends": Case(send(lambda rid: events(event(result(rid), b"\r\n")))),
    "an-event-without-data": Case(
        send(lambda rid: events(b"event: message\n\n", event(result(rid))))
    ),
    "an-event-of-unknown-type-first": Case(
        send(lambda rid: events(b"event: surprise\ndata: {}\n\n", event(result(rid))))
    ),
    "retry-and-id-fields": Case(
        send(lambda rid: events(b"id: 7\nretry: 10\n: ping\n" + event(result(rid))))
    ),
    "garbage-in-an-event": Case(
        send(lambda rid: events(b"data: {not json\n\n")),
        "tool_error",
        "Failed to parse SSE message",
        UNREADABLE,
    ),
    "endless-pings-after-the-answer": Case(pings_after(lambda rid: event(result(rid)))),
    "the-answer-in-an-event-of-unknown-type": Case(
        send(lambda rid: events(b"event: surprise\ndata: " + json.dumps(result(rid)).encode())),
        "unavailable",
        "SSE stream ended without a response",
        LOST,
    ),
    # --- lengths and framing
    "content-length-too-short": Case(
        send(short_length),
        "tool_error",
        "Failed to parse JSON response",
        UNREADABLE,
    ),
    "chunked-with-trailers": Case(
        send(
            lambda rid: chunked(
                json.dumps(result(rid)).encode(),
                ctype=b"application/json",
                end=b"0\r\nx-checksum: 1\r\n\r\n",
            )
        )
    ),
    "chunked-with-a-bad-size": Case(
        send(lambda rid: chunked(ctype=b"application/json", end=b"zz\r\nabc\r\n0\r\n\r\n")),
        "unavailable",
        "the connection was lost during the call",
        LOST,
    ),
    # --- statuses
    "200-with-html": Case(
        send(
            lambda rid: (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 4\r\n\r\n<p/>"
            )
        ),
        "tool_error",
        "Unexpected content type: text/html",
        UNREADABLE,
    ),
    "202": Case(
        send(lambda rid: b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"),
        "tool_error",
        "server answered a request with 202 Accepted",
        UNREADABLE,
    ),
    "204": Case(
        send(lambda rid: b"HTTP/1.1 204 No Content\r\n\r\n"),
        "tool_error",
        "Unexpected content type",
        UNREADABLE,
    ),
    "101": Case(
        send(
            lambda rid: (
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                b"connection: upgrade\r\n\r\n"
            ),
            keep=False,
        ),
        "unavailable",
        "the connection was lost during the call",
        LOST,
    ),
    "500-with-a-huge-body": Case(
        send(
            lambda rid: b"HTTP/1.1 500 Oops\r\ncontent-length: 5000000\r\n\r\n" + b"x" * 5_000_000
        ),
        "unavailable",
        "HTTP 500",
        {"status": 500},
    ),
    # --- compressed bodies that cannot be read: an answer came (the call may have run),
    # unreadable; no reason to reconnect (before, on the direct path, a lost connection)
    "json-in-an-unknown-encoding": Case(
        send(lambda rid: encoded(b"application/json", b"br", json.dumps(result(rid)).encode())),
        "tool_error",
        "Content-Encoding 'br'",
        UNREADABLE,
    ),
    "json-in-corrupt-gzip": Case(
        send(
            lambda rid: encoded(b"application/json", b"gzip", b"\x1f\x8b\x08\x00" + b"garbage" * 4)
        ),
        "tool_error",
        "bad gzip body",
        UNREADABLE,
    ),
    "json-in-gzip-cut-short": Case(  # the deflate data whole, the gzip trailer cut
        send(
            lambda rid: encoded(
                b"application/json", b"gzip", gzip.compress(json.dumps(result(rid)).encode())[:-6]
            )
        ),
        "tool_error",
        "the gzip body ends before its compressed stream",
        UNREADABLE,
    ),
    # --- compressed bodies as servers send them (before, both paths failed these)
    "json-in-raw-deflate-a-byte-first": Case(  # raw deflate told from zlib by two bytes
        send(
            lambda rid: encoded_chunks(
                b"application/json",
                b"deflate",
                *split_at(raw_deflate(json.dumps(result(rid)).encode()), 1),
            )
        )
    ),
    "events-in-raw-deflate-a-byte-first": Case(
        send(
            lambda rid: encoded_chunks(
                b"text/event-stream", b"deflate", *split_at(raw_deflate(event(result(rid))), 1)
            )
        )
    ),
    "json-in-two-gzip-members": Case(  # as `cat a.gz b.gz` makes, read whole as gzip -d
        send(
            lambda rid: encoded(
                b"application/json",
                b"gzip",
                b"".join(map(gzip.compress, split_at(json.dumps(result(rid)).encode(), 20))),
            )
        )
    ),
    "events-in-gzip-members": Case(  # a compressor that ends a member per event
        send(
            lambda rid: encoded_chunks(
                b"text/event-stream",
                b"gzip",
                gzip.compress(b": ping\n\n"),
                gzip.compress(event(result(rid))),
            )
        )
    ),
    "events-in-an-unknown-encoding": Case(
        send(lambda rid: encoded(b"text/event-stream", b"br", event(result(rid)))),
        "tool_error",
        "Content-Encoding 'br'",
        UNREADABLE,
    ),
    "events-in-corrupt-gzip": Case(
        send(
            lambda rid: encoded(b"text/event-stream", b"gzip", b"\x1f\x8b\x08\x00" + b"garbage" * 4)
        ),
        "tool_error",
        "bad gzip body",
        UNREADABLE,
    ),
    "a-500-in-an-unknown-encoding": Case(  # the status speaks
        send(lambda rid: encoded(b"application/json", b"br", b"oops", b"500 Oops")),
        "unavailable",
        "HTTP 500",
        {"status": 500},
    ),
    # --- resets and closes at each stage
    "reset-before-the-answer": Case(
        reset_after(lambda rid: b""), "unavailable", "the outcome is unknown", LOST
    ),
    "closed-mid-head": Case(
        send(lambda rid: b"HTTP/1.1 200 OK\r\ncontent-ty", keep=False),
        "unavailable",
        "the outcome is unknown",
        LOST,
    ),
    "reset-after-the-head": Case(
        reset_after(lambda rid: JSON_HEAD), "unavailable", "the outcome is unknown", LOST
    ),
    "reset-mid-body": Case(
        reset_after(lambda rid: JSON_HEAD + b'{"jsonrpc"'),
        "unavailable",
        "the outcome is unknown",
        LOST,
    ),
    "reset-mid-stream": Case(
        reset_after(lambda rid: SSE_HEAD + b": ping\n\n"),
        "unavailable",
        "the outcome is unknown",
        LOST,
    ),
    "closed-mid-stream": Case(
        send(lambda rid: SSE_HEAD + b": ping\n\n", keep=False),
        "unavailable",
        "SSE stream ended without a response",
        LOST,
    ),
}
SCRIPTS.update({name: case.script for name, case in CASES.items()})


@PATHS
@pytest.mark.parametrize("name", list(CASES))
async def test_each_broken_answer(name: str, direct: bool) -> None:
    case = CASES[name]
    async with serving(scripted_upstream(SCRIPTS)) as srv, gateway(srv, direct=direct) as (k, up):
        session = up._client
        r = await call(k, name)
        if case.kind is None:
            assert r.error is None, r.error
            assert r.content == {"result": case.says}
        else:
            assert r.error is not None, r.content
            assert (r.error.kind, r.error.source) == (case.kind, "mcp:up"), r.error
            assert r.error.message.startswith("MCP server 'up'"), r.error.message
            assert case.says in r.error.message, r.error.message
            assert r.error.details["server"] == "up" and r.error.details["remote_tool"] == "probe"
            assert case.details.items() <= r.error.details.items(), r.error.details
            if case.details.get("invalid_answer"):
                assert "The call may have taken effect upstream" in r.error.message
        if case.lost and direct:
            # The direct path's broken connection was one of its pool's, not the FastMCP
            # client's: the supervisor checks the server (it answers) and keeps the session.
            await eventually(lambda: up.health_checks == 1)
        if not case.lost or direct:  # an answer, however wrong, is no reason to reconnect
            assert up._client is session and up.status == "up"
        await still_serving(k, up)
        assert (up.direct_calls > 0) == direct  # the path under test was taken


#: Lost-connection cases the FastMCP client resolves as its one request's failure ("SSE
#: stream ended without a response"), its session going on.
STREAM_CUTS = ["the-answer-in-an-event-of-unknown-type", "closed-mid-stream", "reset-mid-stream"]


@pytest.mark.parametrize(
    ("name", "direct"),
    [(name, True) for name, case in CASES.items() if case.lost]
    + [(name, False) for name in STREAM_CUTS],
)
async def test_a_broken_answer_fails_only_its_own_call(name: str, direct: bool) -> None:
    """Direct path: an answer that breaks its connection (a reset, a close mid-stream, bytes
    that are no HTTP, an event stream ending without the response) fails that call alone;
    on the FastMCP client's path, so does an event stream ending without the response
    (its transport fails that one request; the session goes on). Before, the supervisor
    took either for a dead server: it dropped the FastMCP session and reconnected, and
    the calls made meanwhile answered ``unavailable`` ("is not connected") though the
    server answered them all along."""
    async with serving(scripted_upstream(SCRIPTS)) as srv, gateway(srv, direct=direct) as (k, up):
        session = up._client
        broken = await call(k, name)
        assert broken.error is not None and broken.error.kind == "unavailable", broken.error
        assert broken.error.details["in_flight"] is True  # the outcome is unknown
        for _ in range(3):  # the next calls, at once: served, no retry needed
            r = await call(k, "ok")
            assert r.content == {"result": "ok"}, r.error
        await eventually(lambda: up.health_checks == 1)  # the server was checked, once
        assert up._client is session and up.status == "up"
        r = await call(k, "ok")
        assert r.content == {"result": "ok"}, r.error
        caller = up._http
        assert caller is None or not [c for c in caller._pool._all if c.busy]


async def test_a_broken_direct_answer_leaves_the_fastmcp_clients_calls_alone() -> None:
    """A call still running on the FastMCP client (a tool whose ``x-mcp-header`` arguments
    keep it there) while a direct-path call loses its connection: it gets its answer.
    Before, the lost direct-path connection ended the FastMCP session, and that call
    with it ("the connection was lost during the call")."""

    async def slow(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        await asyncio.sleep(1.0)
        w.write(ok(rid))
        await w.drain()
        return True

    async with (
        serving(scripted_upstream({**SCRIPTS, "slow": slow})) as srv,
        gateway(srv, direct=True) as (k, up),
    ):
        up._param_header_tools = frozenset({"probe"})  # the next call: the FastMCP client's
        results: dict[str, ToolResult] = {}

        async def run(key: str, case: str) -> None:
            results[key] = await call(k, case)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "slow", "slow")
            await eventually(lambda: sum(b'"slow"' in q for q in srv.requests) == 1)
            up._param_header_tools = frozenset()  # and this one the direct path's
            tg.start_soon(run, "broken", "reset-mid-body")
        broken = results["broken"]
        assert broken.error is not None and broken.error.kind == "unavailable", broken.error
        assert results["slow"].content == {"result": "ok"}, results["slow"].error
        assert up.direct_calls == 1
        await still_serving(k, up)


async def test_a_byte_order_mark_split_across_reads_opens_the_stream() -> None:
    """Direct path: a BOM arriving a byte at a time is still the BOM, and the ``data:`` line
    after it is read (before, only a BOM whole in the first read was; the line after a split
    one was an unknown field, the answer lost: "SSE stream ended without a response").
    (The FastMCP client reads a BOM as part of the first line in any case.)"""
    scripts = {
        **SCRIPTS,
        "bom": bytewise(
            lambda rid: b"\xef\xbb\xbfdata: " + json.dumps(result(rid)).encode() + b"\n\n"
        ),
    }
    async with serving(scripted_upstream(scripts)) as srv, gateway(srv, direct=True) as (k, up):
        r = await call(k, "bom")
        assert r.content == {"result": "ok"}, r.error
        await still_serving(k, up)


@PATHS
async def test_endless_empty_data_lines_are_capped(direct: bool) -> None:
    """An event of nothing but ``data:`` lines: each adds a line break to the event (and
    an entry the reader keeps), so they count toward max_answer_bytes. Before, the direct
    path counted them as 0 bytes: a server could grow the gateway's memory without end."""
    lines = b"data:\n" * 200_000  # 1.2 MB on the wire, a 200,000-line event

    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        w.write(chunked(lines, lines, end=b""))
        await w.drain()
        await s.until_client_closes(r)
        return False

    scripts = {**SCRIPTS, "empty-lines": script}
    async with (
        serving(scripted_upstream(scripts)) as srv,
        gateway(srv, direct=direct, max_answer_bytes=65536) as (k, up),
    ):
        r = await call(k, "empty-lines")
        assert r.error is not None and r.error.kind == "tool_error", r.error
        assert r.error.details["answer_too_large"] is True, r.error
        await still_serving(k, up)


def padded_deflate(data: bytes, blocks: int) -> bytes:
    """``data`` zlib-compressed, with ``blocks`` empty stored blocks (5 bytes each, expanding
    to nothing) before its last block: a valid body, as long as sent as the caller likes."""
    packer = zlib.compressobj()
    head = packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH)
    return head + b"\x00\x00\x00\xff\xff" * blocks + packer.flush()


@PATHS
async def test_a_json_answer_counts_as_sent_too(direct: bool) -> None:
    """Compressed data may expand to nothing: a JSON answer of a few bytes padded with empty
    deflate blocks was read for as long as the server sent them (no cap counted them; the
    read timeout never fired). A body longer as sent than max_answer_bytes is over it, as
    on the a2a and search plugins."""
    assert zlib.decompress(padded_deflate(b"[1]", 3)) == b"[1]"

    def script(rid: Any) -> bytes:
        body = padded_deflate(json.dumps(result(rid)).encode(), 100_000)  # 500 kB as sent
        return encoded_chunks(b"application/json", b"deflate", *split_at(body, 1000, 300_000))

    async with (
        serving(scripted_upstream({**SCRIPTS, "padded": send(script)})) as srv,
        gateway(srv, direct=direct, max_answer_bytes=65536) as (k, up),
    ):
        session = up._client
        r = await call(k, "padded")
        assert r.error is not None and r.error.kind == "tool_error", r.content
        assert r.error.details["answer_too_large"] is True, r.error
        assert up._client is session and up.status == "up"
        await still_serving(k, up)


@PATHS
@pytest.mark.parametrize("coding", ["identity", "gzip", "deflate"])
async def test_a_compressed_stream_of_small_events_is_read_whole(direct: bool, coding: str) -> None:
    """300 kB of small notifications, then the answer, compressed together (one flush, as a
    compressor buffering them sends them) under a 64 KiB max_answer_bytes, which caps one
    event: the call succeeds, as it does sent plain. Before, on both paths, what one read
    decompressed to was held to the cap: answer_too_large, though no event came near it."""
    frames = b"event: message\ndata: " + LOG + b"\n\n"

    def script(rid: Any) -> bytes:
        body = frames * 3000 + event(result(rid))
        if coding != "identity":
            body = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
        return encoded_chunks(b"text/event-stream", coding.encode(), body)

    async with (
        serving(scripted_upstream({**SCRIPTS, "many": send(script)})) as srv,
        gateway(srv, direct=direct, max_answer_bytes=65536) as (k, up),
    ):
        r = await call(k, "many")
        assert r.error is None and r.content == {"result": "ok"}, r.error
        await still_serving(k, up)


@PATHS
async def test_a_compressed_event_over_max_answer_bytes_is_too_large(direct: bool) -> None:
    """A gzip event stream whose one event expands to 100 MB (from 100 kB): too large,
    expanded no further than the cap and a step, on both paths."""
    bomb = gzip.compress(b"data: " + b"x" * 100_000_000, compresslevel=9)

    async with (
        serving(
            scripted_upstream(
                {**SCRIPTS, "bomb": send(lambda rid: encoded(b"text/event-stream", b"gzip", bomb))}
            )
        ) as srv,
        gateway(srv, direct=direct, max_answer_bytes=65536) as (k, up),
    ):
        session = up._client
        r = await call(k, "bomb")
        assert r.error is not None and r.error.kind == "tool_error", r.content
        assert r.error.details["answer_too_large"] is True, r.error
        assert up._client is session and up.status == "up"
        await still_serving(k, up)


@PATHS
@pytest.mark.parametrize("where", ["the-answer", "a-notification"])
async def test_an_event_over_max_answer_bytes_arriving_whole_is_too_large(
    direct: bool, where: str
) -> None:
    """An event over max_answer_bytes fails the call however its bytes arrive. Before, the
    direct path checked the cap only against what was left unparsed after each read: an
    event that came whole in one read (70 kB, a 64 KiB cap) was taken, the answer a
    success where the FastMCP client's path said it was too large."""
    big = event(result(0, "x" * 70_000)) if where == "a-notification" else b""

    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        answer = event(result(rid, "x" * 70_000)) if not big else big + event(result(rid))
        w.write(events(answer))
        await w.drain()
        return True

    async with (
        serving(scripted_upstream({**SCRIPTS, "big-event": script})) as srv,
        gateway(srv, direct=direct, max_answer_bytes=65536) as (k, up),
    ):
        session = up._client
        r = await call(k, "big-event")
        assert r.error is not None and r.error.kind == "tool_error", r.content
        assert r.error.details["answer_too_large"] is True, r.error
        assert up._client is session and up.status == "up"
        await still_serving(k, up)


@PATHS
async def test_an_error_page_over_max_answer_bytes_is_told_by_its_status(direct: bool) -> None:
    """A 500 with a JSON body over max_answer_bytes: the FastMCP client drops the body and
    maps the status; the direct path now does the same (before: answer_too_large, with its
    "the call may have taken effect upstream", for what is a plain server error)."""
    page = json.dumps({"error": "x" * 5000}).encode()
    scripts = {**SCRIPTS, "500": send(lambda rid: json_answer(page, status="500 Oops"))}
    async with (
        serving(scripted_upstream(scripts)) as srv,
        gateway(srv, direct=direct, max_answer_bytes=1024) as (k, up),
    ):
        r = await call(k, "500")
        assert r.error is not None and r.error.kind == "unavailable", r.error
        assert r.error.details["status"] == 500 and "answer_too_large" not in r.error.details
        await still_serving(k, up)


SILENT: dict[str, CallScript] = {
    "silent": stall_after(lambda rid: b""),
    "silent-after-the-head": stall_after(lambda rid: JSON_HEAD),
    "silent-mid-body": stall_after(lambda rid: JSON_HEAD + b'{"jsonrpc"'),
    "silent-mid-stream": stall_after(lambda rid: SSE_HEAD + b": ping\n\n"),
}


@PATHS
async def test_silence_at_each_stage_ends_at_the_entry_timeout(direct: bool) -> None:
    """A server that takes the call and then says nothing (more): the entry's ``timeout``
    ends the call, naming the setting; the connection is dropped, the server stays up."""
    async with (
        serving(scripted_upstream({**SCRIPTS, **SILENT})) as srv,
        gateway(srv, direct=direct, timeout=300) as (k, up),
    ):
        for name in SILENT:
            r = await call(k, name)
            assert r.error is not None and r.error.kind == "timeout", (name, r.error)
            assert "`timeout` = 300 ms of [plugins.mcp.servers.up]" in r.error.message, name
            assert up.status == "up"
            await still_serving(k, up)


@PATHS
async def test_redirect_loops_end_at_once(direct: bool) -> None:
    """A POST answered with a redirect to itself: not followed (the direct path hands the
    call to the FastMCP client, which does not follow it either), nothing loops."""
    loops = {
        "301": send(
            lambda rid: b"HTTP/1.1 301 Moved\r\nlocation: /mcp\r\ncontent-length: 0\r\n\r\n"
        ),
        "307": send(
            lambda rid: b"HTTP/1.1 307 Moved\r\nlocation: /mcp\r\ncontent-length: 0\r\n\r\n"
        ),
    }
    async with (
        serving(scripted_upstream({**SCRIPTS, **loops})) as srv,
        gateway(srv, direct=direct) as (k, up),
    ):
        for name in loops:
            before = sum(b"tools/call" in q for q in srv.requests)
            r = await call(k, name)
            assert r.error is not None and r.error.kind == "tool_error", r.error
            assert "not followed" in r.error.message, r.error
            if name == "301":  # sent once: not handed on (a 307 is: it asks to be sent again)
                assert sum(b"tools/call" in q for q in srv.requests) - before == 1
            await still_serving(k, up)


@PATHS
async def test_a_303_is_not_sent_again(direct: bool) -> None:
    """A 303 See Other answers a POST that was processed: the call must not go to the
    server twice. Before, the direct path sent it again through the FastMCP client (as it
    does for a 307/308, which asks for that)."""
    see_other = send(
        lambda rid: b"HTTP/1.1 303 See Other\r\nlocation: /mcp/done\r\ncontent-length: 0\r\n\r\n"
    )
    async with (
        serving(scripted_upstream({**SCRIPTS, "303": see_other})) as srv,
        gateway(srv, direct=direct) as (k, up),
    ):
        before = sum(b"tools/call" in q for q in srv.requests)
        r = await call(k, "303")
        assert sum(b"tools/call" in q for q in srv.requests) - before == 1
        assert r.error is not None and r.error.kind == "tool_error", r.error
        assert f"Redirect to http://127.0.0.1:{srv.port}/mcp/done not followed" in r.error.message
        await still_serving(k, up)


def gzip_then(junk: int) -> CallScript:
    """A gzip JSON answer, then ``junk`` bytes more in the same body."""

    async def script(rid: int, r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> bool:
        packed = gzip.compress(json.dumps(result(rid)).encode())
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        w.write(head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(packed), packed))
        part = b"\0" * 65536
        try:
            for _ in range(junk // len(part)):
                w.write(b"%x\r\n%s\r\n" % (len(part), part))
                await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()
        except ConnectionError:
            return False
        return True

    return script


@PATHS
async def test_bytes_after_a_compressed_answer_fail_it(direct: bool) -> None:
    """zlib keeps what follows the end of a compressed stream in ``unused_data``, which
    nothing counted: 4 MiB of junk after a small gzip answer passed a 64 KiB cap, held in
    memory, and the call succeeded. Such a body is now no valid answer."""
    async with (
        serving(scripted_upstream({**SCRIPTS, "junk": gzip_then(4 * 1024 * 1024)})) as srv,
        gateway(
            srv, direct=direct, max_answer_bytes=65536, headers={"Accept-Encoding": "gzip"}
        ) as (k, up),
    ):
        session = up._client
        r = await call(k, "junk")
        assert r.error is not None, r.content
        assert "goes on after its compressed stream ends" in r.error.message, r.error
        # an answer came, unreadable: the call's own failure (before, on the direct path,
        # a lost connection: `unavailable`, and the session dropped)
        assert r.error.kind == "tool_error" and r.error.details["invalid_answer"], r.error
        assert up._client is session and up.status == "up"
        await still_serving(k, up)


async def test_a_call_never_sent_within_timeout_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry's ``timeout`` also runs while a call waits for a connection. One that
    never got one was reported as a slow tool ("raise it if the tool needs longer");
    it now says it was not sent (``in_flight: false``). Here the 100 connections are
    held by answered event streams being read to their end (for 5 s; the 100 calls have
    the 1 s `timeout` to be answered, ample on a busy machine)."""
    monkeypatch.setattr("toolwire_mcp._direct._DRAIN_S", 5.0)
    async with (
        serving(scripted_upstream({**SCRIPTS})) as srv,
        gateway(srv, direct=True, timeout=1000) as (k, up),
    ):
        caller = up._http
        assert caller is not None
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(call, k, "endless-pings-after-the-answer")
        await eventually(lambda: caller._pool._limit._value == 0)  # 100 drains hold them
        sent = sum(b"tools/call" in q for q in srv.requests)
        r = await call(k, "ok")
        assert sum(b"tools/call" in q for q in srv.requests) == sent  # not sent
        assert r.error is not None and r.error.kind == "timeout", r.error
        assert r.error.details["in_flight"] is False
        assert "within the entry's `timeout` (1000 ms); the request was not sent" in (
            r.error.message
        )
        assert "set `timeout`" not in r.error.message  # it is set
        await eventually(lambda: caller._pool._limit._value == 100)  # the drains give up
        await still_serving(k, up)


async def test_a_server_silent_past_the_read_limit_is_a_timeout_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Direct path, no ``timeout``: an answer that stops coming ends after the read limit
    (300 s without a byte). Before, the caller got a bare "timed out". (The FastMCP client
    reports it as a lost connection: its HTTP stack's read timeout ends the session.)"""
    monkeypatch.setattr("toolwire_mcp._direct._READ_S", 0.3)
    async with (
        serving(scripted_upstream({**SCRIPTS, **SILENT})) as srv,
        gateway(srv, direct=True) as (k, up),
    ):
        r = await call(k, "silent-mid-stream")
        assert r.error is not None and r.error.kind == "timeout", r.error
        assert "no answer from the server for 0.3 s; the outcome is unknown" in r.error.message
        assert "longer `timeout` of [plugins.mcp.servers.up]" in r.error.message
        await still_serving(k, up)


async def test_calls_waiting_for_a_connection_end_unsent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that takes 100 calls and answers none: the pool's 100 connections stay
    busy; the next call waits for one (60 s, 0.3 here), then fails saying it was not sent.
    Once the hung calls end, every slot and connection is free again."""
    monkeypatch.setattr("toolwire_mcp._direct._POOL_WAIT_S", 0.3)
    async with (
        serving(scripted_upstream({**SCRIPTS, **SILENT})) as srv,
        gateway(srv, direct=True) as (k, up),
    ):
        caller = up._http
        assert caller is not None
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(k.call, "up_probe", {"case": "silent"})
            await eventually(lambda: caller._pool._limit._value == 0)
            r = await call(k, "silent")
            tg.cancel_scope.cancel()  # the hung calls' callers give up
        assert r.error is not None and r.error.kind == "timeout", r.error
        assert r.error.details["in_flight"] is False
        assert "all 100 connections to the server stayed busy for 0.3 s" in r.error.message
        assert "the request was not sent" in r.error.message
        assert "set `timeout` of [plugins.mcp.servers.up]" in r.error.message
        assert sum(b"tools/call" in q for q in srv.requests) == 100
        await eventually(lambda: caller._pool._limit._value == 100 and not caller._pool._all)
        await still_serving(k, up)


def client_tasks() -> set[asyncio.Task[Any]]:
    """The loop's tasks but the scripted servers' own (one per connection they hold)."""
    return {t for t in asyncio.all_tasks() if "Server._serve" not in repr(t.get_coro())}


#: The cases mixed in the storm below, and the successes each may bring.
STORM = {
    "ok": "ok",
    "answer-to-another-request": None,
    "two-answers-in-one-read": "first",
    "a-500-then-a-200-in-one-read": None,
    "reset-mid-body": None,
    "closed-mid-stream": None,
    "silent": None,
    "endless-pings-after-the-answer": "ok",
    "200-with-html": None,
    "events-cut-at-every-byte": "ok",
    "content-length-too-short": None,
    "a-server-error-coded-32000": None,
}


@PATHS
async def test_many_calls_while_the_server_misbehaves(direct: bool) -> None:
    """60 concurrent calls, each answered by one of the cases above, some abandoned by their
    callers: every call ends (at the entry's timeout at the latest) with its own success
    or a typed error, never another call's answer; afterwards no pool slot is taken, no
    connection busy, no task left behind, and the server is served as before."""
    async with (
        serving(scripted_upstream({**SCRIPTS, **SILENT})) as srv,
        gateway(srv, direct=direct, timeout=500) as (k, up),
    ):
        await still_serving(k, up)
        before = len(client_tasks())
        names = [name for _ in range(5) for name in STORM]
        got: dict[int, ToolResult | None] = {}

        async def one(i: int, name: str) -> None:
            got[i] = None
            with anyio.move_on_after(0.1 if i % 7 == 0 else 10):  # some callers give up
                got[i] = await k.call("up_probe", {"case": name})

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i, name in enumerate(names):
                    tg.start_soon(one, i, name)
        for i, name in enumerate(names):
            r = got[i]
            if r is None:
                assert i % 7 == 0, name  # only an abandoned call has no result
            elif r.error is None:
                assert r.content == {"result": STORM[name]}, (name, r.content)
            else:
                assert r.error.source == "mcp:up" and r.error.details["server"] == "up", r.error
                # a case that succeeds alone may end at the entry's timeout when the machine
                # is busy (an answer sent a byte per millisecond); on the FastMCP client's
                # path also answer `unavailable` while the session another case's lost
                # connection ended is reconnected. The direct path's lost connections are
                # its pool's own: they fail no other call (before, they ended the session too)
                allowed = ("timeout",) if direct else ("unavailable", "timeout")
                assert STORM[name] is None or r.error.kind in allowed, (name, r.error)
        await still_serving(k, up)
        # the calls' tasks (the FastMCP client's one per POST, the drains) are gone
        await eventually(lambda: len(client_tasks()) <= before)
        if direct:
            assert up.direct_calls >= len(names)


@asynccontextmanager
async def pings_unanswered(pinged: asyncio.Event) -> AsyncIterator[Server]:
    """The scripted server (``reset``: a call whose connection is reset mid-answer), but a
    ``ping`` is never answered: a server that is gone, as the server check sees it."""
    async with serving(
        scripted_upstream(SCRIPTS | {"reset": CASES["reset-mid-body"].script})
    ) as srv:
        read = srv.read_request

        async def read_request(reader: asyncio.StreamReader) -> bytes | None:
            body = await read(reader)
            if body is not None and json.loads(body).get("method") == "ping":
                pinged.set()
                await asyncio.sleep(3600)
            return body

        srv.read_request = read_request  # type: ignore[method-assign]
        yield srv


async def test_closing_during_a_server_check_ends_it_at_once() -> None:
    """The kernel closes while the supervisor checks the server after a lost call (a
    `ping` the server does not answer, connect_timeout_s = 30): the check ends with the
    plugin. Before, the supervisor sat in the ping: `stop` gave up waiting after 5 s and
    cancelled its task, so closing the kernel took that long."""
    pinged = asyncio.Event()
    async with pings_unanswered(pinged) as srv:
        cfg = {
            "servers": {"up": {"url": f"http://127.0.0.1:{srv.port}/mcp"}},
            "connect_timeout_s": 30,
        }
        mcp = MCPPlugin(MCPConfig.model_validate(cfg))
        async with Kernel(plugins=[mcp]) as k:
            up = mcp._upstreams["up"]
            assert up._direct is not None
            broken = await call(k, "reset")
            assert broken.error is not None and broken.error.kind == "unavailable", broken.error
            with anyio.fail_after(10):
                await pinged.wait()
            task = up._task
        assert task is not None and task.done()
        assert not task.cancelled()  # it ended on its own, not cancelled after stop's 5 s
        assert up.health_checks == 1


async def test_a_server_check_the_entrys_timeout_ends_is_no_answer() -> None:
    """The server check's `ping` goes unanswered until the entry's `timeout` (shorter than
    connect_timeout_s) ends it: the server did not answer, and it is reconnected. Before,
    the FastMCP client's "Request 'ping' timed out" (an MCP error) was taken for an answer:
    the session was kept, and a server gone silent was never found out."""
    pinged = asyncio.Event()
    async with pings_unanswered(pinged) as srv:
        cfg = {
            "servers": {"up": {"url": f"http://127.0.0.1:{srv.port}/mcp", "timeout": 300}},
            "connect_timeout_s": 30,
            "reconnect_initial_s": 0.05,
        }
        mcp = MCPPlugin(MCPConfig.model_validate(cfg))
        async with Kernel(plugins=[mcp]) as k:
            up = mcp._upstreams["up"]
            session = up._client
            assert up._direct is not None
            broken = await call(k, "reset")
            assert broken.error is not None and broken.error.kind == "unavailable", broken.error
            await eventually(lambda: up.health_checks == 1)
            # a new session (the scripted server answers initialize and tools/list)
            await eventually(lambda: up._client is not None and up._client is not session)
            await still_serving(k, up)
