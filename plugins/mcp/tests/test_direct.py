"""``tools/call`` of Streamable-HTTP upstreams: the direct path and the FastMCP client.

A real upstream FastMCP server over HTTP (``upstream_server.py --http PORT``).
With ``direct_http_calls`` true, calls of a 2026-07-28 upstream go over the
lean HTTP caller; false sends them through the FastMCP client. Both must
give the same kernel results, and the direct path must really be taken
where it applies (``Upstream.direct_calls`` counts its requests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types
import pytest
from toolwire_mcp_testkit import (
    HERE,
    HttpUpstream,
    Server,
    call_until_back,
    clean_env,
    direct_caller,
    eventually,
    serving,
    upstream_entry,
)

from toolwire import Kernel, ToolResult
from toolwire_mcp import MCPConfig, MCPPlugin
from toolwire_mcp._direct import DirectCaller
from toolwire_mcp._upstream import Upstream

pytestmark = pytest.mark.anyio

PATHS = pytest.mark.parametrize("direct", [True, False], ids=["direct", "fastmcp-client"])


@pytest.fixture(scope="module")
def upstream() -> Iterator[HttpUpstream]:
    """One HTTP upstream for the tests of this module that do not kill it."""
    up = HttpUpstream().start()
    yield up
    up.stop()


@asynccontextmanager
async def gateway(
    entry: dict[str, Any], *, direct: bool = True, **extra: Any
) -> AsyncIterator[tuple[Kernel, Upstream]]:
    """A kernel with the mcp plugin and one upstream called ``up``."""
    cfg = {
        "servers": {"up": entry},
        "reconnect_initial_s": 0.05,
        "reconnect_max_s": 0.2,
        "direct_http_calls": direct,
        **extra,
    }
    mcp = MCPPlugin(MCPConfig.model_validate(cfg))
    async with Kernel(plugins=[mcp]) as kernel:
        up = mcp._upstreams["up"]
        assert up.status == "up", up.last_error
        yield kernel, up


def outcome(r: ToolResult) -> Any:
    """What a caller can observe of a result (the error in full)."""
    if r.error is None:
        return r.content
    info = r.error.to_dict()
    return {k: v for k, v in info.items() if k != "exception"}


class Progress:
    def __init__(self) -> None:
        self.got: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.got.append((progress, total, message))


@PATHS
async def test_results_remote_errors_progress_and_the_call_id(
    upstream: HttpUpstream, direct: bool
) -> None:
    await scenarios(upstream, direct)


@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})], ids=["uvloop"])
async def test_the_direct_path_on_uvloop(upstream: HttpUpstream) -> None:
    """``toolwire serve`` runs on uvloop by default; its transports are not asyncio's classes."""
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    await scenarios(upstream, direct=True)


async def scenarios(upstream: HttpUpstream, direct: bool) -> None:
    """Results, a remote error, a rate limit, progress, log notifications, the call id."""
    async with gateway({"url": upstream.url}, direct=direct) as (k, up):
        r = await k.call("up_forecast", {"city": "Lyon"})
        assert r.content == {"result": "sunny in Lyon"} and not r.is_error  # text only
        r = await k.call("up_stats", {"text": "a b c", "times": 2})
        assert r.content == {"words": 6, "chars": 10}  # structured content
        r = await k.call("up_seen_meta", {}, call_id="order-17")
        assert r.content == {"call_id": "order-17"}  # the call id travels on upstream
        r = await k.call("up_fail", {"message": "disk on fire"})
        assert r.error is not None and r.error.kind == "tool_error"
        assert "disk on fire" in r.error.message and r.error.source == "mcp:up"
        assert r.error.details["server"] == "up" and r.error.details["remote_tool"] == "fail"
        r = await k.call("up_limited", {})
        assert r.error is not None and r.error.kind == "rate_limit"
        progress = Progress()
        r = await k.call("up_steps", {"n": 2}, progress=progress)
        assert r.content == {"steps": 2}
        assert progress.got == [(1, 2, "step 1 of 2"), (2, 2, "step 2 of 2")]
        r = await k.call("up_chatty", {})  # log notifications on the way
        assert r.content == {"result": "said it"}
        assert up.direct_calls == (7 if direct else 0)


async def test_both_paths_give_identical_results(upstream: HttpUpstream) -> None:
    """Every scenario through both paths at once; what the kernel answers must not differ."""
    entry = {"url": upstream.url, "headers": {"X-Tenant": "acme"}, "timeout": 1000}
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("up_forecast", {"city": "Oslo"}, {}),
        ("up_stats", {"text": "x y"}, {}),
        ("up_envelope", {}, {"call_id": "run-1"}),  # the _meta envelope and the headers sent
        ("up_fail", {"message": "nope"}, {}),
        ("up_limited", {}, {}),
        ("up_chatty", {}, {}),
        ("up_ask", {}, {}),  # input_required with an elicitation we have no handler for
        ("up_come_back", {}, {}),  # input_required, then the retry completes
        ("up_regional", {"region": "eu-west"}, {}),  # needs Mcp-Param-Region
        ("up_http_401", {}, {}),
        ("up_http_429", {}, {}),
        ("up_http_503", {}, {}),
        ("up_slow", {"seconds": 5}, {}),  # longer than the server's 1 s timeout
    ]
    async with (
        gateway(entry, direct=True) as (fast, fast_up),
        gateway(entry, direct=False) as (slow, slow_up),
    ):
        for name, args, kw in calls:
            a, b = await fast.call(name, args, **kw), await slow.call(name, args, **kw)
            assert outcome(a) == outcome(b), name
        pa, pb = Progress(), Progress()
        a = await fast.call("up_steps", {"n": 3}, progress=pa)
        b = await slow.call("up_steps", {"n": 3}, progress=pb)
        assert outcome(a) == outcome(b) == {"steps": 3} and pa.got == pb.got and len(pa.got) == 3
        # 14 calls (not regional, which needs the FastMCP client) and come_back's retry
        assert (fast_up.direct_calls, slow_up.direct_calls) == (14, 0)

        envelope = (await fast.call("up_envelope", {}, call_id="run-2")).content
        assert envelope["headers"]["x-tenant"] == "acme"
        assert envelope["headers"]["mcp-name"] == "envelope"
        assert envelope["meta"]["io.toolwire/call-id"] == "run-2"
        r = await fast.call("up_ask", {})
        assert r.error is not None and r.error.kind == "tool_error"
        assert "Elicitation not supported" in r.error.message
        assert (await fast.call("up_come_back", {})).content == {"result": "came back"}
        r = await fast.call("up_http_401", {})
        assert r.error is not None and r.error.kind == "auth" and r.error.details["status"] == 401
        assert "[plugins.mcp.servers.up]" in r.error.message
        r = await fast.call("up_http_429", {})
        assert r.error is not None and r.error.kind == "rate_limit"
        assert r.error.retry_after_s == 7
        # RFC 9110's other form, an HTTP-date (ignored before), and a "nan" float() took
        r = await fast.call("up_http_429_date", {})
        assert r.error is not None and r.error.kind == "rate_limit"
        assert r.error.retry_after_s is not None and 20 < r.error.retry_after_s <= 30
        r = await fast.call("up_http_429_nan", {})
        assert r.error is not None and r.error.kind == "rate_limit"
        assert r.error.retry_after_s is None
        r = await fast.call("up_http_503", {})
        assert r.error is not None and r.error.kind == "unavailable"
        r = await fast.call("up_slow", {"seconds": 5})
        assert r.error is not None and r.error.kind == "timeout"


async def test_the_direct_path_is_taken_only_where_it_applies(
    upstream: HttpUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway({"url": upstream.url}) as (k, up):
        assert up._direct is not None
        assert (await k.call("up_forecast", {"city": "Rome"})).content == {
            "result": "sunny in Rome"
        }
        assert up.direct_calls == 1
        # A tool asking for Mcp-Param-* headers goes through the FastMCP client
        # (the server refuses the call without the header).
        r = await k.call("up_regional", {"region": "eu"})
        assert r.content == {"result": "served in eu"} and up.direct_calls == 1
    async with gateway({"url": upstream.url}, protocol="legacy") as (k, up):
        assert (await k.call("up_forecast", {"city": "Rome"})).content is not None
        assert up._direct is None and up.direct_calls == 0
    async with gateway({"url": upstream.url}, direct=False) as (k, up):
        assert (await k.call("up_forecast", {"city": "Rome"})).is_error is False
        assert up._direct is None and up.direct_calls == 0
    async with gateway(upstream_entry(include=["forecast"])) as (k, up):  # stdio
        assert (await k.call("up_forecast", {"city": "Rome"})).is_error is False
        assert up._direct is None and up.direct_calls == 0
    # A proxy in the environment (bypassed for this host, as httpx2 honours NO_PROXY):
    # the FastMCP client decides how to reach the server.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with gateway({"url": upstream.url}) as (k, up):
        assert (await k.call("up_forecast", {"city": "Rome"})).is_error is False
        assert up._direct is None and up.direct_calls == 0


async def test_a_redirect_falls_back_to_the_fastmcp_client(upstream: HttpUpstream) -> None:
    """``/mcp/`` answers 307 to ``/mcp``: the SDK follows it, the direct path hands over."""
    async with gateway({"url": upstream.url + "/"}) as (k, up):
        for city in ("Bern", "Graz"):
            r = await k.call("up_forecast", {"city": city})
            assert r.content == {"result": f"sunny in {city}"}
        assert up.direct_calls == 1 and up._direct is None  # tried once, then handed over


@PATHS
async def test_cancelling_a_call_abandons_the_request(upstream: HttpUpstream, direct: bool) -> None:
    async with gateway({"url": upstream.url}, direct=direct) as (k, _):
        before = (await k.call("up_slow_state", {})).content
        with anyio.move_on_after(0.5):
            await k.call("up_slow", {"seconds": 30})

        with anyio.fail_after(10):  # the server saw the request go and stopped the tool
            while True:
                state = (await k.call("up_slow_state", {})).content
                if state["cancelled"] > before["cancelled"]:
                    break
                await anyio.sleep(0.05)
        assert state["finished"] == before["finished"]


@PATHS
async def test_a_timeout_answers_timeout(upstream: HttpUpstream, direct: bool) -> None:
    async with gateway({"url": upstream.url, "timeout": 300}, direct=direct) as (k, up):
        r = await k.call("up_slow", {"seconds": 5})
        assert r.error is not None and r.error.kind == "timeout", r.error
        assert r.error.details["mcp_code"] == -32001
        # Before: only "Request 'tools/call' timed out": which limit, set where?
        assert "`timeout` = 300 ms of [plugins.mcp.servers.up]" in r.error.message, r.error
        assert (await k.call("up_forecast", {"city": "Kyiv"})).content is not None
        assert up.direct_calls == (2 if direct else 0)


@PATHS
@pytest.mark.parametrize("stream", [False, True], ids=["json", "event-stream"])
async def test_an_answer_over_max_answer_bytes_fails_the_call_only(
    upstream: HttpUpstream, direct: bool, stream: bool
) -> None:
    """A server answering more than ``max_answer_bytes`` (a JSON body, or one event) fails
    that call with an error naming the setting; the next calls are served as before."""
    limit = 64 * 1024
    entry = {"url": upstream.url, "max_answer_bytes": limit}
    async with gateway(entry, direct=direct) as (k, up):
        progress = Progress() if stream else None
        r = await k.call("up_big", {"size": 3 * limit, "stream": stream}, progress=progress)
        assert r.error is not None and r.error.kind == "tool_error", r.error
        assert r.error.details["answer_too_large"] is True
        assert r.error.details["max_answer_bytes"] == limit
        assert f"max_answer_bytes = {limit} bytes ([plugins.mcp.servers.up])" in r.error.message
        assert not r.error.retryable  # the same call would bring the same answer
        if stream:
            assert progress is not None and progress.got == [(0, 1, "starting")]
        # under the cap (the text comes twice: content and structuredContent), still up
        r = await k.call("up_big", {"size": limit // 4, "stream": stream}, progress=progress)
        assert r.content == {"result": "x" * (limit // 4)}, r.error
        assert up.status == "up"
        assert up.direct_calls == (2 if direct else 0)


@pytest.fixture(scope="module")
def gzipping() -> Iterator[HttpUpstream]:
    """An upstream that gzips every answer, whatever the client asked for."""
    up = HttpUpstream(env=clean_env(UPSTREAM_FORCE_GZIP="1")).start()
    yield up
    up.stop()


@PATHS
@pytest.mark.parametrize("stream", [False, True], ids=["json", "event-stream"])
async def test_a_compressed_answer_is_decompressed_under_max_answer_bytes(
    gzipping: HttpUpstream, direct: bool, stream: bool
) -> None:
    """A server sending gzip though asked for none: its answers are read (decompressed
    here), and a small compressed answer expanding past the cap fails like a large one.
    Before, the FastMCP client's cap counted the compressed bytes: 8 MiB of 'x' came in
    whole under a 64 KiB cap."""
    limit = 64 * 1024
    async with gateway({"url": gzipping.url, "max_answer_bytes": limit}, direct=direct) as (
        k,
        up,
    ):
        progress = Progress() if stream else None
        r = await k.call("up_big", {"size": 128 * limit, "stream": stream}, progress=progress)
        assert r.error is not None and r.error.details.get("answer_too_large") is True, r.error
        r = await k.call("up_big", {"size": limit // 4, "stream": stream}, progress=progress)
        assert r.content == {"result": "x" * (limit // 4)}, r.error
        assert up.status == "up"


async def test_a_listing_over_max_answer_bytes_keeps_the_server_down_naming_the_key(
    upstream: HttpUpstream,
) -> None:
    """The cap holds for every answer of the server, its tool list included: a server
    listing more than ``max_answer_bytes`` is not connected, and says which key to raise."""
    cfg = {
        "servers": {"up": {"url": upstream.url, "max_answer_bytes": 1024}},
        "connect_timeout_s": 5,
    }
    mcp = MCPPlugin(MCPConfig.model_validate(cfg))
    async with Kernel(plugins=[mcp]):
        up = mcp._upstreams["up"]
        assert up.status != "up"
        assert "max_answer_bytes = 1024 bytes ([plugins.mcp.servers.up])" in str(up.last_error), (
            up.last_error
        )


@PATHS
@pytest.mark.parametrize("tool", ["http_503_page", "http_503_json"])
async def test_a_refusal_with_a_body_over_the_cap_is_still_the_refusal(
    upstream: HttpUpstream, direct: bool, tool: str
) -> None:
    """A 503 whose body (an error page, a JSON-RPC error) is over ``max_answer_bytes``
    answers ``unavailable`` with its status, and the server stays up. Before, the direct
    path took the page for a lost connection and dropped the session, and the JSON one
    for an answer too large (a ``tool_error``)."""
    async with gateway({"url": upstream.url, "max_answer_bytes": 32 * 1024}, direct=direct) as (
        k,
        up,
    ):
        r = await k.call(f"up_{tool}", {})
        assert r.error is not None and r.error.kind == "unavailable", r.error
        assert r.error.details["status"] == 503
        assert up.status == "up"
        assert (await k.call("up_forecast", {"city": "Oslo"})).content == {
            "result": "sunny in Oslo"
        }


@PATHS
async def test_list_changed_announced_during_a_call_re_lists(
    upstream: HttpUpstream, direct: bool
) -> None:
    name = f"fresh_{'direct' if direct else 'client'}"
    async with gateway({"url": upstream.url}, direct=direct) as (k, _):
        r = await k.call("up_grow", {"name": name})
        assert r.content == {"result": f"added {name}"}
        await eventually(lambda: k.get_tool(f"up_{name}") is not None)
        r = await k.call(f"up_{name}", {})
        assert r.content == {"result": f"I am {name}"}


@PATHS
async def test_a_crash_mid_call_answers_unavailable_then_reconnects(direct: bool) -> None:
    server = HttpUpstream().start()
    try:
        async with gateway({"url": server.url}, direct=direct) as (k, up):
            first = up._direct
            r = await k.call("up_crash", {})
            assert r.error is not None and r.error.kind == "unavailable", r.error
            assert "connection was lost during the call to 'crash'" in r.error.message
            assert r.error.details["in_flight"] is True
            if direct:
                assert first is not None and up.direct_calls == 1
            # The server is gone: the supervisor finds out (on the direct path by checking
            # it, the lost connection being one of the pool's) and reconnects with backoff.
            await eventually(lambda: up.status == "down")
            server.start()  # the same port again
            r = await call_until_back(k, "up_forecast", {"city": "Oslo"})
            assert r.content == {"result": "sunny in Oslo"}
            if direct:  # a new session, the same HTTP client: reconnects cut no call
                assert up._direct is first and not first.closed
            else:
                assert up._direct is None
            assert up.direct_calls == (2 if direct else 0)
    finally:
        server.stop()


async def test_a_restarted_server_that_forgot_the_session_gets_a_new_one() -> None:
    """A handshake-era (2025-11-25) Streamable-HTTP session: a restarted server answers
    HTTP 404 to its Mcp-Session-Id, and the spec says to start a new session. Before:
    the session stayed ``up`` and every call failed for good with "Session not found"
    (``tool_error``; from a TypeScript server, -32001: ``timeout``)."""
    server = HttpUpstream().start()
    try:
        async with gateway({"url": server.url}, protocol="legacy") as (k, up):
            r = await k.call("up_forecast", {"city": "Oslo"})
            assert r.content == {"result": "sunny in Oslo"}
            server.start()  # the same port again: a new process, no sessions
            r = await k.call("up_forecast", {"city": "Oslo"})
            assert r.error is not None and r.error.kind == "unavailable", r.error
            assert "no longer knows toolwire's session (HTTP 404" in r.error.message
            assert "the call was not run" in r.error.message
            assert r.error.details["in_flight"] is False  # refused: safe to send again
            assert r.error.details["session_expired"] is True
            r = await call_until_back(k, "up_forecast", {"city": "Oslo"})
            assert r.content == {"result": "sunny in Oslo"}
            assert up.status == "up"
    finally:
        server.stop()


async def test_a_call_the_fastmcp_client_could_not_send_says_so() -> None:
    """The server is down (the connection is refused): the call's POST never went out.
    Before: on the FastMCP client's path the SDK's bare "Connection closed" was taken
    for a connection lost during the call (``in_flight: true``, "the outcome is
    unknown"), so the retry plugin refused to send again a call that never ran; the
    direct path said ``in_flight: false``."""
    server = HttpUpstream().start()
    try:
        async with gateway({"url": server.url}, protocol="legacy") as (k, _up):
            server.stop()
            r = await k.call("up_forecast", {"city": "Oslo"})
            assert r.error is not None and r.error.kind == "unavailable", r.error
            assert "the call was not sent" in r.error.message
            assert "cannot connect to" in r.error.message
            assert r.error.details["in_flight"] is False
            server.start()
            r = await call_until_back(k, "up_forecast", {"city": "Oslo"})
            assert r.content == {"result": "sunny in Oslo"}
    finally:
        server.stop()


async def test_a_lost_list_changed_subscription_is_opened_again_and_re_lists() -> None:
    """A 2026-07-28 server's ``subscriptions/listen`` stream ends when it restarts. Its
    calls are stateless, so the session goes on; before, the subscription was not
    opened again (a debug log line), and the server's tool changes went unnoticed for
    the rest of the session: a tool it added was unknown, one it removed still listed."""
    from fastmcp import Client

    server = HttpUpstream(script=HERE / "sdk_upstream_server.py").start()
    try:
        async with gateway({"url": server.url}) as (k, _up):
            async with Client(server.url) as other:  # another client changes the tools
                await other.call_tool("grow", {"name": "early"})
            await eventually(lambda: k.get_tool("up_early") is not None)
            server.start()  # the same port again: the subscription's stream ends
            async with Client(server.url) as other:
                await other.call_tool("grow", {"name": "late"})
            await eventually(lambda: k.get_tool("up_late") is not None, 30)
            r = await call_until_back(k, "up_late", {})
            assert r.content == {"result": "I am late"}
            assert k.get_tool("up_early") is None  # the restarted server has no such tool
    finally:
        server.stop()


@PATHS
async def test_user_and_password_in_the_url_are_sent_as_basic_auth(direct: bool) -> None:
    """The FastMCP client (httpx) sends the URL's ``user:password@`` as HTTP Basic auth.
    Before: the direct path dropped it, so the server connected and listed, and every
    call failed ``auth`` (HTTP 401)."""
    server = HttpUpstream(env=clean_env(UPSTREAM_BASIC="ops:p@ss")).start()
    try:
        url = f"http://ops:p%40ss@127.0.0.1:{server.port}/mcp"
        async with gateway({"url": url}, direct=direct) as (k, up):
            r = await k.call("up_forecast", {"city": "Oslo"})
            assert r.content == {"result": "sunny in Oslo"}, r.error
            assert up.direct_calls == (1 if direct else 0)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def guarded() -> Iterator[HttpUpstream]:
    """An HTTP upstream requiring the bearer token ``up-secret``."""
    up = HttpUpstream(env=clean_env(UPSTREAM_TOKEN="up-secret")).start()
    yield up
    up.stop()


@PATHS
async def test_bearer_auth(guarded: HttpUpstream, direct: bool) -> None:
    async with gateway({"url": guarded.url, "auth": "up-secret"}, direct=direct) as (k, up):
        r = await k.call("up_envelope", {})
        assert r.content["headers"]["authorization"] == "Bearer up-secret"
        assert up.direct_calls == (1 if direct else 0)
    entry = {"url": guarded.url, "auth": "wrong", "include": ["forecast"]}
    cfg = {"servers": {"up": entry}, "direct_http_calls": direct, "connect_timeout_s": 5}
    async with Kernel(plugins=[MCPPlugin(MCPConfig.model_validate(cfg))]) as k:
        r = await k.call("up_forecast", {"city": "Oslo"})
        assert r.error is not None and r.error.kind == "auth", r.error
        assert "HTTP 401" in r.error.message and "[plugins.mcp.servers.up]" in r.error.message


def _sse_answer(end_after_s: float) -> Any:
    """A scripted upstream: each tools/call is answered as an event stream (a progress
    notification, then the response) whose end comes ``end_after_s`` after the response."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, srv: Server) -> None:
        while (body := await srv.read_request(r)) is not None:
            rid = json.loads(body)["id"]
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
            w.write(b"transfer-encoding: chunked\r\n\r\n")
            for msg in (
                {"jsonrpc": "2.0", "method": "notifications/progress",
                 "params": {"progressToken": rid, "progress": 1, "total": 1}},
                {"jsonrpc": "2.0", "id": rid, "result": {"content": [], "structuredContent":
                 {"n": rid}, "isError": False}},
            ):  # fmt: skip
                frame = b"event: message\r\ndata: " + json.dumps(msg).encode() + b"\r\n\r\n"
                w.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                await w.drain()
            await asyncio.sleep(end_after_s)
            w.write(b"0\r\n\r\n")
            await w.drain()

    return handler


async def test_an_event_stream_answer_keeps_its_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The response of an event stream is returned at once; the stream's end, coming a little
    later, is read in the background and the connection serves the next call."""
    async with serving(_sse_answer(end_after_s=0.3)) as srv:
        caller: DirectCaller = direct_caller(srv)
        try:
            for i in range(3):
                progress = Progress()
                with anyio.fail_after(0.25):  # the answer does not wait for the stream's end
                    result = await caller.call_tool("t", {}, meta=None, progress=progress)
                assert isinstance(result, mcp_types.CallToolResult)
                assert result.structured_content is not None and progress.got == [(1, 1, None)]
                with anyio.fail_after(5):
                    await asyncio.gather(*caller._drains)
                assert (srv.connections, caller._pool.opened) == (1, 1), f"call {i}"
        finally:
            await caller.close()
    # a stream that does not end in time loses its connection, as before
    monkeypatch.setattr("toolwire_mcp._direct._DRAIN_S", 0.05)
    async with serving(_sse_answer(end_after_s=1.0)) as srv:
        caller: DirectCaller = direct_caller(srv)
        try:
            for _ in range(2):
                await caller.call_tool("t", {}, meta=None, progress=None)
                with anyio.fail_after(5):
                    await asyncio.gather(*caller._drains)
            assert caller._pool.opened == 2
        finally:
            await caller.close()


async def test_the_http_session_closes_with_the_kernel(upstream: HttpUpstream) -> None:
    async with gateway({"url": upstream.url}) as (k, up):
        caller = up._direct
        assert caller is not None and not caller.closed
        assert (await k.call("up_forecast", {"city": "Nice"})).content is not None
    assert caller.closed and up._direct is None


async def test_one_lost_call_does_not_cut_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection lost under one call (a stale keep-alive, say) leaves the others alone."""
    from toolwire_mcp._direct import DirectCaller
    from toolwire_mcp._wire import Disconnected

    server = HttpUpstream().start()
    try:
        async with gateway({"url": server.url}) as (k, up):
            caller = up._direct
            assert caller is not None
            real = DirectCaller._exchange

            async def exchange(self: DirectCaller, name: str, *args: Any) -> Any:
                if name == "forecast":
                    raise Disconnected("the server closed the connection before its answer")
                return await real(self, name, *args)

            monkeypatch.setattr(DirectCaller, "_exchange", exchange)
            results: dict[str, ToolResult] = {}

            async def run(key: str, tool: str, args: dict[str, Any]) -> None:
                results[key] = await k.call(tool, args)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "slow", "up_slow", {"seconds": 1.0})
                await anyio.sleep(0.3)  # the slow call is on the wire
                tg.start_soon(run, "lost", "up_forecast", {"city": "Oslo"})
            lost = results["lost"]
            assert lost.error is not None and lost.error.kind == "unavailable"
            assert lost.error.details["in_flight"] is True
            assert results["slow"].content == {"result": "slept 1.0"}, results["slow"].error
            assert up._http is caller and not caller.closed
            monkeypatch.setattr(DirectCaller, "_exchange", real)
            r = await call_until_back(k, "up_forecast", {"city": "Oslo"})
            assert r.content == {"result": "sunny in Oslo"}
    finally:
        server.stop()


async def test_a_result_breaking_its_output_schema_is_a_tool_error() -> None:
    """The SDK's output-schema check failing is the tool's fault, not a lost connection."""
    from toolwire_mcp._upstream import _schema_violation

    assert _schema_violation(RuntimeError("Invalid structured content returned by tool x: 5"))
    assert _schema_violation(
        RuntimeError("Tool x has an output schema but did not return structured content")
    )
    assert not _schema_violation(RuntimeError("Connection closed"))
    assert not _schema_violation(ValueError("Invalid structured content returned by tool x"))


#: tools/call answers that are JSON-RPC but carry no valid MCP result, keyed by the ``city``
#: argument that asks the rewriting proxy below for them.
BAD_ANSWERS: dict[str, dict[str, Any]] = {
    "content-not-a-list": {"result": {"resultType": "complete", "content": "nope"}},
    "bogus-block": {"result": {"resultType": "complete", "content": [{"type": "bogus"}]}},
    "null-result": {"result": None},
    "malformed-error": {"error": {"code": "x", "message": 5}},
}


def _rewriting_proxy(target: str, answers: dict[str, dict[str, Any]] = BAD_ANSWERS) -> Any:
    """A scripted front for a real upstream: passes everything on, except tools/call of a
    ``city`` in ``BAD_ANSWERS``, answered with that body instead."""
    import httpx

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, srv: Server
    ) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while (body := await srv.read_request(reader)) is not None:
                head = srv.requests[-1][: len(srv.requests[-1]) - len(body)]
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ")[0]
                headers = [tuple(x.split(": ", 1)) for x in lines[1:] if ": " in x]
                msg = json.loads(body) if body else {}
                city = (msg.get("params") or {}).get("arguments", {}).get("city")
                if msg.get("method") == "tools/call" and city in answers:
                    status, ctype = 200, "application/json"
                    data = json.dumps({"jsonrpc": "2.0", "id": msg["id"], **answers[city]})
                    out = data.encode()
                else:
                    skip = {"host", "content-length", "connection", "transfer-encoding"}
                    fwd = [(k, v) for k, v in headers if k.lower() not in skip]
                    r = await client.request(method, target, content=body, headers=fwd)
                    status, ctype, out = r.status_code, r.headers.get("content-type", ""), r.content
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\n"
                    f"content-length: {len(out)}\r\n\r\n".encode()
                    + out
                )
                await writer.drain()

    return handler


@PATHS
async def test_an_invalid_result_is_a_tool_error_naming_the_server(
    upstream: HttpUpstream, direct: bool
) -> None:
    """Before: a ``tool_error: ValidationError ...`` with no server in it or in its details
    (and on the direct path, a null result or a malformed error object likewise)."""
    async with (
        serving(_rewriting_proxy(upstream.url)) as srv,
        gateway({"url": f"http://127.0.0.1:{srv.port}/mcp"}, direct=direct) as (k, up),
    ):
        invalid = 0
        for city in BAD_ANSWERS:
            r = await k.call("up_forecast", {"city": city})
            assert r.error is not None and r.error.kind == "tool_error", (city, r.error)
            assert r.error.message.startswith("MCP server 'up', tool 'forecast': "), r.error
            assert r.error.details["server"] == "up", (city, r.error.details)
            assert r.error.details["remote_tool"] == "forecast"
            if r.error.details.get("invalid_answer"):
                assert "may have taken effect upstream" in r.error.message, r.error
                invalid += 1
        assert invalid >= 2  # what the answers broke is named, and what to do
        r = await k.call("up_forecast", {"city": "Oslo"})  # and the next call is served
        assert r.content == {"result": "sunny in Oslo"}
        assert up.direct_calls == (len(BAD_ANSWERS) + 1 if direct else 0)


async def test_a_result_breaking_its_output_schema_keeps_what_the_server_answered(
    upstream: HttpUpstream,
) -> None:
    """The call may have taken effect upstream: its answer is kept in the error's details
    (before: only server and remote_tool)."""
    wrong = {
        "result": {
            "resultType": "complete",
            "content": [{"type": "text", "text": "charged card #4242, order 991"}],
            "structuredContent": {"result": 991},  # forecast's schema wants a string
        }
    }
    async with (
        serving(_rewriting_proxy(upstream.url, {"charge": wrong})) as srv,
        gateway({"url": f"http://127.0.0.1:{srv.port}/mcp"}) as (k, _up),
    ):
        r = await k.call("up_forecast", {"city": "charge"})
    assert r.error is not None and r.error.kind == "tool_error", r.error
    assert "Invalid structured content returned by tool forecast" in r.error.message
    assert "details.remote_text" in r.error.message and "may have taken effect" in r.error.message
    assert r.error.details["remote_text"] == "charged card #4242, order 991"
    assert r.error.details["remote_structured_content"] == {"result": 991}
