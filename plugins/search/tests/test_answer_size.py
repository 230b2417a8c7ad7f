"""A provider's answer is capped at max_answer_bytes, decompressed, while it arrives.

A hostile or faulty provider (a public SearXNG instance, a proxy in between) is a
real HTTP server on 127.0.0.1 here, reached through real httpx sockets; the next
backend of the chain is a FakeProvider.
"""

from __future__ import annotations

import json
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from toolwire_search_testkit import E1, load, make_kernel

from toolwire import Kernel
from toolwire_ratelimit.testing import FakeProvider, Reply

pytestmark = pytest.mark.anyio

LIMIT = 65536
_PIECE = 64 * 1024


@dataclass
class Answer:
    """What the server sends: ``body`` (called per request), as it is (``length``:
    with Content-Length, else chunked), under ``headers``."""

    body: Callable[[], Iterable[bytes]]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None


class Provider:
    """A real HTTP server streaming ``answer`` to each request, noting how far it got."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[dict[str, str]] = []
        self.sent = 0  # body bytes written (of the last request)
        self.finished = False  # the whole body was written
        self.hung_up = False  # the client closed the connection before the end
        self.done = threading.Event()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def setup(self) -> None:
                super().setup()
                provider.connections += 1

            def do_GET(self) -> None:
                provider.requests.append({k.lower(): v for k, v in self.headers.items()})
                provider.sent, provider.finished, provider.hung_up = 0, False, False
                provider.done.clear()
                a = provider.answer
                self.send_response(a.status)
                for k, v in {"Content-Type": "application/json", **a.headers}.items():
                    self.send_header(k, v)
                chunked = a.length is None
                self.send_header(
                    *(
                        ("Transfer-Encoding", "chunked")
                        if chunked
                        else ("Content-Length", str(a.length))
                    )
                )
                self.end_headers()
                try:
                    for piece in a.body():
                        self.wfile.write(
                            b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
                        )
                        provider.sent += len(piece)
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                    provider.finished = True
                except (BrokenPipeError, ConnectionResetError):
                    provider.hung_up = True
                    self.close_connection = True
                finally:
                    provider.done.set()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# ------------------------------------------------------------------ bodies
def padded(size: int) -> Iterator[bytes]:
    """A valid SearXNG answer (three results) of exactly ``size`` bytes, made as it is sent."""
    base = json.dumps(load("searxng_search_200.json")).encode()
    head = b'{"padding": "'
    tail = b'", ' + base[1:]
    pad = size - len(head) - len(tail)
    assert pad >= 0
    yield head
    while pad > 0:
        n = min(pad, _PIECE)
        yield b" " * n
        pad -= n
    yield tail


def compressed(pieces: Iterable[bytes], encoding: str) -> Iterator[bytes]:
    """``pieces`` gzip, zlib-wrapped deflate or raw deflate compressed, as they come."""
    wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding]
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    for piece in pieces:
        out = c.compress(piece)
        if out:
            yield out
    yield c.flush()


def answer(size: int, how: str) -> Answer:
    """A SearXNG answer of ``size`` bytes (decompressed) sent ``how``."""
    if how == "length":
        return Answer(lambda: padded(size), length=size)
    if how == "chunked":
        return Answer(lambda: padded(size))
    if how == "raw-deflate-a-byte-first":  # chunked, its first chunk one byte long
        data = b"".join(compressed(padded(size), "raw-deflate"))
        return Answer(lambda: [data[:1], data[1:]], headers={"Content-Encoding": "deflate"})
    if how == "gzip-members":  # a member per piece, as `cat a.gz b.gz` makes
        parts = [b"".join(compressed([p], "gzip")) for p in padded(size)]
        return Answer(lambda: parts, headers={"Content-Encoding": "gzip"})
    data = b"".join(compressed(padded(size), how))
    encoding = "deflate" if how == "raw-deflate" else how
    return Answer(lambda: [data], headers={"Content-Encoding": encoding}, length=len(data))


def kernel_for(searx: Provider, exa: FakeProvider | None = None, **searxng: Any) -> Kernel:
    environ = {"SEARXNG_URL": searx.url}
    search: dict[str, Any] = {
        "chain_order": ["searxng", "exa"],
        "searxng": {"max_answer_bytes": LIMIT, **searxng},
    }
    if exa is not None:
        environ["EXA_API_KEY"] = E1
        search["exa"] = {"base_url": exa.url}
    return make_kernel(environ=environ, search=search, retry={"max_provider_attempts": 1})


# ------------------------------------------------------------------- tests
@pytest.mark.parametrize(
    "how",
    [
        "length",
        "chunked",
        "gzip",
        "deflate",
        "raw-deflate",
        "raw-deflate-a-byte-first",  # before: taken for zlib data, failed as corrupt
        "gzip-members",  # before: the members after the first dropped, the JSON cut
    ],
)
async def test_an_answer_of_max_answer_bytes_is_served(how: str) -> None:
    with Provider(answer(LIMIT, how)) as searx:
        async with kernel_for(searx) as kernel:
            first = await kernel.call("web_search_searxng", {"query": "q"})
            second = await kernel.call("web_search_searxng", {"query": "q"})
    assert not first.is_error, first.error
    assert first.content["served_by"] == "searxng" and len(first.content["results"]) == 3
    assert not second.is_error
    assert searx.connections == 1  # read to its end: the connection is kept for the next call
    assert searx.requests[0]["accept-encoding"] == "gzip, deflate"


@pytest.mark.parametrize(
    ("anyio_backend", "how"),
    [
        ("asyncio", "length"),
        ("asyncio", "chunked"),
        ("asyncio", "gzip"),
        ("asyncio", "deflate"),
        ("trio", "chunked"),
    ],
)
async def test_an_answer_one_byte_over_fails_and_the_next_backend_answers(how: str) -> None:
    with (
        Provider(answer(LIMIT + 1, how)) as searx,
        FakeProvider("exa") as exa,
    ):
        exa.script(Reply(200, json=load("exa_search_200.json")))
        async with kernel_for(searx, exa) as kernel:
            forced = await kernel.call("web_search_searxng", {"query": "q"})
            walked = await kernel.call("web_search", {"query": "q"})
    err = forced.error
    assert err is not None and err.kind == "unavailable", err
    assert err.message.startswith(
        f"searxng (searxng-1): the answer is over max_answer_bytes = {LIMIT} bytes"
    )
    assert "Raise [plugins.search.searxng] max_answer_bytes" in err.message
    assert err.details["answer_too_large"] is True and err.details["max_answer_bytes"] == LIMIT
    assert err.details["backend"] == "searxng"
    if how == "length":  # refused on its Content-Length, before the body
        assert (
            err.details["content_length"] == LIMIT + 1 and "(Content-Length 65537)" in err.message
        )
    assert "padding" not in json.dumps(err.details)  # nothing of the answer is kept
    # the chain falls back, as from any broken answer
    assert [(a.tool, a.error_kind) for a in walked.meta.attempts] == [
        ("web_search", "unavailable"),
        ("web_search_exa", None),
    ]
    assert walked.content["served_by"] == "exa"
    assert walked.content["warnings"][0] == "attempt 1: searxng failed (unavailable, key searxng-1)"
    # the connection of a dropped answer is closed, never reused
    assert searx.connections == 2 and len(searx.requests) == 2


def gzip_then_junk(size: int) -> Answer:
    """A small valid gzip answer, then ``size`` bytes after the end of its stream."""
    data = b"".join(compressed(padded(LIMIT // 2), "gzip"))
    junk = (b"\0" * _PIECE for _ in range(size // _PIECE))
    return Answer(lambda: [data, *junk], headers={"Content-Encoding": "gzip"})


def deflate_of_nothing(size: int) -> Answer:
    """``size`` bytes of deflate data that expand to nothing: empty stored blocks, endlessly."""
    empty = b"\x00\x00\x00\xff\xff" * (_PIECE // 5)
    return Answer(
        lambda: [b"\x78\x9c", *(empty for _ in range(size // len(empty)))],
        headers={"Content-Encoding": "deflate"},
    )


@pytest.mark.parametrize("how", ["length", "chunked", "deflate-of-nothing"])
async def test_a_long_answer_is_not_read_to_its_end(how: str) -> None:
    """Bytes on the wire count too: a compressed answer may not be longer than the cap
    either, even when it decompresses to nothing."""
    size = 64 * 1024 * 1024
    sent = deflate_of_nothing(size) if how == "deflate-of-nothing" else answer(size, how)
    with Provider(sent) as searx:
        async with kernel_for(searx) as kernel:
            res = await kernel.call("web_search_searxng", {"query": "q"})
        assert searx.done.wait(10)
    assert res.error is not None and res.error.details["answer_too_large"] is True
    # the client hung up: the server could not write it all (only what socket buffers hold)
    assert searx.hung_up and not searx.finished and searx.sent < size


@pytest.mark.parametrize("size", [_PIECE, 64 * 1024 * 1024])
async def test_bytes_after_the_end_of_compressed_data_are_a_broken_answer(size: int) -> None:
    """Before: what followed the end of a gzip answer was dropped and the answer taken,
    read on until it passed the cap as sent. The body is not what was compressed: it
    fails as soon as such a byte comes, and the rest is not read."""
    with Provider(gzip_then_junk(size)) as searx:
        async with kernel_for(searx) as kernel:
            res = await kernel.call("web_search_searxng", {"query": "q"})
        assert searx.done.wait(10)
    assert res.error is not None and res.error.kind == "unavailable", res.error
    assert "the answer cannot be read" in res.error.message
    assert "goes on after its compressed stream ends" in res.error.message
    if size > LIMIT:  # the client hung up
        assert searx.hung_up and not searx.finished and searx.sent < size


async def test_a_compressed_answer_cut_short_is_a_broken_answer() -> None:
    """Before: the part decoded was taken as the answer (and blamed as not JSON)."""
    data = b"".join(compressed(padded(LIMIT // 2), "gzip"))[:-10]
    with Provider(Answer(lambda: [data], headers={"Content-Encoding": "gzip"})) as searx:
        async with kernel_for(searx) as kernel:
            res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is not None and res.error.kind == "unavailable", res.error
    assert res.error.message.startswith("searxng (searxng-1): the answer cannot be read: its")
    assert "the gzip body ends before its compressed stream" in res.error.message


async def test_a_gzip_bomb_is_expanded_no_further_than_the_cap() -> None:
    """64 MiB of JSON in 64 KiB of gzip: one network read, that httpx's own decoder
    would expand whole. Read here one step at a time, stopped at the cap (1 MiB)."""
    size, cap = 64 * 1024 * 1024, 1024 * 1024
    bomb = answer(size, "gzip")
    assert bomb.length is not None and bomb.length < 128 * 1024
    with Provider(bomb) as searx:
        async with kernel_for(searx, max_answer_bytes=cap) as kernel:
            tracing = tracemalloc.is_tracing()
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                res = await kernel.call("web_search_searxng", {"query": "q"})
                peak = tracemalloc.get_traced_memory()[1] - base
            finally:
                if not tracing:
                    tracemalloc.stop()
    assert res.error is not None and res.error.details["answer_too_large"] is True
    assert res.error.details["max_answer_bytes"] == cap
    assert peak < 8 * cap, f"{peak} bytes allocated at the peak"


async def test_an_error_answer_is_read_up_to_8_kib() -> None:
    """A 503 with an endless body is classified from its start; the rest is never read."""
    size = 64 * 1024 * 1024
    err = Answer(lambda: padded(size), status=503, headers={"Content-Type": "text/plain"})
    with Provider(err) as searx:
        async with kernel_for(searx) as kernel:
            res = await kernel.call("web_search_searxng", {"query": "q"})
        assert searx.done.wait(10)
    assert res.error is not None and res.error.kind == "unavailable"
    assert res.error.details["status"] == 503 and "HTTP 503" in res.error.message
    assert "answer_too_large" not in res.error.details
    assert searx.hung_up and searx.sent < size


@pytest.mark.parametrize(
    ("encoding", "what"),
    [("br", "Content-Encoding 'br' is not one"), ("gzip", "compressed body is corrupt")],
)
async def test_an_answer_that_cannot_be_decoded_is_a_broken_answer(
    encoding: str, what: str
) -> None:
    """Before: an encoding httpx does not know was passed on as it came (a SearXNG
    instance was then blamed for answering HTML)."""
    body = json.dumps(load("searxng_search_200.json")).encode()
    sent = Answer(lambda: [body], headers={"Content-Encoding": encoding}, length=len(body))
    with Provider(sent) as searx, FakeProvider("exa") as exa:
        exa.script(Reply(200, json=load("exa_search_200.json")))
        async with kernel_for(searx, exa) as kernel:
            forced = await kernel.call("web_search_searxng", {"query": "q"})
            walked = await kernel.call("web_search", {"query": "q"})
    assert forced.error is not None and forced.error.kind == "unavailable"
    assert forced.error.message.startswith("searxng (searxng-1): the answer cannot be read: its")
    assert what in forced.error.message
    assert walked.content["served_by"] == "exa"


async def test_an_answer_dripping_in_is_cut_at_timeout_seconds() -> None:
    """httpx times each read: a provider sending a byte every 0.2 s never trips a 1 s read
    timeout. The whole answer now has ``timeout_seconds``; before, such a call ran on for
    as long as the provider liked."""
    import time

    def drip() -> Iterator[bytes]:
        for _ in range(100):  # 20 s of an answer, a byte at a time
            time.sleep(0.2)
            yield b" "

    with Provider(Answer(drip)) as searx:
        async with kernel_for(searx, timeout_seconds=1) as kernel:
            t0 = time.monotonic()
            r = await kernel.call("web_search_searxng", {"query": "q"})
            took = time.monotonic() - t0
    assert r.error is not None and r.error.kind == "timeout", r.error
    assert "no complete answer within 1s" in r.error.message
    assert took < 10  # cut near 1 s (a busy machine may be slow): not the 20 s of the drip
