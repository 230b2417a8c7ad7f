"""uvicorn's HTTP/1.1 protocol with a deadline for reading each request, and a cap on its head.

uvicorn times only the idle gap after a response (``timeout_keep_alive``). A
connection that never sends a byte, or that sends a request's head or body a
byte at a time ("slowloris"), is held for as long as the client likes, and
counts against ``[server] max_connections``: a few hundred such sockets lock
every other client out. Here each request must arrive whole, head and body,
within ``request_read_timeout_s`` of its first byte (or of the connection's
opening, for its first request); otherwise the connection is closed — with a
408 when part of a head had arrived, and with the request's handler told the
client is gone (``http.disconnect``) when the head had and the body had not.

Streams the server writes (SSE responses, the GET stream) are not timed: the
deadline covers only what the client sends. Nor is the time a pipelined
request waits behind an earlier one still being answered (uvicorn stops
reading it until then): its clock starts when that answer is complete.

uvicorn's httptools protocol also keeps a request's line and headers in
memory however long they grow, before any auth: one client sending a header
of 150 MB, fast, held as much of the server's memory (and a few hundred such
connections all of it). Here a head longer than ``max_head_bytes`` gets a 431
and the connection is closed (memory held: the cap plus one read, at most).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("toolwire.mcp")

_408_BODY = b"the request did not arrive in time ([server] request_read_timeout_s)"
_408 = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n"
    b"\r\n%s" % (len(_408_BODY), _408_BODY)
)

#: The default of ``[server] max_header_bytes``: a request's line and headers, together.
DEFAULT_MAX_HEAD_BYTES = 64 * 1024


def _431(limit: int) -> bytes:
    body = b"the request line and headers are over %d bytes ([server] max_header_bytes)" % limit
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n"
        b"\r\n%s" % (len(body), body)
    )


class TimedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` closing connections whose request does not arrive in time,
    or whose request head is too long.

    ``read_timeout_s`` (None: no deadline) and ``max_head_bytes`` (None: no cap)
    are set on the subclass ``timed_http_protocol`` makes.
    """

    read_timeout_s: float | None = 30.0
    max_head_bytes: int | None = DEFAULT_MAX_HEAD_BYTES
    #: Connections closed for a late request, in this process (for tests and stats).
    timed_out = 0
    #: Connections closed for a head over ``max_head_bytes``, in this process.
    head_too_long = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._in_head = False
        #: Between a request's first byte and its last.
        self._reading = False
        #: Waiting for, or reading, a request's head (not its body).
        self._head_open = True
        #: Bytes of the head being read, counted by whole reads that did not end it.
        self._head_bytes = 0
        #: Heads read whole on this connection (a read that ends one is not counted).
        self._heads = 0

    def data_received(self, data: bytes) -> None:
        limit = self.max_head_bytes
        if limit is None or not self._head_open:
            super().data_received(data)
            return
        heads = self._heads
        super().data_received(data)
        # A read that ended a head (of this request, or a pipelined one) is not counted:
        # how much of it was head is unknown. So the count is short by one read at most.
        if self._heads != heads or not self._head_open or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > limit:
            self._head_overflow(limit)

    # A request's first byte (or the connection's opening) starts its clock ...
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._reading = True
        if self._read_timer is None and not self._answering():
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_open = False
        self._head_bytes = 0
        self._heads += 1
        super().on_headers_complete()

    # ... and its last byte stops it.
    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = False
        self._head_open = True  # the next request's head, if any
        self._disarm()

    # A request pipelined behind one still being answered is not read (uvicorn pauses
    # reading until that answer is sent): its clock starts once the answer is complete.
    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._reading and self._read_timer is None and not self.transport.is_closing():
            self._arm()

    def _answering(self) -> bool:
        """An earlier request of this connection is still being answered."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        if self.read_timeout_s is not None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _head_overflow(self, limit: int) -> None:
        TimedHttpProtocol.head_too_long += 1
        log.debug("closing %s: request head over %d bytes", self.client, limit)
        if not self._answering():  # no answer of an earlier request is being written
            self.transport.write(_431(limit))
        self.transport.close()

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        TimedHttpProtocol.timed_out += 1
        cycle = self.cycle
        if self._in_head:
            # part of a head: say why before closing (no handler has seen this request)
            log.debug(
                "closing %s: request head incomplete after %ss", self.client, self.read_timeout_s
            )
            self.transport.write(_408)
        elif cycle is not None and not cycle.response_complete and cycle.more_body:
            # the handler is reading a body that stopped coming: it sees the client leave
            log.debug(
                "closing %s: request body incomplete after %ss", self.client, self.read_timeout_s
            )
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def timed_http_protocol(
    read_timeout_s: float | None, max_head_bytes: int | None = DEFAULT_MAX_HEAD_BYTES
) -> type[TimedHttpProtocol]:
    """A ``TimedHttpProtocol`` class giving each request ``read_timeout_s`` to arrive,
    and a head of at most ``max_head_bytes``."""
    return type(
        "TimedHttpProtocol",
        (TimedHttpProtocol,),
        {"read_timeout_s": read_timeout_s, "max_head_bytes": max_head_bytes},
    )
