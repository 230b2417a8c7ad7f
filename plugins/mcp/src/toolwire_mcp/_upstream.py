"""Upstream MCP servers as tool sources: one FastMCP client per server, supervised.

Each server gets a supervisor task that connects, lists the tools, watches the
session (``tools/list_changed`` -> re-list; lost connection -> reconnect with
exponential backoff) and hands calls to the live client. The FastMCP client
runs on asyncio, so this side of the plugin needs an asyncio event loop.

``tools/call`` of a Streamable-HTTP server speaking the 2026-07-28 protocol
goes through a lean direct caller (``_direct.py``, one keep-alive connection
pool per upstream session) unless ``direct_http_calls`` is false; both paths' failures
are mapped by the same code (``_failure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import ssl
import threading
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from time import monotonic
from typing import Any, Final, Literal, cast

import anyio
import httpx2
import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import jsonschema.exceptions  # type: ignore[import-untyped]
import jsonschema.validators  # type: ignore[import-untyped]
import mcp_types
import pydantic_core
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from fastmcp.client.transports import (
    ClientTransport,
    SSETransport,
    StdioTransport,
    StreamableHttpTransport,
)
from mcp.client import InputRequiredRoundsExceededError
from mcp.client.subscriptions import ListenNotSupportedError, ToolsListChanged, listen
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, ValidationError

from toolwire import (
    CallContext,
    ErrorKind,
    Kernel,
    Tool,
    ToolAnnotations,
    ToolError,
    parse_retry_after,
)
from toolwire.decoding import Decoder, DecodingError, UnsupportedEncoding, content_coding

from ._config import TOOL_NAME, MCPConfig, ServerConfig
from ._convert import (
    CALL_ID_META_KEY,
    RESULT_META_KEY,
    make_validator,
    quick_check,
    remote_error,
    remote_value,
    utf8_safe,
)
from ._direct import (
    CLIENT_INFO,
    SDK_REFUSED_TEXT,
    AnswerTooLarge,
    DirectCaller,
    HTTPRefusal,
    NotMirrored,
    ProgressFn,
    refused,
)
from ._lenient import from_json, install_stdio_reader
from ._wire import ConnectError, PoolTimeout, WireError

__all__ = ["Upstream"]

log = logging.getLogger("toolwire.mcp")

_PERMISSIVE: dict[str, Any] = {"type": "object", "additionalProperties": True}
_CACHE_PREFIX = "toolwire_mcp:tools:"
_HEALTH_TICK_S = 0.5
_STOP_WAIT_S = 5.0
#: The MCP client's error for a ping its request timeout ended (the server did not answer)
_PING_TIMED_OUT = "Request 'ping' timed out"
#: Transport failures that mean the connection is gone (the outcome of a call is unknown).
_LOST: tuple[type[BaseException], ...] = (
    RuntimeError,
    OSError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    httpx2.TransportError,
    WireError,
)


def _schema_violation(exc: BaseException) -> bool:
    """The MCP SDK's check of a result against the tool's output schema failed."""
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return text.startswith(
        ("Invalid structured content returned by tool", "Invalid schema for tool")
    ) or text.endswith("has an output schema but did not return structured content")


#: Set around a FastMCP-client call: the HTTP statuses >= 400 its POSTs got, with
#: their Retry-After (the SDK turns them into a bare "Server returned an error
#: response" MCP error; the status decides the kind).
_REFUSALS: ContextVar[list[tuple[int, str | None]] | None] = ContextVar(
    "toolwire_mcp_refusals", default=None
)


#: Set around a FastMCP-client call: the requests of it that never went out (no connection
#: could be made). The SDK then ends the session and fails the call with a bare
#: "Connection closed", which says nothing of whether the call was sent.
_UNSENT: ContextVar[list[str] | None] = ContextVar("toolwire_mcp_unsent", default=None)


class _NotingClient(httpx2.AsyncClient):
    """The MCP transport's HTTP client, noting for the call in progress (``_UNSENT``) a
    request that could not be sent: no connection could be made, so nothing ran."""

    async def send(self, request: httpx2.Request, *args: Any, **kwargs: Any) -> httpx2.Response:
        try:
            return await super().send(request, *args, **kwargs)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            unsent = _UNSENT.get()
            if unsent is not None:
                unsent.append(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            raise


class _OverLimit(httpx2.StreamError):
    """Raised reading a FastMCP-client answer over ``max_answer_bytes`` (the SDK then
    answers the request with a parse error quoting this text, recognized by ``_MARK``)."""

    def __init__(self, limit: int, server: str) -> None:
        super().__init__(f"{_MARK} {limit} bytes ([plugins.mcp.servers.{server}])")


class _Unreadable(httpx2.StreamError):
    """A JSON answer that cannot be decompressed (the SDK answers the request with a parse
    error quoting this text: an answer came, unreadable)."""


class _UnreadableEvents(httpx2.SSEError):
    """An event stream that cannot be decompressed (the SDK ends the stream's request with
    "SSE stream failed: ...", which ``_call_client`` turns into the direct path's error)."""


#: What ``_CappedStream`` (and the direct path's ``_wire``) say of a body they cannot decode.
_UNDECODABLE: Final = re.compile(
    r"unsupported Content-Encoding |bad \S+ body: |the \S+ body (goes on after|ends before) "
    r"its compressed stream"
)


_MARK: Final = "toolwire: the answer is over max_answer_bytes ="
#: The most an event stream's compressed read is decompressed to at a time.
_STEP: Final = 64 * 1024


class _NotOurAnswer(httpx2.StreamError):
    """Raised reading a FastMCP-client JSON answer that is no answer to the request it came
    for (the SDK then answers the request with a parse error quoting this text; it would
    drop such an answer and wait for the request's own, for ever without a ``timeout``)."""


class _Envelope(BaseModel):
    """What of a JSON-RPC message tells whose answer it is; the rest is skipped, not built."""

    model_config = ConfigDict(extra="ignore")
    id: Any = None
    error: Any = None
    method: Any = None


def _request_id(request: httpx2.Request) -> Any:
    """The id of the JSON-RPC request a POST carries; None for a notification (or no JSON)."""
    try:
        msg = from_json(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    return msg.get("id") if isinstance(msg, dict) and "method" in msg else None


def _same_id(theirs: Any, ours: Any) -> bool:
    """Whether two request ids are one, as the SDK correlates them ("7" is 7)."""
    if isinstance(theirs, str):
        theirs = coerce_request_id(theirs)
    if isinstance(ours, str):
        ours = coerce_request_id(ours)
    return bool(theirs == ours)


def _our_answer(body: bytes, rid: Any) -> bytes:
    """``body``, a JSON answer to the request of id ``rid``, as the SDK can use it.

    An answer to another request, or a message that is no answer, raises
    ``_NotOurAnswer`` (the direct path fails such a call alike). An error for no
    request (id null) gets ``rid``, as the SDK does with one in a 4xx answer and
    the direct path always. Anything that is no single JSON-RPC message passes
    as it is: the SDK says what is wrong with it.
    """
    try:
        env = _Envelope.model_validate_json(body)
    except ValueError:
        return body
    if "method" in env.model_fields_set or "id" not in env.model_fields_set:
        raise _NotOurAnswer("not a JSON-RPC response")
    if env.id is None and "error" in env.model_fields_set:
        msg = from_json(body)
        msg["id"] = rid
        return pydantic_core.to_json(msg)
    if not _same_id(env.id, rid):
        raise _NotOurAnswer(f"an answer to request id {env.id!r}, not to this request ({rid!r})")
    return body


class _CappedStream(httpx2.AsyncByteStream):
    """A response body capped at ``limit`` bytes, decompressed here (gzip, deflate).

    ``whole``: the whole body is capped, decompressed and as sent (a JSON answer;
    ``_OverLimit``), with the room left as the most any one call may produce, so
    that a small compressed read cannot expand a thousandfold first. Else (an
    event stream, whose events the SDK caps itself at ``max_sse_event_size``) the
    body is decompressed ``_STEP`` bytes at a time, each piece made when the SDK
    reads on. httpx is then told the body is plain.
    With ``rid``, a JSON answer is read whole and checked to answer that
    request (``_our_answer``).
    """

    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limit: int,
        server: str,
        *,
        whole: bool,
        declared: int | None,
        encoding: str | None,
        rid: Any = None,
    ) -> None:
        self._rid = rid
        self._inner = inner
        self._limit = limit
        self._server = server
        self._whole = whole
        self._declared = declared
        self._encoding = encoding

    def _over(self) -> Exception:
        return _OverLimit(self._limit, self._server)  # a whole body (events: the SDK's cap)

    def _unreadable(self, why: str) -> Exception:
        # raised while the SDK reads the body, so that it answers the request with it
        # (an exception in the response hook would end its whole writer task instead)
        return _Unreadable(why) if self._whole else _UnreadableEvents(why)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        limit, whole = self._limit, self._whole
        if whole and self._encoding is None and (self._declared or 0) > limit:
            raise self._over()
        decoder: Decoder | None = None
        if self._encoding is not None:
            try:
                decoder = Decoder(self._encoding)
            except DecodingError as exc:
                raise self._unreadable(str(exc)) from None
        size = sent = 0
        held: list[bytes] | None = [] if self._rid is not None else None
        async for chunk in self._inner:
            if decoder is not None and chunk and not whole:
                # An event stream: decoded as the SDK reads it, ``_STEP`` bytes at a time;
                # its parser caps each event (and a line under way) at the limit. Capping
                # what one read expands to failed a stream of small events arriving in one
                # read (a compressor's flush) as one event over the cap.
                try:
                    for piece in decoder.pieces(chunk, _STEP):
                        yield piece
                except DecodingError as exc:
                    raise self._unreadable(str(exc)) from None
                continue
            if decoder is not None and chunk:
                # a whole body counts as sent too: compressed data may expand to nothing
                sent += len(chunk)
                if whole and sent > limit:
                    raise self._over()
                # at most the room left plus one byte: a small read cannot expand first
                room = limit - (size if whole else 0)
                try:
                    chunk = decoder.decompress(chunk, room + 1)
                except DecodingError as exc:
                    raise self._unreadable(str(exc)) from None
                if len(chunk) > room:  # past the cap
                    raise self._over()
            size += len(chunk)
            if whole and size > limit:
                raise self._over()
            if held is not None:
                held.append(chunk)
            elif chunk:
                yield chunk
        if decoder is not None:
            try:  # as the direct path: a cut compressed body is no answer
                decoder.finish()
            except DecodingError as exc:
                raise self._unreadable(str(exc)) from None
        if held is not None:
            yield _our_answer(b"".join(held), self._rid)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _quiet_over_limit(record: logging.LogRecord) -> bool:
    """Drop the SDK's "Error parsing JSON response" traceback for an answer toolwire cut
    (the call's own error says what happened)."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, _OverLimit)


logging.getLogger("mcp.client.streamable_http").addFilter(_quiet_over_limit)


def _too_large(exc: MCPError, limit: int) -> bool:
    """Whether the SDK's error is an answer over ``limit``: a JSON body ``_CappedStream``
    stopped, or an event over the transport's ``max_sse_event_size``."""
    if exc.code == mcp_types.PARSE_ERROR:
        return f"{_MARK} {limit} bytes" in exc.message
    return exc.code == mcp_types.CONNECTION_CLOSED and exc.message.endswith(
        f"exceeded the {limit} byte limit."
    )


def _client_closed(exc: MCPError) -> bool:
    """Whether a -32000 error is the client's word for a connection or stream that ended
    (the SDK's "Connection closed" and "SSE stream ...", which the direct path uses too).

    Not a server's own JSON-RPC error with that code: -32000 is the first of JSON-RPC's
    "server error" codes, which many servers use for any failure. Such an error is an
    answer (``tool_error``), not a lost connection to reconnect.
    """
    return exc.message == "Connection closed" or exc.message.startswith("SSE stream ")


def _no_answer(exc: MCPError) -> bool:
    """Whether the error is the client's for a 2xx answer it could not read as the
    answer: not JSON-RPC, an answer to another request, no MCP content type, a 202."""
    if exc.code == mcp_types.PARSE_ERROR:
        return exc.message.startswith(("Failed to parse JSON response", "Failed to parse SSE"))
    return exc.code == mcp_types.INVALID_REQUEST and exc.message.startswith(
        ("Unexpected content type", "server answered a request with 202 Accepted")
    )


def _session_dead(client: Client[Any]) -> bool:
    """True once the connection under ``client``'s session has closed.

    ``Client.is_connected()`` stays true after a stdio server's process exits:
    FastMCP's stdio transport keeps its session until it is disconnected, though
    the session's read loop has ended (``StdioTransport._is_session_dead``, which
    FastMCP's own ``keep_alive`` reconnect relies on). Without this, a server that
    died while idle was noticed only when the next call failed on it.
    """
    dead = getattr(client.transport, "_is_session_dead", None)
    if not callable(dead):
        return False
    try:
        return bool(dead())
    except Exception:  # a FastMCP internal: never let it break the health watch
        return False


class _ConnectionLost(Exception):
    """The session ended (process exited, stream closed) while it was up."""


class _SessionExpired(Exception):
    """A handshake-era Streamable-HTTP session the server no longer knows: HTTP 404 to a
    request carrying its ``Mcp-Session-Id`` (the server restarted, or ended the session),
    or HTTP 400 to it and to a ``ping`` on the session (``Upstream._forgotten``). The
    server refused the request: nothing ran. The spec's answer is a new session."""

    def __init__(self, message: str, *, status: int = 404) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status that told it


def _session_id(client: Client[Any]) -> str | None:
    """The ``Mcp-Session-Id`` of ``client``'s Streamable-HTTP session, if it has one."""
    get = getattr(client.transport, "get_session_id", None)
    if not callable(get):
        return None
    try:
        sid = get()
    except Exception:  # a FastMCP internal: never let it break a call
        return None
    return sid if isinstance(sid, str) and sid else None


class _StderrTap:
    """A pipe for a stdio child's stderr: each line is logged (JSON) and the last ones kept.

    ``redact`` hides known secrets in each line before it is logged or kept: a
    server printing the key it was given in ``env`` (a ``$secretRef``) must not
    put it in the gateway's log, nor, through the kept lines, in errors.
    """

    def __init__(self, server: str, redact: Callable[[str], str] | None = None) -> None:
        self.server = server
        self._redact = redact
        self.tail: deque[str] = deque(maxlen=20)
        rfd, wfd = os.pipe()
        self.writer = os.fdopen(wfd, "w", buffering=1)
        self._reader = os.fdopen(rfd, "r", errors="replace")
        self._lock = threading.Lock()
        self._ended = False
        self._on_end: Callable[[], object] | None = None
        self._thread = threading.Thread(
            target=self._pump, name=f"toolwire-mcp-stderr-{server}", daemon=True
        )
        self._thread.start()

    def _pump(self) -> None:
        try:
            self._read_lines()
        finally:
            with self._lock:
                self._ended = True
                if self._on_end is not None:
                    with contextlib.suppress(RuntimeError):  # the loop is closed
                        self._on_end()

    def _read_lines(self) -> None:
        lg = logging.getLogger(f"toolwire.mcp.stderr.{self.server}")
        with self._reader:
            while line := self._reader.readline(_MAX_STDERR_LINE):
                if line.endswith("\n"):
                    text = line[:-1]
                else:  # longer than the cap: keep its start, count the rest (memory stays small)
                    rest = 0
                    while more := self._reader.readline(_MAX_STDERR_LINE):
                        rest += len(more)
                        if more.endswith("\n"):
                            rest -= 1
                            break
                    text = f"{line}... ({rest} more characters on this line)" if rest else line
                if self._redact is not None:
                    text = self._redact(text)
                self.tail.append(text)
                lg.info("%s", text)

    def recent(self, n: int = 3) -> str:
        """The last ``n`` lines, joined."""
        return " | ".join(list(self.tail)[-n:])

    def close(self) -> None:
        """Close our end; the reader stops once the children have exited."""
        with contextlib.suppress(OSError):
            self.writer.close()

    async def aclose(self, wait_s: float = _STOP_WAIT_S) -> None:
        """``close()``, then wait (bounded) for the reader thread to end: once the server's
        processes are gone their end of the pipe is closed too, so it ends at once."""
        self.close()
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._ended:

                def settle() -> None:
                    if not ended.done():
                        ended.set_result(None)

                self._on_end = lambda: loop.call_soon_threadsafe(settle)
        if self._on_end is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(wait_s):
                await ended
        if self._ended:
            self._thread.join(1.0)  # it is returning from _pump: a moment at most
        else:
            log.warning(
                "MCP server %r: a process it started still holds its stderr open; the "
                "thread reading it ends when that process exits",
                self.server,
            )


#: A stdio server's stderr line is kept (logged, quoted in errors) up to this many characters.
_MAX_STDERR_LINE = 8192


class _Notifications(MessageHandler):
    def __init__(self, on_list_changed: Callable[[], None]) -> None:
        self._on_list_changed = on_list_changed

    async def on_tool_list_changed(self, message: mcp_types.ToolListChangedNotification) -> None:
        self._on_list_changed()


def _object_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """An output schema the kernel's normalized content matches (objects pass through).

    Structured content that is an object is the kernel's content as it is
    (``remote_value``), so a schema that may describe an object — no ``type``
    (``properties`` alone, ``anyOf``, a ``$ref``), or a list of types naming
    ``object`` — says ``"type": "object"`` at its top (its ``$defs`` stay at the
    root, where its ``$ref``s point). Wrapping it in ``{"result": ...}`` described
    a value the tool never gives: the gateway's MCP export (which wraps any
    schema whose ``type`` is not ``"object"``) then failed every call of the tool
    as a result breaking its output schema. Only a schema of another type (an
    array, a string) is wrapped, as its value is (``{"result": value}``).
    """
    if schema is None:
        return None
    kind = schema.get("type")
    if kind == "object":
        return schema
    if kind is None or (isinstance(kind, list) and "object" in kind):
        return {**schema, "type": "object"}
    return {"type": "object", "properties": {"result": schema}, "required": ["result"]}


def _first_problem(exc: ValidationError) -> str:
    """The first of a pydantic error's problems, on one line ("resultType: Field required")."""
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where or 'result'}: {first.get('msg', '')}{more}"


def _answer_text(result: mcp_types.CallToolResult) -> str:
    """The text blocks of an answer, as ``remote_text`` quotes them (bounded)."""
    text = "\n".join(b.text for b in result.content or [] if isinstance(b, mcp_types.TextContent))
    return text[:2000]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    if isinstance(exc, httpx2.HTTPStatusError):  # its text quotes the URL, query and all
        response = exc.response
        return f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, _ConnectionLost | _SessionExpired):  # ours: the class name is noise
        return str(exc)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, RuntimeError) else text


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, what caused it and the members of exception groups, depth first (bounded)."""
    out: list[BaseException] = []
    todo = [exc]
    while todo and len(out) < 32:
        e = todo.pop()
        if any(e is seen for seen in out):
            continue
        out.append(e)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(reversed(e.exceptions))
        for nxt in (e.__context__, e.__cause__):
            if nxt is not None:
                todo.append(nxt)
    return out


class Upstream:
    """One configured upstream MCP server: its client, its tools, its health."""

    def __init__(
        self,
        name: str,
        cfg: ServerConfig,
        plugin_cfg: MCPConfig,
        kernel: Kernel,
        refresh: Callable[[], Awaitable[None]],
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.plugin_cfg = plugin_cfg
        self.kernel = kernel
        self._refresh = refresh
        self.tools: list[Tool] = []
        self.status: Literal["connecting", "up", "down", "stopped"] = "connecting"
        self.last_error: str | None = None
        self.down_kind: str = ErrorKind.UNAVAILABLE
        self._http_status: int | None = None
        self.next_attempt_at: float | None = None
        self._connecting_since = monotonic()
        self.first_attempt = anyio.Event()
        self._signature: tuple[Any, ...] = ()
        self._unknown_names: tuple[str, ...] = ()  # include/exclude names last warned about
        self._unfit_names: tuple[str, ...] = ()  # remote names MCP does not allow, last warned
        self._twice_names: tuple[str, ...] = ()  # remote names listed twice, last warned
        self._client: Client[Any] | None = None
        self._stop = anyio.Event()
        self._wake = anyio.Event()
        self._want_relist = False
        self._relist_at = 0.0  # after a failed re-listing: not before this (monotonic)
        self._lost_client: Client[Any] | None = None
        self._lost_why = "the connection was lost"  # what the supervisor logs for it
        #: A session whose server the supervisor is to check: a call lost a connection of
        #: its own (the direct path's, or one event stream), not the session's (``_lost``).
        self._suspect: Client[Any] | None = None
        #: The server check in progress (``_check``): ``stop`` cancels it
        self._checking: anyio.CancelScope | None = None
        #: Such checks done (tests wait for them)
        self.health_checks = 0
        self._session_client: Client[Any] | None = None
        self._session_down = anyio.Event()
        self._task: asyncio.Task[None] | None = None
        self._direct: DirectCaller | None = None  # the caller of the live session, if any
        self._http: DirectCaller | None = None  # kept across sessions, closed on stop
        #: remote tools whose schema asks for ``Mcp-Param-*`` headers (FastMCP client only)
        self._param_header_tools: frozenset[str] = frozenset()
        self._output_schemas: dict[str, dict[str, Any]] = {}
        self._output_checkers: dict[str, tuple[Any, Any]] = {}
        #: ``tools/call`` requests sent over the direct HTTP path (tests check it is used)
        self.direct_calls = 0
        self._stderr = (
            _StderrTap(name, redact=kernel.redactor.text) if cfg.kind == "stdio" else None
        )

    # ------------------------------------------------------------ lifecycle
    async def load_known_tools(self) -> None:
        """Before the first connection: the tools remembered in the state store, or the include list."""
        remote: list[mcp_types.Tool] = []
        if self.plugin_cfg.cache_tools:
            try:
                cached = await self.kernel.state.get(_CACHE_PREFIX + self.name)
            except Exception as exc:
                log.warning("MCP server %r: cannot read its cached tool list: %s", self.name, exc)
                cached = None
            if isinstance(cached, list):
                for item in cached:
                    with contextlib.suppress(Exception):
                        remote.append(mcp_types.Tool.model_validate(item))
        if not remote and self.cfg.include:
            remote = [
                mcp_types.Tool(
                    name=n,
                    description=f"(tool of MCP server {self.name!r}; its schema is known once "
                    "the server is reachable)",
                    input_schema=dict(_PERMISSIVE),
                )
                for n in self.cfg.include
            ]
        self._adopt(remote, listed=False)

    def start(self) -> None:
        """Start the supervisor task (asyncio)."""
        self._task = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"toolwire-mcp:{self.name}"
        )

    async def stop(self) -> None:
        """Stop the supervisor and close the client (bounded)."""
        self._stop.set()
        self._wake.set()
        if self._checking is not None:  # a ping the server may never answer
            self._checking.cancel()
        task = self._task
        if task is not None and not task.done():
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(_STOP_WAIT_S):
                    await asyncio.wait({task})
                if not task.done():
                    task.cancel()
                    with anyio.move_on_after(_STOP_WAIT_S):
                        await asyncio.wait({task})
        self.status = "stopped"
        self._direct = None
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
        if self._stderr is not None:
            await self._stderr.aclose()

    # -------------------------------------------------------------- client
    def _transport(self) -> ClientTransport:
        cfg = self.cfg
        if cfg.kind == "stdio":
            install_stdio_reader()  # lines with lone surrogates: read, not dropped
            return StdioTransport(
                command=str(cfg.command),
                args=list(cfg.args),
                env=dict(cfg.env) or None,
                cwd=cfg.cwd,
                keep_alive=False,
                log_file=self._stderr.writer if self._stderr is not None else None,
            )
        auth = cfg.auth.get_secret_value() if cfg.auth is not None else None
        factory: Any = self._http_client  # an McpHttpClientFactory
        if cfg.kind == "sse":
            return SSETransport(
                str(cfg.url), headers=dict(cfg.headers), auth=auth, httpx_client_factory=factory
            )
        return StreamableHttpTransport(
            str(cfg.url),
            headers=dict(cfg.headers),
            auth=auth,
            httpx_client_factory=factory,
            max_sse_event_size=cfg.max_answer_bytes,
        )

    def _http_client(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
        **_: Any,
    ) -> httpx2.AsyncClient:
        """The HTTP client of the MCP transport, noting refused responses (401, 403, 5xx),
        capping every answer at ``max_answer_bytes`` (``_CappedStream``) and, on
        Streamable HTTP, failing a JSON answer to another request (``_our_answer``).

        It asks for answers uncompressed (``Accept-Encoding: identity``) unless
        the entry's ``headers`` ask otherwise; a gzip or deflate body (sent
        anyway, or asked for) is decompressed under the cap, another coding
        fails the request.
        """
        limit, server = self.cfg.max_answer_bytes, self.name
        checks_ids = self.cfg.kind == "http"

        async def note(response: httpx2.Response) -> None:
            try:
                coding = content_coding(response.headers.get("content-encoding"))
            except UnsupportedEncoding as exc:
                coding = exc.coding  # refused by _CappedStream as the SDK reads the body
            if coding is not None:
                del response.headers["content-encoding"]  # decoded by _CappedStream, not httpx
            declared = response.headers.get("content-length", "")
            ctype = response.headers.get("content-type", "").lower()
            response.stream = _CappedStream(
                cast(httpx2.AsyncByteStream, response.stream),
                limit,
                server,
                whole=not ctype.startswith("text/event-stream"),
                declared=int(declared) if declared.isdigit() else None,
                encoding=coding,
                # Streamable HTTP: a JSON answer to a request POST is its response (a
                # 4xx one the SDK matches itself; a legacy SSE server answers elsewhere)
                rid=_request_id(response.request)
                if checks_ids
                and ctype.startswith("application/json")
                and response.request.method == "POST"
                and 200 <= response.status_code < 300
                else None,
            )
            if response.status_code >= 400:
                self._http_status = response.status_code
                refusals = _REFUSALS.get()
                if refusals is not None:
                    refusals.append((response.status_code, response.headers.get("retry-after")))

        merged = httpx2.Headers(headers or {})
        merged.setdefault("accept-encoding", "identity")
        return _NotingClient(
            headers=merged,
            timeout=timeout or httpx2.Timeout(30.0, read=300.0),
            auth=auth,
            event_hooks={"response": [note]},
        )

    def _list_changed(self) -> None:
        """The server announced ``tools/list_changed``: the supervisor re-lists it."""
        self._want_relist = True
        self._wake.set()

    def _make_client(self) -> Client[Any]:
        return Client(
            self._transport(),
            name=f"toolwire-mcp-{self.name}",
            client_info=CLIENT_INFO,
            timeout=self.cfg.timeout_s,
            init_timeout=self.plugin_cfg.connect_timeout_s,
            mode=self.plugin_cfg.protocol,
            message_handler=_Notifications(self._list_changed),
        )

    # ---------------------------------------------------------- supervisor
    async def _supervise(self) -> None:
        pcfg = self.plugin_cfg
        delay = pcfg.reconnect_initial_s
        failures = 0
        while not self._stop.is_set():
            try:
                await self._session_once()
            except Exception as exc:
                self._client = None
                if self.status == "up":  # it worked before it broke: start the backoff afresh
                    failures = 0
                    delay = pcfg.reconnect_initial_s
                failures += 1
                if self._stderr is not None:
                    await anyio.sleep(0.1)  # the last stderr lines of a dying server
                self._went_down(exc, quiet=failures > 1)
            finally:
                self._client = None
                self._direct = None
                self._session_down.set()
            self.first_attempt.set()
            if self._stop.is_set():
                break
            self.next_attempt_at = monotonic() + delay
            with anyio.move_on_after(delay):
                await self._stop.wait()
            delay = min(delay * 2, pcfg.reconnect_max_s)

    async def _session_once(self) -> None:
        """Connect, list, then watch the session until it ends (raises) or the plugin stops."""
        client = self._make_client()
        self.status = "connecting"
        self._connecting_since = monotonic()
        self._session_client = client
        self._session_down = anyio.Event()
        self._http_status = None
        if self._stderr is not None:
            self._stderr.tail.clear()
        async with contextlib.AsyncExitStack() as stack:
            with anyio.fail_after(self.plugin_cfg.connect_timeout_s):
                await stack.enter_async_context(client)
                remote = await client.list_tools()
            # Not bounded: the server has answered. A catalog refresh held up (by another
            # tool source re-indexing, say) must neither fail this attempt nor be cut
            # after the listing was adopted (the next attempt would find nothing changed).
            await self._apply(remote)
            direct = await self._direct_caller(client)
            self._direct = direct
            self._client = client
            self.status = "up"
            self.last_error = None
            self.next_attempt_at = None
            self.first_attempt.set()
            log.info(
                "MCP server %r connected (%s, protocol %s%s): %d tools",
                self.name,
                self.cfg.kind,
                client.protocol_version,
                ", direct HTTP calls" if direct is not None else "",
                len(self.tools),
            )
            async with anyio.create_task_group() as tg:
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    tg.start_soon(self._listen, client)
                await self._watch(client)
                tg.cancel_scope.cancel()
            self._client = None
            self._direct = None

    async def _direct_caller(self, client: Client[Any]) -> DirectCaller | None:
        """The direct caller for this session, when the direct path applies.

        One caller (one HTTP connection pool) serves every session of this
        server: a reconnect must not cut the calls still running on it. It is
        closed when the plugin stops, or replaced when the protocol changes.
        """
        cached = self._http
        if (
            cached is not None
            and not cached.closed
            and cached.protocol_version == str(client.protocol_version)
        ):
            return cached if self.plugin_cfg.direct_http_calls else None
        if cached is not None:
            self._http = None
            await cached.close()
        cfg = self.cfg
        if (
            not self.plugin_cfg.direct_http_calls
            or cfg.kind != "http"
            or client.protocol_version not in MODERN_PROTOCOL_VERSIONS
        ):
            return None
        url = str(cfg.url)
        auth = cfg.auth.get_secret_value() if cfg.auth is not None else None
        proxies = urllib.request.getproxies()
        why = (
            "a proxy is configured in the environment"
            if urllib.parse.urlsplit(url).scheme in proxies or "all" in proxies
            else "`auth` asks FastMCP for an OAuth flow"
            if auth == "oauth"
            else None
        )
        if why is not None:
            log.info(
                "MCP server %r: %s; tools/call goes through the FastMCP client", self.name, why
            )
            return None
        self._http = DirectCaller(
            server=self.name,
            url=url,
            protocol_version=str(client.protocol_version),
            headers=cfg.headers,
            auth=auth,
            timeout_s=cfg.timeout_s,
            on_list_changed=self._list_changed,
            max_answer_bytes=cfg.max_answer_bytes,
        )
        return self._http

    async def _watch(self, client: Client[Any]) -> None:
        while not self._stop.is_set():
            with anyio.move_on_after(_HEALTH_TICK_S):
                await self._wake.wait()
            self._wake = anyio.Event()
            if self._stop.is_set():
                return
            if self._lost_client is client or not client.is_connected() or _session_dead(client):
                self._client = None  # no new calls on this client from here on
                why = self._lost_why if self._lost_client is client else None
                raise _ConnectionLost(why or "the connection was lost")
            if self._suspect is not None:
                suspect, self._suspect = self._suspect, None
                if suspect is client:
                    await self._check(client)
            if self._want_relist and monotonic() >= self._relist_at:
                self._want_relist = False
                await self._relist_live(client)

    async def _check(self, client: Client[Any]) -> None:
        """Whether the server still answers, after a call lost its connection (``_lost``).

        That connection was one of the direct caller's pool (dropped with its call), or an
        event stream of one request: a broken answer (a reset, a close mid-answer, bytes
        that are no HTTP) says little of the server. Any answer to a ``ping`` (a 2026-07-28
        server may answer it "method not found") means it is up: the session goes on. No
        answer within ``connect_timeout_s`` (or the entry's shorter ``timeout``), or none
        the client can get, ends the session
        and the supervisor reconnects, as for a session that died; an HTTP 404 (or 400)
        to a handshake-era session starts a new one at once.
        """
        limit = self.plugin_cfg.connect_timeout_s
        why: str | None = None
        refusals: list[tuple[int, str | None]] = []
        token = _REFUSALS.set(refusals)
        stopping = anyio.CancelScope()  # cancelled by stop(): the check ends with the plugin
        self._checking = stopping
        try:
            with stopping:
                if self._stop.is_set():
                    stopping.cancel()
                with anyio.fail_after(limit):
                    await client.ping()
            if stopping.cancel_called:
                return
        except MCPError as exc:
            # a handshake-era session it forgot (a ping cannot be a bad request: a 400 to
            # it is about the session too)
            if self._expired(client, exc, refusals, ping=True):
                status = refusals[-1][0]
                self._session_gone(client, status)
                raise _SessionExpired(self._lost_why, status=status) from exc
            if exc.code == mcp_types.CONNECTION_CLOSED and _client_closed(exc):
                why = self.shown(_describe(exc))  # the client could not reach it
            elif exc.code == mcp_types.REQUEST_TIMEOUT and exc.message == _PING_TIMED_OUT:
                # the client's own timeout (the entry's `timeout`, when shorter than
                # connect_timeout_s) ended the ping: no answer, not an error answer
                why = f"no answer within the entry's timeout ({self.cfg.timeout} ms)"
        except Exception as exc:
            why = (
                f"no answer within connect_timeout_s={limit}s"
                if isinstance(exc, TimeoutError)
                else self.shown(_describe(exc))
            )
        finally:
            self._checking = None
            _REFUSALS.reset(token)
            self.health_checks += 1
        if why is not None and not self._stop.is_set():
            self._client = None  # no new calls on this client from here on
            raise _ConnectionLost(
                f"the connection was lost during a call, and the server does not answer ({why})"
            )
        if why is None:
            log.info(
                "MCP server %r answers after a call lost its connection; the session goes on",
                self.name,
            )

    async def _relist_live(self, client: Client[Any]) -> None:
        """Re-list a live session after ``tools/list_changed``, bounded by connect_timeout_s.

        A server busy with long calls may answer late, or fail the listing: its tools
        stay as they were, the session stays up, and the listing is asked again later.
        """
        limit = self.plugin_cfg.connect_timeout_s
        refusals: list[tuple[int, str | None]] = []
        token = _REFUSALS.set(refusals)
        try:
            await self._relist(client, limit=limit)
        except Exception as exc:
            if self._expired(client, exc, refusals) or (
                self._refused_session(client, exc, refusals) and await self._forgotten(client)
            ):
                # the server restarted (or ended the session): asking again on it fails
                # for ever; a new session is the answer
                status = refusals[-1][0]
                self._session_gone(client, status)
                raise _SessionExpired(self._lost_why, status=status) from exc
            if self._lost_client is client or not client.is_connected():
                raise
            why = (
                f"no answer within connect_timeout_s={limit}s"
                if isinstance(exc, TimeoutError)
                else self.shown(_describe(exc))
            )
            self._want_relist = True
            self._relist_at = monotonic() + min(limit, 5.0)
            self._signature = ()  # whatever was adopted, the next listing goes through
            log.warning(
                "MCP server %r announced a tool change, but re-listing it failed (%s); "
                "the catalog keeps its tools as they were; asking again",
                self.name,
                why,
            )
        finally:
            _REFUSALS.reset(token)

    async def _listen(self, client: Client[Any]) -> None:
        """2026-07-28 sessions: ``subscriptions/listen`` for ``tools/list_changed``.

        A stream that ends (the server restarted, a proxy cut it) is opened again,
        with backoff, and the server is re-listed once it is: events are not
        replayed, so a change made meanwhile would be missed (the spec: "re-listen
        and refetch"). The calls of a 2026-07-28 session are stateless, so the
        session itself goes on; before, its tool changes went unnoticed from then
        on. A server that does not offer the method (or refuses the first request)
        is not asked again during the session.
        """
        pcfg = self.plugin_cfg
        delay = pcfg.reconnect_initial_s
        acknowledged = False
        opened = 0.0
        while not self._stop.is_set():
            try:
                async with listen(client.session, tools_list_changed=True) as sub:
                    if acknowledged:  # listening again: what changed meanwhile was not told
                        self._list_changed()
                    acknowledged = True
                    opened = monotonic()
                    async for event in sub:
                        if isinstance(event, ToolsListChanged):
                            self._list_changed()
                why = "the server closed it"
            except ListenNotSupportedError as exc:
                log.debug("MCP server %r: no tools/list_changed subscription: %s", self.name, exc)
                return
            except MCPError as exc:
                if not acknowledged or exc.code == mcp_types.METHOD_NOT_FOUND:
                    # not offered by the server (or refused): not asked again on this session
                    log.debug(
                        "MCP server %r: no tools/list_changed subscription: %s", self.name, exc
                    )
                    return
                why = self.shown(_describe(exc))
            except Exception as exc:  # the stream broke (or never came): listen again
                why = self.shown(_describe(exc))
            if self._stop.is_set():
                return
            if acknowledged and monotonic() - opened >= pcfg.reconnect_max_s:
                delay = pcfg.reconnect_initial_s  # it lasted: the backoff starts afresh
            log.info(
                "MCP server %r: the tools/list_changed subscription ended (%s); listening "
                "again in %.1fs",
                self.name,
                why,
                delay,
            )
            await anyio.sleep(delay)
            delay = min(delay * 2, pcfg.reconnect_max_s)

    def _expired(
        self,
        client: Client[Any],
        exc: BaseException,
        refusals: list[tuple[int, str | None]],
        *,
        ping: bool = False,
    ) -> bool:
        """Whether a failed request was refused because the server no longer knows the
        session: HTTP 404 to a handshake-era Streamable-HTTP session (the spec's word for
        it, whatever JSON-RPC error the body carries: FastMCP's -32600 "Session not
        found", the TypeScript SDK's -32001, none). For a ``ping``, HTTP 400 too: it
        carries nothing a server could find bad but the session (servers written after
        the TypeScript SDK's early examples answer an unknown session 400, "Bad Request:
        No valid session ID provided")."""
        return (
            self.cfg.kind == "http"
            and bool(refusals)
            and refusals[-1][0] in ((400, 404) if ping else (404,))
            and isinstance(exc, MCPError)
            and exc.code != mcp_types.METHOD_NOT_FOUND
            and _session_id(client) is not None
        )

    def _refused_session(
        self, client: Client[Any], exc: BaseException, refusals: list[tuple[int, str | None]]
    ) -> bool:
        """HTTP 400 to a request on a handshake-era session: a bad request, or a server
        that answers a session it forgot with 400 instead of the spec's 404 (``_forgotten``
        tells which)."""
        return (
            self.cfg.kind == "http"
            and bool(refusals)
            and refusals[-1][0] == 400
            and isinstance(exc, MCPError)
            and exc.code != mcp_types.METHOD_NOT_FOUND
            and _session_id(client) is not None
        )

    async def _forgotten(self, client: Client[Any]) -> bool:
        """After an HTTP 400 to a request on ``client``'s session: whether a ``ping`` on the
        session is refused too (400 or 404), which means the server no longer knows it.

        A ping that is answered (or not at all, within ``connect_timeout_s``) leaves the
        400 to the request that got it: the session goes on."""
        refusals: list[tuple[int, str | None]] = []
        token = _REFUSALS.set(refusals)
        try:
            with anyio.fail_after(self.plugin_cfg.connect_timeout_s):
                await client.ping()
        except MCPError as exc:
            return self._expired(client, exc, refusals, ping=True)
        except Exception:  # no answer: not proof the session is gone
            return False
        finally:
            _REFUSALS.reset(token)
        return False

    def _session_gone(self, client: Client[Any], status: int = 404) -> None:
        """The server no longer knows ``client``'s session: the supervisor starts a new one."""
        self._lost_why = (
            f"the server no longer knows toolwire's session (HTTP {status}"
            + ("" if status == 404 else " to a call and to a ping on the session")
            + ": it restarted, or ended the session)"
        )
        self._lost_client = client
        self._client = None  # no new calls on this session
        self._wake.set()

    def _went_down(self, exc: BaseException, *, quiet: bool) -> None:
        was_up = self.status == "up"
        self.status = "down"
        msg = _describe(exc)
        if isinstance(exc, TimeoutError):
            msg = (
                f"no answer within connect_timeout_s={self.plugin_cfg.connect_timeout_s}s "
                "(connecting and listing its tools)"
            )
        self.down_kind = ErrorKind.UNAVAILABLE
        # An HTTP status explains a failed connection attempt; once the session was up,
        # an old one (the 404 of an unsupported subscriptions/listen, say) explains nothing.
        status = None if was_up else self._http_status
        if status in (401, 403):
            self.down_kind = ErrorKind.AUTH
            msg = f"HTTP {status}: {self._auth_hint()} ({msg})"
        elif status is not None:
            msg = f"HTTP {status} ({msg})"
        hint = None if was_up else self._connect_hint(exc, status)
        if hint:
            msg = f"{msg}; {hint}"
        if self._stderr is not None and self._stderr.tail:
            msg = f"{msg} (server stderr: {self._stderr.recent()})"
        msg = self.shown(msg)
        self.last_error = msg
        if was_up or not quiet:
            log.warning(
                "MCP server %r (%s) is unavailable: %s; reconnecting with backoff",
                self.name,
                self.target,
                msg,
            )
        else:
            log.info("MCP server %r still unavailable: %s", self.name, msg)

    def _connect_hint(self, exc: BaseException, status: int | None) -> str | None:
        """What to change when a connection attempt failed for a reason the config explains:
        a stdio `command` or `cwd` that cannot be used, an HTTP `url` or `transport` the
        server does not answer, TLS to a plain-HTTP port, no protocol version in common."""
        entry = f"[plugins.mcp.servers.{self.name}]"
        causes = _causes(exc)
        for e in causes:
            if isinstance(e, MCPError) and e.code == mcp_types.UNSUPPORTED_PROTOCOL_VERSION:
                return self._version_hint(e)
            if isinstance(e, RuntimeError) and str(e).startswith(
                "Unsupported protocol version from the server"
            ):
                offered = str(e).rpartition(":")[2].strip()
                return (
                    f"the server answered the initialize handshake with protocol version "
                    f"{offered!r}, which toolwire does not speak (it speaks "
                    f"{', '.join(KNOWN_PROTOCOL_VERSIONS)}); upgrade the server"
                    + (
                        ', or set [plugins.mcp] protocol = "auto" if it also speaks 2026-07-28'
                        if self.plugin_cfg.protocol == "legacy"
                        else ""
                    )
                )
        cfg = self.cfg
        if cfg.kind == "stdio":
            if not any(isinstance(e, OSError) for e in causes):
                return None
            cwd = cfg.cwd
            if cwd is not None and not os.path.isdir(cwd):
                what = "is not a directory" if os.path.exists(cwd) else "does not exist"
                return f"`cwd` {cwd!r} of {entry} {what}: create it or fix `cwd`"
            command = str(cfg.command)
            if os.sep in command or (os.altsep and os.altsep in command):
                path: str | None = os.path.join(cwd, command) if cwd else command
            else:
                search = cfg.env.get("PATH", os.environ.get("PATH", os.defpath))
                path = shutil.which(command, path=search)
                if path is None:
                    return (
                        f"`command` {command!r} of {entry} is not found on PATH: give its "
                        "full path, or add its directory to PATH (or to `env.PATH`)"
                    )
            assert path is not None
            if os.path.isdir(path):
                return f"`command` {command!r} of {entry} is a directory, not a program"
            if not os.path.exists(path):
                return f"`command` {command!r} of {entry} does not exist: fix `command`"
            if not os.access(path, os.X_OK):
                return (
                    f"`command` {command!r} of {entry} is not executable: make it so "
                    "(chmod +x), or run it through its interpreter (`command` = "
                    '"python", `args` = ["script.py"])'
                )
            return None
        if any(isinstance(e, ssl.SSLError) for e in causes):
            if any(isinstance(e, ssl.SSLCertVerificationError) for e in causes):
                return (
                    f"the server's TLS certificate is not trusted: check `url` of {entry} "
                    "(the host name must match the certificate), or add its CA to the "
                    "system's trust store (SSL_CERT_FILE)"
                )
            return (
                f"TLS to {self.target} failed: if the server speaks plain HTTP on that "
                f"port, write `url` of {entry} with http://"
            )
        if status == 404:
            path = urllib.parse.urlsplit(str(cfg.url)).path or "/"
            return (
                f"nothing answers MCP at the path {path!r}: check `url` of {entry} "
                "(FastMCP servers serve Streamable HTTP at /mcp and SSE at /sse)"
            )
        if status in (400, 405, 406, 415):
            other = "http" if cfg.kind == "sse" else "sse"
            return (
                f"the server refused the {cfg.kind} transport's request: check `transport` "
                f'of {entry} (transport = "{other}"?)'
            )
        return None

    def _version_hint(self, exc: MCPError) -> str:
        data = exc.error.data if isinstance(exc.error.data, dict) else {}
        supported = data.get("supported")
        theirs = (
            ", ".join(str(v) for v in supported)
            if isinstance(supported, list) and supported
            else "versions it did not name"
        )
        if (
            self.plugin_cfg.protocol == "legacy"
            and isinstance(supported, list)
            and any(v in MODERN_PROTOCOL_VERSIONS for v in supported)
        ):
            return (
                f"the server speaks only protocol {theirs}, and [plugins.mcp] protocol = "
                '"legacy" asks for the initialize handshake: set protocol = "auto"'
            )
        return (
            f"no protocol version in common: the server speaks {theirs}, toolwire "
            f"{', '.join(KNOWN_PROTOCOL_VERSIONS)}"
            + (
                ' (with [plugins.mcp] protocol = "legacy", only the handshake-era ones)'
                if self.plugin_cfg.protocol == "legacy"
                else ""
            )
            + "; upgrade the side that is behind"
        )

    @property
    def target(self) -> str:
        """What the server runs or where it is, for messages, logs and the status: the URL's
        credentials as ``***``, and the values of ``$secretRef``s (an ``args`` token, say)
        as ``[secret:NAME]``."""
        return self.shown(self.cfg.target())

    def shown(self, text: str) -> str:
        """``text`` fit for messages and logs: the raw URL replaced by its redacted form,
        known secrets (``kernel.add_secret``, ``$secretRef``) hidden."""
        url = self.cfg.url
        if url and url in text:
            text = text.replace(url, self.cfg.target())
        return self.kernel.redactor.text(text)

    def _auth_hint(self) -> str:
        return (
            "the server refused toolwire's credentials; check `auth` and "
            f"`headers` of [plugins.mcp.servers.{self.name}]"
        )

    async def _relist(self, client: Client[Any], *, limit: float | None = None) -> None:
        """List the server's tools, adopt them, cache them, refresh the kernel's catalog.

        ``limit`` bounds the server's answer only: once adopted, the listing is
        always carried through to the catalog (a cut there would leave it stale).
        """
        if limit is None:
            remote = await client.list_tools()
        else:
            with anyio.fail_after(limit):
                remote = await client.list_tools()
        await self._apply(remote)

    async def _apply(self, remote: list[mcp_types.Tool]) -> None:
        """Adopt a listing, cache it, refresh the kernel's catalog when it changed."""
        changed = self._adopt(remote)
        if self.plugin_cfg.cache_tools:
            dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in remote]
            try:
                await self.kernel.state.set(_CACHE_PREFIX + self.name, dumped)
            except Exception as exc:
                log.warning("MCP server %r: cannot cache its tool list: %s", self.name, exc)
        if changed:
            await self._refresh()

    # --------------------------------------------------------------- tools
    def _adopt(self, remote: list[mcp_types.Tool], *, listed: bool = True) -> bool:
        """Make kernel tools from a remote listing; True when the catalog changes.

        ``listed``: ``remote`` is the server's own listing (not the cache or the
        include list), so names in include/exclude it lacks are worth a warning.
        """
        include = set(self.cfg.include) if self.cfg.include is not None else None
        exclude = set(self.cfg.exclude)
        keep: list[mcp_types.Tool] = []
        seen: set[str] = set()
        twice: list[str] = []
        for t in remote:
            if t.name in seen:  # one name, two tools: which one a call reaches is unknowable
                if t.name not in twice:
                    twice.append(t.name)
                continue
            seen.add(t.name)
            if (include is None or t.name in include) and t.name not in exclude:
                keep.append(t)
        if twice and listed and tuple(twice) != self._twice_names:
            log.warning(
                "MCP server %r lists more than one tool named %s; the first listed of each "
                "is kept, the others are left out (rename them on the server)",
                self.name,
                ", ".join(repr(n) for n in twice),
            )
        if listed:
            self._twice_names = tuple(twice)
        unfit = [
            t.name
            for t in keep
            if not TOOL_NAME.fullmatch(self.plugin_cfg.tool_name(self.name, t.name))
        ]
        if unfit:  # one such name would make every MCP / OpenAI export of the catalog fail
            keep = [t for t in keep if t.name not in unfit]
            if listed and tuple(unfit) != self._unfit_names:
                log.warning(
                    "MCP server %r lists tools whose names MCP does not allow once named "
                    "here (letters, digits, '_', '-' or '.', at most 128): %s; they are left "
                    "out (rename them on the server, or use exclude)",
                    self.name,
                    ", ".join(repr(n) for n in unfit),
                )
        if listed:
            self._unfit_names = tuple(unfit)
        names = {t.name for t in remote}
        unknown = sorted(((include or set()) | exclude) - names) if listed else []
        if unknown and tuple(unknown) != self._unknown_names:
            log.warning(
                "MCP server %r has no tool named %s (from include/exclude of "
                "[plugins.mcp.servers.%s]); it lists: %s",
                self.name,
                ", ".join(repr(n) for n in unknown),
                self.name,
                ", ".join(sorted(names)) or "no tools",
            )
        if listed:
            self._unknown_names = tuple(unknown)
        try:
            signature = tuple(t.model_dump_json(by_alias=True, exclude_none=True) for t in keep)
        except pydantic_core.PydanticSerializationError:
            # a lone surrogate in a description or schema (text cut mid-character): U+FFFD
            keep = [
                type(t).model_validate(utf8_safe(t.model_dump(by_alias=True, exclude_none=True)))
                for t in keep
            ]
            signature = tuple(t.model_dump_json(by_alias=True, exclude_none=True) for t in keep)
        if signature == self._signature:
            return False
        self._signature = signature
        self.tools = [self._kernel_tool(t) for t in keep]
        self._param_header_tools = frozenset(
            t.name
            for t in keep
            if x_mcp_header_map(t.input_schema) or find_invalid_x_mcp_header(t.input_schema)
        )
        self._output_schemas = {t.name: t.output_schema for t in keep if t.output_schema}
        self._output_checkers.clear()
        return True

    def _check_output(self, remote_tool: str, result: mcp_types.CallToolResult) -> None:
        """What the MCP SDK's ``validate_tool_result`` checks, with the same messages.

        Against the schema of the last listing, without the FastMCP client: a
        call that outlives its session (a reconnect) is still checked.
        """
        schema = self._output_schemas.get(remote_tool)
        if schema is None:
            return
        if (
            result.structured_content is None
            and "structured_content" not in result.model_fields_set
        ):
            raise RuntimeError(
                f"Tool {remote_tool} has an output schema but did not return structured content"
            )
        checkers = self._output_checkers.get(remote_tool)
        if checkers is None:
            try:
                cls = jsonschema.validators.validator_for(schema)
                checkers = (cls(schema), quick_check(schema, cls))
                self._output_checkers[remote_tool] = checkers
            except Exception as exc:
                raise RuntimeError(f"Invalid schema for tool {remote_tool}: {exc}") from exc
        checker, quick = checkers
        if quick is not None and quick(result.structured_content):
            return
        try:
            error = jsonschema.exceptions.best_match(checker.iter_errors(result.structured_content))
        except Exception as exc:  # an unresolvable $ref, say
            raise RuntimeError(f"Invalid schema for tool {remote_tool}: {exc}") from exc
        if error is not None:
            violation = RuntimeError(
                f"Invalid structured content returned by tool {remote_tool}: {error}"
            )
            violation.add_note("the result is in the exception's `result` attribute")
            violation.result = result  # type: ignore[attr-defined]  # kept for the caller
            raise violation from error

    def _kernel_tool(self, remote: mcp_types.Tool) -> Tool:
        remote_name = remote.name
        schema = dict(remote.input_schema or _PERMISSIVE)
        ann = remote.annotations
        meta = remote.meta or {}
        fm = meta.get("fastmcp") if isinstance(meta, dict) else None
        remote_tags = fm.get("tags", []) if isinstance(fm, dict) else []

        async def execute(args: dict[str, Any], ctx: CallContext) -> Any:
            return await self.call(remote_name, args, ctx)

        return Tool(
            name=self.plugin_cfg.tool_name(self.name, remote_name),
            description=remote.description or "",
            input_schema=schema,
            executor=execute,
            output_schema=_object_schema(remote.output_schema),
            validator=make_validator(schema),
            tags=frozenset({"mcp", f"mcp:{self.name}", *(str(t) for t in remote_tags)}),
            source=f"mcp:{self.name}",
            annotations=ToolAnnotations(
                title=(ann.title if ann else None) or remote.title,
                readOnlyHint=ann.read_only_hint if ann else None,
                destructiveHint=ann.destructive_hint if ann else None,
                idempotentHint=ann.idempotent_hint if ann else None,
                openWorldHint=ann.open_world_hint if ann else None,
            ),
            settings={"mcp": {"server": self.name, "remote_name": remote_name}},
        )

    # ---------------------------------------------------------------- calls
    def _unavailable(self, remote_tool: str) -> ToolError:
        wait = None
        if self.next_attempt_at is not None:
            wait = max(0.0, self.next_attempt_at - monotonic())
        state = "is connecting" if self.status == "connecting" else "is not connected"
        why = f": {self.last_error}" if self.last_error else ""
        if self.status == "connecting":
            limit = self.plugin_cfg.connect_timeout_s
            took = monotonic() - self._connecting_since
            state = (
                f"is connecting (for {took:.1f}s of connect_timeout_s={limit}s: "
                "no answer to initialize and tools/list yet"
                if took < limit
                else f"is not connected (no answer to initialize and tools/list within "
                f"connect_timeout_s={limit}s; the attempt is being stopped"
            )
            if self._stderr is not None and self._stderr.tail:
                state += f"; server stderr: {self._stderr.recent()}"
            state += ")"
            why = f"; the previous attempt failed: {self.last_error}" if self.last_error else ""
        when = f"; next reconnect attempt in {wait:.1f}s" if wait is not None else ""
        return ToolError(
            f"MCP server {self.name!r} ({self.target}) {state}{why}{when}",
            kind=self.down_kind if self.status == "down" else ErrorKind.UNAVAILABLE,
            retry_after_s=wait,
            details={"server": self.name, "remote_tool": remote_tool, "status": self.status},
        )

    async def _lost(
        self, client: Client[Any], remote_tool: str, exc: BaseException, *, direct: bool = False
    ) -> ToolError:
        """The error of a call whose connection was lost.

        On the direct path (``direct``) that connection was one of its pool's, dropped with
        the call; an event stream of the FastMCP client's that ended (or failed) without
        the response is that one request's failure, its session still connected. Either
        way the session may well be sound: the supervisor checks the server (``_check``).
        Otherwise the session is ended and the supervisor reconnects."""
        msg = self.shown(_describe(exc))
        stream_cut = (
            isinstance(exc, MCPError)
            and exc.message.startswith("SSE stream ")
            and client.is_connected()
        )
        if direct or stream_cut:
            self._suspect = client  # one check for the calls failing meanwhile
            self._wake.set()
            return ToolError(
                f"MCP server {self.name!r}: the connection was lost during the call to "
                f"{remote_tool!r} ({msg}); the outcome is unknown; checking the server",
                kind=ErrorKind.UNAVAILABLE,
                details={"server": self.name, "remote_tool": remote_tool, "in_flight": True},
            )
        self._lost_why = "the connection was lost"
        self._lost_client = client
        self._wake.set()
        if self._session_client is client:
            # The supervisor notes why the session ended (with the server's last stderr lines).
            down = self._session_down
            with anyio.move_on_after(2.0):
                await down.wait()
            if down.is_set() and self.last_error and "server stderr" in self.last_error:
                msg = f"{msg}; {self.last_error}"
        return ToolError(
            f"MCP server {self.name!r}: the connection was lost during the call to "
            f"{remote_tool!r} ({msg}); the outcome is unknown; reconnecting",
            kind=ErrorKind.UNAVAILABLE,
            details={"server": self.name, "remote_tool": remote_tool, "in_flight": True},
        )

    async def call(self, remote_tool: str, args: dict[str, Any], ctx: CallContext) -> Any:
        """Call ``remote_tool`` on the live client; failures raise ``ToolError`` with a kind."""
        client = self._client
        if client is None or self.status != "up":
            raise self._unavailable(remote_tool)
        meta = {CALL_ID_META_KEY: ctx.call.call_id} if ctx.call.call_id else None
        progress = ctx.report_progress if ctx.progress is not None else None
        direct = self._direct
        on_direct = False  # the call went over the direct path (its failures are its own)
        try:
            if direct is not None and remote_tool not in self._param_header_tools:
                try:
                    on_direct = True
                    result = await self._call_direct(
                        direct, client, remote_tool, args, meta, progress
                    )
                except NotMirrored as exc:  # nothing ran: the FastMCP client handles this one
                    on_direct = False
                    log.info(
                        "MCP server %r: %s; tools/call goes through the FastMCP client from now on",
                        self.name,
                        exc,
                    )
                    if self._direct is direct:
                        self._direct = None
                    result = await self._call_client(client, remote_tool, args, meta, progress)
            else:
                result = await self._call_client(client, remote_tool, args, meta, progress)
        except Exception as exc:
            error = await self._failure(client, remote_tool, exc, direct=on_direct)
            if error is None:
                raise
            raise error from exc
        if result.is_error:
            kind, message, retry_after, details = remote_error(
                result, server=self.name, remote_tool=remote_tool
            )
            raise ToolError(message, kind=kind, retry_after_s=retry_after, details=details)
        stamp = (result.meta or {}).get(RESULT_META_KEY)
        if isinstance(stamp, dict) and stamp.get("replayed") is True:
            ctx.meta.replayed = True  # a toolwire upstream replayed it: nothing ran now
        return remote_value(result)

    async def _call_client(
        self,
        client: Client[Any],
        remote_tool: str,
        args: dict[str, Any],
        meta: dict[str, Any] | None,
        progress: ProgressFn | None,
    ) -> mcp_types.CallToolResult:
        """The call through the FastMCP client; an HTTP refusal raises ``HTTPRefusal``."""
        refusals: list[tuple[int, str | None]] = []
        unsent: list[str] = []
        token = _REFUSALS.set(refusals)
        unsent_token = _UNSENT.set(unsent)
        try:
            return await client.call_tool_mcp(
                remote_tool,
                args,
                progress_handler=progress,
                timeout=self.cfg.timeout_s,
                meta=meta,
            )
        except MCPError as exc:
            if _too_large(exc, self.cfg.max_answer_bytes):
                raise AnswerTooLarge(self.cfg.max_answer_bytes) from exc
            # The SDK answers a refused POST with this stand-in; the status tells more.
            if (
                refusals
                and exc.code == mcp_types.INTERNAL_ERROR
                and exc.message == SDK_REFUSED_TEXT
                and refused(refusals[-1][0])
            ):
                raise HTTPRefusal(*refusals[-1]) from exc
            if self._expired(client, exc, refusals):
                raise _SessionExpired(f"MCP error {exc.code}: {exc.message}") from exc
            if self._refused_session(client, exc, refusals) and await self._forgotten(client):
                raise _SessionExpired(
                    f"MCP error {exc.code}: {exc.message}", status=refusals[-1][0]
                ) from exc
            failed = "SSE stream failed: "
            if exc.code == mcp_types.CONNECTION_CLOSED and exc.message.startswith(failed):
                why = exc.message[len(failed) :]
                if _UNDECODABLE.match(why):
                    # An event stream whose body cannot be decoded: an answer came,
                    # unreadable (not a lost connection); worded as the direct path does.
                    raise MCPError(
                        code=mcp_types.PARSE_ERROR, message=f"Failed to parse SSE stream: {why}"
                    ) from exc
            if unsent and exc.code == mcp_types.CONNECTION_CLOSED and _client_closed(exc):
                # the session ended because this call's request could not be sent: it
                # did not run (the direct path tells it so too)
                raise ConnectError(unsent[-1]) from exc
            raise
        finally:
            _UNSENT.reset(unsent_token)
            _REFUSALS.reset(token)

    async def _call_direct(
        self,
        direct: DirectCaller,
        client: Client[Any],
        remote_tool: str,
        args: dict[str, Any],
        meta: dict[str, Any] | None,
        progress: ProgressFn | None,
    ) -> mcp_types.CallToolResult:
        """The call over the direct HTTP path, with what the FastMCP client does around it."""
        self.direct_calls += 1
        first = await direct.call_tool(remote_tool, args, meta=meta, progress=progress)
        if isinstance(first, mcp_types.InputRequiredResult):

            async def retry(
                responses: mcp_types.InputResponses | None, state: str | None
            ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
                self.direct_calls += 1
                return await direct.call_tool(
                    remote_tool,
                    args,
                    meta=meta,
                    progress=progress,
                    input_responses=responses,
                    request_state=state,
                )

            # The FastMCP client's own multi-round-trip driver: its handlers, its limits.
            result = await client._drive_input_required(first, retry)
        else:
            result = first
        if not result.is_error:  # as the SDK's call_tool: against the listed output schema
            self._check_output(remote_tool, result)
        return result

    async def _failure(
        self, client: Client[Any], remote_tool: str, exc: Exception, *, direct: bool = False
    ) -> ToolError | None:
        """The ``ToolError`` for a failed call (either path: ``direct`` for the direct
        path's); None: not ours to map."""
        where = {"server": self.name, "remote_tool": remote_tool}
        prefix = f"MCP server {self.name!r}, tool {remote_tool!r}"
        if isinstance(exc, MCPError):
            code = exc.code
            if code == mcp_types.CONNECTION_CLOSED and _client_closed(exc):
                return await self._lost(client, remote_tool, exc, direct=direct)
            if _no_answer(exc):
                # A 2xx the client could not read as the answer: the server took the request.
                # (The SDK's text of a pydantic error runs over many lines: the first says it.)
                said = exc.message.strip().partition("\n")[0]
                return ToolError(
                    f"{prefix}: {said} (MCP error {code}); the server's answer is no "
                    "MCP answer. The call may have taken effect upstream: check before "
                    "calling it again; the server (or what is in front of it) must answer "
                    "tools/call with JSON-RPC",
                    kind=ErrorKind.TOOL_ERROR,
                    details={**where, "mcp_code": code, "invalid_answer": True},
                )
            kind: str = {
                mcp_types.REQUEST_TIMEOUT: ErrorKind.TIMEOUT,
                mcp_types.INVALID_PARAMS: ErrorKind.INVALID_ARGS,
                mcp_types.METHOD_NOT_FOUND: ErrorKind.NOT_FOUND,
            }.get(code, ErrorKind.TOOL_ERROR)
            hint = ""
            if code == mcp_types.REQUEST_TIMEOUT and self.cfg.timeout:
                # The limit is ours: say which setting it is, or the caller guesses.
                hint = (
                    f"; no answer within `timeout` = {self.cfg.timeout} ms of "
                    f"[plugins.mcp.servers.{self.name}]: raise it if the tool needs longer"
                )
            return ToolError(
                f"{prefix}: {exc.message} (MCP error {code}){hint}",
                kind=kind,
                details={**where, "mcp_code": code},
            )
        if isinstance(exc, HTTPRefusal | httpx2.HTTPStatusError):
            if isinstance(exc, HTTPRefusal):
                status, ra = exc.status, exc.retry_after
            else:
                status, ra = exc.response.status_code, exc.response.headers.get("retry-after")
            retry_after = parse_retry_after(ra)
            kind = (
                ErrorKind.AUTH
                if status in (401, 403)
                else ErrorKind.RATE_LIMIT
                if status == 429
                else ErrorKind.UNAVAILABLE
                if status >= 500
                else ErrorKind.TOOL_ERROR
            )
            hint = f"; {self._auth_hint()}" if kind == ErrorKind.AUTH else ""
            return ToolError(
                f"{prefix}: HTTP {status}{hint}",
                kind=kind,
                status=status,
                retry_after_s=retry_after,
                details=where,
            )
        if isinstance(exc, TimeoutError):
            # Before: a bare "timed out", naming neither the limit nor whether the call went.
            if isinstance(exc, PoolTimeout):
                advice = (
                    ""  # the entry's timeout ends the calls the server does not answer
                    if self.cfg.timeout
                    else f"; set `timeout` of [plugins.mcp.servers.{self.name}] to end calls "
                    "it does not answer"
                )
                return ToolError(
                    f"{prefix}: timed out: {exc}: the server is not answering the calls "
                    f"already sent to it{advice}",
                    kind=ErrorKind.TIMEOUT,
                    details={**where, "in_flight": False},
                )
            said = f": {exc}" if str(exc) else ""
            return ToolError(
                f"{prefix}: timed out{said}; the outcome is unknown. The limit between two "
                "reads of an answer is 300 s, or the entry's `timeout` when longer: a tool "
                "silent for longer needs a longer `timeout` of "
                f"[plugins.mcp.servers.{self.name}]",
                kind=ErrorKind.TIMEOUT,
                details=where,
            )
        if isinstance(exc, AnswerTooLarge):
            return ToolError(
                f"{prefix}: the server's answer is over max_answer_bytes = {exc.limit} bytes "
                f"([plugins.mcp.servers.{self.name}]); it was dropped. The call may have taken "
                "effect upstream: check before calling it again; raise max_answer_bytes if "
                "answers this large are expected",
                kind=ErrorKind.TOOL_ERROR,
                details={**where, "answer_too_large": True, "max_answer_bytes": exc.limit},
            )
        if isinstance(exc, InputRequiredRoundsExceededError):
            # The server answered every round with input_required (a RuntimeError, once
            # taken for a lost connection: `unavailable`, and the session ended).
            return ToolError(
                f"{prefix}: the server answered input_required for more than "
                f"{exc.max_rounds} rounds; the call did not complete. It may have taken "
                "effect upstream: check before calling it again",
                kind=ErrorKind.TOOL_ERROR,
                details={**where, "input_required_rounds": exc.max_rounds},
            )
        if _schema_violation(exc):
            # The SDK's check of a result against the tool's output schema: the server
            # answered, the answer is wrong. Not a lost connection. What it answered is kept:
            # the call may have taken effect upstream.
            details: dict[str, Any] = dict(where)
            answered = getattr(exc, "result", None)
            kept = ""
            if isinstance(answered, mcp_types.CallToolResult):
                details["remote_text"] = _answer_text(answered)
                details["remote_structured_content"] = answered.structured_content
                kept = " (its answer is in details.remote_text and remote_structured_content)"
            return ToolError(
                f"{prefix}: {exc}; the server's answer breaks the tool's own output "
                f"schema{kept}. The call may have taken effect upstream: check before "
                "calling it again; the server must fix the tool or its output schema",
                kind=ErrorKind.TOOL_ERROR,
                details=details,
            )
        if isinstance(exc, ValidationError):
            # The answer is JSON-RPC, but its result is no valid MCP result (content
            # that is not a list, a block of no known type, no resultType on a
            # 2026-07-28 answer, a null result, a malformed error object).
            return ToolError(
                f"{prefix}: the server's answer is not a valid MCP result: "
                f"{_first_problem(exc)}. The call may have taken effect upstream: check "
                "before calling it again; the server must fix its tools/call answers",
                kind=ErrorKind.TOOL_ERROR,
                details={**where, "invalid_answer": True},
            )
        if isinstance(exc, _SessionExpired):
            # Refused before it ran (the spec: 404 to a session the server does not
            # know); the supervisor opens a new session, and the call may be sent again.
            self._session_gone(client, exc.status)
            said = f"; it answered: {exc}" if str(exc) else ""
            to = "" if exc.status == 404 else " to the call and to a ping on the session"
            return ToolError(
                f"{prefix}: the server no longer knows toolwire's session "
                f"(HTTP {exc.status}{to}{said}): "
                "it restarted, or ended the session; the call was not run; reconnecting",
                kind=ErrorKind.UNAVAILABLE,
                details={**where, "in_flight": False, "session_expired": True},
            )
        if isinstance(exc, ConnectError):
            # Nothing was sent: the call did not run. The supervisor checks the server.
            self._lost_why = "the connection was lost"
            self._lost_client = client
            self._wake.set()
            return ToolError(
                f"{prefix}: cannot connect to {self.target} ({self.shown(str(exc))}); "
                "the call was not sent",
                kind=ErrorKind.UNAVAILABLE,
                details={**where, "in_flight": False},
            )
        if isinstance(exc, _LOST):
            return await self._lost(client, remote_tool, exc, direct=direct)
        return None
