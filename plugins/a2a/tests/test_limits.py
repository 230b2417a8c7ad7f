"""``max_answer_bytes``: what an agent sends is capped, per answer and per stream event.

A real a2a-sdk agent answers an artifact over the cap; a raw HTTP server on a
loopback port plays the hostile agent (a huge Content-Length, an endless body,
a gzip bomb, an endless event, a huge card). Each fails with the typed error
and nothing of it is kept; the next answer under the cap is taken as usual.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from google.protobuf.json_format import MessageToDict
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
from toolwire_a2a._limits import AnswerTooLarge, AnswerUndecodable, capped_client

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


def _big(value: Any) -> bytes:
    """``value`` as JSON, its "@@" string BOMB_TEXT x's long (valid, and it compresses well)."""
    return json.dumps(value).replace('"@@"', '"' + "x" * BOMB_TEXT + '"').encode()


def _big_message(rid: Any) -> bytes:
    """A valid SendMessage answer: a message whose text is BOMB_TEXT characters."""
    message = {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "@@"}]}
    return _big({"jsonrpc": "2.0", "id": rid, "result": {"message": message}})


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
            return await self._hostile(mode, _big({**card, "description": "@@"}), reader, writer)
        rid = json.loads(body).get("id")
        streaming = "text/event-stream" in headers.get("accept", "")
        mode, self.rpc = self.rpc, None
        if mode is None:
            if streaming:
                writer.write(_whole(_events(), "text/event-stream"))
            else:
                writer.write(_whole(_task_answer(rid), "application/json"))
            return True
        return await self._hostile(mode, _big_message(rid), reader, writer)

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
            stream = _events().split(b"\n\n")[0] + b"\n\ndata: " + b"x" * BOMB_TEXT + b"\n\n"
            writer.write(
                _whole(gzip.compress(stream), "text/event-stream", **{"content-encoding": "gzip"})
            )
            return True
        # endless: a chunked body (or one SSE event, after the task event) that goes on
        ctype = "text/event-stream" if mode == "event" else "application/json"
        writer.write(_head(200, {"content-type": ctype, "transfer-encoding": "chunked"}))
        first = _events().split(b"\n\n")[0] + b"\n\ndata: " if mode == "event" else b"["
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


def hostile_kernel(agent: HostileAgent, **config: Any) -> tuple[Kernel, A2APlugin]:
    cfg = {
        "agents": [{"url": agent.url, "nickname": "hostile"}],
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


# ------------------------------------------------------------- the client alone
def _client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return capped_client(
        limit=LIMIT, setting="here", transport=httpx.MockTransport(handler), timeout=5
    )


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
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
