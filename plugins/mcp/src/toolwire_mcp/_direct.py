"""``tools/call`` straight over HTTP, for Streamable-HTTP upstreams on the 2026-07-28 protocol.

On that protocol every request is one self-contained POST (no session), so a
call needs no client state beyond the negotiated version: the FastMCP client
still connects, lists the tools and watches the server, and this module sends
the ``tools/call`` POSTs themselves over one keep-alive connection pool
(``_wire.Pool``: httptools' parser on asyncio transports), for a fraction of
the FastMCP client's CPU per call.

It mirrors what the MCP SDK's Streamable-HTTP transport puts on the wire for a
``tools/call`` (headers, ``_meta`` envelope, progress token) and how it reads
the answer (one JSON response, or SSE frames: notifications, then the
response), and raises what the FastMCP client raises, so the caller maps both
paths' failures with the same code:

- a JSON-RPC error (also one in the body of a 4xx answer) -> ``MCPError``;
- HTTP 401/403/429/5xx without one -> ``HTTPRefusal``; other 4xx -> the SDK's
  stand-ins (404 -> ``METHOD_NOT_FOUND`` "Not Found", else ``INTERNAL_ERROR``);
- the request timeout (``timeout_s``) -> ``MCPError(REQUEST_TIMEOUT)``;
- a stream that ends without the response -> ``MCPError(CONNECTION_CLOSED)``;
- a 2xx body that cannot be decoded (its Content-Encoding) -> ``MCPError(PARSE_ERROR)``
  ("Failed to parse JSON response: ..." / "Failed to parse SSE stream: ..."), as the
  FastMCP path's reader (``_upstream._CappedStream``) words it;
- connection failures -> ``_wire.WireError`` (``ConnectError``: nothing was
  sent) / ``TimeoutError`` (the read timeout: ``_READ_S`` without a byte);
- a redirect (the SDK follows some) -> ``NotMirrored``: nothing ran, the
  caller sends the call through the FastMCP client instead.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import fastmcp
import httpx2
import mcp_types
import pydantic_core
from mcp.shared.dispatcher import ProgressFnT as ProgressFn
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    encode_header_value,
)
from pydantic import ValidationError

from ._lenient import from_json
from ._wire import Pool, PoolTimeout, Response, Sending, TooLarge, UndecodableBody, WireError

__all__ = ["CLIENT_INFO", "DirectCaller", "HTTPRefusal", "NotMirrored", "ProgressFn"]

log = logging.getLogger("toolwire.mcp")

#: The identity both paths announce (FastMCP's default, given explicitly to the client).
CLIENT_INFO: Final = mcp_types.Implementation(name="fastmcp", version=fastmcp.__version__)
#: What the FastMCP client stamps into every 2026-07-28 request besides the
#: version and identity: no capabilities (toolwire registers no sampling,
#: elicitation or roots handler) and log level "debug" (FastMCP asks for all
#: log notifications).
_CAPABILITIES: Final[dict[str, Any]] = {}
_LOG_LEVEL: Final = "debug"
_LOG_LEVEL_META_KEY: Final = "io.modelcontextprotocol/logLevel"

#: The MCP transport's limits: 30 s to connect, 300 s between reads (the
#: stream may stay open). The size of an answer is the server entry's
#: ``max_answer_bytes``.
_CONNECT_S: Final = 30.0
#: How long a call may wait for a pooled connection (as httpx2's pool timeout) plus connecting.
_POOL_WAIT_S: Final = 60.0
_READ_S: Final = 300.0
#: Shorter than common server keep-alive timeouts (uvicorn: 5 s), so an idle
#: connection the server is about to close is not reused.
_KEEPALIVE_S: Final = 4.0
#: After the response of an event stream: how long, and how many bytes, to read
#: to its end so the connection serves the next call (a server ends it at once;
#: one that does not holds a pool slot this long).
_DRAIN_S: Final = 0.5
_DRAIN_BYTES: Final = 64 * 1024

#: The SDK's text for a refused POST without a JSON-RPC error in its body.
SDK_REFUSED_TEXT: Final = "Server returned an error response"

#: SSE line ends: CRLF, LF or CR.
_EOL: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


class HTTPRefusal(Exception):
    """The server answered the POST with HTTP 401, 403, 429 or 5xx (no JSON-RPC error)."""

    def __init__(self, status: int, retry_after: str | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class AnswerTooLarge(Exception):
    """The server's answer (a JSON body, or one event) is over ``max_answer_bytes``.

    Nothing of it was kept; the connection is dropped. The call may have run.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is over {limit} bytes")
        self.limit = limit


class NotMirrored(Exception):
    """An answer the direct path does not handle like the SDK (a redirect); nothing ran."""


def _small(resp: Response) -> bool:
    """Whether the answer declares a body of at most 64 KiB (an error page worth draining)."""
    length = resp.headers.get("content-length", "")
    return length.isdigit() and int(length) <= 65536


def _basic_auth(url: str) -> str | None:
    """The ``Authorization`` header for the ``user:password@`` of ``url`` (percent-decoded,
    as httpx sends it), or None without one."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def refused(status: int) -> bool:
    """Whether an HTTP status is mapped by status (auth, rate limit, server error)."""
    return status in (401, 403, 429) or status >= 500


class DirectCaller:
    """Sends ``tools/call`` to one upstream over one connection pool (``_wire.Pool``).

    Create it inside the event loop; ``close()`` it when the upstream session
    ends.
    """

    def __init__(
        self,
        *,
        server: str,
        url: str,
        protocol_version: str,
        headers: Mapping[str, str],
        auth: str | None,
        timeout_s: float | None,
        on_list_changed: Callable[[], None],
        max_answer_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.server = server
        self._max_answer = max_answer_bytes
        self.protocol_version = protocol_version
        self._url = url
        self._timeout_s = timeout_s
        self._on_list_changed = on_list_changed
        self._ids = itertools.count(1)
        self._envelope: dict[str, Any] = {
            mcp_types.PROTOCOL_VERSION_META_KEY: protocol_version,
            mcp_types.CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(
                by_alias=True, mode="json", exclude_none=True
            ),
            mcp_types.CLIENT_CAPABILITIES_META_KEY: _CAPABILITIES,
            _LOG_LEVEL_META_KEY: _LOG_LEVEL,
        }
        # As the MCP transport layers them: configured headers, then the MCP
        # headers, then the bearer token.
        fixed = {k.lower(): v for k, v in headers.items()}
        fixed.update(
            {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
                MCP_PROTOCOL_VERSION_HEADER: protocol_version,
                MCP_METHOD_HEADER: "tools/call",
            }
        )
        if auth is not None:
            fixed["authorization"] = f"Bearer {auth}"
        else:
            basic = _basic_auth(url)
            if basic is not None:  # as httpx: user:password in the URL, when no `auth`
                fixed["authorization"] = basic
        fixed.setdefault("user-agent", f"toolwire-mcp (fastmcp/{fastmcp.__version__})")
        self._name_headers: dict[str, bytes] = {}
        self._drains: set[asyncio.Task[None]] = set()  # answered event streams read to their end
        # As the MCP transport: a longer request timeout also extends the read timeout.
        read_s = max(_READ_S, timeout_s) if timeout_s is not None else _READ_S
        self._pool = Pool(
            url,
            fixed,
            # The certificates httpx2 (the FastMCP client's HTTP stack) would trust.
            ssl=httpx2.create_ssl_context() if url.startswith("https:") else None,
            keepalive_s=_KEEPALIVE_S,
            connect_s=_CONNECT_S,
            pool_wait_s=_POOL_WAIT_S,
            read_s=read_s,
            max_body=max_answer_bytes,
        )

    @property
    def closed(self) -> bool:
        """Whether the HTTP connections are closed."""
        return self._pool.closed

    async def close(self) -> None:
        """Close the HTTP connections."""
        for task in list(self._drains):
            task.cancel()
        with anyio.CancelScope(shield=True):
            await self._pool.close()

    # ---------------------------------------------------------------- call
    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        meta: Mapping[str, Any] | None,
        progress: ProgressFn | None,
        input_responses: mcp_types.InputResponses | None = None,
        request_state: str | None = None,
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        """One ``tools/call`` POST: the result, or ``InputRequiredResult`` to drive."""
        rid = next(self._ids)
        envelope = dict(meta) if meta else {}
        envelope.update(self._envelope)
        if progress is not None:
            envelope["progressToken"] = rid  # the request id doubles as the token, as in the SDK
        params: dict[str, Any]
        if input_responses is None and request_state is None:
            params = {"name": name, "arguments": arguments, "_meta": envelope}
        else:  # a retry after input_required: dumped the way the SDK dumps it
            params = mcp_types.CallToolRequestParams(
                name=name,
                arguments=arguments,
                input_responses=input_responses,
                request_state=request_state,
                _meta=envelope,
            ).model_dump(by_alias=True, mode="json", exclude_none=True)
        body = pydantic_core.to_json(  # compact UTF-8 JSON, as json.dumps with separators
            {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
        )
        sending = Sending()
        if self._timeout_s is None:
            return await self._exchange(name, body, rid, progress, sending)
        deadline = asyncio.timeout(self._timeout_s)
        try:
            async with deadline:
                return await self._exchange(name, body, rid, progress, sending)
        except TimeoutError:
            if deadline.expired() and not sending.sent:
                raise PoolTimeout(
                    f"no connection to the server came free or could be opened within the "
                    f"entry's `timeout` ({self._timeout_s * 1000:g} ms); the request was not sent"
                ) from None
            if deadline.expired():  # what the SDK raises when the request times out
                raise MCPError(
                    code=mcp_types.REQUEST_TIMEOUT, message="Request 'tools/call' timed out"
                ) from None
            raise

    def _headers(self, name: str) -> bytes:
        h = self._name_headers.get(name)
        if h is None:
            h = Pool.header_block({MCP_NAME_HEADER: encode_header_value(name)})
            if len(self._name_headers) < 4096:  # the upstream's tools; bounded all the same
                self._name_headers[name] = h
        return h

    async def _exchange(
        self, name: str, body: bytes, rid: int, progress: ProgressFn | None, sending: Sending
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        resp = await self._pool.post(body, self._headers(name), sending)
        try:
            result = await self._answer(resp, name, rid, progress)
        except (MCPError, HTTPRefusal, NotMirrored):
            resp.release()  # an answer (a 429, a JSON-RPC error): kept if it was read to its end
            raise
        except BaseException:
            resp.close()  # cancelled or broken: drop the connection, the server sees it go
            raise
        if resp.consumed:
            resp.release()
        else:  # an event stream answered before its end: keep the connection if it ends soon
            self._drain_later(resp)
        return result

    def _drain_later(self, resp: Response) -> None:
        task = asyncio.get_running_loop().create_task(self._drain(resp))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    @staticmethod
    async def _drain(resp: Response) -> None:
        """Read the rest of an answered event stream, then give the connection back.

        A server ends the stream of a POST once it has sent the response; what
        comes before the end (rarely anything) is for a finished request and is
        dropped. A stream that runs on past ``_DRAIN_S`` or ``_DRAIN_BYTES``
        loses its connection, as it did before.
        """
        size = 0
        try:
            async with asyncio.timeout(_DRAIN_S):
                async for chunk in resp.chunks():
                    size += len(chunk)
                    if size > _DRAIN_BYTES:
                        break
        except (TimeoutError, WireError) as exc:
            log.debug("an answered event stream did not end: %s", exc)
        finally:
            resp.release()  # reused only when read to its end

    async def _answer(
        self, resp: Response, name: str, rid: int, progress: ProgressFn | None
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        status = resp.status
        ctype = resp.headers.get("content-type", "").lower()
        if status in (307, 308):  # the request is to be sent again, elsewhere: it did not run
            raise NotMirrored(f"HTTP {status} (redirect to {resp.headers.get('location')})")
        if 300 <= status < 400 and "location" in resp.headers:
            # Another redirect of a POST (a 303 See Other answers one that was processed):
            # not followed, as the SDK does not follow it; sending it again could run it twice.
            where = urllib.parse.urljoin(self._url, resp.headers["location"])
            raise MCPError(
                code=mcp_types.INVALID_REQUEST,
                message=f"Redirect to {where} not followed; use that URL as the endpoint if it "
                "is the intended server",
            )
        if status == 202:
            raise MCPError(
                code=mcp_types.INVALID_REQUEST,
                message="server answered a request with 202 Accepted",
            )
        if status >= 400:
            if ctype.startswith("application/json"):
                try:
                    msg = mcp_types.jsonrpc_message_adapter.validate_json(
                        await self._read(resp), by_name=False
                    )
                except (ValidationError, ValueError, AnswerTooLarge, UndecodableBody):
                    msg = None  # the status speaks (a refusal's body is not the answer)
                if isinstance(msg, mcp_types.JSONRPCError):
                    raise MCPError.from_error_data(msg.error)
            elif _small(resp):
                # read to its end, the connection can serve the next call (one over
                # the cap, decompressed, is not kept and loses its connection)
                with contextlib.suppress(TooLarge, UndecodableBody):
                    await resp.read()
            if refused(status):
                raise HTTPRefusal(status, resp.headers.get("retry-after"))
            if status == 404:
                raise MCPError(code=mcp_types.METHOD_NOT_FOUND, message="Not Found")
            raise MCPError(code=mcp_types.INTERNAL_ERROR, message=SDK_REFUSED_TEXT)
        if ctype.startswith("application/json"):
            try:
                raw = await self._read(resp)
            except UndecodableBody as exc:  # an answer came, unreadable
                raise MCPError(
                    code=mcp_types.PARSE_ERROR, message=f"Failed to parse JSON response: {exc}"
                ) from None
            try:
                msg = from_json(raw)
            except ValueError as exc:
                raise MCPError(
                    code=mcp_types.PARSE_ERROR, message=f"Failed to parse JSON response: {exc}"
                ) from None
            outcome = self._response(msg, rid)
            if outcome is None:
                theirs = msg.get("id") if isinstance(msg, dict) else None
                raise MCPError(
                    code=mcp_types.PARSE_ERROR,
                    message="Failed to parse JSON response: "
                    + (
                        f"an answer to request id {theirs!r}, not to this request ({rid})"
                        if theirs is not None
                        else "not a JSON-RPC response"
                    ),
                )
            return outcome
        if ctype.startswith("text/event-stream"):
            return await self._events(resp, name, rid, progress)
        raise MCPError(code=mcp_types.INVALID_REQUEST, message=f"Unexpected content type: {ctype}")

    async def _read(self, resp: Response) -> bytes:
        try:
            return await resp.read()
        except TooLarge as exc:
            raise AnswerTooLarge(exc.limit) from None

    # ------------------------------------------------------------- answers
    @staticmethod
    def _response(
        msg: Any, rid: int
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult | None:
        """The result of the JSON-RPC response to request ``rid`` (raises ``MCPError`` for an
        error); None for anything else (a notification, a response to another id)."""
        if not isinstance(msg, dict) or "id" not in msg:
            return None
        theirs = msg["id"]
        if isinstance(theirs, str):  # "7" is 7, as the SDK correlates (and the TS SDK)
            theirs = coerce_request_id(theirs)
        if theirs != rid and not (theirs is None and "error" in msg):
            log.warning("MCP server answered request %r to our request %r: ignored", msg["id"], rid)
            return None
        # Both (JSON-RPC forbids it): the error wins, as in the SDK, never a success
        # the server also called a failure.
        if "error" in msg:
            raise MCPError.from_error_data(mcp_types.ErrorData.model_validate(msg["error"]))
        if "result" in msg:
            raw = msg["result"]
            if isinstance(raw, dict) and raw.get("resultType") == "input_required":
                return mcp_types.InputRequiredResult.model_validate(raw)
            return mcp_types.CallToolResult.model_validate(raw)
        return None

    async def _events(
        self, resp: Response, name: str, rid: int, progress: ProgressFn | None
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        """Read SSE frames until the response: notifications on the way, comments ignored."""
        try:
            return await self._read_events(resp, name, rid, progress)
        except TooLarge as exc:  # not raised by chunks() now: _read_events caps each event
            raise AnswerTooLarge(exc.limit) from None
        except UndecodableBody as exc:  # an answer came, unreadable
            raise MCPError(
                code=mcp_types.PARSE_ERROR, message=f"Failed to parse SSE stream: {exc}"
            ) from None

    async def _read_events(
        self, resp: Response, name: str, rid: int, progress: ProgressFn | None
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        buf = bytearray()
        first = True
        data: list[bytes] = []
        size = 0
        event = b""
        scanned = 0  # the start of buf holds no line end this far (a long line comes in parts)
        async for chunk in resp.chunks():
            buf += chunk
            if first:  # a UTF-8 byte order mark may open the stream (and come split)
                if len(buf) < 3 and _BOM.startswith(buf):
                    continue
                if buf.startswith(_BOM):
                    del buf[:3]
                first = False
            start = 0
            # Lines end with CRLF, LF or a lone CR (the SSE spec, as the SDK reads them);
            # a CR ending the buffer waits for the next read, which may bring its LF.
            while (m := _EOL.search(buf, max(start, scanned))) is not None:
                nl = m.start()
                if m.end() == len(buf) and m.end() - nl == 1 and buf[nl] == 0x0D:
                    break
                line = bytes(buf[start:nl])
                start = m.end()
                if line:
                    if line.startswith(b":"):
                        continue  # a comment (keep-alive ping)
                    # The event's lines count toward the cap as they are read (as httpx2's
                    # SSE decoder counts them: a "data:" line of nothing is 5 bytes), even
                    # when the whole event came in one read.
                    size += len(line)
                    if size > self._max_answer:
                        raise AnswerTooLarge(self._max_answer)
                    field, _, value = line.partition(b":")
                    if value.startswith(b" "):
                        value = value[1:]
                    if field == b"data":
                        data.append(value)
                    elif field == b"event":
                        event = value
                    continue
                # a blank line ends the event
                if data and event in (b"", b"message"):
                    outcome = await self._frame(b"\n".join(data), name, rid, progress)
                    if outcome is not None:
                        return outcome
                elif data:
                    log.warning("MCP server %r: unknown SSE event %r", self.server, event)
                data, size, event = [], 0, b""
            del buf[:start]
            scanned = max(0, len(buf) - 1)  # a CR ending it is looked at again, with what follows
            if size + len(buf) > self._max_answer:
                raise AnswerTooLarge(self._max_answer)
        if buf == b"\r" and data and event in (b"", b"message"):  # a blank line, then the end
            outcome = await self._frame(b"\n".join(data), name, rid, progress)
            if outcome is not None:
                return outcome
        raise MCPError(
            code=mcp_types.CONNECTION_CLOSED, message="SSE stream ended without a response"
        )

    async def _frame(
        self, data: bytes, name: str, rid: int, progress: ProgressFn | None
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult | None:
        try:
            msg = from_json(data)
        except ValueError as exc:
            raise MCPError(
                code=mcp_types.PARSE_ERROR, message=f"Failed to parse SSE message: {exc}"
            ) from None
        outcome = self._response(msg, rid)
        if outcome is not None:
            return outcome
        method = msg.get("method") if isinstance(msg, dict) else None
        params = msg.get("params") if isinstance(msg, dict) else None
        if not isinstance(params, dict):
            params = {}
        if method == "notifications/progress":
            await self._progress(params, rid, progress)
        elif method == "notifications/message":
            level = params.get("level")
            log.log(
                logging.DEBUG if level == "debug" else logging.INFO,
                "MCP server %r, tool %r logs (%s): %s",
                self.server,
                name,
                level,
                params.get("data"),
            )
        elif method == "notifications/tools/list_changed":
            self._on_list_changed()
        else:
            log.debug("MCP server %r: ignored %s during a call", self.server, method)
        return None

    async def _progress(
        self, params: dict[str, Any], rid: int, progress: ProgressFn | None
    ) -> None:
        token, value = params.get("progressToken"), params.get("progress")
        if (
            progress is None
            or token != rid
            or isinstance(token, bool)
            or not isinstance(value, int | float)
            or isinstance(value, bool)
        ):
            return
        total, message = params.get("total"), params.get("message")
        try:
            await progress(
                float(value),
                float(total) if isinstance(total, int | float) else None,
                message if isinstance(message, str) else None,
            )
        except Exception:
            log.exception("MCP server %r: the progress handler raised", self.server)
