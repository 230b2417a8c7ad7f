"""The direct path's HTTP client (``_wire.Pool``) against real TCP servers that misbehave on cue.

Each test starts an asyncio server on 127.0.0.1 whose handler writes exactly
the bytes the case needs (a chunked body, a 100 Continue, a connection cut in
the middle of an answer...), and runs on asyncio's loop and on uvloop, the
loop ``toolwire serve`` runs on by default.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import struct
import zlib
from typing import Any

import pytest
import trustme
from toolwire_mcp_testkit import Server, direct_caller, serving

from toolwire_mcp._wire import (
    ConnectError,
    Disconnected,
    Pool,
    ProtocolError,
    TooLarge,
    WireError,
)

pytestmark = pytest.mark.anyio

BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body


async def json_echo(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
    """Keep-alive: each request's body comes back as the JSON answer."""
    while (body := await s.read_request(r)) is not None:
        w.write(answer(body, "content-type: application/json"))
        await w.drain()


def pool_for(srv: Server, **kw: Any) -> Pool:
    return Pool(f"http://127.0.0.1:{srv.port}/mcp?x=1", {"content-type": "application/json"}, **kw)


async def post(pool: Pool, body: bytes = b"{}") -> tuple[int, dict[str, str], bytes]:
    resp = await pool.post(body, Pool.header_block({"mcp-name": "echo"}))
    try:
        data = await resp.read()
    except BaseException:
        resp.close()
        raise
    resp.release()
    return resp.status, resp.headers, data


async def test_a_configured_host_header_replaces_the_urls() -> None:
    """An entry's ``headers`` may name the virtual host of a server reached by address.
    Before: the request carried the URL's Host line and the configured one, and an
    HTTP/1.1 server must refuse two (h11, the parser of uvicorn --http h11, and nginx
    answer 400): every direct call failed while the FastMCP client's requests worked."""
    import h11

    async def strict(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        while (body := await s.read_request(r)) is not None:
            parser = h11.Connection(h11.SERVER)
            parser.receive_data(s.requests[-1])
            try:
                parser.next_event()
            except h11.RemoteProtocolError as exc:
                w.write(answer(str(exc).encode(), status="400 Bad Request"))
            else:
                w.write(answer(body, "content-type: application/json"))
            await w.drain()

    async with serving(strict) as srv:
        pool = Pool(f"http://127.0.0.1:{srv.port}/mcp", {"Host": "mcp.internal"})
        status, _, data = await post(pool)
        await pool.close()
    assert (status, data) == (200, b"{}"), data
    head = srv.requests[0].split(b"\r\n\r\n")[0].lower()
    assert head.count(b"\r\nhost:") == 1 and b"\r\nhost: mcp.internal" in head


async def test_requests_share_one_keep_alive_connection() -> None:
    async with serving(json_echo) as srv:
        pool = pool_for(srv)
        for i in range(5):
            status, headers, data = await post(pool, b'{"n":%d}' % i)
            assert (status, data) == (200, b'{"n":%d}' % i)
            assert headers["content-type"] == "application/json"
        await pool.close()
    assert srv.connections == 1 and len(srv.requests) == 5
    head = srv.requests[0].split(b"\r\n")
    assert head[0] == b"POST /mcp?x=1 HTTP/1.1"
    assert f"host: 127.0.0.1:{srv.port}".encode() in head
    assert b"mcp-name: echo" in head and b"content-length: 7" in head
    assert b"content-type: application/json" in head


async def test_chunked_gzip_and_a_100_continue_first() -> None:
    payload = b'{"result": "' + b"x" * 5000 + b'"}'
    packed = gzip.compress(payload)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(0, len(packed), 100):  # many small chunks, in separate writes
            part = packed[i : i + 100]
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await json_echo(r, w, s)  # and the connection stays usable

    async with serving(handler) as srv:
        pool = pool_for(srv)
        assert await post(pool) == (
            200,
            {"content-encoding": "gzip", "transfer-encoding": "chunked"},
            payload,
        )
        assert (await post(pool, b"[2]"))[2] == b"[2]"
        await pool.close()
    assert srv.connections == 1


async def test_a_deflate_body_and_repeated_headers() -> None:
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # "deflate" as some servers send it
    raw_deflate = raw.compress(b"[2]") + raw.flush()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(zlib.compress(b"[1]"), "content-encoding: deflate", "x-a: 1", "x-a: 2"))
        await s.read_request(r)
        w.write(answer(raw_deflate, "content-encoding: deflate"))
        await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv)
        _, headers, data = await post(pool)
        assert data == b"[1]" and headers["x-a"] == "1, 2"
        assert (await post(pool))[2] == b"[2]"
        await pool.close()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_an_empty_body_in_a_coding_is_empty_and_the_connection_kept(coding: str) -> None:
    """A 202 or 204 declaring a coding has no compressed stream at all: an empty body, not
    a truncated one. Before: ``UndecodableBody`` ("ends before its compressed stream")."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(b"", f"content-encoding: {coding}", status="202 Accepted"))
        await s.read_request(r)
        w.write(b"HTTP/1.1 204 No Content\r\ncontent-encoding: %s\r\n\r\n" % coding.encode())
        await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv)
        assert (await post(pool))[::2] == (202, b"")
        assert (await post(pool))[::2] == (204, b"")
        await pool.close()
    assert srv.connections == 1


async def test_a_body_that_ends_with_the_connection_is_read_whole_and_not_reused() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await w.drain()
        w.close()

    async with serving(handler) as srv:
        pool = pool_for(srv)
        assert (await post(pool))[2] == b"all of it"
        assert (await post(pool))[2] == b"all of it"
        await pool.close()
    assert srv.connections == 2


@pytest.mark.parametrize(
    ("script", "error", "text"),
    [
        (b"", Disconnected, "closed the connection before its answer"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", Disconnected, "in the middle of"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", ProtocolError, "not a valid HTTP/1.1 response"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: 1\r\n\r\nx",
            ProtocolError,
            "'br'",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 4\r\n\r\nnope",
            ProtocolError,
            "bad gzip body",
        ),
        (
            b"HTTP/1.1 200 OK\r\n" + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n",
            ProtocolError,
            "headers exceed",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s"
            % (len(gzip.compress(b"x" * 5000)) - 8, gzip.compress(b"x" * 5000)[:-8]),
            ProtocolError,
            "gzip body ends before its compressed stream",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            ProtocolError,
            r"switched protocols \(101\)",
        ),
    ],
    ids=[
        "closed-before",
        "closed-mid-body",
        "not-http",
        "unknown-coding",
        "bad-gzip",
        "huge-head",
        "truncated-gzip",
        "upgrade",
    ],
)
async def test_broken_answers_raise_typed_errors_and_free_the_slot(
    script: bytes, error: type[Exception], text: str
) -> None:
    calls = 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:  # the next call, on a new connection, is answered properly
            await json_echo(r, w, s)
            return
        await s.read_request(r)
        w.write(script)
        await w.drain()
        w.close()

    async with serving(handler) as srv:
        pool = pool_for(srv, limit=1)
        with pytest.raises(error, match=text):
            await post(pool)
        assert (await post(pool, b"[3]"))[2] == b"[3]"  # limit=1: the slot came back
        await pool.close()


async def test_read_timeout_without_a_byte() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(4):  # a byte every 0.1 s keeps the call alive past read_s...
            await asyncio.sleep(0.1)
            w.write(b"1\r\nx\r\n")
        await s.until_client_closes(r)  # ...then silence

    async with serving(handler) as srv:
        pool = pool_for(srv, read_s=0.3)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError, match=r"no answer from the server for 0\.3 s"):
            await post(pool)
        assert 0.6 <= loop.time() - start < 3
        await asyncio.wait_for(srv.closed_by_client.wait(), 5)  # the connection was dropped
        await pool.close()


async def test_connect_errors_say_nothing_was_sent() -> None:
    async with serving(json_echo) as srv:
        port = srv.port
    pool = Pool(f"http://127.0.0.1:{port}/mcp", {})
    with pytest.raises(ConnectError, match=f"cannot connect to 127.0.0.1:{port}"):
        await pool.post(b"{}")
    assert isinstance(ConnectError("x"), WireError)
    await pool.close()


async def test_stale_and_lost_idle_connections_are_not_reused() -> None:
    async def one_answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(b"[1]"))
        await w.drain()
        await asyncio.sleep(0.2)
        w.close()  # the server's keep-alive timeout: it closes the idle connection

    async with serving(one_answer) as srv:
        pool = pool_for(srv)
        await post(pool)
        await asyncio.sleep(0.4)  # the close has arrived while the connection was idle
        assert (await post(pool))[2] == b"[1]"
        assert srv.connections == 2
        await pool.close()
    async with serving(json_echo) as srv:
        pool = pool_for(srv, keepalive_s=0.1)
        await post(pool)
        await asyncio.sleep(0.2)  # idle longer than keepalive_s: not reused
        await post(pool)
        await pool.close()
    assert srv.connections == 2


async def test_at_most_limit_connections_and_every_call_answered() -> None:
    active = peak = 0

    async def slow_echo(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        nonlocal active, peak
        while (body := await s.read_request(r)) is not None:
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.05)
            active -= 1
            w.write(answer(body))
            await w.drain()

    async with serving(slow_echo) as srv:
        pool = pool_for(srv, limit=2)
        got = await asyncio.gather(*(post(pool, b"[%d]" % i) for i in range(7)))
        assert [g[2] for g in got] == [b"[%d]" % i for i in range(7)]
        await pool.close()
    assert peak == 2 and srv.connections == 2


async def test_cancelling_drops_the_connection_and_frees_the_slot() -> None:
    async def never(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        if len(s.requests) == 0:
            await s.read_request(r)
            await s.until_client_closes(r)
            return
        await json_echo(r, w, s)

    async with serving(never) as srv:
        pool = pool_for(srv, limit=1)
        task = asyncio.ensure_future(post(pool))
        await asyncio.wait_for(srv.got_request.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(srv.closed_by_client.wait(), 5)  # the server saw the client go
        assert (await asyncio.wait_for(post(pool, b"[4]"), 5))[2] == b"[4]"
        await pool.close()


async def test_a_large_streamed_body_arrives_whole_under_back_pressure() -> None:
    size = 3 * 1024 * 1024

    async def stream(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for i in range(size // 65536):
            w.write(bytes([i % 256]) * 65536)
            await w.drain()

    async with serving(stream) as srv:
        pool = pool_for(srv)
        resp = await pool.post(b"{}")
        got = bytearray()
        async for chunk in resp.chunks():
            got += chunk
            await asyncio.sleep(0)  # a slow reader: the socket is paused and resumed
        resp.release()
        assert len(got) == size
        assert all(got[i * 65536] == i % 256 for i in range(size // 65536))
        await pool.close()


async def test_close_fails_calls_in_flight_and_refuses_new_ones() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        await asyncio.sleep(30)

    async with serving(silent) as srv:
        pool = pool_for(srv)
        task = asyncio.ensure_future(post(pool))
        await asyncio.wait_for(srv.got_request.wait(), 5)
        await pool.close()
        with pytest.raises(Disconnected):
            await asyncio.wait_for(task, 5)
        with pytest.raises(WireError, match="closed"):
            await post(pool)
        assert pool.closed


async def test_header_injection_is_refused() -> None:
    with pytest.raises(ValueError, match="CR, LF and NUL"):
        Pool.header_block({"mcp-name": "x\r\nx-evil: 1"})
    with pytest.raises(ValueError, match="CR, LF and NUL"):
        Pool("http://127.0.0.1:1/mcp", {"x-token": "a\nb"})
    with pytest.raises(ValueError, match="not an http"):
        Pool("ftp://127.0.0.1/mcp", {})


async def test_tls_with_the_given_trust_and_a_wrong_name_refused() -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with serving(json_echo, tls=server_ctx) as srv:
        pool = Pool(f"https://127.0.0.1:{srv.port}/mcp", {}, ssl=client_ctx)
        assert (await post(pool, b"[5]"))[2] == b"[5]"
        await pool.close()
        untrusted = Pool(f"https://127.0.0.1:{srv.port}/mcp", {})  # the system's trust store
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await post(untrusted)
        await untrusted.close()


async def test_a_large_body_read_whole_leaves_the_connection_readable() -> None:
    size = 1024 * 1024

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(b"x" * size))
        await w.drain()
        await json_echo(r, w, s)

    async with serving(handler) as srv:
        pool = pool_for(srv, read_s=2)
        assert len((await post(pool))[2]) == size
        assert (await asyncio.wait_for(post(pool, b"[6]"), 5))[2] == b"[6]"
        await pool.close()
    assert srv.connections == 1


async def test_close_fails_a_read_until_close_body_in_flight() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart")
        await w.drain()
        await s.until_client_closes(r)

    async with serving(handler) as srv:
        pool = pool_for(srv)
        resp = await pool.post(b"{}")
        await asyncio.sleep(0.1)  # "part" is in
        await pool.close()
        with pytest.raises(Disconnected):
            await resp.read()
        resp.close()


async def test_a_reset_read_until_close_body_is_not_complete() -> None:
    """A body that ends at EOF ends only at a clean EOF: a reset cuts it."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart")
        await w.drain()
        await asyncio.sleep(0.2)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()  # RST: the body is cut, not ended

    async with serving(handler) as srv:
        pool = pool_for(srv)
        resp = await pool.post(b"{}")
        with pytest.raises(Disconnected):
            await resp.read()
        resp.close()
        await pool.close()


async def test_close_fails_calls_waiting_for_a_slot() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        await s.until_client_closes(r)

    async with serving(silent) as srv:
        pool = pool_for(srv, limit=1)
        first = asyncio.ensure_future(post(pool))
        await asyncio.wait_for(srv.got_request.wait(), 5)
        second = asyncio.ensure_future(post(pool, b"[2]"))
        await asyncio.sleep(0.05)  # waiting for the slot
        await pool.close()
        with pytest.raises(Disconnected):
            await first
        try:
            with pytest.raises(WireError, match="closed"):
                await asyncio.wait_for(second, 2)
        finally:
            assert len(srv.requests) == 1, srv.requests  # nothing sent after close()


async def test_a_connection_being_closed_is_not_reused() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        if s.connections > 1:
            await json_echo(r, w, s)
            return
        await s.read_request(r)
        w.write(answer(b"[1]") + b"JUNK\r\n\r\n")  # bytes after the answer: client aborts
        await w.drain()
        await json_echo(r, w, s)

    async with serving(handler) as srv:
        pool = pool_for(srv)
        resp = await pool.post(b"{}")
        assert await resp.read() == b"[1]"
        resp.release()
        # in the same loop step: the aborted connection (connection_lost still pending)
        assert (await post(pool, b"[7]"))[2] == b"[7]"
        await pool.close()


async def test_a_slow_reader_is_not_a_silent_server() -> None:
    size = 2 * 1024 * 1024

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(b"x" * size))
        await w.drain()
        await s.until_client_closes(r)

    async with serving(handler) as srv:
        pool = pool_for(srv, read_s=0.3)
        resp = await pool.post(b"{}")
        got = 0
        async for chunk in resp.chunks():
            got += len(chunk)
            await asyncio.sleep(0.5)  # slow consumer; socket paused by back-pressure
        resp.release()
        assert got == size
        await pool.close()


async def test_a_head_that_never_ends_is_cut_off() -> None:
    """Header bytes trickling in without end: refused once past the limit, not buffered forever."""

    async def trickle(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
        for _ in range(400):
            w.write(b"a" * 1024)
            await w.drain()
            await asyncio.sleep(0.001)
        await s.until_client_closes(r)

    async with serving(trickle) as srv:
        pool = pool_for(srv)
        with pytest.raises(ProtocolError, match="headers exceed"):
            await asyncio.wait_for(post(pool), 10)
        await pool.close()


async def test_a_head_arriving_with_a_large_body_in_one_read_is_no_endless_head() -> None:
    """Before: the bytes of a read that completed the head were all counted as head bytes, so
    an answer whose head and first 128+ KiB of body arrived in one read (a server writing a
    large result at once) failed as "the response headers exceed 65536 bytes" about every
    other time, and the upstream session was torn down as lost."""
    size = 1024 * 1024

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        while await s.read_request(r) is not None:
            w.write(answer(b"x" * size))  # head and body in one write
            await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv, read_s=5)
        for _ in range(20):
            status, _, body = await asyncio.wait_for(post(pool), 10)
            assert status == 200 and len(body) == size
        await pool.close()
    assert srv.connections == 1


async def test_close_names_the_client_as_the_one_that_closed() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await s.until_client_closes(r)

    async with serving(silent) as srv:
        pool = pool_for(srv)
        resp = await pool.post(b"{}")
        await pool.close()
        with pytest.raises(Disconnected, match="the HTTP client was closed during the call"):
            await resp.read()
        resp.close()


async def test_an_error_answer_read_whole_keeps_the_connection() -> None:
    """A 429 or a JSON-RPC error is an answer: the direct caller reuses its connection."""
    from mcp.shared.exceptions import MCPError

    from toolwire_mcp._direct import HTTPRefusal

    error = b'{"jsonrpc":"2.0","id":%d,"error":{"code":-32602,"message":"bad"}}'
    result = b'{"jsonrpc":"2.0","id":%d,"result":{"content":[],"isError":false}}'

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(b"slow down", "retry-after: 2", status="429 Too Many Requests"))
        await s.read_request(r)
        w.write(answer(error % 2, "content-type: application/json", status="400 Bad Request"))
        await s.read_request(r)
        w.write(answer(result % 3, "content-type: application/json"))
        await w.drain()
        await s.until_client_closes(r)

    async with serving(script) as srv:
        caller = direct_caller(srv, server="s")
        with pytest.raises(HTTPRefusal) as refusal:
            await caller.call_tool("t", {}, meta=None, progress=None)
        assert (refusal.value.status, refusal.value.retry_after) == (429, "2")
        with pytest.raises(MCPError, match="bad"):
            await caller.call_tool("t", {}, meta=None, progress=None)
        ok = await caller.call_tool("t", {}, meta=None, progress=None)
        assert not getattr(ok, "is_error", True)
        await caller.close()
    assert srv.connections == 1


async def test_a_body_over_the_read_limit_raises_and_keeps_nothing() -> None:
    """``max_body``: a Content-Length over it fails before the body comes; a chunked
    body fails once past it; a body at the limit is read whole, on the same connection."""
    limit = 100_000

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (limit + 1))
        await w.drain()  # and the body never comes
        await s.read_request(r)  # a new connection for this one: the first was dropped

    async def chunked(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        part = b"y" * 10_000
        for _ in range(limit // len(part)):  # exactly the limit: read whole
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
        w.write(b"0\r\n\r\n")
        await s.read_request(r)  # the same connection serves the next request
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(100):  # then 1 MB, endless as far as the limit goes
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
            await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv, max_body=limit)
        resp = await pool.post(b"{}")
        with pytest.raises(TooLarge, match=f"over {limit} bytes") as info:
            await asyncio.wait_for(resp.read(), 5)
        assert info.value.limit == limit
        resp.close()
        await pool.close()

    async with serving(chunked) as srv:
        pool = pool_for(srv, max_body=limit)
        resp = await pool.post(b"{}")
        assert await resp.read() == b"y" * limit
        resp.release()
        resp = await pool.post(b"{}")
        with pytest.raises(TooLarge):
            await asyncio.wait_for(resp.read(), 5)
        # nothing of it kept, and not read to its end (reading pauses at 256 KiB unread)
        assert not resp._chunks and resp._size < 100 * len(b"y" * 10_000)
        resp.close()
        await pool.close()
    assert srv.connections == 1


async def test_a_compressed_body_is_not_expanded_past_the_read_limit() -> None:
    """A gzip "bomb" (100 MB of zeros in about 100 KB) stops at the limit, decompressed."""
    bomb = gzip.compress(b"\0" * 100_000_000, compresslevel=9)
    limit = 1_000_000

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(bomb, "content-encoding: gzip"))
        await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv, max_body=limit)
        resp = await pool.post(b"{}")
        with pytest.raises(TooLarge):
            await asyncio.wait_for(resp.read(), 5)
        assert resp._size <= 2 * (limit + 1)  # decompressed past the limit by one read, no more
        resp.close()
        await pool.close()


async def test_a_compressed_stream_is_expanded_only_as_it_is_read() -> None:
    """A streamed body (SSE) has no cap on its whole (the reader caps its events): a
    compressed one is decompressed as it is read, 64 KiB at a time, never ahead of the
    reader; plain reads of any size pass. Before, one socket read decompressing past
    ``max_body`` was ``TooLarge``, which failed a stream of small events arriving
    together (see ``test_a_compressed_stream_of_small_events_is_read_whole``)."""
    bomb = gzip.compress(b"\0" * 100_000_000, compresslevel=9)
    plain = b"z" * 500_000

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(answer(plain, "content-type: text/event-stream"))
        await s.read_request(r)
        w.write(answer(bomb, "content-type: text/event-stream", "content-encoding: gzip"))
        await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv, max_body=100_000)
        resp = await pool.post(b"{}")
        assert b"".join([c async for c in resp.chunks()]) == plain
        resp.release()
        resp = await pool.post(b"{}")
        await asyncio.sleep(0.2)  # what comes before reading pauses has come
        assert resp._size == 0  # nothing decompressed before it is read
        read = 0
        async for piece in resp.chunks():
            assert 0 < len(piece) <= 65536 and piece == bytes(len(piece))
            read += len(piece)
            assert resp._size == read  # no more decompressed than was read
            if read > 1_000_000:
                break
        assert not resp.consumed
        resp.close()
        await pool.close()


async def test_a_compressed_stream_of_small_events_is_read_whole() -> None:
    """A gzip event stream of small events, flushed once (as a compressor buffering them
    does), arriving in one socket read: read whole, on a connection kept. Before, what one
    read decompressed to was capped at ``max_body``: 300 kB of 150-byte events failed
    ``TooLarge`` under a 64 KiB cap, though no event came near it (sent plain, it passed)."""
    frame = b"event: message\ndata: " + b'{"jsonrpc": "2.0", "method": "x"}' + b"\n\n"
    plain = frame * 6000

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        gz = gzip.compress(plain)
        w.write(answer(gz, "content-type: text/event-stream", "content-encoding: gzip"))
        await w.drain()
        await s.read_request(r)
        w.write(answer(b"{}", "content-type: application/json"))
        await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv, max_body=65536)
        resp = await pool.post(b"{}")
        await asyncio.sleep(0.1)  # all of it arrives before the reader asks
        assert b"".join([c async for c in resp.chunks()]) == plain
        assert resp.consumed
        resp.release()
        resp = await pool.post(b"{}")
        assert await resp.read() == b"{}"
        resp.release()
        await pool.close()
    assert srv.connections == 1


async def test_many_compressed_pieces_in_one_read_are_not_expanded_before_reading() -> None:
    """A chunked gzip body of many small pieces, each expanding 100-fold, arriving in one
    socket read: nothing of it is decoded before the reader asks, then 64 KiB at a time.
    Before, each piece was capped alone, and 200 of them buffered 198 times the cap before
    the reader came."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    pieces = [packer.compress(b"\0" * 99_000) + packer.flush(zlib.Z_SYNC_FLUSH) for _ in range(200)]
    pieces.append(packer.flush())
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        head = b"content-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
        w.write(b"HTTP/1.1 200 OK\r\n" + head + b"transfer-encoding: chunked\r\n\r\n" + body)
        await w.drain()

    async with serving(handler) as srv:
        pool = pool_for(srv, max_body=100_000)
        resp = await pool.post(b"{}")
        await asyncio.sleep(0.2)  # all of it arrives before the reader asks
        assert resp._size == 0 and resp._unread < 100_000  # held as sent
        async for piece in resp.chunks():
            assert len(piece) <= 65536 and resp._size == len(piece)
            break
        resp.close()
        await pool.close()
