"""Read a provider's answer without trusting its size.

A search provider may be a public SearXNG instance run by a stranger, or sit
behind a proxy: its answer may be gigabytes long, or a small gzip body that
expands a thousandfold. ``read_answer`` counts the body while it arrives,
decompressed, and stops at the cap: it decompresses gzip and deflate itself
(``toolwire.decoding``), ``_STEP`` bytes at a time (httpx would expand a whole
network read at once),
and never holds more than the cap plus one step. Nothing of an answer over the
cap is kept; the caller closes the response, which drops the connection.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Final, cast

import httpx

from toolwire.decoding import Decoder, DecodingError, UnsupportedEncoding, decoder_for

__all__ = [
    "ACCEPT_ENCODING",
    "AnswerTooLarge",
    "UndecodableAnswer",
    "read_answer",
    "with_body",
]

#: What the plugin's client asks for: the encodings ``read_answer`` decodes.
ACCEPT_ENCODING: Final = "gzip, deflate"
#: The most one decompression step yields (one network read may expand a thousandfold).
_STEP: Final = 64 * 1024
#: Headers that describe the body as sent, not the decoded copy ``with_body`` makes.
_WIRE_HEADERS: Final = frozenset({"content-encoding", "content-length", "transfer-encoding"})


class AnswerTooLarge(Exception):
    """The answer is over ``limit`` bytes (decompressed, or as sent); nothing of it is kept.

    ``declared``: the Content-Length the server announced, when it did.
    """

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(f"the answer is over {limit} bytes")
        self.limit = limit
        self.declared = declared


class UndecodableAnswer(Exception):
    """The answer's Content-Encoding is not one asked for, or its compressed data is corrupt,
    cut short, or followed by other bytes."""


def _decoder(response: httpx.Response, *, lenient: bool) -> Decoder | None:
    """The decoder of the response's Content-Encoding (None: as sent)."""
    fields = response.headers.get_list("content-encoding")
    try:
        return decoder_for(", ".join(fields) if fields else None)
    except UnsupportedEncoding as exc:
        if lenient:
            return None
        raise UndecodableAnswer(
            f"its Content-Encoding {exc.coding!r} is not one the plugin asks for "
            f"({ACCEPT_ENCODING})"
        ) from None


async def read_answer(response: httpx.Response, limit: int, *, cut: bool = False) -> bytes:
    """The body of a streamed ``response``, decompressed, of at most ``limit`` bytes.

    Over ``limit`` (decompressed, or as sent: a declared Content-Length, or the
    bytes received), ``AnswerTooLarge`` is raised as soon as that is known, and
    what was read is dropped. ``cut``: return the first ``limit`` bytes instead
    and read no further (an error answer, of which only the start is wanted); a
    corrupt or unknown encoding then gives what could be read.
    """
    decoder = _decoder(response, lenient=cut)
    length = response.headers.get("content-length", "").strip()
    declared = int(length) if length.isdigit() else None
    if declared is not None and declared > limit and not cut:
        raise AnswerTooLarge(limit, declared)
    parts: list[bytes] = []
    size = sent = 0
    raw = cast(AsyncGenerator[bytes, None], response.aiter_raw())  # an async generator
    async with aclosing(raw) as chunks:
        try:
            async for chunk in chunks:
                sent += len(chunk)
                for piece in decoder.pieces(chunk, _STEP) if decoder is not None else (chunk,):
                    if size + len(piece) > limit:
                        if cut:
                            parts.append(piece[: limit - size])
                            return b"".join(parts)
                        parts.clear()  # nothing of it is kept
                        raise AnswerTooLarge(limit, declared)
                    parts.append(piece)
                    size += len(piece)
                if cut and size >= limit:
                    return b"".join(parts)
                if sent > limit:  # compressed data is not allowed more bytes than the cap either
                    if cut:
                        return b"".join(parts)
                    parts.clear()
                    raise AnswerTooLarge(limit, declared)
            if decoder is not None:
                decoder.finish()
        except DecodingError as exc:
            if cut:  # the start of an error answer: what could be read
                return b"".join(parts)
            parts.clear()
            raise UndecodableAnswer(f"its compressed body is corrupt ({exc})") from None
    return b"".join(parts)


def with_body(response: httpx.Response, body: bytes) -> httpx.Response:
    """A copy of ``response`` holding ``body`` (already decoded): what backends read."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k not in _WIRE_HEADERS]
    extensions = {k: v for k, v in response.extensions.items() if k != "network_stream"}
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=body,
        request=response.request,
        extensions=extensions,
    )
