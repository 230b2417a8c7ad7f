"""The lean path for ``tools/call`` over Streamable HTTP (protocol 2026-07-28).

In the 2026-07-28 protocol every request is one self-contained POST: no
session, no handshake. For the request a gateway sees most — ``tools/call`` —
FastMCP's generic machinery (the SDK's single-exchange handler, its runner and
dispatch context, FastMCP's middleware chain, provider fan-out and result
re-validation) costs about 1 ms of CPU per call on this machine, several times
the work of the call itself. ``FastCallPath`` replaces FastMCP's endpoint
inside its route, answers the plain ``tools/call`` requests itself, and hands
every other request to FastMCP untouched, body included. In front of the
app, ``_Front`` sends a request whose line and headers are those of a
``tools/call`` down a shorter way: the app's own middleware (Host/Origin
guard, bearer-token check, request context, any added later) and the route's
auth, skipping only Starlette's error wrappers and router. Under a path
prefix (a mounted app) Starlette routes the request to the same lean path.

What the lean path answers is what FastMCP would answer, byte for byte in
content (tests compare both paths on the same requests): the same result
object with the server-info stamp, JSON while the call sends nothing, and
``text/event-stream`` from the first progress notification on (or after 15 s
of silence, with keep-alive pings), exactly as the SDK's handler decides.
A request is only taken when every check FastMCP's handler would make is
one the lean path makes too (the SDK's own ``classify_inbound_request`` and
``validate_client_request`` among them); anything else — another method, a
batch, a malformed body or envelope, mismatched or repeated headers, an
unsupported version, ``Mcp-Param-*`` headers, FastMCP's JSON-only mode, a
client that can answer elicitations (approval prompts need FastMCP's request
context), a retried request carrying input responses — goes to FastMCP,
which produces the protocol's answer. One difference remains by design: a
client that disconnects cancels its call only once the call has run 0.5 s
(short calls pay for no watcher task).

``[server] fast_path = false`` turns it off.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import mcp_types
import pydantic_core
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundModernRoute,
    classify_inbound_request,
    x_mcp_header_map,
)
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.methods import validate_client_request
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolwire import Kernel, Tool, ToolResult

from ._calls import ProgressSender, ServeGate, call_id_from_meta, run_call, tenant_of
from ._convert import content_blocks, render_text, result_meta, utf8_safe, wire_blocks

__all__ = ["FastCallPath", "install_fast_path", "wire_result"]

log = logging.getLogger("toolwire.serve")

_PING_INTERVAL_S: Final = 15.0  # as the SDK's handler: commit SSE and ping after 15 s of silence
_WATCH_AFTER_S: Final = 0.5
_MODERN: Final = frozenset(v.encode("latin-1") for v in MODERN_PROTOCOL_VERSIONS)
_PARAM_PREFIX: Final = b"mcp-param-"
_ROUTING: Final = frozenset(
    h.encode() for h in (MCP_PROTOCOL_VERSION_HEADER, MCP_METHOD_HEADER, MCP_NAME_HEADER)
)
#: Headers a request may carry once only to be taken.
_SINGLE: Final = _ROUTING | {b"accept", b"content-type", b"content-length", b"mcp-session-id"}
_PARAM_KEYS: Final = frozenset({"name", "arguments", "_meta"})
_ENVELOPE_KEYS: Final = frozenset({"jsonrpc", "id", "method", "params"})
_JSON_HEADERS: Final = (b"content-type", b"application/json")
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]
_PING: Final = b": ping\r\n\r\n"
#: Scope key marking a request the front tried and handed on (the route then skips the lean path).
_TRIED: Final = "toolwire.lean_path_tried"


def wire_result(
    result: ToolResult,
    server_info: Mapping[str, Any],
    blocks: list[mcp_types.ContentBlock] | None = None,
) -> dict[str, Any]:
    """The ``CallToolResult`` object of a kernel result, as FastMCP puts it on the wire.

    ``blocks``: the content when already made (an image file read by ``ImageFiles``).
    """
    if blocks is not None:
        content = wire_blocks(blocks)
    elif result.is_error or "content" not in result.content:
        content = [{"type": "text", "text": render_text(result)}]
    else:  # MCP content blocks (an image, say) travel as themselves
        content = wire_blocks(content_blocks(result))
    out: dict[str, Any] = {
        "content": content,
        "isError": result.is_error,
        "resultType": "complete",
        "_meta": {**result_meta(result), SERVER_INFO_META_KEY: server_info},
    }
    if not result.is_error:
        out["structuredContent"] = result.content
    return out


def _json(message: Mapping[str, Any]) -> bytes:
    try:
        return pydantic_core.to_json(message)
    except pydantic_core.PydanticSerializationError:  # a lone surrogate, which UTF-8 cannot carry
        return pydantic_core.to_json(utf8_safe(message))


def _sse(message: Mapping[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + _json(message) + b"\r\n\r\n"


class _Reply:
    """The response of one exchange: JSON until the first event, then an SSE stream.

    Events may come from other tasks (an upstream's progress); the lock that
    orders them is made with the first event, so a call without events pays
    for none.
    """

    __slots__ = ("_lock", "_send", "finished", "last_event", "streaming")

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock: asyncio.Lock | None = None
        self.streaming = False
        self.finished = False
        self.last_event = time.monotonic()  # the request's arrival counts as the last word

    async def event(self, frame: bytes) -> None:
        """Send ``frame`` on the event stream, committing to SSE first if need be."""
        if self.finished:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.finished:
                return
            if not self.streaming:
                self.streaming = True
                await self._send(
                    {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS}
                )
            await self._send({"type": "http.response.body", "body": frame, "more_body": True})
            self.last_event = time.monotonic()

    async def finish(self, message: Mapping[str, Any]) -> None:
        """The JSON-RPC reply: the last SSE frame, or the whole JSON response."""
        self.finished = True  # before any await: later events are dropped
        if self._lock is None:
            await self._write(message)
            return
        async with self._lock:
            await self._write(message)

    async def _write(self, message: Mapping[str, Any]) -> None:
        if self.streaming:
            await self._send(
                {"type": "http.response.body", "body": _sse(message), "more_body": False}
            )
            return
        body = _json(message)
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [_JSON_HEADERS, (b"content-length", str(len(body)).encode())],
            }
        )
        await self._send({"type": "http.response.body", "body": body})


def _replay(read: list[Message], receive: Receive) -> Receive:
    """``receive`` that yields the messages already read, then the real stream."""
    pending = read[::-1]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


class FastCallPath:
    """ASGI app answering plain 2026-07-28 ``tools/call`` POSTs; everything else goes to ``inner``.

    ``inner`` is FastMCP's Streamable HTTP endpoint. ``server_info`` is the
    server-info stamp FastMCP puts in every result's ``_meta``.
    """

    def __init__(
        self,
        inner: ASGIApp,
        *,
        kernel: Kernel,
        gate: ServeGate,
        server_info: Mapping[str, Any],
        max_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
    ) -> None:
        self.inner = inner
        self.kernel = kernel
        self.gate = gate
        self.server_info = dict(server_info)
        self.max_body_size = max_body_size
        #: Requests answered on the lean path / handed to FastMCP (for tests and stats).
        self.taken = 0
        self.passed = 0
        self._param_headers: dict[str, tuple[Tool, bool]] = {}

    # ------------------------------------------------------------ routing
    def _limits(self) -> int | None:
        """FastMCP's body limit, or None when its endpoint answers in a way the lean path
        does not (JSON-only responses) or is not running."""
        manager = getattr(self.inner, "session_manager", None)
        if manager is None or getattr(manager, "json_response", False):
            return None
        limit = getattr(manager, "max_request_body_size", self.max_body_size)
        return limit if isinstance(limit, int) else self.max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The MCP endpoint's route: take what the lean path can, hand the rest to FastMCP.

        With the front installed (the usual case), a request the front already
        tried and gave up on arrives marked and goes straight to FastMCP.
        """
        if not scope.get(_TRIED) and self.wants(scope):
            await self.take(scope, receive, send, self._to_fastmcp)
        else:
            await self._to_fastmcp(scope, receive, send)

    async def _to_fastmcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.passed += 1
        await self.inner(scope, receive, send)

    def wants(self, scope: Scope) -> bool:
        """From the request line and headers alone: a request the lean path may take."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return False
        limit = self._limits()
        return limit is not None and self._headers_fit(scope, limit)

    async def take(self, scope: Scope, receive: Receive, send: Send, fallback: ASGIApp) -> None:
        """Read the body and answer the call, or hand the request (body replayed) to ``fallback``."""
        read: list[Message] = []
        size = 0
        limit = self._limits() or self.max_body_size
        while True:  # servers may deliver the body in chunks (small bodies: one, under uvicorn)
            message = await receive()
            read.append(message)
            if message["type"] == "http.disconnect":
                return  # gone before its body ended: no one to answer (FastMCP would raise)
            if message["type"] != "http.request":
                await fallback(scope, _replay(read, receive), send)
                return
            size += len(message.get("body", b""))
            if size > limit:  # FastMCP answers an oversized body
                await fallback(scope, _replay(read, receive), send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in read) if len(read) > 1 else read[0]["body"]
        call = self._parse(body, scope)
        if call is None:
            await fallback(scope, _replay(read, receive), send)
            return
        self.taken += 1
        await self._exchange(call, receive, send)

    def _headers_fit(self, scope: Scope, limit: int) -> bool:
        """The headers are those of a modern request FastMCP would accept as they are."""
        version = accept = ctype = method = None
        length = -1
        seen: set[bytes] = set()
        for key, value in scope["headers"]:
            if key in _SINGLE:
                if key in seen:
                    # FastMCP rejects repeated routing headers, and reads the first of a
                    # repeated Accept / Content-Type: leave every such request to it.
                    return False
                seen.add(key)
            if key == b"mcp-protocol-version":
                version = value
            elif key == b"mcp-method":
                method = value
            elif key == b"accept":
                accept = value
            elif key == b"content-type":
                ctype = value
            elif key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return False
            elif key.startswith(_PARAM_PREFIX):
                return False  # validated against the tool's schema by FastMCP
        if version not in _MODERN or method != b"tools/call" or ctype is None or accept is None:
            return False
        if not ctype.lower().startswith(b"application/json"):
            return False
        if length < 0 or length > limit:
            return False
        types = {t.split(b";")[0].strip().lower() for t in accept.split(b",")}
        any_type = b"*/*" in types
        has_json = any_type or b"application/json" in types or b"application/*" in types
        has_sse = any_type or b"text/event-stream" in types or b"text/*" in types
        return has_json and has_sse

    def _parse(self, body: bytes, scope: Scope) -> _Call | None:
        """The call a body asks for, or None when FastMCP should answer it."""
        try:  # anything it does not read (not UTF-8, nested too deep, ...) goes to FastMCP
            req = pydantic_core.from_json(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(req, dict) or req.keys() - _ENVELOPE_KEYS:
            return None
        rid = req.get("id")
        if req.get("jsonrpc") != "2.0" or req.get("method") != "tools/call":
            return None
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            return None
        params = req.get("params")
        if not isinstance(params, dict) or params.keys() - _PARAM_KEYS:
            return None
        name = params.get("name")
        arguments = params.get("arguments")
        meta = params.get("_meta")
        if not isinstance(name, str) or not isinstance(meta, dict):
            return None
        if arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            return None
        token = meta.get("progressToken")
        if token is not None and (isinstance(token, bool) or not isinstance(token, (str, int))):
            return None
        headers = {}
        session_id = None
        for key, value in scope["headers"]:
            if key in _ROUTING:
                headers[key.decode("latin-1")] = value.decode("latin-1")
            elif key == b"mcp-session-id" and value:
                session_id = value.decode("latin-1")
        verdict = classify_inbound_request(req, headers=headers)
        if not isinstance(verdict, InboundModernRoute):
            return None
        try:  # the SDK's own check of the params (envelope, capabilities, log level, ...)
            validate_client_request("tools/call", verdict.protocol_version, params)
        except (ValueError, KeyError):
            return None
        caps = verdict.client_capabilities
        if not isinstance(caps, dict) or caps.get("elicitation") is not None:
            return None  # MCP elicitation (approval prompts) runs in FastMCP's request context
        if self._needs_param_headers(name):
            return None
        return _Call(rid, name, arguments, meta, token, session_id, tenant_of(scope))

    def _needs_param_headers(self, name: str) -> bool:
        """The tool's schema declares ``Mcp-Param-*`` headers (FastMCP validates those)."""
        tool = self.kernel.get_tool(name)
        if tool is None:
            return False
        cached = self._param_headers.get(name)
        if cached is not None and cached[0] is tool:
            return cached[1]
        try:
            needs = bool(x_mcp_header_map(tool.input_schema))
        except Exception:
            needs = True
        self._param_headers[name] = (tool, needs)
        return needs

    # ----------------------------------------------------------- exchange
    async def _exchange(self, call: _Call, receive: Receive, send: Send) -> None:
        reply = _Reply(send)
        progress: ProgressSender | None = None
        if call.token is not None:
            progress = _progress_sender(reply, call.token)
        outcome: dict[str, Any] | None = None
        # A call that is still running after _WATCH_AFTER_S gets a watcher task
        # (client disconnect -> cancel the call; silence -> SSE pings). Short
        # calls, the common case, never pay for a task; a client that leaves
        # earlier than that has its call finish (the answer goes nowhere).
        loop = asyncio.get_running_loop()
        watcher: list[asyncio.Task[None]] = []
        # A call with a call id (de-duplicated) runs to its end when its client goes away,
        # so that the client's replay after a crash gets its stored result instead of
        # running the tool again; other calls are cancelled, as the protocol says.
        resumable = isinstance(call_id_from_meta(call.meta), str)
        try:
            with anyio.CancelScope() as scope:

                def start_watching() -> None:
                    watcher.append(loop.create_task(self._watch(receive, reply, scope, resumable)))

                timer = loop.call_later(_WATCH_AFTER_S, start_watching)
                try:
                    outcome = await self._run(call, progress, scope)
                except Exception:  # as FastMCP answers a tool that raised (details masked)
                    log.exception("tools/call %r failed outside the kernel pipeline", call.name)
                    outcome = self._masked_error(call)
                finally:
                    timer.cancel()
                    for task in watcher:
                        task.cancel()
            if outcome is None and self.gate.cutting:  # cancelled as the grace period ended
                cid = call_id_from_meta(call.meta)
                cut = self.gate.cut_result(call.name, cid if isinstance(cid, str) else None)
                outcome = self._answer(call, cut, None)
            if outcome is not None:  # None: the client went away and the call was cancelled
                await reply.finish(outcome)
        finally:
            reply.finished = True  # progress arriving later from other tasks is dropped

    def _masked_error(self, call: _Call) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": call.rid,
            "result": {
                "content": [{"type": "text", "text": f"Error calling tool {call.name!r}"}],
                "isError": True,
                "resultType": "complete",
                "_meta": {SERVER_INFO_META_KEY: self.server_info},
            },
        }

    async def _run(
        self, call: _Call, progress: ProgressSender | None, scope: anyio.CancelScope
    ) -> dict[str, Any]:
        call_id = call_id_from_meta(call.meta, call.name)
        if isinstance(call_id, ToolResult):
            result = call_id
        else:
            result = await run_call(
                self.kernel,
                self.gate,
                call.name,
                call.arguments,
                call_id=call_id,
                request_id=call.rid,
                session_id=call.session_id,
                tenant=call.tenant,
                progress=progress,
                scope=scope,
            )
        blocks = await self.gate.images.blocks(result) if self.gate.images.wanted(result) else None
        return self._answer(call, result, blocks)

    def _answer(
        self, call: _Call, result: ToolResult, blocks: list[mcp_types.ContentBlock] | None
    ) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": call.rid,
            "result": wire_result(result, self.server_info, blocks),
        }

    async def _watch(
        self, receive: Receive, reply: _Reply, scope: anyio.CancelScope, resumable: bool
    ) -> None:
        """Cancel the call when the client disconnects (``resumable``: let it run to its end,
        its answer unsent); ping an SSE stream after 15 s of silence."""
        try:
            while True:
                quiet_for = time.monotonic() - reply.last_event
                with anyio.move_on_after(max(0.0, _PING_INTERVAL_S - quiet_for)):
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        if not resumable:
                            scope.cancel()
                        return
                    continue
                await reply.event(_PING)
        except Exception as exc:  # the connection broke under a ping: nothing to answer
            log.debug("tools/call watcher stopped: %s", exc)
            if not resumable:
                scope.cancel()


class _Call:
    __slots__ = ("arguments", "meta", "name", "rid", "session_id", "tenant", "token")

    def __init__(
        self,
        rid: str | int,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
        token: str | int | None,
        session_id: str | None,
        tenant: str | None,
    ) -> None:
        self.rid = rid
        self.name = name
        self.arguments = arguments
        self.meta = meta
        self.token = token
        self.session_id = session_id
        self.tenant = tenant


def _progress_sender(reply: _Reply, token: str | int) -> ProgressSender:
    async def send(progress: float, total: float | None, message: str | None) -> None:
        params: dict[str, Any] = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        frame = _sse({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})
        try:
            await reply.event(frame)
        except OSError as exc:  # progress is best effort: a client that went away is no error
            log.debug("progress notification not delivered: %s", exc)

    return send


class _Front:
    """The app's middleware stack, with the lean path in front of Starlette's own layers.

    A ``tools/call`` POST to the MCP endpoint (judged by its request line and
    headers) runs down ``lean``: the app's own middleware (Host/Origin guard,
    bearer-token check, request context, and any middleware added later) and
    the route's own auth, then the lean path. It skips only Starlette's error
    and exception wrappers and its router, which do nothing for this request
    and cost about 4% of a gateway call's instructions (callgrind). What the
    lean path gives up on (after reading the body) goes on down Starlette's
    own stack below the app's middleware — which it has passed already, so no
    middleware sees it twice — marked so the route does not try again.
    """

    __slots__ = ("below", "fast", "full", "lean", "path")

    def __init__(
        self, fast: FastCallPath, full: ASGIApp, lean: ASGIApp, below: ASGIApp, path: str
    ) -> None:
        self.fast = fast
        self.full = full
        self.lean = lean
        self.below = below  # what ``full`` runs below the app's middleware: errors + router
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == self.path
            and not scope.get("root_path")  # mounted under a prefix: Starlette routes it
            and self.fast.wants(scope)
        ):
            await self.lean(scope, receive, send)
        else:
            await self.full(scope, receive, send)

    async def end(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The bottom of ``lean``: the lean path, or on to FastMCP below the middleware."""
        await self.fast.take(scope, receive, send, self._hand_on)

    async def _hand_on(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The app's middleware has run on the way down ``lean``: carry on below it,
        # as ``full`` would have, so no middleware sees the request twice.
        scope[_TRIED] = True
        await self.below(scope, receive, send)


def _install_front(app: Any, fast: FastCallPath, route_app: Any, path: str) -> None:
    """Have Starlette build ``_Front`` as the app's middleware stack (on the first request,
    so middleware added after ``create_http_app`` applies to the lean path too)."""
    build_full = app.build_middleware_stack

    def build() -> ASGIApp:
        from starlette.middleware import Middleware
        from starlette.middleware.exceptions import ExceptionMiddleware

        full = build_full()
        # Starlette's innermost layer, as build_middleware_stack makes it.
        handlers = {k: v for k, v in app.exception_handlers.items() if k not in (500, Exception)}
        below = ExceptionMiddleware(app.router, handlers=handlers, debug=app.debug)
        front = _Front(fast, full, full, below, path)
        bottom: ASGIApp = front.end
        if route_app is not fast:  # the route's auth check, in front of the lean path
            guard = copy.copy(route_app)
            guard.app = bottom
            bottom = guard
        layers: list[Middleware] = []
        limit = getattr(app, "max_body_size", None)
        if limit is not None:  # Starlette's own body limit, as build_middleware_stack adds it
            from starlette.middleware.body_limit import RequestBodyLimitMiddleware

            layers.append(Middleware(RequestBodyLimitMiddleware, max_body_size=limit))
        layers += app.user_middleware
        for cls, args, kwargs in reversed(layers):
            bottom = cls(bottom, *args, **kwargs)
        front.lean = bottom
        return front

    app.build_middleware_stack = build


def install_fast_path(
    app: Any,
    path: str,
    *,
    kernel: Kernel,
    gate: ServeGate,
    server_info: Mapping[str, Any],
) -> FastCallPath | None:
    """Put a ``FastCallPath`` in front of the MCP endpoint of FastMCP's ``http_app``.

    It replaces the endpoint inside its route (behind the bearer-token check
    when there is one), and a ``_Front`` takes plain ``tools/call`` POSTs
    there by a shorter way through the same middleware. Returns None, and
    serves everything through FastMCP, when the app is not laid out as
    FastMCP 4.2 lays it out.
    """
    from fastmcp.server.http import StreamableHTTPASGIApp
    from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
    from starlette.routing import Route

    for route in getattr(getattr(app, "router", None), "routes", ()):
        if not isinstance(route, Route) or route.path != path:
            continue
        holder: Any = route
        if isinstance(route.app, RequireAuthMiddleware):
            holder = route.app
        if isinstance(holder.app, StreamableHTTPASGIApp):
            fast = FastCallPath(holder.app, kernel=kernel, gate=gate, server_info=server_info)
            holder.app = fast
            _install_front(app, fast, route.app, path)
            return fast
    log.warning(
        "the lean tools/call path is off: FastMCP's HTTP app is not laid out as expected "
        "(every request goes through FastMCP; results are the same, only slower)"
    )
    return None
