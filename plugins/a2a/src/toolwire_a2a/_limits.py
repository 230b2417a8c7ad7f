"""A cap on what an agent (or a registry) may send: ``max_answer_bytes``.

The a2a-sdk client reads a JSON-RPC answer whole (``response.json()``) and an
SSE event line by line with no bound, and httpx expands a compressed body
before anyone counts it: one faulty or hostile agent could exhaust the process.
``capped_client`` builds the ``httpx.AsyncClient`` the plugin hands to the SDK
(and reads cards and the registry with): every response body it receives is
counted as it arrives, decompressed, and stops with ``AnswerTooLarge`` past the
cap. A body is capped whole; an event stream answering a streaming request
(``Accept: text/event-stream``) is capped per event, since a long task may
stream for long. Nothing of a stopped body is kept, and its connection is
closed (not put back in the pool); the client's other requests go on.

The client asks for ``Accept-Encoding: identity``, so the bytes counted are the
bytes kept. A server that compresses anyway (gzip, deflate) is decompressed
here by ``toolwire.decoding``, never more than ``_STEP`` bytes at a time, and
counted as it expands and as it was sent (a body, or the bytes since the last
event end, over the cap as sent is too large too). Corrupt compressed data, a
body cut short inside it, or bytes after its end (other than a further gzip
member) are ``AnswerUndecodable``, raised as soon as known; so is any other
coding, rather than expanded unbounded.

An event stream is read as UTF-8 whatever charset it declares (SSE is UTF-8 by
definition): the bytes the cap splits into events are the text the SDK's parser
splits into lines. A stream holding a NUL byte is refused (``AnswerUndecodable``):
A2A events are JSON, which has no raw NUL, so it is text in UTF-16 or UTF-32
(where every ASCII character carries one), not a stream the parser could read.

Redirects are followed within the origin only (and from http to https on the
same host, as httpx keeps credentials there): the client carries the agent's
configured headers, which must not go to another host. A redirect elsewhere
fails with ``RedirectRefused``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Final, cast

import httpx

from toolwire.decoding import Decoder, DecodingError, UnsupportedEncoding, content_coding

__all__ = ["AnswerTooLarge", "AnswerUndecodable", "RedirectRefused", "capped_client"]

#: The most bytes one step of decompression may produce.
_STEP: Final = 64 * 1024
#: Statuses whose answer has no body whatever its Content-Length says.
_NO_BODY: Final = frozenset({204, 304})
#: Where an SSE event ends: a line ending followed by an empty line's (CRLF, LF and CR
#: all end lines; ``\r\n`` alone ends one line only).
_EVENT_END: Final = re.compile(rb"\n[\r\n]|\r\r")


class AnswerTooLarge(Exception):
    """An answer (a body, or one event of a stream) over ``limit`` bytes, decompressed;
    or (``kept``) the events of one stream adding up to more than ``limit`` bytes kept.

    ``setting`` says where the limit was set (for the error message). Nothing of
    the answer was kept; its connection was closed. The request may have taken
    effect on the other side.
    """

    def __init__(self, limit: int, setting: str, *, kept: bool = False) -> None:
        what = "the stream's events add up to more than" if kept else "the answer is over"
        super().__init__(f"{what} max_answer_bytes = {limit} bytes")
        self.limit = limit
        self.setting = setting
        self.kept = kept


class AnswerUndecodable(ValueError):
    """An answer that could not be read: compressed with a coding not supported, corrupt
    compressed data, or an event stream not in UTF-8. The agent was reached."""


class RedirectRefused(Exception):
    """An answer redirecting to another origin (``target``), not followed: the request
    carried the agent's configured headers, which must not go there."""

    def __init__(self, method: str, url: httpx.URL, status: int, target: httpx.URL) -> None:
        super().__init__(
            f"{method} {url} was redirected (HTTP {status}) to another origin, {target}; "
            "toolwire follows redirects within the origin only, so that the agent's "
            "headers (its credentials) do not go elsewhere: configure the URL it redirects "
            "to if you trust that host"
        )
        self.status = status
        self.target = target


def _port(url: httpx.URL) -> int | None:
    return url.port or {"http": 80, "https": 443}.get(url.scheme)


def _may_follow(url: httpx.URL, target: httpx.URL) -> bool:
    """Whether a redirect from ``url`` to ``target`` stays within the origin, or moves to
    https on the same host (the only move httpx keeps ``Authorization`` on)."""
    if (url.scheme, url.host, _port(url)) == (target.scheme, target.host, _port(target)):
        return True
    return (
        url.host == target.host
        and (url.scheme, _port(url)) == ("http", 80)
        and (target.scheme, _port(target)) == ("https", 443)
    )


class _CappedStream(httpx.AsyncByteStream):
    """A response body decompressed (if need be) and stopped past ``limit`` bytes: the
    whole of it, or each SSE event of it (``per_event``)."""

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        limit: int,
        setting: str,
        *,
        declared: int | None,
        coding: str | None,
        per_event: bool,
        charset: str | None = None,
    ) -> None:
        self._inner = inner
        #: an event stream's declared charset ("" if none); None: not an event stream
        self._charset = charset
        self._limit = limit
        self._setting = setting
        self._declared = declared
        self._coding = coding
        self._per_event = per_event
        self._size = 0  # bytes of the body, or of the event under way
        self._last = b""  # the body's last byte so far (an event end may straddle reads)
        #: compressed bytes as sent, of the body or (about) since the last event end
        self._sent = 0

    def _take(self, data: bytes) -> tuple[bytes, bool]:
        """Count ``data``: what of it to pass on, and whether the cap was passed.

        Past the cap, a whole body passes nothing more; a stream passes the events
        that ended before the one over the cap (one read may hold several).
        """
        if not self._per_event:
            self._size += len(data)
            return (b"", True) if self._size > self._limit else (data, False)
        if not data:
            return data, False
        # ``_size`` counts the event under way, ``_last`` (its last byte) included
        seen = self._last + data
        size, begin = self._size - len(self._last), 0
        for end in _EVENT_END.finditer(seen):  # every event ending in this read
            if size + end.start() - begin > self._limit:
                break
            size, begin = 0, end.end()
            self._sent = 0  # an event came out whole: what it was sent as is done with
        else:
            size += len(seen) - begin
            if size <= self._limit:
                self._size, self._last = size, data[-1:]
                return data, False
        return data[: max(0, begin - len(self._last))], True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._coding is None and self._declared is not None and self._declared > self._limit:
            raise AnswerTooLarge(self._limit, self._setting)  # before any of it is read
        async for piece in self._pieces():
            if self._charset is not None and b"\x00" in piece:
                declared = f"declared charset={self._charset}" if self._charset else "no charset"
                raise AnswerUndecodable(
                    f"the agent's event stream is not UTF-8 ({declared}; it holds NUL bytes, "
                    "as UTF-16 or UTF-32 text does): A2A event streams are UTF-8 by "
                    "definition; ask the agent's owner to send UTF-8"
                )
            passed, over = self._take(piece)
            if passed:
                yield passed
            if over:
                raise AnswerTooLarge(self._limit, self._setting)

    async def _pieces(self) -> AsyncIterator[bytes]:
        """The body as it comes, decompressed in steps of at most ``_STEP`` bytes."""
        if self._coding is None:
            async for chunk in self._inner:
                yield chunk
            return
        # Bytes as sent count too: deflate blocks that expand to nothing (or little) would
        # otherwise hold the connection, read on without end, under any cap.
        decoder = Decoder(self._coding)
        try:
            async for chunk in self._inner:
                self._sent += len(chunk)
                for piece in decoder.pieces(chunk, _STEP):
                    yield piece
                if self._sent > self._limit:
                    raise AnswerTooLarge(self._limit, self._setting)
            decoder.finish()
        except DecodingError as exc:
            raise AnswerUndecodable(str(exc)) from None

    async def aclose(self) -> None:
        await self._inner.aclose()


def _coding(response: httpx.Response) -> str | None:
    """The one coding to undo (gzip, deflate), or None; ``AnswerUndecodable`` for others."""
    fields = response.headers.get_list("content-encoding")
    try:
        return content_coding(", ".join(fields) if fields else None)
    except UnsupportedEncoding as exc:
        raise AnswerUndecodable(
            f"the answer came with Content-Encoding {exc.coding!r}, although "
            "identity (no compression) was asked for; toolwire reads gzip and deflate only"
        ) from None


def capped_client(
    *,
    limit: int,
    setting: str,
    transport: httpx.AsyncBaseTransport | None,
    headers: dict[str, str] | None = None,
    timeout: httpx.Timeout | float,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose every response body is capped at ``limit`` bytes
    (``AnswerTooLarge`` naming ``setting``), per event for an event stream it asked for.

    It follows redirects within the origin (their bodies are capped too; a redirect to
    another origin raises ``RedirectRefused``) and asks for uncompressed answers.
    """

    async def cap(response: httpx.Response) -> None:
        request = response.request
        if response.has_redirect_location:
            try:
                target = request.url.join(response.headers["location"])
            except httpx.InvalidURL:
                target = None  # httpx refuses it when it follows
            if target is not None and not _may_follow(request.url, target):
                raise RedirectRefused(request.method, request.url, response.status_code, target)
        ctype = response.headers.get("content-type", "").lower()
        charset = None
        if ctype.startswith("text/event-stream"):
            # SSE is UTF-8 whatever charset is declared: read so by the SDK, the text it
            # splits into lines is the bytes counted here (UTF-16 would hide line ends)
            charset = response.charset_encoding or ""
            response.encoding = "utf-8"
        per_event = ctype.startswith("text/event-stream") and "text/event-stream" in (
            request.headers.get("accept", "").lower()
        )
        declared = response.headers.get("content-length", "").strip()
        coding = _coding(response)
        if coding is not None:  # undone here, counted as it expands: httpx must not again
            del response.headers["content-encoding"]
        no_body = response.status_code in _NO_BODY or request.method == "HEAD"
        response.stream = _CappedStream(
            cast(httpx.AsyncByteStream, response.stream),
            limit,
            setting,
            # a stream's length says nothing of its events' (a proxy may buffer it whole)
            declared=int(declared) if declared.isdigit() and not (no_body or per_event) else None,
            coding=coding,
            per_event=per_event,
            charset=charset,
        )

    mine = {k: v for k, v in (headers or {}).items() if k.lower() != "accept-encoding"}
    return httpx.AsyncClient(
        transport=transport,
        headers={**mine, "Accept-Encoding": "identity"},
        timeout=timeout,
        follow_redirects=True,
        event_hooks={"response": [cap]},
    )
