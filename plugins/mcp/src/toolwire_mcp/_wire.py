"""A keep-alive HTTP/1.1 POST client for one upstream: httptools' parser on asyncio transports.

The direct ``tools/call`` path (``_direct``) sends every call of an upstream
to one URL, with the same headers, and reads one answer: a JSON body or an
SSE stream. A general HTTP client (aiohttp) spends most of its CPU per request
on what this never needs: URL parsing and joining, cookie jars, redirects,
proxies, per-request timers and tracing. This client does only this:

- POST to one fixed URL over a pool of keep-alive connections (at most
  ``limit`` at a time, idle ones kept ``keepalive_s``), plain or TLS;
- the request line and the fixed headers are encoded once;
- the response is parsed by ``httptools`` (llhttp, the parser uvicorn uses):
  Content-Length, chunked and read-until-close bodies, 1xx skipped,
  ``Connection: close`` honoured, gzip/deflate bodies decoded;
- one timer per request enforces the read timeout (``read_s`` without a byte).

Errors: ``ConnectError`` (nothing was sent), ``Disconnected`` (the server
closed the connection before the answer was complete: the call's outcome is
unknown), ``ProtocolError`` (not an HTTP response we can read), and
``TimeoutError`` for a read or pool-wait timeout (``PoolTimeout``: no
connection came free, nothing was sent). All but the timeouts are
``WireError``. Nothing is retried: a ``tools/call`` is not idempotent.

Measured on this project's benchmark machine: about 40 us of CPU per request
against aiohttp's 155 us, same server, same payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

from toolwire.decoding import Decoder, DecodingError, UnsupportedEncoding, decoder_for

__all__ = [
    "ConnectError",
    "Disconnected",
    "Pool",
    "PoolTimeout",
    "ProtocolError",
    "Response",
    "Sending",
    "TooLarge",
    "UndecodableBody",
    "WireError",
]

#: The largest status line plus headers accepted, as aiohttp's default limits roughly allow.
MAX_HEAD: Final = 64 * 1024
#: Unread body bytes buffered before the socket stops being read (back-pressure).
_HIGH_WATER: Final = 256 * 1024
#: The most a compressed streamed body is decompressed to at a time (``Response.chunks``).
_STEP: Final = 64 * 1024


class WireError(Exception):
    """The HTTP exchange with the upstream failed."""


class ConnectError(WireError):
    """No connection could be made: the request was not sent."""


class Disconnected(WireError):
    """The server closed the connection before its answer was complete."""


class ProtocolError(WireError):
    """The server's bytes are not an HTTP/1.1 response this client can read."""


class UndecodableBody(ProtocolError):
    """An answer came, but its body cannot be decoded: a Content-Encoding other than gzip
    or deflate, a corrupt compressed body, one cut short, or bytes after its end. The
    status and headers stand; nothing of the body is kept; the connection is dropped."""


class PoolTimeout(TimeoutError):
    """No connection of the pool came free within ``pool_wait_s``: nothing was sent."""


class Sending:
    """Set by ``Pool.post`` once the request is written (``sent``): a failure before that
    (a timeout waiting for a connection, say) means the server never saw the request."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class TooLarge(WireError):
    """A body (decompressed) longer than the reader's limit; what came of it is dropped."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over {limit} bytes")
        self.limit = limit


def _check(value: str, what: str) -> str:
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"{what} {value!r}: CR, LF and NUL are not allowed in HTTP headers")
    return value


class Response:
    """One answer: ``status`` and ``headers`` (lower-case names), then the body.

    Read the body with ``read()`` or ``chunks()``; then ``release()`` (the
    connection goes back to the pool when the answer was read to its end) or
    ``close()`` (the connection is dropped: the server sees it go).
    """

    __slots__ = (
        "_chunks",
        "_conn",
        "_decoder",
        "_done",
        "_error",
        "_limit",
        "_sent",
        "_size",
        "_unread",
        "_waiter",
        "_whole",
        "headers",
        "status",
    )

    def __init__(self, conn: _Conn, limit: int | None = None) -> None:
        self._conn: _Conn | None = conn
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: list[bytes] = []
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: None: identity, or a compressed body decoded to its end. A compressed body's
        #: _chunks are its bytes as sent: the reader decodes them as it reads, no sooner.
        self._decoder: Decoder | None = None
        #: Bytes of body received (decompressed), and the pool's ``max_body`` (None: no cap).
        self._size = 0
        self._sent = 0  # bytes of a compressed body as sent (a whole body is capped so too)
        self._unread = 0  # bytes in _chunks
        self._limit = limit
        self._whole = False  # read() was called: the limit is on the whole body

    # -- fed by the connection
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed(self, data: bytes) -> None:
        if self._error is not None:
            return  # a failed answer (too large, say): the rest is dropped as it comes
        limit = self._limit
        if self._decoder is not None:
            # Kept as sent, decoded by the reader as it reads (a small compressed read may
            # expand a thousandfold: never before it is wanted, nor past the room left).
            # Compressed data may expand to nothing: a whole body counts as sent too.
            self._sent += len(data)
            if limit is not None and self._whole and self._sent > limit:
                self._chunks.append(data)
                self._over_as_sent(limit)
                return
        elif data:
            self._size += len(data)
            if limit is not None and self._whole and self._size > limit:
                self._too_large(limit)
                return
        if data:
            self._chunks.append(data)
            self._unread += len(data)
            self._wake()

    def _undecodable(self, exc: DecodingError) -> UndecodableBody:
        # nothing of a body that cannot be decoded is kept, what came before the fault
        # included (zlib would have kept bytes after its end in unused_data, uncounted)
        self._chunks.clear()
        self._unread = 0
        self._decoder = None
        error = UndecodableBody(str(exc))
        self._error = error  # found by the reader, the body may have been received whole
        self._wake()
        return error

    def _over_as_sent(self, limit: int) -> None:
        """A compressed whole body past ``limit`` as sent: too large, unless what came is
        corrupt (bytes after the end of its data, say), which is what is wrong with it."""
        if self._decoder is not None and self._chunks:
            with contextlib.suppress(TooLarge, UndecodableBody):
                self._decode(self._decoder)
        self._too_large(limit)

    def _take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._unread = 0
        return data

    def _decode(self, decoder: Decoder) -> bytes:
        """What the received bytes decode to, up to the room left under the cap (one byte
        more is over it: ``TooLarge``)."""
        limit = self._limit
        room = None if limit is None else limit - self._size
        try:
            data = decoder.decompress(self._take(), None if room is None else room + 1)
        except DecodingError as exc:
            raise self._undecodable(exc) from None
        if limit is not None and room is not None and len(data) > room:
            self._too_large(limit)
            raise TooLarge(limit)
        self._size += len(data)
        return data

    def _end(self, decoder: Decoder) -> None:
        """The body was received and decoded whole: cut short, it is no answer."""
        try:
            decoder.finish()
        except DecodingError as exc:
            raise self._undecodable(exc) from None
        self._decoder = None

    def _too_large(self, limit: int) -> None:
        self._chunks.clear()  # nothing of it is kept, even when it all came
        self._unread = 0
        self._decoder = None
        if self._error is None:
            self._error = TooLarge(limit)
            self._wake()

    def _finish(self) -> None:
        self._done = True  # a compressed body's end is checked as the reader decodes it
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None and not self._done:
            self._error = exc
            self._wake()

    # -- the reader's side
    async def _more(self) -> None:
        """Wait for body bytes, the end, or the failure."""
        conn = self._conn
        if conn is None:
            raise WireError("the response was closed")
        conn.resume()
        self._waiter = conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    @property
    def consumed(self) -> bool:
        """Whether the body was received to its end and read (``release`` then keeps the
        connection)."""
        return self._done and self._error is None and not self._chunks and self._decoder is None

    async def read(self) -> bytes:
        """The whole body: at most the pool's ``max_body`` bytes (decompressed, and as sent),
        else ``TooLarge``, raised as soon as it is known (a larger Content-Length, or the
        bytes so far)."""
        self._whole = True
        limit = self._limit
        if limit is not None and self._error is None:
            declared = self.headers.get("content-length", "")
            if self._sent > limit:
                self._over_as_sent(limit)
            elif self._size > limit or (
                self._decoder is None and declared.isdigit() and int(declared) > limit
            ):
                self._too_large(limit)
        decoder = self._decoder
        parts: list[bytes] = []
        while True:
            if self._error is not None:
                raise self._error
            if decoder is not None and self._chunks:
                parts.append(self._decode(decoder))
                continue
            if self._done:
                break
            await self._more()
        if decoder is None:
            return self._take()
        self._end(decoder)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, chunk by chunk (no cap on the whole: a stream may run
        long, and the reader caps what it keeps). A compressed body is decompressed as it
        is read, in pieces of at most 64 KiB, each made when the reader asks for it."""
        decoder = self._decoder
        while True:
            if self._chunks:
                data = self._take()
                if decoder is None:
                    yield data
                    continue
                try:
                    for piece in decoder.pieces(data, _STEP):
                        self._size += len(piece)
                        yield piece
                except DecodingError as exc:
                    raise self._undecodable(exc) from None
                continue
            if self._error is not None:
                raise self._error
            if self._done:
                if decoder is not None:
                    self._end(decoder)
                return
            await self._more()

    def release(self) -> None:
        """Done with the answer: its connection is reused when the answer was read to its end."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(reuse=self.consumed)

    def close(self) -> None:
        """Drop the connection (an unfinished call: the server sees the client go)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(reuse=False)


class _Conn(asyncio.Protocol):
    """One connection: at most one request at a time; httptools parses the answers."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.busy = False  # holds one of the pool's slots (a request in flight)
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._resp: Response | None = None
        self._head: asyncio.Future[Response] | None = None
        self._head_size = 0
        self._pre_head = 0  # bytes received while the head was incomplete
        self._sized = False  # Content-Length or chunked: the body does not end at EOF
        self._keep_alive = False
        self._paused = False
        self._aborted = False  # we dropped the connection: an EOF then is no end of a body
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        resp = self._resp
        if resp is None:  # bytes nobody asked for: the connection is not reusable
            self._abort()
            return
        self._last_read = self.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            # a callback below raised; it has already recorded the failure
            self._abort()
        except httptools.HttpParserUpgrade:
            self._failed(ProtocolError("the server switched protocols (101): not an MCP answer"))
            self._abort()
        except httptools.HttpParserError as exc:
            self._failed(ProtocolError(f"not a valid HTTP/1.1 response: {exc}"))
            self._abort()
        else:
            if self._head is not None:  # still no complete head: bound what httptools buffers
                # (counted after feeding: the bytes that completed a head, and the body
                # arriving with it in the same read, are no head bytes)
                self._pre_head += len(data)
                if self._pre_head > MAX_HEAD + 65536:
                    self._failed(ProtocolError(f"the response headers exceed {MAX_HEAD} bytes"))
                    self._abort()
                    return
            if (
                not resp._done
                and len(resp._chunks) > 1
                and resp._unread > _HIGH_WATER  # the bytes in _chunks, kept as they come
            ):
                self._paused = True
                assert self.transport is not None
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool._forget(self)
        resp = self._resp
        if resp is None:
            return
        if (
            self._head is None
            and not self._sized
            and not resp._done
            and not self._aborted
            and exc is None
        ):
            resp._finish()  # a body without Content-Length or chunking ends with the connection
        elif not resp._done:
            where = "before" if self._head is not None else "in the middle of"
            self._failed(
                Disconnected(f"the server closed the connection {where} its answer")
                if exc is None
                else Disconnected(f"the connection broke {where} the answer: {exc}")
            )
        self._stop_timer()

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        resp = self._resp
        if resp is not None and resp._done:
            # A second answer to one request (in the same read as the first, or before the
            # first was released): it must not be merged into the first (its status and
            # headers over the first's, its body appended). The first stands; the connection
            # is dropped, as for any bytes nobody asked for.
            raise ProtocolError("a second answer to one request")

    def on_status(self, status: bytes) -> None:
        self._head_size += len(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD:
            self._failed(ProtocolError(f"the response headers exceed {MAX_HEAD} bytes"))
            raise ProtocolError("headers too large")
        resp = self._resp
        assert resp is not None
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in resp.headers:  # repeated: joined as RFC 9110 allows
            text = f"{resp.headers[key]}, {text}"
        resp.headers[key] = text
        if key == "content-length" or (key == "transfer-encoding" and "chunked" in text.lower()):
            self._sized = True

    def on_headers_complete(self) -> None:
        resp = self._resp
        assert resp is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: the answer follows
            resp.headers = {}
            self._sized = False
            return
        resp.status = status
        self._keep_alive = self._parser.should_keep_alive()
        coding = resp.headers.get("content-encoding")
        if coding is not None:
            try:
                resp._decoder = decoder_for(coding)
            except UnsupportedEncoding as exc:
                # An answer all the same (its status may speak): the reader gets the error
                # for its body, which is dropped as it comes; the connection is not reused.
                resp._fail(UndecodableBody(str(exc)))
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(resp)

    def on_body(self, body: bytes) -> None:
        resp = self._resp
        assert resp is not None
        resp._feed(body)

    def on_message_complete(self) -> None:
        resp = self._resp
        if resp is None or resp.status == 0:  # the end of a 1xx
            return
        self._stop_timer()
        resp._finish()

    # -- the pool's side
    def request(self, data: bytes, read_s: float) -> asyncio.Future[Response]:
        """Send one request; the future resolves with the response once its headers are in."""
        assert self.transport is not None
        self._resp = Response(self, self.pool.max_body)
        self._head = self.loop.create_future()
        self._head_size = 0
        self._pre_head = 0
        self._sized = False
        self._last_read = self.loop.time()
        self._timer = self.loop.call_at(self._last_read + read_s, self._check_read, read_s)
        self.transport.write(data)
        return self._head

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self._last_read = self.loop.time()  # the pause was ours, not the server's silence
            self.transport.resume_reading()

    def finished(self, *, reuse: bool) -> None:
        self._stop_timer()
        self._resp = None
        self._head = None
        if reuse and self._keep_alive and self.alive:
            self.pool._put(self)
        else:
            self._abort()
            self.pool._forget(self)

    @property
    def alive(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    # -- internals
    def _failed(self, exc: BaseException) -> None:
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(exc)
        if self._resp is not None:
            self._resp._fail(exc)

    def _check_read(self, read_s: float) -> None:
        if self._paused:
            self._last_read = self.loop.time()
        idle = self.loop.time() - self._last_read
        if idle < read_s:
            self._timer = self.loop.call_at(self._last_read + read_s, self._check_read, read_s)
            return
        self._timer = None
        self._failed(TimeoutError(f"no answer from the server for {read_s:g} s"))
        self._abort()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _abort(self) -> None:
        self._aborted = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class Pool:
    """POSTs to one URL over at most ``limit`` keep-alive connections.

    ``max_body``: the longest body ``Response.read`` takes, decompressed and as sent
    (a streamed body, ``Response.chunks``, is the reader's to cap); None: no cap.
    Create it inside the event loop; ``close()`` it when done.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        ssl: ssl_module.SSLContext | None = None,
        limit: int = 100,
        keepalive_s: float = 4.0,
        connect_s: float = 30.0,
        pool_wait_s: float = 60.0,
        read_s: float = 300.0,
        max_body: int | None = None,
    ) -> None:
        parts = urlsplit(url)
        self.max_body = max_body
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: not an http(s) URL")
        self.loop = asyncio.get_running_loop()
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl_module.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl if ssl is not None else ssl_module.create_default_context()
        host = f"[{self._host}]" if ":" in self._host else self._host
        default_port = self._port == (443 if parts.scheme == "https" else 80)
        authority = host if default_port else f"{host}:{self._port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {_check(target, 'path')} HTTP/1.1"]
        # A configured Host replaces the URL's (a virtual host behind an address, as
        # httpx does): two Host lines are a request HTTP/1.1 servers must refuse (400).
        fixed = {"host": authority, "accept-encoding": "gzip, deflate"}
        fixed.update({k.lower(): v for k, v in headers.items()})
        lines += [f"{_check(k, 'header name')}: {_check(v, 'header')}" for k, v in fixed.items()]
        self._prefix = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._limit = asyncio.Semaphore(limit)
        self._size = limit
        self._keepalive_s = keepalive_s
        self._connect_s = connect_s
        self._pool_wait_s = pool_wait_s
        self._read_s = read_s
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self.closed = False
        #: Connections opened so far (a measure of reuse).
        self.opened = 0

    @staticmethod
    def header_block(headers: Mapping[str, str]) -> bytes:
        """Headers for ``post(extra=...)``, encoded once (CR, LF or NUL: ``ValueError``)."""
        return "".join(
            f"{_check(k, 'header name')}: {_check(v, 'header')}\r\n" for k, v in headers.items()
        ).encode("latin-1")

    async def post(
        self, body: bytes, extra: bytes = b"", sending: Sending | None = None
    ) -> Response:
        """Send ``body`` (``extra``: a ``header_block``); the response once its head is in.

        ``sending.sent`` turns true when the request is written."""
        if self.closed:
            raise WireError("the HTTP client is closed")
        data = b"%s%scontent-length: %d\r\n\r\n%s" % (self._prefix, extra, len(body), body)
        if self._limit.locked():
            try:
                async with asyncio.timeout(self._pool_wait_s):
                    await self._limit.acquire()
            except TimeoutError:
                raise PoolTimeout(
                    f"all {self._size} connections to the server stayed busy for "
                    f"{self._pool_wait_s:g} s; the request was not sent"
                ) from None
        else:
            await self._limit.acquire()
        try:
            if self.closed:
                raise WireError("the HTTP client is closed")
            conn = self._reusable() or await self._connect()
        except BaseException:
            self._limit.release()
            raise
        if self.closed:  # closed while connecting
            conn.finished(reuse=False)
            raise WireError("the HTTP client is closed")
        if sending is not None:
            sending.sent = True  # conn.request writes it before it first waits
        try:
            return await conn.request(data, self._read_s)
        except BaseException:
            conn.finished(reuse=False)
            raise

    def _reusable(self) -> _Conn | None:
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()
            if conn.alive and now - conn.idle_since < self._keepalive_s:
                conn.busy = True
                return conn
            conn._abort()
            self._forget(conn)
        return None

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self._connect_s):
                _, conn = await self.loop.create_connection(
                    lambda: _Conn(self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to {self._host}:{self._port}: no answer in {self._connect_s:g} s"
            ) from None
        except (OSError, ssl_module.SSLError) as exc:
            raise ConnectError(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        if conn.lost:  # closed at once (a TLS or proxy refusal after the handshake)
            raise ConnectError(f"cannot connect to {self._host}:{self._port}: closed at once")
        conn.busy = True
        self._all.add(conn)
        self.opened += 1
        return conn

    def _put(self, conn: _Conn) -> None:
        conn.busy = False
        self._limit.release()
        if self.closed:
            conn._abort()
            return
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def _forget(self, conn: _Conn) -> None:
        """``conn`` is gone (closed, lost or stale): its slot, if it held one, is free."""
        self._all.discard(conn)
        if conn.busy:
            conn.busy = False
            self._limit.release()
        if conn in self._idle:
            self._idle.remove(conn)

    async def close(self) -> None:
        """Close every connection; calls still running fail with ``Disconnected``."""
        self.closed = True
        for conn in list(self._all):
            conn._failed(Disconnected("the HTTP client was closed during the call"))
            conn._abort()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports report their loss
