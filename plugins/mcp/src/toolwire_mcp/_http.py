"""uvicorn's HTTP/1.1 protocol with a deadline for reading each request.

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


class TimedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` closing connections whose request does not arrive in time.

    ``read_timeout_s`` is set on the subclass ``timed_http_protocol`` makes.
    """

    read_timeout_s: float = 30.0
    #: Connections closed for a late request, in this process (for tests and stats).
    timed_out = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._in_head = False
        #: Between a request's first byte and its last.
        self._reading = False

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
        super().on_headers_complete()

    # ... and its last byte stops it.
    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = False
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
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

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


def timed_http_protocol(read_timeout_s: float) -> type[TimedHttpProtocol]:
    """A ``TimedHttpProtocol`` class giving each request ``read_timeout_s`` to arrive."""
    return type("TimedHttpProtocol", (TimedHttpProtocol,), {"read_timeout_s": read_timeout_s})
