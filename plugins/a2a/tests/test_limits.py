"""``max_answer_bytes``: what an agent sends is capped, per answer and per stream event.

A real a2a-sdk agent answers an artifact over the cap; a raw HTTP server on a
loopback port plays the hostile agent (a huge Content-Length, an endless body,
a gzip bomb, an endless event, a huge card). Each fails with the typed error
and nothing of it is kept; the next answer under the cap is taken as usual.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import random
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from a2a.client.transports.http_helpers import parse_sse_stream
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from toolwire_a2a_testkit import (
    FIXTURES,
    RESEARCH,
    KernelFactory,
    Router,
    eventually,
    fixture,
    make_agent,
    make_card,
)

from toolwire import ErrorKind, Kernel
from toolwire_a2a import A2AConfig, A2APlugin
from toolwire_a2a._limits import AnswerTooLarge, AnswerUndecodable, RedirectRefused, capped_client

pytestmark = pytest.mark.anyio

LIMIT = 64 * 1024
CARD_URL = RESEARCH + "/.well-known/agent-card.json"
GLOBAL = "[plugins.a2a] max_answer_bytes"


# ------------------------------------------------------ a real a2a-sdk agent
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("where", ["global", "agent"])
async def test_an_artifact_over_the_cap_fails_that_call_only(
    make_kernel: KernelFactory, router: Router, streaming: bool, where: str
) -> None:
    """Before: the SDK read the answer whole, whatever its size."""
    agent: dict[str, Any] = {"url": RESEARCH, "nickname": "research"}
    config: dict[str, Any] = {"agents": [agent], "streaming": streaming}
    if where == "agent":
        agent["max_answer_bytes"] = LIMIT
        setting = f"max_answer_bytes of the agent {CARD_URL} in [plugins.a2a] agents"
    else:
        config["max_answer_bytes"] = LIMIT
        setting = GLOBAL
    kernel, plugin = await make_kernel(config)

    res = await kernel.call("agent_research", {"query": f"big {3 * LIMIT}"})
    err = res.error
    assert err is not None and err.kind == ErrorKind.TOOL_ERROR, res
    assert not err.retryable  # the same request brings the same answer; it may have acted
    assert err.details["answer_too_large"] is True
    assert err.details["max_answer_bytes"] == LIMIT
    assert err.message.startswith("agent 'research': sending the message: ")
    assert f"the agent's answer is over max_answer_bytes = {LIMIT} bytes ({setting})" in (
        err.message
    )
    assert "may have taken effect on the agent's side" in err.message
    if streaming:  # the task event came first: the error says which task the agent took
        task_id = res.meta.extra["a2a"]["task_id"]
        assert err.details["task_id"] == task_id and err.details["context_id"]
        assert f"the agent had taken the task {task_id!r}" in err.message
        # GetTask answers the same artifact: its answer is over the cap too
        got = await kernel.call("agent_research_task", {"task_id": task_id})
        assert got.error is not None and got.error.details["answer_too_large"] is True
        assert got.error.message.startswith("agent 'research': reading task ")
    # not taken for a lost connection: the agent is up, its next answer is taken
    assert plugin.agents()[CARD_URL]["status"] == "up"
    ok = await kernel.call("agent_research", {"query": f"big {LIMIT // 2}"})
    assert ok.error is None, ok.error
    assert ok.content["text"] == "x" * (LIMIT // 2)
    # every request asked for an uncompressed answer
    assert router.hits and all(h.headers["accept-encoding"] == "identity" for h in router.hits)


@pytest.mark.parametrize("streaming", [False, True])
async def test_the_rest_binding_is_capped_alike(
    make_kernel: KernelFactory, router: Router, streaming: bool
) -> None:
    rest = make_agent("http://rest.test", name="Rest Agent", rest=True)
    router.hosts["rest.test"] = rest.app
    config = {"agents": ["http://rest.test"], "streaming": streaming, "max_answer_bytes": LIMIT}
    kernel, _ = await make_kernel(config)
    res = await kernel.call("agent_rest_agent", {"query": f"big {3 * LIMIT}"})
    assert res.error is not None and res.error.details.get("answer_too_large") is True, res
    assert res.error.kind == ErrorKind.TOOL_ERROR
    ok = await kernel.call("agent_rest_agent", {"query": f"big {LIMIT // 2}"})
    assert ok.error is None and ok.content["text"] == "x" * (LIMIT // 2), ok.error
    sent = [h for h in router.hits if h.host == "rest.test" and h.method == "POST"]
    assert sent[-1].path == ("/message:stream" if streaming else "/message:send")


async def test_the_default_cap_is_32_mib_and_lets_a_large_artifact_through(
    make_kernel: KernelFactory,
) -> None:
    assert A2AConfig().max_answer_bytes == 32 * 1024 * 1024
    kernel, _ = await make_kernel({"agents": [{"url": RESEARCH, "nickname": "research"}]})
    res = await kernel.call("agent_research", {"query": f"big {2 * 1024 * 1024}"})
    assert res.error is None, res.error
    assert len(res.content["text"]) == 2 * 1024 * 1024


# --------------------------------------------------- a hostile raw HTTP agent
TASK_ID = "032af180-8014-4e36-a33d-195749129961"  # the streamed task of the fixture
#: What the hostile answers would be in all: far past the cap, bounded so that a run
#: without the cap ends (and fails) rather than eats the machine.
TOTAL = 64 * 1024 * 1024
BOMB_TEXT = 20 * 1024 * 1024

Writer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, str]], Awaitable[bool]]


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} OK"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


_CHUNKED = {"transfer-encoding": "chunked"}
_KEEPALIVE = b": keep-alive\n\n"


def _whole(body: bytes, ctype: str, **extra: str) -> bytes:
    return _head(200, {"content-type": ctype, "content-length": str(len(body)), **extra}) + body


def _task_answer(rid: Any) -> bytes:
    """A JSON-RPC SendMessage answer: the fixture's completed task."""
    answer = fixture("sendmessage_response_task_v1.json")
    answer["id"] = rid
    return json.dumps(answer).encode()


def _events() -> bytes:
    """The fixture's SSE answer: a task, its progress, its artifact, completed."""
    return (FIXTURES / "sendstreamingmessage_v1.sse.txt").read_bytes()


def _first_event() -> bytes:
    """The first event of the fixture's SSE answer (the task, submitted), with its end
    (the fixture's lines end with CRLF)."""
    return _events().split(b"\r\n\r\n")[0] + b"\r\n\r\n"


def _big(value: Any) -> bytes:
    """``value`` as JSON, its "@@" string BOMB_TEXT x's long (valid, and it compresses well)."""
    return json.dumps(value).replace('"@@"', '"' + "x" * BOMB_TEXT + '"').encode()


def _big_message(rid: Any) -> bytes:
    """A valid SendMessage answer: a message whose text is BOMB_TEXT characters."""
    message = {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "@@"}]}
    return _big({"jsonrpc": "2.0", "id": rid, "result": {"message": message}})


def _sse(rid: Any, results: list[dict[str, Any]]) -> bytes:
    """An SSE answer: one event per JSON-RPC result."""
    events = (json.dumps({"jsonrpc": "2.0", "id": rid, "result": r}) for r in results)
    return "".join(f"data: {e}\n\n" for e in events).encode()


_IDS = {"taskId": TASK_ID, "contextId": "c7cd63b8-1eff-45a2-87a8-0fe541dd0226"}


def _stream_of(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A task's events: taken, ``updates`` (each under the cap), completed."""
    task = {
        "id": TASK_ID,
        "contextId": _IDS["contextId"],
        "status": {"state": "TASK_STATE_WORKING"},
    }
    done = {"statusUpdate": {**_IDS, "status": {"state": "TASK_STATE_COMPLETED"}}}
    return [{"task": task}, *updates, done]


def _appends(n: int, size: int) -> list[dict[str, Any]]:
    """``n`` events adding ``size`` characters each to one artifact, the i-th of letter i."""
    return _stream_of(
        [
            {
                "artifactUpdate": {
                    **_IDS,
                    "append": i > 0,
                    "artifact": {"artifactId": "a", "parts": [{"text": chr(97 + i % 26) * size}]},
                }
            }
            for i in range(n)
        ]
    )


def _artifacts(n: int, size: int) -> list[dict[str, Any]]:
    """``n`` events each bringing an artifact of its own of ``size`` characters."""
    return _stream_of(
        [
            {
                "artifactUpdate": {
                    **_IDS,
                    "artifact": {"artifactId": f"a{i}", "parts": [{"text": "y" * size}]},
                }
            }
            for i in range(n)
        ]
    )


def _statuses(n: int, size: int) -> list[dict[str, Any]]:
    """``n`` progress events, each a status message of ``size`` characters (each replaces
    the one before), then a small artifact."""
    said = {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "z" * size}]}
    working = {"state": "TASK_STATE_WORKING", "message": said}
    art = {"artifactId": "r", "name": "report", "parts": [{"text": "done"}]}
    return _stream_of(
        [{"statusUpdate": {**_IDS, "status": working}} for _ in range(n)]
        + [{"artifactUpdate": {**_IDS, "artifact": art}}]
    )


#: Streams of events each under the cap: the first two keep 32 times the cap in all.
_STREAMS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "appends": lambda: _appends(64, LIMIT // 2),
    "artifacts": lambda: _artifacts(64, LIMIT // 2),
    "small-appends": lambda: _appends(200, 100),
    "statuses": lambda: _statuses(64, LIMIT // 2),
}
#: How the "drip" modes send: each piece well within request_timeout_s (DRIP_TIMEOUT),
#: the whole five times past it.
DRIP_TIMEOUT = 1.0
DRIP_PIECES = 25
DRIP_EVERY = 0.2


class HostileAgent:
    """An A2A agent on a loopback port that answers what the test says.

    ``card`` / ``rpc``: how the next card request / JSON-RPC request is answered (a mode
    name, used once; then a proper answer). ``cut``: how many answers the client cut
    off before the server had written them whole.
    """

    def __init__(self) -> None:
        self.card: str | None = None
        self.rpc: str | None = None
        self.cut = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.url = ""
        self.redirect_to = ""  # where the "redirect" modes send the client
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> HostileAgent:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (line.split(":", 1) for line in head[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((method, path, headers))
                if not await self._answer(path, headers, body, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(
        self,
        path: str,
        headers: dict[str, str],
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if path.endswith("agent-card.json"):
            mode, self.card = self.card, None
            card = MessageToDict(make_card(self.url, name="Hostile"))
            if mode is None:
                writer.write(_whole(json.dumps(card).encode(), "application/json"))
                return True
            if mode in ("drip", "redirect"):
                return await self._slow_or_sent_on(mode, json.dumps(card).encode(), writer)
            return await self._hostile(mode, _big({**card, "description": "@@"}), reader, writer)
        rid = json.loads(body).get("id")
        streaming = "text/event-stream" in headers.get("accept", "")
        mode, self.rpc = self.rpc, None
        if mode in ("drip", "redirect"):
            if json.loads(body).get("method") in ("GetTask", "CancelTask"):
                task = {**fixture("gettask_response_v1.json"), "id": rid}
                return await self._slow_or_sent_on(mode, json.dumps(task).encode(), writer)
            return await self._slow_or_sent_on(mode, _task_answer(rid), writer)
        if mode == "linger":  # the whole answer, then the stream stays open (keep-alives)
            writer.write(_head(200, {"content-type": "text/event-stream", **_CHUNKED}))
            events = _events()
            writer.write(b"%x\r\n%s\r\n" % (len(events), events))
            try:
                while True:
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    writer.write(b"%x\r\n%s\r\n" % (len(_KEEPALIVE), _KEEPALIVE))
            except ConnectionError:
                self.cut += 1
                return False
        if mode == "charset":  # a proper UTF-8 stream, declared UTF-16
            writer.write(_whole(_events(), "text/event-stream; charset=utf-16-le"))
            return True
        if mode == "utf-16":  # a stream really in UTF-16, as declared
            text = _events().decode()
            writer.write(_whole(text.encode("utf-16"), "text/event-stream; charset=utf-16"))
            return True
        if mode == "br":  # compressed with a coding toolwire does not read
            writer.write(_whole(b"\x1b\x00\x00", "application/json", **{"content-encoding": "br"}))
            return True
        if mode in _STREAMS:
            writer.write(_whole(_sse(rid, _STREAMS[mode]()), "text/event-stream"))
            return True
        if mode is None:
            if streaming:
                writer.write(_whole(_events(), "text/event-stream"))
            else:
                writer.write(_whole(_task_answer(rid), "application/json"))
            return True
        return await self._hostile(mode, _big_message(rid), reader, writer)

    async def _slow_or_sent_on(self, mode: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """``drip``: ``body`` in DRIP_PIECES pieces, one each DRIP_EVERY seconds (each read
        well within request_timeout_s, the whole far past it); ``redirect``: a 307 to
        ``redirect_to``."""
        if mode == "redirect":
            writer.write(_head(307, {"location": self.redirect_to, "content-length": "0"}))
            return True
        writer.write(
            _head(200, {"content-type": "application/json", "content-length": str(len(body))})
        )
        step = -(-len(body) // DRIP_PIECES)
        try:
            for i in range(0, len(body), step):
                writer.write(body[i : i + step])
                await writer.drain()
                await asyncio.sleep(DRIP_EVERY)
        except ConnectionError:
            self.cut += 1
            return False
        return True

    async def _hostile(
        self, mode: str, big: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer ``mode``; False: the connection is done."""
        if mode == "declared":  # a Content-Length of 10 GB, and the body never comes
            declared = {"content-type": "application/json", "content-length": str(10**10)}
            writer.write(_head(200, declared))
            writer.write(b'{"jsonrpc": "2.0", ')
            await writer.drain()
            await reader.read()  # until the client hangs up
            self.cut += 1
            return False
        if mode == "gzip":  # a small body expanding a thousandfold, sent though not asked
            writer.write(
                _whole(gzip.compress(big), "application/json", **{"content-encoding": "gzip"})
            )
            return True
        if mode == "gzip-event":
            stream = _first_event() + b"data: " + b"x" * BOMB_TEXT + b"\n\n"
            writer.write(
                _whole(gzip.compress(stream), "text/event-stream", **{"content-encoding": "gzip"})
            )
            return True
        # endless: a chunked body (or one SSE event, after the task event) that goes on
        ctype = "text/event-stream" if mode == "event" else "application/json"
        writer.write(_head(200, {"content-type": ctype, "transfer-encoding": "chunked"}))
        first = _first_event() + b"data: " if mode == "event" else b"["
        writer.write(b"%x\r\n%s\r\n" % (len(first), first))
        part = b"x" * (256 * 1024)
        try:
            for _ in range(TOTAL // len(part)):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self.cut += 1
            return False
        return True


@pytest.fixture
async def hostile() -> AsyncIterator[HostileAgent]:
    async with HostileAgent() as agent:
        yield agent


def hostile_kernel(
    agent: HostileAgent, headers: dict[str, str] | None = None, **config: Any
) -> tuple[Kernel, A2APlugin]:
    cfg = {
        "agents": [{"url": agent.url, "nickname": "hostile", "headers": headers or {}}],
        "refresh_interval_s": 0,
        "max_answer_bytes": LIMIT,
        **config,
    }
    plugin = A2APlugin(A2AConfig.model_validate(cfg))
    return Kernel(plugins=[plugin]), plugin


@pytest.mark.parametrize(
    ("mode", "streaming"),
    [
        ("declared", False),
        ("endless", False),
        ("gzip", False),
        ("endless", True),  # a streaming request answered with a plain (endless) body
        ("event", True),
        ("gzip-event", True),
    ],
)
async def test_a_hostile_answer_fails_with_the_typed_error_and_the_next_call_works(
    hostile: HostileAgent, mode: str, streaming: bool
) -> None:
    """Before: a declared 10 GB body was waited for, an endless one read on, a gzip bomb
    expanded, an endless event held line by line: all in the process's memory."""
    kernel, plugin = hostile_kernel(hostile, streaming=streaming)
    async with kernel:
        hostile.rpc = mode
        with anyio.fail_after(30):  # bounds a hang, not a speed
            res = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        err = res.error
        assert err is not None and err.kind == ErrorKind.TOOL_ERROR, res
        assert err.details["answer_too_large"] is True, err
        assert err.details["max_answer_bytes"] == LIMIT
        assert f"over max_answer_bytes = {LIMIT} bytes ({GLOBAL})" in err.message
        assert "malformed" not in str(err.details)
        if mode in ("event", "gzip-event"):
            assert err.details["task_id"] == TASK_ID
        if mode in ("declared", "endless", "event"):
            # the client hung up on the answer: it was not read to its end
            await eventually(lambda: hostile.cut == 1)
        with anyio.fail_after(30):
            ok = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        assert ok.error is None, ok.error
        assert ok.content["text"] == "Findings on: solid-state batteries"
        assert plugin.agents()[hostile.url + "/.well-known/agent-card.json"]["status"] == "up"
    assert all(h["accept-encoding"] == "identity" for _, _, h in hostile.requests)


async def test_a_stream_left_open_after_the_answer_does_not_hold_the_result(
    hostile: HostileAgent,
) -> None:
    """Before: the call read the stream until the agent closed it: one that stayed open
    after the task completed (keep-alives) held the finished result until the call's
    timeout, then gave a `timeout` — or, without one, held it for ever."""
    kernel, _ = hostile_kernel(hostile)
    async with kernel:
        hostile.rpc = "linger"
        with anyio.fail_after(30):  # bounds a hang, not a speed
            res = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        assert res.error is None, res.error
        assert res.content["state"] == "completed"
        assert res.content["text"] == "Findings on: solid-state batteries"
        await eventually(lambda: hostile.cut == 1)  # the client hung up on the stream


@pytest.mark.parametrize("mode", ["declared", "endless", "gzip"])
async def test_a_card_over_the_cap_is_not_read_and_a_later_one_is(
    hostile: HostileAgent, mode: str
) -> None:
    """Before: a card of any size (or a gzip bomb) was read into memory."""
    kernel, plugin = hostile_kernel(hostile)
    card_url = hostile.url + "/.well-known/agent-card.json"
    hostile.card = mode
    async with kernel:
        assert kernel.get_tool("agent_hostile") is None
        error = plugin.agents()[card_url]["last_error"]
        assert error == (
            f"GET {card_url}: the answer is over max_answer_bytes = {LIMIT} bytes "
            f"({GLOBAL}); it was dropped"
        )
        assert await plugin.refresh()  # a card under the cap: the tools appear
        assert kernel.get_tool("agent_hostile") is not None
        assert plugin.agents()[card_url]["last_error"] is None


async def test_a_registry_listing_over_the_cap_is_not_read(hostile: HostileAgent) -> None:
    hostile.card = "endless"  # the listing's URL is the hostile server's card path
    cfg = {
        "registry": {"url": hostile.url + "/.well-known/agent-card.json"},
        "refresh_interval_s": 0,
        "max_answer_bytes": LIMIT,
    }
    plugin = A2APlugin(A2AConfig.model_validate(cfg))
    async with Kernel(plugins=[plugin]):
        assert plugin._registry_error is not None
        assert f"over max_answer_bytes = {LIMIT} bytes ({GLOBAL})" in plugin._registry_error


@pytest.mark.parametrize("mode", ["appends", "artifacts"])
async def test_a_stream_keeps_no_more_than_the_cap_in_all(hostile: HostileAgent, mode: str) -> None:
    """Before: each event was capped, but the call kept every one: 64 events of half the
    cap (appended to one artifact, or each an artifact) kept 32 times the cap."""
    kernel, _ = hostile_kernel(hostile, streaming=True)
    async with kernel:
        hostile.rpc = mode
        res = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        err = res.error
        assert err is not None and err.kind == ErrorKind.TOOL_ERROR, res
        assert err.details["answer_too_large"] is True, err
        assert err.details["max_answer_bytes"] == LIMIT
        assert err.details["task_id"] == TASK_ID
        assert err.message.startswith(
            "agent 'hostile': sending the message: what the agent's stream sent adds up to "
            f"more than max_answer_bytes = {LIMIT} bytes ({GLOBAL}); it was dropped."
        )
        assert f"the agent had taken the task {TASK_ID!r}" in err.message
        ok = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        assert ok.error is None, ok.error


async def test_a_stream_within_the_cap_in_all_is_kept_whole(hostile: HostileAgent) -> None:
    """Many small appends arrive whole, in order; progress messages replace each other, so
    a long task's progress (64 x half the cap here) does not add up."""
    kernel, _ = hostile_kernel(hostile, streaming=True)
    async with kernel:
        hostile.rpc = "small-appends"
        res = await kernel.call("agent_hostile", {"query": "q"})
        assert res.error is None, res.error
        assert res.content["text"] == "\n".join(chr(97 + i % 26) * 100 for i in range(200))
        hostile.rpc = "statuses"
        res = await kernel.call("agent_hostile", {"query": "q"})
        assert res.error is None, res.error
        assert res.content["state"] == "completed" and res.content["text"] == "done"


async def test_an_event_stream_declaring_another_charset_is_read_as_utf8(
    hostile: HostileAgent,
) -> None:
    """SSE is UTF-8 by definition. Before: a UTF-8 stream declared UTF-16 was decoded as
    UTF-16 (nonsense to the parser); a UTF-16 one got past the cap (below)."""
    kernel, _ = hostile_kernel(hostile, streaming=True)
    async with kernel:
        hostile.rpc = "charset"
        res = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        assert res.error is None, res.error
        assert res.content["text"] == "Findings on: solid-state batteries"


async def test_a_card_sent_slowly_fails_within_request_timeout_s(hostile: HostileAgent) -> None:
    """Before: request_timeout_s bounded each read only; a card sent a piece at a time
    held the kernel's startup for as long as the agent liked (5 s here, past 1 s)."""
    kernel, plugin = hostile_kernel(hostile, request_timeout_s=DRIP_TIMEOUT)
    card_url = hostile.url + "/.well-known/agent-card.json"
    hostile.card = "drip"
    with anyio.fail_after(30):  # bounds a hang, not a speed
        async with kernel:
            assert kernel.get_tool("agent_hostile") is None
            assert plugin.agents()[card_url]["last_error"] == (
                f"GET {card_url} timed out: no complete answer within 1s (request_timeout_s)"
            )
            await eventually(lambda: hostile.cut == 1)  # the client hung up
            assert await plugin.refresh()
            assert kernel.get_tool("agent_hostile") is not None


@pytest.mark.parametrize("call", ["get_task", "cancel", "hands_off"])
async def test_answers_due_at_once_come_whole_within_request_timeout_s(
    hostile: HostileAgent, call: str
) -> None:
    """GetTask, CancelTask and a hands-off SendMessage: before, an answer sent a piece at a
    time (each within request_timeout_s) held the call for as long as the agent liked."""
    kernel, _ = hostile_kernel(hostile, request_timeout_s=DRIP_TIMEOUT)
    args: dict[str, Any] = {"task_id": TASK_ID}
    tool, action = "agent_hostile_task", f"reading task {TASK_ID!r}"
    if call == "cancel":
        args["cancel"] = True
        action = f"canceling task {TASK_ID!r}"
    elif call == "hands_off":
        tool, args = "agent_hostile", {"query": "q", "hands_off": True}
        action = "sending the message (hands-off)"
    async with kernel:
        hostile.rpc = "drip"
        with anyio.fail_after(30):  # bounds a hang, not a speed
            res = await kernel.call(tool, args)
        err = res.error
        assert err is not None and err.kind == ErrorKind.TIMEOUT, res
        assert err.message.startswith(
            f"agent 'hostile': {action}: no complete answer within request_timeout_s = 1s "
            "(the agent is slow, or sends its answer slowly); try again later, or raise "
            "plugins.a2a.request_timeout_s."
        )
        assert ("may have taken effect" in err.message) == (call != "get_task")
        assert err.details["request_timeout_s"] == DRIP_TIMEOUT
        await eventually(lambda: hostile.cut == 1)  # the client hung up
        if call != "cancel":  # (the raw agent answers GetTask with a task: not for SendMessage)
            ok = await kernel.call(tool, args)
            assert ok.error is None, ok.error


async def test_a_redirect_to_another_origin_is_not_followed(hostile: HostileAgent) -> None:
    """Before: a redirect to another host was followed with the agent's headers (httpx
    drops Authorization only): an API key went to whatever host the agent named."""
    card_url = hostile.url + "/.well-known/agent-card.json"
    async with HostileAgent() as other:
        kernel, plugin = hostile_kernel(hostile, headers={"X-Api-Key": "s3cret"})
        hostile.redirect_to = other.url + "/.well-known/agent-card.json"
        hostile.card = "redirect"
        async with kernel:
            assert kernel.get_tool("agent_hostile") is None
            assert plugin.agents()[card_url]["last_error"] == (
                f"GET {card_url} was redirected (HTTP 307) to another origin, "
                f"{hostile.redirect_to}; toolwire follows redirects within the origin only, "
                "so that the agent's headers (its credentials) do not go elsewhere: configure "
                "the URL it redirects to if you trust that host"
            )
            assert await plugin.refresh()
            hostile.redirect_to, hostile.rpc = other.url + "/", "redirect"
            res = await kernel.call("agent_hostile", {"query": "q"})
            err = res.error
            assert err is not None and err.kind == ErrorKind.TOOL_ERROR, res
            assert err.details["reason"] == "redirect_refused"
            assert err.details["location"] == other.url + "/"
            assert err.message.startswith(
                f"agent 'hostile': sending the message: POST {hostile.url}/a2a/jsonrpc was redirected "
                f"(HTTP 307) to another origin, {other.url}/;"
            )
            ok = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
            assert ok.error is None, ok.error
        assert other.requests == []
    assert len(hostile.requests) == 4  # two cards, two calls
    assert all(h["x-api-key"] == "s3cret" for _, _, h in hostile.requests)


# ------------------------------------------------------------- the client alone
def _client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return capped_client(
        limit=LIMIT, setting="here", transport=httpx.MockTransport(handler), timeout=5
    )


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.sent = 0  # bytes the client took

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            self.sent += len(c)
            yield c


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def _read(client: httpx.AsyncClient, headers: dict[str, str], into: list[bytes]) -> None:
    async with client.stream("POST", "http://a/rpc", headers=headers) as r:
        async for c in r.aiter_bytes():
            into.append(c)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("chunk", [1, 7, 4096, 10**9])
async def test_a_stream_is_capped_per_event_whatever_its_line_endings(
    ending: bytes, chunk: int
) -> None:
    """Many events under the cap pass whole, however the reads split them (an event's end
    across two reads included); one event over the cap stops the stream."""
    event = b"data: " + b"y" * (LIMIT - 16) + ending + ending
    stream = event * 5
    chunks: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        # its length (a proxy may buffer a stream whole) is not one event's
        length = str(sum(map(len, chunks)))
        headers = {"content-type": "text/event-stream", "content-length": length}
        return httpx.Response(200, headers=headers, stream=Chunks(chunks))

    sse = {"accept": "text/event-stream"}
    async with _client(answer) as client:
        chunks[:] = _split(stream, chunk)
        async with client.stream("POST", "http://a/rpc", headers=sse) as r:
            assert b"".join([c async for c in r.aiter_bytes()]) == stream
        chunks[:] = _split(event + b"data: " + b"z" * LIMIT + ending + ending + event, chunk)
        got: list[bytes] = []
        with pytest.raises(AnswerTooLarge) as info:
            await _read(client, sse, got)
        assert info.value.limit == LIMIT and info.value.setting == "here"
        # stopped within the event over the cap
        assert len(b"".join(got)) <= len(event) + LIMIT + 8
        # the same stream not asked for as a stream: capped whole
        chunks[:] = _split(stream, chunk)
        with pytest.raises(AnswerTooLarge):
            await client.post("http://a/rpc")


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
async def test_compressed_answers_are_decoded_under_the_cap_and_stopped_past_it(
    coding: str,
) -> None:
    def compress(data: bytes) -> bytes:
        if coding == "gzip":
            return gzip.compress(data)
        if coding == "deflate":
            return zlib.compress(data)
        obj = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return obj.compress(data) + obj.flush()

    body = b"{}" + b" " * (LIMIT - 2)
    wire = coding.removeprefix("raw-")

    def answer(request: httpx.Request) -> httpx.Response:
        data = body + (b" " if request.url.path == "/over" else b"")
        return httpx.Response(
            200, headers={"content-encoding": wire}, stream=Chunks(_split(compress(data), 3))
        )

    async with _client(answer) as client:
        r = await client.get("http://a/at")
        assert r.content == body and "content-encoding" not in r.headers
        with pytest.raises(AnswerTooLarge):
            await client.get("http://a/over")


async def test_other_codings_are_refused_and_bodiless_answers_pass() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/br":
            return httpx.Response(200, headers={"content-encoding": "br"}, content=b"\x1b")
        if request.url.path == "/twice":
            return httpx.Response(200, headers={"content-encoding": "gzip, gzip"}, content=b"")
        # a 304 may repeat the Content-Length of what it stands for
        return httpx.Response(304, headers={"content-length": str(10 * LIMIT)})

    async with _client(answer) as client:
        with pytest.raises(AnswerUndecodable, match="Content-Encoding 'br'"):
            await client.get("http://a/br")
        with pytest.raises(AnswerUndecodable, match="'gzip, gzip'"):
            await client.get("http://a/twice")
        assert (await client.get("http://a/card")).status_code == 304


@pytest.mark.parametrize("per_event", [False, True])
async def test_bytes_after_the_end_of_compressed_data_fail_the_answer(per_event: bool) -> None:
    """Before: bytes after the end of a gzip body were dropped and the answer taken (and,
    earlier still, read for as long as the server sent them). The body is not what was
    compressed: it fails as soon as such a byte comes, and the rest is not read."""
    body = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
    packed = gzip.compress(body)
    stream = Chunks([packed] + [b"\0" * 65536] * 64)

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-encoding": "gzip", "content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=stream)

    async with _client(answer) as client:
        with pytest.raises(AnswerUndecodable, match="goes on after its compressed stream ends"):
            await _read(client, {"accept": "text/event-stream"} if per_event else {}, [])
    assert stream.sent == len(packed) + 65536


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_compressed_answer_cut_short_fails(coding: str) -> None:
    """Before: a body ending inside its compressed data passed as what had been decoded
    (a JSON answer then failed to parse; an event stream lost its end silently)."""
    body = b'{"jsonrpc": "2.0", "id": 1, "result": {"kind": "task"}}'
    packed = (gzip.compress if coding == "gzip" else zlib.compress)(body)[:-5]

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-encoding": coding}, stream=Chunks([packed]))

    async with _client(answer) as client:
        with pytest.raises(AnswerUndecodable, match=f"the {coding} body ends before"):
            await client.get("http://a/rpc")


async def test_a_gzip_answer_of_several_members_is_read_whole() -> None:
    """Before: the members after the first were dropped as if bytes after the end."""
    body = b'{"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "id": "t"}}'
    packed = gzip.compress(body[:20]) + gzip.compress(body[20:])

    def answer(request: httpx.Request) -> httpx.Response:
        stream = Chunks(_split(packed, 7))
        return httpx.Response(200, headers={"content-encoding": "gzip"}, stream=stream)

    async with _client(answer) as client:
        assert (await client.get("http://a/rpc")).content == body


@pytest.mark.parametrize("per_event", [False, True])
async def test_compressed_bytes_count_as_sent_too(per_event: bool) -> None:
    """Deflate blocks that expand to nothing (empty stored blocks, endlessly): before, the
    body was read for as long as it came; now past the cap as sent, it stops."""
    stream = Chunks(_split(b"\x78\x9c" + b"\x00\x00\x00\xff\xff" * (1024 * 1024), 4096))

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-encoding": "deflate", "content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=stream)

    async with _client(answer) as client:
        with pytest.raises(AnswerTooLarge):
            await _read(client, {"accept": "text/event-stream"} if per_event else {}, [])
    assert LIMIT < stream.sent <= LIMIT + 4096


async def test_a_compressed_stream_past_the_cap_as_sent_passes_event_by_event() -> None:
    """The bytes as sent are counted per event too: a long stream may add up past the cap."""
    rnd = random.Random(0)  # data that compresses little, so that the stream is long as sent
    stream = b"".join(
        b"data: " + base64.b64encode(rnd.randbytes(LIMIT // 4)) + b"\n\n" for _ in range(12)
    )
    packed = gzip.compress(stream)
    assert len(packed) > 2 * LIMIT

    def answer(request: httpx.Request) -> httpx.Response:
        chunks = Chunks(_split(packed, 4096))
        headers = {"content-encoding": "gzip", "content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=chunks)

    got: list[bytes] = []
    async with _client(answer) as client:
        await _read(client, {"accept": "text/event-stream"}, got)
    assert b"".join(got) == stream


async def test_an_event_stream_is_read_as_utf8_whatever_charset_it_declares() -> None:
    """Before: the SDK's parser decoded the declared charset. In UTF-16, U+0A0A is the bytes
    0A 0A: event ends to the cap, no line break to the parser, which read one event four
    times the cap."""
    bodies = {
        "/utf-16": ("utf-16-le", ("data: " + "\u0a0a" * 4 * LIMIT + "\n\n").encode("utf-16-le")),
        "/latin-1": ("iso-8859-1", "data: é\n\n".encode()),
    }

    def answer(request: httpx.Request) -> httpx.Response:
        charset, body = bodies[request.url.path]
        headers = {"content-type": f"text/event-stream; charset={charset}"}
        return httpx.Response(200, headers=headers, content=body)

    sse = {"accept": "text/event-stream"}
    async with _client(answer) as client:
        async with client.stream("POST", "http://a/utf-16", headers=sse) as r:
            events = [data async for _, data in parse_sse_stream(r)]
        assert all(len(data.encode()) <= LIMIT for data in events)
        async with client.stream("POST", "http://a/latin-1", headers=sse) as r:
            assert [data async for _, data in parse_sse_stream(r)] == ["é"]


async def test_redirects_are_followed_within_the_origin_only() -> None:
    """Before: followed anywhere, with the agent's headers (an API key here)."""
    seen: list[httpx.Request] = []
    moves = {
        "http://a/moved": "/card",
        "http://a/up": "https://a/card",  # http to https on the same host, as httpx allows
        "http://a/away": "http://b/card",
        "http://a/port": "http://a:8080/card",
        "https://a/down": "http://a/card",
    }

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        to = moves.get(str(request.url))
        return httpx.Response(302, headers={"location": to}) if to else httpx.Response(200)

    client = capped_client(
        limit=LIMIT,
        setting="here",
        transport=httpx.MockTransport(answer),
        headers={"X-Api-Key": "s3cret"},
        timeout=5,
    )
    async with client:
        for start, end in [("http://a/moved", "http://a/card"), ("http://a/up", "https://a/card")]:
            r = await client.get(start)
            assert r.status_code == 200 and str(r.url) == end
            assert seen[-1].headers["x-api-key"] == "s3cret"
        for start in ["http://a/away", "http://a/port", "https://a/down"]:
            seen.clear()
            with pytest.raises(RedirectRefused) as info:
                await client.get(start)
            assert str(info.value.target) == moves[start] and info.value.status == 302
            assert str(info.value).startswith(
                f"GET {start} was redirected (HTTP 302) to another origin, {moves[start]};"
            )
            assert [str(q.url) for q in seen] == [start]  # the other origin was not asked


@pytest.mark.parametrize(
    ("mode", "streaming", "says"),
    [
        ("utf-16", True, "event stream is not UTF-8 (declared charset=utf-16; it holds NUL bytes"),
        ("br", False, "Content-Encoding 'br'"),
        ("br", True, "Content-Encoding 'br'"),
    ],
)
async def test_an_answer_toolwire_cannot_read_says_why_and_the_next_call_works(
    hostile: HostileAgent, mode: str, streaming: bool, says: str
) -> None:
    """Before: a stream really in UTF-16 came out as "the agent's answer contained neither
    a task nor a message", and a coding not read here as "not A2A 1.0 JSON-RPC: check the
    card's URL": neither said what was wrong."""
    kernel, _ = hostile_kernel(hostile, streaming=streaming)
    async with kernel:
        hostile.rpc = mode
        res = await kernel.call("agent_hostile", {"query": "q"})
        err = res.error
        assert err is not None and err.kind == ErrorKind.TOOL_ERROR, res
        assert err.details["reason"] == "undecodable_answer", err
        assert says in err.message, err.message
        assert "may have taken effect" in err.message
        ok = await kernel.call("agent_hostile", {"query": "solid-state batteries"})
        assert ok.error is None, ok.error
        assert ok.content["text"] == "Findings on: solid-state batteries"


async def test_json_nested_too_deeply_is_a_failed_read_not_a_recursion_error(
    make_kernel: KernelFactory, router: Router
) -> None:
    """Before: a registry listing of 400 KB of nested brackets (well under the cap) raised
    RecursionError out of the refresh, before any card was read: the configured agents got
    no tools at startup and never did, and ``plugin.refresh()`` raised it."""
    deep = "[" * 200_000 + "]" * 200_000

    async def listing(_: Request) -> Response:
        return Response(deep, media_type="application/json")

    async def answer(_: Request) -> Response:
        body = '{"jsonrpc": "2.0", "id": 1, "result": ' + deep + "}"
        return Response(body, media_type="application/json")

    router.hosts["registry.test"] = Starlette(routes=[Route("/agents", listing)])
    router.hosts["deep.test"] = Starlette(
        routes=[
            Route("/.well-known/agent-card.json", listing),
            Route("/a2a/jsonrpc", answer, methods=["POST"]),
        ]
    )
    config = {
        "agents": {"research": RESEARCH, "deep": "http://deep.test"},
        "registry": {"url": "http://registry.test/agents"},
        "streaming": False,
    }
    kernel, plugin = await make_kernel(config)
    assert kernel.get_tool("agent_research") is not None
    assert "nested too deeply" in str(plugin._registry_error)
    deep_card = plugin.agents()["http://deep.test/.well-known/agent-card.json"]
    assert "answered JSON nested too deeply to read" in deep_card["last_error"]
    assert await plugin.refresh() is False

    # an agent whose answer is nested so deeply: the call fails as a malformed answer
    router.hosts["research.test"] = router.hosts["deep.test"]
    res = await kernel.call("agent_research", {"query": "x"})
    assert res.is_error and res.error is not None
    assert res.error.details["reason"] == "malformed_answer", res.error
    assert "nested too deeply" in res.error.message
