"""Bounded decoding of compressed HTTP bodies, for plugins that call HTTP APIs.

An answer's ``Content-Encoding`` may be ``gzip`` (``x-gzip``) or ``deflate``
even when none was asked for, and a small compressed body may expand a
thousandfold: an HTTP client that decodes for you (httpx does) expands a whole
network read before anyone can count it. ``Decoder`` decodes one body
incrementally, never producing more than the caller allows per call, so that a
cap on the *decompressed* size holds while the body arrives.

Semantics (every toolwire plugin reads answers this way):

- codings: ``identity`` (nothing to do: ``decoder_for`` returns None), ``gzip``
  and ``x-gzip`` (RFC 1952; a body of several gzip members, as ``gzip``
  concatenates them, is decoded whole), ``deflate`` (meant zlib-wrapped, RFC
  1950; sent raw, RFC 1951, by some servers: told by the first two bytes, as
  browsers and httpx do). Any other coding, or more than one coding applied
  (``gzip, gzip``), is ``UnsupportedEncoding``: never passed on undecoded.
- ``decompress(data, max_length)`` returns at most ``max_length`` bytes; what
  ``data`` holds beyond that is kept, not decompressed, until the next call.
  A decompression bomb is therefore expanded no further than the caller's cap
  plus the one call that found it over.
- a corrupt body, one that ends before its compressed data does (truncated),
  and bytes after the end of the compressed data (other than a further gzip
  member) are ``CorruptBody``: the body is not what the server meant to send,
  and nothing of it should be used. A body of no bytes at all is empty, whatever
  its coding (a 204, a HEAD answer).

The caller owns the cap and its error: compare what came out with the room left,
and count the bytes as sent too (compressed data can expand to nothing: a body of
empty deflate blocks is otherwise read for as long as the server sends it).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Final

__all__ = [
    "CODINGS",
    "CorruptBody",
    "Decoder",
    "DecodingError",
    "UnsupportedEncoding",
    "content_coding",
    "decoder_for",
]

#: The content codings this module decodes (``identity``: none to undo).
CODINGS: Final = frozenset({"identity", "gzip", "x-gzip", "deflate"})
_GZIP: Final = zlib.MAX_WBITS | 16
_ZLIB: Final = zlib.MAX_WBITS
_RAW: Final = -zlib.MAX_WBITS


class DecodingError(ValueError):
    """A body that cannot be decoded; ``coding`` is its content coding as the server named
    it (lower-case). Nothing of the body should be used."""

    def __init__(self, message: str, coding: str) -> None:
        super().__init__(message)
        self.coding = coding


class UnsupportedEncoding(DecodingError):
    """A ``Content-Encoding`` other than identity, gzip, x-gzip and deflate, or several
    codings stacked (``coding`` then lists them, comma-separated); also ``Decoder`` given
    ``identity`` or nothing, which need no decoder (the message says so)."""

    def __init__(self, coding: str) -> None:
        if coding in ("", "identity"):  # Decoder("identity"): a caller's slip, said so
            message = (
                f"Content-Encoding {coding!r} needs no decoding: read the body as it is "
                "(decoder_for returns None for it)"
            )
        else:
            message = (
                f"unsupported Content-Encoding {coding!r}: toolwire reads identity, gzip "
                "and deflate"
            )
        super().__init__(message, coding)


class CorruptBody(DecodingError):
    """Compressed data that is corrupt, ends before its end (truncated), or is followed by
    bytes that are not part of it."""


def content_coding(header: str | None) -> str | None:
    """The one coding to undo that a ``Content-Encoding`` value names, lower-case, or None
    (no header, empty, or ``identity``).

    ``header`` is the field's value, several fields joined by commas (as RFC 9110 allows).
    ``UnsupportedEncoding`` for a coding not in ``CODINGS`` or for more than one.
    """
    if header is None:
        return None
    codings = [
        c for c in (p.strip().lower() for p in header.split(",")) if c not in ("", "identity")
    ]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in CODINGS:
        raise UnsupportedEncoding(", ".join(codings))
    return codings[0]


def decoder_for(header: str | None) -> Decoder | None:
    """A ``Decoder`` for a body sent with this ``Content-Encoding`` value, or None when it is
    sent as is (read it directly: identity costs nothing). ``UnsupportedEncoding`` as
    ``content_coding``."""
    coding = content_coding(header)
    return None if coding is None else Decoder(coding)


def _zlib_header(data: bytes) -> bool:
    """Whether ``data`` (two bytes at least) opens with a zlib header (RFC 1950): deflate,
    and a valid check value."""
    return data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class Decoder:
    """The decoder of one body in ``coding`` (``gzip``, ``x-gzip`` or ``deflate``).

    Feed the body's bytes as they come to ``decompress`` (or ``pieces``), then
    call ``finish`` at its end. Raises ``CorruptBody``; ``UnsupportedEncoding``
    for another coding. Not thread-safe; one body per decoder.
    """

    __slots__ = ("_coding", "_fed", "_full", "_gzip", "_head", "_obj", "_tail")

    def __init__(self, coding: str) -> None:
        coding = coding.strip().lower()
        if coding not in CODINGS or coding == "identity":
            raise UnsupportedEncoding(coding)
        self._coding = coding
        self._gzip = coding != "deflate"
        #: the zlib stream under way; None: deflate waiting for its first two bytes
        self._obj: zlib._Decompress | None = zlib.decompressobj(_GZIP) if self._gzip else None
        self._head = b""  # deflate: its first byte, until the second tells zlib from raw
        self._tail = b""  # input held back by the last call's max_length
        self._full = False  # the last call filled max_length: more may come without input
        self._fed = False  # any byte of the body received

    @property
    def coding(self) -> str:
        """The coding decoded (as given, lower-case)."""
        return self._coding

    @property
    def pending(self) -> bool:
        """Whether output may be held back: the last call returned ``max_length`` bytes;
        call ``decompress(b"", n)`` for more."""
        return self._full or bool(self._tail)

    @property
    def eof(self) -> bool:
        """Whether the compressed data has ended here (a gzip body may yet go on with another
        member) and nothing is held back."""
        obj = self._obj
        return obj is not None and obj.eof and not self._tail and not self._full

    def _bad(self, exc: zlib.error) -> CorruptBody:
        return CorruptBody(f"bad {self._coding} body: {exc}", self._coding)

    def _trailing(self) -> CorruptBody:
        return CorruptBody(
            f"the {self._coding} body goes on after its compressed stream ends", self._coding
        )

    def decompress(self, data: bytes, max_length: int | None) -> bytes:
        """What ``data`` (after any input held back) decompresses to: at most ``max_length``
        bytes (None: no bound; use one for any body from the network).

        Input beyond that is held back and decompressed by the next call (``data``
        may be ``b""``). A cap of ``limit`` bytes in all: pass the room left plus
        one, and a longer result is over the cap.
        """
        if max_length is None:
            max_length = 0  # zlib's "no bound"
        elif max_length < 1:
            raise ValueError(f"max_length must be at least 1, not {max_length}")
        if self._tail:
            data = self._tail + data if data else self._tail
            self._tail = b""
        elif not data and not self._full:
            return b""
        self._fed = self._fed or bool(data)
        obj = self._obj
        if obj is None:  # deflate: zlib-wrapped or raw, told by the first two bytes
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return b""
            self._head = b""
            obj = self._obj = zlib.decompressobj(_ZLIB if _zlib_header(data) else _RAW)
        out = b""
        while True:
            if obj.eof:
                if not data:
                    break
                if not self._gzip or data[0] != 0x1F:
                    raise self._trailing()
                obj = self._obj = zlib.decompressobj(_GZIP)  # another gzip member
            want = max_length - len(out) if max_length else 0
            try:
                piece = obj.decompress(data, want)
            except zlib.error as exc:
                raise self._bad(exc) from None
            out = out + piece if out else piece
            if obj.eof:
                data = obj.unused_data
                if max_length and len(out) >= max_length:
                    self._tail = data
                    break
                continue
            self._tail = obj.unconsumed_tail
            break
        self._full = bool(max_length) and len(out) >= max_length
        return out

    def pieces(self, data: bytes, step: int) -> Iterator[bytes]:
        """All that ``data`` decompresses to, in pieces of at most ``step`` bytes, each made
        when asked for: stop iterating (past a cap) and no more is decompressed."""
        out = self.decompress(data, step)
        while True:
            if out:
                yield out
            if not self.pending:
                return
            out = self.decompress(b"", step)

    def finish(self) -> None:
        """The body has ended: ``CorruptBody`` if its compressed data has not (a body of no
        bytes at all is empty, not truncated). ``RuntimeError`` if output is still
        held back (drain ``decompress(b"", n)`` first)."""
        if self.pending:
            raise RuntimeError("the decoder still holds output back: drain it before finish()")
        if self._fed and not (self._obj is not None and self._obj.eof):
            raise CorruptBody(
                f"the {self._coding} body ends before its compressed stream", self._coding
            )
