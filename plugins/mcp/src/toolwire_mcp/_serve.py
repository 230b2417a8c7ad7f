"""Serve a kernel as an MCP server (FastMCP 4): a live ``Provider`` over the catalog.

Every ``tools/call`` goes through ``Kernel.call`` so every plugin applies to MCP
callers exactly as to in-process callers; the kernel validates the arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import anyio
import anyio.abc
import mcp_types
import pydantic_core
import uvicorn
from fastmcp import FastMCP
from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.server.context import Context
from fastmcp.server.context import _current_context as _CONTEXT
from fastmcp.server.dependencies import FastMCPRequestContext
from fastmcp.server.providers import Provider
from fastmcp.tools import Tool as MCPTool
from fastmcp.tools import ToolResult as MCPToolResult
from fastmcp.tools.base import InputRequiredToolResult
from fastmcp.utilities.versions import VersionSpec
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import PrivateAttr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

import toolwire
from toolwire import ConfigError, Kernel, Tool, ToolResult, export_tool

from ._calls import TENANT_CLAIM, ProgressSender, ServeGate, call_id_from_meta, run_call, tenant_of
from ._config import BearerAuth, ServeConfig, auth_switched_off, resolve_auth, token_problem
from ._convert import content_blocks, result_meta, utf8_safe
from ._fastpath import install_fast_path
from ._guard import remember_guard_verdicts
from ._http import timed_http_protocol
from ._images import ImageFiles

__all__ = [
    "ELICIT_EXTENSION",
    "INPUT_REQUIRED",
    "BearerTokenVerifier",
    "KernelProvider",
    "KernelTool",
    "ListChanged",
    "MCPElicitation",
    "ServeGate",
    "create_http_app",
    "create_server",
    "plugin_http_routes",
    "run_server",
]

#: ``ctx.extensions`` key under which ``KernelTool.run`` offers MCP elicitation.
ELICIT_EXTENSION = "mcp.elicit"
#: Error kind a plugin ends a call with after ``MCPElicitation.ask`` deferred a question
#: (2026-07-28 connections): the client gets an ``InputRequiredResult`` and retries.
INPUT_REQUIRED = "input_required"

log = logging.getLogger("toolwire.serve")

_PERMISSIVE: dict[str, Any] = {"type": "object", "additionalProperties": True}


def _current_context() -> Context | None:
    return _CONTEXT.get()


def _session_id(ctx: Context | None, rc: FastMCPRequestContext | None) -> str | None:
    """The MCP session id when the session has one (Streamable HTTP, or a stable legacy session)."""
    if rc is None or ctx is None:
        return None
    if rc.request is not None:
        sid = rc.request.headers.get("mcp-session-id")
        if sid:
            return str(sid)
    if rc.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None  # 2026-07-28: every request is its own connection
    try:
        return ctx.session_id
    except RuntimeError:
        return None


def _progress_sender(rc: FastMCPRequestContext, token: str | int) -> ProgressSender:
    """Progress notifications for this request, callable from any task.

    ``Context.report_progress`` reads the request from a context variable, which
    is not set in the tasks an upstream client delivers its progress on.
    """
    session, request_id = rc.session, rc.request_id

    async def send(progress: float, total: float | None, message: str | None) -> None:
        try:
            await session.send_progress_notification(
                progress_token=token,
                progress=progress,
                total=total,
                message=message,
                related_request_id=request_id,
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            # Progress is best effort: a client that went away must not fail the call.
            log.debug("progress notification not delivered: %s", exc)

    return send


def _principal(rc: FastMCPRequestContext) -> str | None:
    """The ``[server.clients]`` name the request's bearer token belongs to, or None."""
    request = rc.request
    if request is None or tenant_of(request.scope) is None:
        return None  # only a client entry's token carries a tenant
    grant = getattr(request.scope.get("user"), "access_token", None)
    name = getattr(grant, "client_id", None)
    return name if isinstance(name, str) else None


class MCPElicitation:
    """``ctx.extensions["mcp.elicit"]``: ask the MCP client's user (form elicitation).

    Offered by ``KernelTool.run`` when the client declared the elicitation
    capability. ``mode`` is ``"push"`` on handshake-era connections: ``ask``
    sends ``elicitation/create`` and waits for the answer. On 2026-07-28
    connections (no server-to-client requests) it is ``"input_required"``:
    ``ask`` returns the answer the client sent with this (retried) request, or
    records the question and returns None; the plugin then ends the call with
    error kind ``input_required``, and ``KernelTool.run`` answers with an MCP
    ``InputRequiredResult`` carrying the questions and ``state`` as the
    (server-sealed) ``request_state``. The client asks its user and retries the
    same ``tools/call`` with the answers; ``request_state`` then holds ``state``.
    Answers are ``{"action": "accept"|"decline"|"cancel", "content": {...}}``.
    """

    def __init__(self, ctx: Context, rc: FastMCPRequestContext) -> None:
        self.mode = (
            "push" if rc.protocol_version not in MODERN_PROTOCOL_VERSIONS else "input_required"
        )
        self._ctx = ctx
        self._rc = rc
        info = None
        with contextlib.suppress(RuntimeError, AttributeError):
            params = ctx.session.client_params
            info = params.client_info if params is not None else None
        #: The client's name (``clientInfo.name``), when it said: the client's own word.
        self.client: str | None = info.name if info is not None else None
        #: The ``[server.clients]`` name of the client's bearer token (authenticated), or
        #: None (the shared token, no auth, stdio).
        self.principal: str | None = _principal(rc)
        self._answers: dict[str, dict[str, Any]] | None = None  # read on first use
        self._request_state: str | None = None
        self._questions: dict[str, mcp_types.ElicitRequest] = {}
        self._state: str | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        """The answers (and echoed state) this request carries (2026-07-28 retries)."""
        if self._answers is None:
            self._answers = {}
            if self.mode == "input_required":
                with contextlib.suppress(RuntimeError, ValueError):
                    self._request_state = self._ctx.request_state
                    for key, answer in (self._ctx.input_responses or {}).items():
                        if isinstance(answer, mcp_types.ElicitResult):
                            self._answers[key] = {
                                "action": answer.action,
                                "content": answer.content,
                            }
        return self._answers

    @property
    def request_state(self) -> str | None:
        """The ``request_state`` the client echoed (None on a first round and in push mode)."""
        self._load()
        return self._request_state

    @staticmethod
    def offered(ctx: Context | None, rc: FastMCPRequestContext | None) -> MCPElicitation | None:
        """The capability for this request, or None when the client cannot elicit."""
        if ctx is None or rc is None:
            return None
        try:
            caps = ctx.session.client_capabilities
        except RuntimeError:
            return None
        if caps is None or caps.elicitation is None:
            return None
        return MCPElicitation(ctx, rc)

    async def ask(
        self, key: str, message: str, schema: dict[str, Any], *, state: str | None = None
    ) -> dict[str, Any] | None:
        """Ask the client's user; the answer, or None when the question was deferred."""
        if self.mode == "push":
            result = await self._ctx.session.elicit(
                message=message, requested_schema=schema, related_request_id=self._rc.request_id
            )
            return {"action": result.action, "content": result.content}
        answer = self._load().pop(key, None)  # each answer answers one question
        if answer is not None:
            return answer
        self._questions[key] = mcp_types.ElicitRequest(
            params=mcp_types.ElicitRequestFormParams(message=message, requested_schema=schema)
        )
        self._state = state
        return None

    def input_required(self) -> mcp_types.InputRequiredResult | None:
        """The deferred questions as an ``InputRequiredResult`` (None: nothing deferred)."""
        if not self._questions:
            return None
        return mcp_types.InputRequiredResult(
            input_requests=dict(self._questions), request_state=self._state
        )


def to_mcp_result(
    result: ToolResult, blocks: list[mcp_types.ContentBlock] | None = None
) -> MCPToolResult:
    """A kernel result as an MCP result: structured content + text, or ``isError`` + ``_meta``.

    ``blocks``: the content when already made (an image file read by ``ImageFiles``).
    """
    # An error result carries no structured content: clients validate structured
    # content against the tool's output schema even for errors (the TypeScript SDK
    # does). The kind travels in ``_meta`` and leads the text.
    structured = None if result.is_error else result.content
    meta = result_meta(result)
    try:  # the SDK serializes these later, out of our reach: a failure then is a masked error
        pydantic_core.to_json((structured, meta))
    except pydantic_core.PydanticSerializationError:  # a lone surrogate, which UTF-8 cannot carry
        structured, meta = utf8_safe(structured), utf8_safe(meta)
    return MCPToolResult.model_construct(
        content=blocks if blocks is not None else content_blocks(result),
        structured_content=structured,
        meta=meta,
        is_error=result.is_error,
    )


class KernelTool(MCPTool):
    """A catalog tool as FastMCP sees it; ``run`` hands the call to ``Kernel.call``."""

    _kernel: Kernel = PrivateAttr()
    _gate: ServeGate = PrivateAttr()

    @classmethod
    def wrap(cls, tool: Tool | None, name: str, kernel: Kernel, gate: ServeGate) -> KernelTool:
        """The MCP view of ``tool`` (None: an unknown name, answered by the kernel)."""
        if tool is None:
            # Built without FastMCP's validation: its SEP-986 name check logs five warnings
            # quoting the name whole, and this name is the client's (up to the 4 MiB body),
            # sent anew on every call: no tool is registered under it.
            out = cls.model_construct(
                name=name, description="(not in the catalog)", parameters=dict(_PERMISSIVE)
            )
        else:
            ann = tool.annotations.to_dict()
            listed = export_tool(tool, "mcp")  # object schemas, as every MCP client wants
            out = cls(
                name=tool.name,
                description=tool.description,
                parameters=listed["inputSchema"],
                output_schema=listed.get("outputSchema"),
                annotations=mcp_types.ToolAnnotations.model_validate(ann) if ann else None,
                title=tool.annotations.title,
                tags=set(tool.tags),
            )
        out._kernel = kernel
        out._gate = gate
        return out

    async def run(self, arguments: dict[str, Any]) -> MCPToolResult:
        """Run the call through the kernel pipeline."""
        ctx = _current_context()
        rc = ctx.request_context if ctx is not None else None
        raw_meta = rc.meta if rc is not None else None
        call_id = call_id_from_meta(raw_meta, self.name)
        if isinstance(call_id, ToolResult):
            return to_mcp_result(call_id)
        progress: ProgressSender | None = None
        token = raw_meta.get("progressToken") if raw_meta else None
        if token is not None and rc is not None:
            progress = _progress_sender(rc, token)
        elicit = MCPElicitation.offered(ctx, rc)
        call = run_call(
            self._kernel,
            self._gate,
            self.name,
            arguments,
            call_id=call_id,
            request_id=rc.request_id if rc is not None else None,
            session_id=_session_id(ctx, rc),
            tenant=tenant_of(rc.request.scope) if rc is not None and rc.request else None,
            progress=progress,
            extensions={ELICIT_EXTENSION: elicit} if elicit is not None else None,
        )
        # A call with a call id runs to its end when its request is cancelled (a client
        # that went away, or sent notifications/cancelled), as on the lean path: its
        # result is stored for the client's replay after a crash. The gate still cuts
        # it at the end of the shutdown grace period; its timeouts still bound it.
        result = await (_outliving(call, self._gate) if call_id is not None else call)
        if elicit is not None and result.error is not None and result.error.kind == INPUT_REQUIRED:
            asked = elicit.input_required()
            if asked is not None:
                return InputRequiredToolResult(asked)
        return to_mcp_result(result, await self._gate.images.blocks(result))


async def _outliving(call: Awaitable[ToolResult], gate: ServeGate) -> ToolResult:
    """``call`` in a task of its own, which a cancellation of the awaiting request does not
    reach (asyncio; elsewhere it is simply awaited)."""
    if asyncio._get_running_loop() is None:
        return await call
    task = asyncio.ensure_future(call)
    gate.detached.add(task)
    task.add_done_callback(_detached_done(gate))
    return await asyncio.shield(task)


def _detached_done(gate: ServeGate) -> Callable[[asyncio.Future[ToolResult]], None]:
    def done(task: asyncio.Future[ToolResult]) -> None:
        gate.detached.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a call outliving its request failed", exc_info=task.exception())

    return done


class ListChanged:
    """Tells a server's clients when the kernel's catalog changes (``tools/list_changed``).

    2026-07-28 clients subscribe with ``subscriptions/listen`` (the MCP SDK's
    ``ListenHandler`` over an in-process bus, registered on the server).
    Handshake-era sessions (stdio, legacy HTTP) that listed tools get
    ``notifications/tools/list_changed`` on their connection. A burst of
    changes (an upstream re-listed, several tools added) is one notification.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.bus = InMemorySubscriptionBus()
        self.sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self.sent = 0
        self._pending = False
        ref = weakref.WeakMethod(self._changed)

        def listener() -> None:  # the kernel must not keep a dropped server alive
            changed = ref()
            if changed is None:
                unsubscribe()
            else:
                changed()

        unsubscribe = kernel.on_catalog_change(listener)

    def track(self, ctx: Context | None) -> None:
        """Remember the connection of the current request when it is a handshake-era session."""
        rc = ctx.request_context if ctx is not None else None
        if rc is None or rc.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        # The SDK's Connection outlives the request; the per-request ServerSession
        # does not. Reached through private attributes (tests pin them).
        conn = getattr(getattr(rc, "_srctx", None), "connection", None)
        if conn is None:
            conn = getattr(rc.session, "_connection", None)
        if conn is not None and getattr(conn, "has_standalone_channel", False):
            self.sessions.add(conn)

    def _changed(self) -> None:
        if self._pending:
            return
        try:
            self.kernel.spawn(self._notify, name="toolwire-mcp:list_changed")
        except Exception:  # no event loop yet: nobody can be connected
            return
        self._pending = True

    async def _notify(self) -> None:
        try:
            await anyio.sleep(0.01)  # let a burst of changes land first
        finally:
            self._pending = False  # also when the kernel closes meanwhile: later changes notify
        self.sent += 1
        await self.bus.publish(ToolsListChanged())
        for conn in list(self.sessions):
            await conn.send_tool_list_changed()  # best effort: the SDK drops it on a closed stream


class KernelProvider(Provider):
    """A FastMCP provider reading the kernel's live catalog.

    Tools added to the kernel later appear on the next ``tools/list``. A call
    to a name that is not in the catalog still goes to the kernel, which
    answers ``not_found`` with close matches.
    """

    def __init__(
        self, kernel: Kernel, gate: ServeGate | None = None, changes: ListChanged | None = None
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.gate = gate or ServeGate()
        self.changes = changes
        self._views: dict[str, tuple[Tool, KernelTool]] = {}

    def _view(self, tool: Tool) -> KernelTool:
        cached = self._views.get(tool.name)
        if cached is not None and cached[0] is tool:
            return cached[1]
        view = KernelTool.wrap(tool, tool.name, self.kernel, self.gate)
        self._views[tool.name] = (tool, view)
        return view

    async def _list_tools(self) -> Sequence[MCPTool]:
        await self.kernel.start()
        if self.changes is not None:
            self.changes.track(_current_context())
        tools: list[Tool] = self.kernel.list_tools()
        live = {t.name for t in tools}
        for stale in self._views.keys() - live:
            del self._views[stale]
        return [self._view(t) for t in tools]

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> MCPTool | None:
        await self.kernel.start()
        tool = self.kernel.get_tool(name)
        if tool is None:
            return KernelTool.wrap(None, name, self.kernel, self.gate)
        return self._view(tool)


#: ``AccessToken.client_id`` of the shared token (``[server] auth_token``, ``TOOLS_AUTH_TOKEN``).
#: No client name can be it (``:`` is not allowed in one): the MCP SDK binds a session to
#: the client id of the token that opened it, so a client named as the shared token would
#: be let into the sessions of the shared token's holders, and they into its.
SHARED_CLIENT_ID = "toolwire:shared-token"


class BearerTokenVerifier(TokenVerifier):
    """Accepts the configured bearer tokens, compared in constant time.

    ``token``: the shared token (its calls have no tenant). ``clients``: name ->
    (token, tenant); a client's ``AccessToken`` has its name as ``client_id`` and
    its tenant in ``claims["io.toolwire/tenant"]``, which the calls it makes run as.
    Every token is compared (SHA-256 digests through ``hmac.compare_digest``), so
    the time taken does not tell which one, or how much of one, matched.
    """

    def __init__(
        self, token: str | None = None, *, clients: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        super().__init__()
        entries: list[tuple[bytes, AccessToken]] = []
        for secret in [token, *(t for t, _ in (clients or {}).values())]:
            problem = token_problem(secret) if secret else None
            if problem is not None:
                raise ValueError(f"the bearer token {problem}")
        if token:
            entries.append(
                (_digest(token), AccessToken(token="***", client_id=SHARED_CLIENT_ID, scopes=[]))
            )
        for name, (secret, tenant) in (clients or {}).items():
            if not secret:
                raise ValueError(f"the bearer token of client {name!r} must not be empty")
            if name == SHARED_CLIENT_ID:
                raise ValueError(
                    f"a client may not be named {name!r}: that is the shared token's client "
                    "id, and the two would share their sessions; choose another name"
                )
            grant = AccessToken(
                token="***", client_id=name, scopes=[], claims={TENANT_CLAIM: tenant}
            )
            entries.append((_digest(secret), grant))
        if not entries:
            raise ValueError("the bearer token must not be empty")
        self._entries = entries

    @classmethod
    def of(cls, auth: str | BearerAuth) -> BearerTokenVerifier:
        """The verifier of a shared token, or of every token of ``auth``."""
        if isinstance(auth, str):
            return cls(auth)
        return cls(auth.token, clients=auth.clients)

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access granted to ``token``, or None (HTTP 401)."""
        given = _digest(token)
        found: AccessToken | None = None
        for digest, grant in self._entries:
            if hmac.compare_digest(given, digest):
                found = grant
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _tokens(auth: str | BearerAuth | None) -> list[str]:
    if auth is None or isinstance(auth, str):
        return [auth] if auth else []
    return auth.tokens()


def _verifier(auth: str | BearerAuth | None) -> BearerTokenVerifier | None:
    return BearerTokenVerifier.of(auth) if auth is not None and _tokens(auth) else None


def create_server(
    kernel: Kernel,
    *,
    name: str = "toolwire",
    instructions: str | None = None,
    auth_token: str | BearerAuth | None = None,
    gate: ServeGate | None = None,
) -> FastMCP:
    """A FastMCP server offering ``kernel``'s catalog; every call goes through ``kernel.call``.

    ``auth_token``: HTTP clients must send ``Authorization: Bearer <token>``
    (401 otherwise); a ``BearerAuth`` gives several, a client's calls running as
    its tenant. The kernel is started on first use; closing it is the caller's job.
    """
    changes = ListChanged(kernel)
    provider = KernelProvider(kernel, gate, changes)
    mcp = FastMCP(
        name,
        instructions=instructions,
        version=toolwire.__version__,
        auth=_verifier(auth_token),
        providers=[provider],
        mask_error_details=True,
    )
    # 2026-07-28 clients learn of catalog changes on a subscriptions/listen stream.
    mcp._mcp_server.add_request_handler(
        "subscriptions/listen",
        mcp_types.SubscriptionsListenRequestParams,
        ListenHandler(changes.bus),
    )
    return mcp


# ------------------------------------------------------------- plugin routes
class _GuardedRoute(BaseRoute):
    """A plugin's route behind the server's bearer token (401 without it)."""

    def __init__(self, route: BaseRoute, verifier: BearerTokenVerifier | None) -> None:
        self.route = route
        self.verifier = verifier

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return self.route.matches(scope)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        return self.route.url_path_for(name, **path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.verifier is not None and scope["type"] == "http":
            header = Request(scope).headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            ok = scheme.lower() == "bearer" and bool(token.strip())
            if ok and await self.verifier.verify_token(token.strip()) is None:
                ok = False
            if not ok:
                response = JSONResponse(
                    {"error": {"kind": "auth", "message": "missing or wrong bearer token"}},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.route.handle(scope, receive, send)


def plugin_http_routes(
    kernel: Kernel, *, auth_token: str | BearerAuth | None = None, reserved: Sequence[str] = ()
) -> list[BaseRoute]:
    """The HTTP routes the kernel's plugins offer, behind ``auth_token`` when given.

    A plugin offers routes with an ``http_routes()`` method returning Starlette
    routes (full paths, e.g. ``/approvals/{id}``). A route whose path starts
    with one of ``reserved`` (the MCP endpoint) is a ``ConfigError``.

    A route with a ``toolwire_auth`` attribute checks its own credentials: a
    function ``(bearer_token) -> bool`` telling whether a token opens it. It
    is served without the server's bearer check (one ``Authorization`` header
    cannot carry two tokens), and a route that ``auth_token`` would open is a
    ``ConfigError``: every MCP client holds that token (the approval API's
    token, say, must be the approvers' own).
    """
    verifier = _verifier(auth_token)
    tokens = _tokens(auth_token)
    out: list[BaseRoute] = []
    for info in kernel.plugins.ordered():
        fn = getattr(info.plugin, "http_routes", None)
        if not callable(fn):
            continue
        for route in fn():
            path = str(getattr(route, "path", ""))
            if any(path == r or path.startswith(r.rstrip("/") + "/") for r in reserved):
                raise ConfigError(
                    f"plugin {info.name!r} offers the HTTP route {path!r}, which clashes with "
                    "the MCP endpoint; change [server] path or the plugin's route prefix",
                    key="server.path",
                )
            own_auth = getattr(route, "toolwire_auth", None)
            if own_auth is None:
                out.append(_GuardedRoute(route, verifier))
                continue
            if any(own_auth(t) for t in tokens):
                raise ConfigError(
                    f"plugin {info.name!r} serves the HTTP route {path!r} to holders of a "
                    "bearer token of the server, which MCP clients hold; give the plugin a "
                    "token of its own (for the approval plugin: [plugins.approval] http_token)",
                    key=f"plugins.{info.name}",
                )
            out.append(route)  # it checks its own token
    return out


# ------------------------------------------------------------------- running
_FOREIGN_LOGGERS = ("fastmcp", "mcp", "uvicorn", "uvicorn.error", "uvicorn.access", "httpx2")


#: Loggers of the MCP SDK that log once per line a peer sends: a stdio upstream printing
#: non-protocol output to stdout (``yes``, a chatty library) would flood the log with them.
#: Loggers one client can make write a traceback per line or per request: the SDK's
#: stdio parse failures and POST errors, and uvicorn's "Exception in ASGI application".
_PER_LINE_LOGGERS = (
    "mcp.client.stdio",
    "mcp.server.stdio",
    "mcp.server.streamable_http",
    "uvicorn.error",
)


class _ClientGone(logging.Filter):
    """Drops the traceback for a client that left in the middle of its request body.

    Nobody is left to answer, and it is no fault of the server's: a client cut
    off, or one ``[server] request_read_timeout_s`` closed, is not an error.
    On the SDK's logger (its handshake-era handler logs it) and on uvicorn's:
    the 2026-07-28 handler lets it rise to uvicorn's "Exception in ASGI
    application", whose throttle it would fill, hiding the server's real errors.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from starlette.requests import ClientDisconnect

        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ClientDisconnect)


class RepeatThrottle(logging.Filter):
    """Lets ``burst`` records of one message through per ``window_s``, then drops the rest.

    The first record after a window with drops says how many were dropped.
    Keyed by the message template, so one chatty peer cannot hide another's
    different messages.
    """

    def __init__(
        self, burst: int = 5, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int, int]] = {}  # msg -> (window start, let, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        key = str(record.msg)
        start, let, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window_s:
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this in the last {now - start:.0f}s were not logged)"
            start, let, dropped = now, 0, 0
        if let >= self.burst:
            self._seen[key] = (start, let, dropped + 1)
            return False
        self._seen[key] = (start, let + 1, dropped)
        if len(self._seen) > 256:  # bounded: forget the oldest windows
            for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:128]:
                del self._seen[old]
        return True


def route_foreign_logs() -> None:
    """Send FastMCP / MCP SDK / uvicorn logs through toolwire's JSON-lines handler (stderr).

    Also throttles the logs one client can make repeat per line or per request
    (``RepeatThrottle``: the SDK's parse failures, uvicorn's ASGI exceptions).
    Idempotent; ``toolwire serve`` calls it before the kernel starts, so the
    upstreams' first connection already logs as JSON lines.
    """
    for name in _PER_LINE_LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(f, RepeatThrottle) for f in lg.filters):
            lg.addFilter(RepeatThrottle())
    for name in ("mcp.server.streamable_http", "uvicorn.error"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _ClientGone) for f in lg.filters):
            lg.filters.insert(0, _ClientGone())  # before the throttle counts it
    ours = logging.getLogger("toolwire")
    if not ours.handlers:
        return
    for name in _FOREIGN_LOGGERS:
        lg = logging.getLogger(name)
        lg.handlers[:] = list(ours.handlers)
        lg.propagate = False
        lg.setLevel(max(ours.getEffectiveLevel(), logging.WARNING))


def _proxy_headers(allow: list[str] | None) -> dict[str, Any]:
    """uvicorn's proxy-header settings for ``[server] forwarded_allow_ips``.

    uvicorn on its own believes ``X-Forwarded-For`` / ``-Proto`` from 127.0.0.1:
    on a gateway bound to loopback any local process could then name the client
    address recorded (the approval audit's ``client``). Here nobody is believed
    unless the config, or uvicorn's own ``FORWARDED_ALLOW_IPS``, names the proxies.
    """
    if allow is None:
        env = os.environ.get("FORWARDED_ALLOW_IPS", "").strip()
        allow = [part.strip() for part in env.split(",") if part.strip()] if env else []
    if not allow:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": allow}


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: ``run_server`` drains first, then stops it."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def raise_fd_limit(target: int = 65536) -> int:
    """Raise the open-file soft limit towards ``target`` (within the hard limit); the new limit.

    Services often start with a soft limit of 1024: each HTTP connection is a
    file descriptor, so a few hundred idle clients could lock everyone out.
    """
    try:
        import resource
    except ImportError:  # Windows
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the open-file limit from %s: %s", soft, exc)
    return int(soft)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: a free port), IPv4 or IPv6 by ``host``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.setblocking(False)
    return sock


def serve_gate(cfg: ServeConfig) -> ServeGate:
    """The ``ServeGate`` of a server run with ``cfg`` (its image roots and size limit)."""
    return ServeGate(images=ImageFiles(cfg.image_roots, max_bytes=cfg.image_max_bytes))


#: "never" for session_idle_timeout_s: ten years.
_NEVER_S = 10 * 365 * 24 * 3600.0


def create_http_app(
    kernel: Kernel,
    cfg: ServeConfig | None = None,
    *,
    auth_token: str | BearerAuth | None = None,
    gate: ServeGate | None = None,
) -> Starlette:
    """The ASGI app ``toolwire serve --transport http`` runs, to mount in your own server.

    The MCP endpoint at ``cfg.path`` (with the lean ``tools/call`` path unless
    ``cfg.fast_path`` is false; the ``FastCallPath`` is ``app.state.toolwire_fast_path``,
    None when off), the plugins' HTTP routes, all behind ``auth_token`` when
    given, and the Host/Origin guard. Run the app's lifespan (uvicorn does).
    """
    cfg = cfg or ServeConfig(transport="http")
    gate = gate or serve_gate(cfg)
    mcp = create_server(
        kernel, name=cfg.name, instructions=cfg.instructions, auth_token=auth_token, gate=gate
    )
    # Plugins' HTTP routes (e.g. /approvals), behind the same token.
    extra_routes = plugin_http_routes(kernel, auth_token=auth_token, reserved=[cfg.path])
    allowed = [*cfg.allowed_hosts, cfg.host] if _is_loopback(cfg.host) else cfg.allowed_hosts
    app = mcp.http_app(
        path=cfg.path,
        transport="http",
        host_origin_protection="auto",
        allowed_hosts=allowed or None,
        allowed_origins=cfg.allowed_origins or None,
        # FastMCP reads None as "the SDK's default" (30 min), and the SDK refuses inf
        session_idle_timeout=(
            cfg.session_idle_timeout_s if cfg.session_idle_timeout_s is not None else _NEVER_S
        ),
    )
    app.router.routes.extend(extra_routes)
    remember_guard_verdicts(app)
    _cap_sessions(app, cfg.path, cfg.max_sessions)
    fast = None
    if cfg.fast_path:
        stamp = mcp._mcp_server.server_info_stamp
        fast = install_fast_path(app, cfg.path, kernel=kernel, gate=gate, server_info=stamp)
    app.state.toolwire_fast_path = fast
    return app


def _cap_sessions(app: Starlette, path: str, max_sessions: int | None) -> None:
    """Set the MCP SDK's session cap, which FastMCP's ``http_app`` does not pass on.

    FastMCP makes the session manager when the app's lifespan starts; the cap
    is set on it there, before the first request.
    """
    from fastmcp.server.http import StreamableHTTPASGIApp
    from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
    from starlette.routing import Route

    endpoint: Any = None
    for route in app.router.routes:
        if isinstance(route, Route) and route.path == path:
            inner = route.app.app if isinstance(route.app, RequireAuthMiddleware) else route.app
            if isinstance(inner, StreamableHTTPASGIApp):
                endpoint = inner
    if endpoint is None:
        log.warning("[server] max_sessions is not applied: FastMCP's HTTP app is laid out anew")
        return
    started = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with started(a) as state:
            manager = endpoint.session_manager
            if manager is not None and hasattr(manager, "max_sessions"):
                manager.max_sessions = max_sessions
            yield state

    app.router.lifespan_context = lifespan


async def run_server(
    kernel: Kernel,
    cfg: ServeConfig,
    *,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    handle_signals: bool = True,
) -> None:
    """Serve ``kernel`` over ``cfg.transport`` until stdin closes (stdio) or a signal arrives.

    On SIGINT/SIGTERM new calls are refused (``unavailable``), in-flight calls
    get ``cfg.shutdown_grace_s`` to finish, then the transport stops and the
    remaining calls are cancelled (their ``after_call`` hooks still run). The
    caller closes the kernel.
    """
    if asyncio._get_running_loop() is None:
        raise RuntimeError(
            "toolwire-mcp's server (run_server, `toolwire serve`) needs an asyncio event loop: "
            "FastMCP's server, uvicorn and the stdio reader run on asyncio, not trio; run it "
            "under asyncio (anyio.run(main) or asyncio.run(main))"
        )
    token = resolve_auth(cfg) if cfg.transport == "http" else None
    if cfg.transport == "http" and token is None:
        switched_off = auth_switched_off(cfg)
        if switched_off is not None:
            log.warning("%s", switched_off)
    gate = serve_gate(cfg)
    app: Starlette | None = None
    if cfg.transport == "http":
        app = create_http_app(kernel, cfg, auth_token=token, gate=gate)
    route_foreign_logs()
    tools = len(kernel.list_tools())
    sock: socket.socket | None = None
    if cfg.transport == "http":
        try:
            raise_fd_limit()
            sock = bind_socket(cfg.host, cfg.port)
        except OSError as exc:
            # a host that does not resolve or is no address of this machine: the host's fault
            bad_host = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
            raise ConfigError(
                f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}; "
                + (
                    "give --host an address (or name) of this machine, e.g. 127.0.0.1"
                    if bad_host
                    else "choose another --port (0 picks a free one) or --host"
                ),
                key="server.host" if bad_host else "server.port",
            ) from exc
    async with anyio.create_task_group() as tg:
        stop: Callable[[], Awaitable[None]]
        if cfg.transport == "stdio":
            outs: list[_StdoutFrames] = []

            async def stop_stdio() -> None:
                # The gate is idle once the calls have left the kernel; their answers are
                # written after that: let them out before the transport stops.
                for out in outs:
                    await out.answered(_CUT_SETTLE_S)
                tg.cancel_scope.cancel()

            stop = stop_stdio
            if handle_signals:
                await tg.start(_on_signal, gate, cfg.shutdown_grace_s, stop)
            info: dict[str, Any] = {
                "transport": "stdio",
                "tools": tools,
                "auth": False,
                "loop": _loop_name(),
            }
            log.info("toolwire serving %d tools over stdio (loop: %s)", tools, info["loop"])
            if on_ready is not None:
                on_ready(info)
            mcp = create_server(
                kernel, name=cfg.name, instructions=cfg.instructions, auth_token=None, gate=gate
            )
            await _run_stdio(mcp, gate, cfg.shutdown_grace_s, outs)
            tg.cancel_scope.cancel()
            return

        assert sock is not None
        port = sock.getsockname()[1]
        assert app is not None
        server = _Uvicorn(
            uvicorn.Config(
                app,
                log_config=None,
                access_log=False,
                lifespan="on",
                ws="none",
                http=(
                    timed_http_protocol(cfg.request_read_timeout_s, cfg.max_header_bytes)
                    if cfg.request_read_timeout_s is not None or cfg.max_header_bytes is not None
                    else "httptools"
                ),
                timeout_graceful_shutdown=1,
                **_proxy_headers(cfg.forwarded_allow_ips),
                log_level=logging.WARNING,
                # uvicorn refuses at len(connections) >= limit, the asking one included
                limit_concurrency=(
                    cfg.max_connections + 1 if cfg.max_connections is not None else None
                ),
            )
        )

        async def stop_http() -> None:
            server.should_exit = True

        stop = stop_http
        if handle_signals:
            await tg.start(_on_signal, gate, cfg.shutdown_grace_s, stop)
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        url = f"http://{host}:{port}{cfg.path}"
        if token is None and not _is_loopback(cfg.host):
            log.warning(
                "serving on %s without bearer auth: anyone who can reach it can call every "
                "tool; set TOOLS_AUTH_TOKEN (or [server] auth_token)",
                url,
            )
        loop = _loop_name()
        info = {
            "transport": "http",
            "url": url,
            "port": port,
            "tools": tools,
            "auth": bool(token),
            "loop": loop,
        }

        async def announce() -> None:
            await server.ready.wait()
            if server.started:
                log.info(
                    "toolwire serving %d tools at %s (auth: %s, loop: %s)",
                    tools,
                    url,
                    bool(token),
                    loop,
                )
                if on_ready is not None:
                    on_ready(info)

        tg.start_soon(announce)
        try:
            await server.serve(sockets=[sock])
        except BaseException:
            # Cancelled (an embedder stopping run_server by cancelling its task):
            # uvicorn's own exit path did not run, which left the listening socket
            # registered with the loop (closing it under the loop made the next
            # server given that file descriptor deaf) and the app's lifespan running.
            # The calls in flight are cut at once, each answered `cancelled`: on the lean
            # path and on FastMCP's handler alike (a call with a call id there runs in a
            # task of its own, which uvicorn's shutdown would not reach).
            gate.cancel_all()
            if server.started:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_SHUTDOWN_S):
                    await server.shutdown(sockets=[sock])
            raise
        finally:
            sock.close()
        tg.cancel_scope.cancel()


#: How long a cancelled ``run_server`` gives uvicorn to close (its calls were cut already).
_CANCEL_SHUTDOWN_S = 5.0


def _loop_name() -> str:
    """``uvloop`` or ``asyncio``: the event loop serving (``[server] loop``)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


#: The longest stdin line read (a longer one is answered with an error and skipped).
_MAX_FRAME = 64 * 1024 * 1024

_TOO_LONG = (
    f"Invalid Request: the line is longer than {_MAX_FRAME >> 20} MiB, the most toolwire "
    "reads in one message; it was skipped (send large data by reference, e.g. a path or URL)"
)

_UNANSWERED = (
    "toolwire is shutting down: the request was still unanswered when the shutdown grace "
    "period ([server] shutdown_grace_s) ended; its outcome is unknown: check whether it "
    "took effect before sending it again"
)


#: The protocol's stdout while ``stdout_for_frames`` holds it (fd 1 then points at stderr).
_CLAIMED_STDOUT: int | None = None


@contextlib.contextmanager
def stdout_for_frames() -> Iterator[None]:
    """Keep stdout for the protocol's frames from now on: fd 1 points at stderr meanwhile.

    ``toolwire serve`` over stdio holds it from before the kernel is built until
    the kernel is closed, so output while tool modules are imported, plugins
    start or upstreams connect (a ``print()`` at import, a chatty library) goes
    to stderr too, not ahead of the first frame; ``run_server`` alone covers
    only the serving itself.
    """
    global _CLAIMED_STDOUT
    if _CLAIMED_STDOUT is not None:
        yield
        return
    with contextlib.suppress(ValueError, OSError):
        sys.stdout.flush()
    wire = os.dup(1)
    os.dup2(2, 1)
    _CLAIMED_STDOUT = wire
    try:
        yield
    finally:
        _CLAIMED_STDOUT = None
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.flush()  # stray output still buffered goes to stderr too
        os.dup2(wire, 1)
        os.close(wire)


class _StdoutFrames:
    """The protocol's stdout: frames go to a private copy of fd 1, stray output to stderr.

    While serving, fd 1 points at stderr, so a ``print()`` in a tool or a
    library cannot corrupt the protocol stream. Writes are serialized (the SDK's
    writer and the parse-error replies share the stream).
    """

    def __init__(self) -> None:
        self._saved = os.dup(1)  # what fd 1 is now: stdout, or stderr under stdout_for_frames
        self._wire = os.dup(_CLAIMED_STDOUT if _CLAIMED_STDOUT is not None else 1)
        os.dup2(2, 1)
        self._lock = anyio.Lock()
        #: ids of the requests read and not answered yet (for the end of input)
        self._unanswered: set[str | int] = set()
        self._all_answered: anyio.Event | None = None
        #: True once stdout failed (the client closed its end): later frames are dropped
        self.gone = False
        #: called once when stdout fails (the stdin reader stops, as at the end of input)
        self.on_gone: Callable[[], None] | None = None

    def expect(self, request_id: str | int) -> None:
        """A request was read: its answer is awaited at the end of input."""
        self._unanswered.add(request_id)

    def forget(self, request_id: str | int) -> None:
        """A request will get no answer (the client cancelled it)."""
        self._unanswered.discard(request_id)
        if not self._unanswered and self._all_answered is not None:
            self._all_answered.set()

    async def answered(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` until every request read has been answered."""
        if self._unanswered:
            if self._all_answered is None or self._all_answered.is_set():
                self._all_answered = anyio.Event()  # shared by concurrent waiters
            with anyio.move_on_after(timeout_s):
                await self._all_answered.wait()

    async def answer_the_rest(self) -> None:
        """Answer each request read and still unanswered with an error (the SDK is done)."""
        rest, self._unanswered = self._unanswered, set()
        frames = [
            json.dumps(
                {"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": _UNANSWERED}}
            )
            + "\n"
            for rid in rest
        ]
        if frames:
            data = "".join(frames).encode("utf-8")
            async with self._lock:
                await self._send(data)

    async def write(self, text: str) -> None:
        data = text.encode("utf-8")
        async with self._lock:
            await self._send(data)
        if self._unanswered:
            rid = _response_id(text)
            if rid is not None:
                self.forget(rid)

    async def _send(self, data: bytes) -> None:
        """Write ``data`` to the wire; once the wire has failed, drop it."""
        if self.gone:
            return
        try:
            await anyio.to_thread.run_sync(self._write_all, data)
        except OSError as exc:
            # The client closed its end of our stdout (or died): nobody hears answers
            # any more. Stop as at the end of input rather than end with a traceback.
            self.gone = True
            log.warning(
                "stdio: cannot write to stdout (%s): the client stopped reading; stopping "
                "as at the end of input (answers still due are dropped)",
                exc.strerror or exc,
            )
            if self.on_gone is not None:
                self.on_gone()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._wire, view)
            view = view[n:]

    async def flush(self) -> None:
        """Writes are unbuffered."""

    def restore(self) -> None:
        """Point fd 1 back where it pointed before."""
        sys.stdout.flush()
        os.dup2(self._saved, 1)
        os.close(self._saved)
        os.close(self._wire)


class _StdinFrames:
    """stdin lines read on the event loop (cancellable), checked before the SDK sees them.

    The MCP SDK's default reader blocks a worker thread in ``read()``, which no
    cancellation can interrupt (a SIGTERM would hang until the client closed
    stdin), and it drops malformed lines silently. Here a line that is not
    JSON, or not a JSON-RPC message, gets the JSON-RPC error reply (-32700 /
    -32600, ``id: null``) and serving goes on. At end of input, in-flight
    calls get the shutdown grace period to finish.
    """

    def __init__(
        self, reader: asyncio.StreamReader, out: _StdoutFrames, gate: ServeGate, grace_s: float
    ) -> None:
        self._reader = reader
        self._out = out
        self._gate = gate
        self._grace_s = grace_s
        self._reading: anyio.CancelScope | None = None
        out.on_gone = self._stop_reading

    def _stop_reading(self) -> None:
        """stdout failed: the line being waited for is not waited for (end of input)."""
        if self._reading is not None:
            self._reading.cancel()

    def __aiter__(self) -> _StdinFrames:
        return self

    async def __anext__(self) -> str:
        while True:
            line: bytes | None = b""
            if not self._out.gone:
                with anyio.CancelScope() as self._reading:
                    line = await self._readline()
                self._reading = None
                if self._out.gone:
                    line = b""  # nobody reads our answers: stop as at the end of input
            if line is None:
                # too long to read: skipped whole, and answered (its id is unknown)
                log.warning("stdio: rejected a frame of more than %d bytes", _MAX_FRAME)
                too_long = {"code": -32600, "message": _TOO_LONG}
                frame = {"jsonrpc": "2.0", "id": None, "error": too_long}
                await self._out.write(json.dumps(frame) + "\n")
                continue
            if not line:
                # Every request read gets its answer (one still on its way to its handler
                # included), then the calls in flight drain, within one grace period.
                start = anyio.current_time()
                await self._out.answered(self._grace_s)
                left = max(0.0, self._grace_s - (anyio.current_time() - start))
                cut = await self._gate.drain(left)
                if cut:
                    # as on SIGTERM: each call still running is answered `cancelled`, rather
                    # than cut off with the transport (no answer, or "Connection closed")
                    log.warning(
                        "end of input: %d calls still running after %.1fs: cancelling them",
                        cut,
                        self._grace_s,
                    )
                    self._gate.cancel_all()
                # the calls cut are answered `cancelled`, those not started yet `unavailable`
                # (the gate drains); what is still unanswered then, _run_stdio answers
                await self._out.answered(_CUT_SETTLE_S)
                raise StopAsyncIteration
            problem: tuple[int, str, str | int | None] | None
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                # JSON text is UTF-8: a line that is not must not run with its bytes
                # replaced (HTTP answers such a body -32700 too)
                text = line.decode("utf-8", errors="replace")
                if not text.strip():
                    continue
                problem, data = _not_utf8(exc, text)
            else:
                if not text.strip():
                    continue
                problem, data = _check_frame(text)
            if problem is None:
                self._track(data)
                return text
            code, message, rid = problem
            log.warning("stdio: rejected a malformed frame: %s", message)
            reply = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
            await self._out.write(json.dumps(reply) + "\n")

    async def _readline(self) -> bytes | None:
        """The next line (b"" at the end of input), or None for one longer than
        ``_MAX_FRAME``, which is skipped to its end rather than ending the server."""
        too_long = False
        while True:
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial  # the last line has no newline; b"" at the end
            except asyncio.LimitOverrunError as exc:
                # drop what is buffered of the line (up to its newline, when it came)
                await self._reader.readexactly(exc.consumed)
                too_long = True
                continue
            return None if too_long else line

    def _track(self, data: Any) -> None:
        """Note a request the server owes an answer; a cancelled one is owed none."""
        if not isinstance(data, dict) or "method" not in data:
            return  # a response to one of the server's own requests
        if "id" in data:
            self._out.expect(data["id"])  # a valid id: _check_frame checked it
        elif data["method"] == "notifications/cancelled":
            params = data.get("params")
            rid = params.get("requestId") if isinstance(params, dict) else None
            if isinstance(rid, (str, int)) and not isinstance(rid, bool):
                self._out.forget(rid)


#: The head of a response as the MCP SDK writes it: ``{"jsonrpc":"2.0","id":...,"result"``.
_RESPONSE_HEAD = re.compile(r'\{"jsonrpc":"2\.0","id":(-?\d+|"(?:[^"\\]|\\.)*"),"(?:result|error)"')


def _response_id(text: str) -> str | int | None:
    """The id of the request a frame written to stdout answers; None for another frame."""
    head = _RESPONSE_HEAD.match(text)
    if head is not None:
        rid = json.loads(head.group(1))
        return rid if isinstance(rid, (str, int)) else None
    if text.startswith('{"jsonrpc":"2.0","method"'):
        return None  # a notification or a request of the server's: no parse needed
    try:
        data = pydantic_core.from_json(text)
    except ValueError:
        return None
    if isinstance(data, dict) and ("result" in data or "error" in data):
        rid = data.get("id")
        if isinstance(rid, (str, int)) and not isinstance(rid, bool):
            return rid
    return None


def _not_utf8(exc: UnicodeDecodeError, text: str) -> tuple[tuple[int, str, str | int | None], None]:
    """The -32700 error of a line that is not UTF-8; ``text``: the line with its bad bytes
    replaced, read only for the request's id, so the client waiting for it is answered."""
    try:
        data = pydantic_core.from_json(text)
    except (ValueError, RecursionError):
        data = None
    rid = data.get("id") if isinstance(data, dict) and "method" in data else None
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        rid = None
    bad = exc.object[exc.start : exc.end].hex(" ")
    message = (
        f"Parse error: the line is not valid UTF-8 (bytes {bad} at offset {exc.start}); "
        "JSON-RPC messages must be UTF-8 text, so the message was not processed"
    )
    return (-32700, message, rid), None


def _check_frame(text: str) -> tuple[tuple[int, str, str | int | None] | None, Any]:
    """((code, message, id) of the JSON-RPC error a malformed line gets, or None when it is
    fine; the parsed line, or None when it is not JSON).

    The line is read as the MCP SDK reads it (pydantic's JSON parser, whose
    nesting limit and rejection of lone surrogates differ from ``json``'s), so
    every line the SDK would drop without a word gets an answer here instead.
    """
    try:
        data = pydantic_core.from_json(text)
    except (ValueError, RecursionError) as exc:
        return (-32700, f"Parse error: {exc}", None), None
    return _frame_problem(data, text), data


def _frame_problem(data: Any, text: str) -> tuple[int, str, str | int | None] | None:
    """(code, message, id) of the JSON-RPC error the parsed line ``data`` gets, or None."""
    rid = data.get("id") if isinstance(data, dict) else None
    valid_id = isinstance(rid, (str, int)) and not isinstance(rid, bool)
    if isinstance(data, dict) and "method" in data and "id" in data and not valid_id:
        # Not a notification (those carry no id): a request whose id is no string or
        # integer, which the SDK would take for a notification and never answer.
        return -32600, "Invalid Request: the id must be a string or an integer", None
    try:
        mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except (ValueError, RecursionError):
        return (
            -32600,
            'Invalid Request: expected a JSON-RPC 2.0 message ({"jsonrpc": "2.0", "method": ..., '
            '"id": ...} or a response)',
            rid if valid_id else None,
        )
    return None


def _pollable(fd: int) -> bool:
    """Whether the event loop can watch ``fd`` (epoll refuses regular files and /dev/null)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return True
    return stat.S_ISCHR(mode) and os.isatty(fd)


async def _feed_from_thread(fd: int, reader: asyncio.StreamReader) -> None:
    """Feed ``reader`` from a file the loop cannot watch, reading in a worker thread."""
    try:
        while data := await anyio.to_thread.run_sync(os.read, fd, 1 << 16):
            reader.feed_data(data)
    except OSError as exc:
        log.warning("stdin: cannot read it: %s; ending as at the end of input", exc)
    finally:
        reader.feed_eof()
        with contextlib.suppress(OSError):
            os.close(fd)


async def _stdin_reader() -> tuple[asyncio.StreamReader, asyncio.Task[None] | None] | None:
    """stdin as an event-loop stream (and the task feeding it, for a file), or None.

    A pipe, socket or terminal is watched by the loop. A regular file or
    /dev/null, which epoll refuses (uvloop aborts the process on one), is read
    in a worker thread instead; None only when there is no stdin or no asyncio.
    """
    if asyncio._get_running_loop() is None:
        return None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_MAX_FRAME)
    try:
        fd = os.dup(sys.stdin.fileno())
        pollable = _pollable(fd)
    except (OSError, ValueError, AttributeError):
        return None
    if not pollable:
        return reader, loop.create_task(_feed_from_thread(fd, reader))
    pipe = os.fdopen(fd, "rb", buffering=0)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    except (OSError, ValueError):
        pipe.close()
        return None
    return reader, None


async def _run_stdio(
    mcp: FastMCP, gate: ServeGate, grace_s: float, outs: list[_StdoutFrames] | None = None
) -> None:
    """``FastMCP.run_stdio_async`` with toolwire's stdin/stdout framing; ``outs`` gets the
    stdout it writes to (for a shutdown to wait for the answers still due)."""
    from fastmcp.server.context import reset_transport, set_transport
    from mcp.server.stdio import stdio_server

    found = await _stdin_reader()
    if found is None:
        if _CLAIMED_STDOUT is None:
            await mcp.run_stdio_async(show_banner=False)
            return
        os.dup2(_CLAIMED_STDOUT, 1)  # the SDK writes its frames to fd 1
        try:
            await mcp.run_stdio_async(show_banner=False)
        finally:
            os.dup2(2, 1)
        return
    reader, feeder = found
    out = _StdoutFrames()
    if outs is not None:
        outs.append(out)
    token = set_transport("stdio")
    try:
        async with mcp._lifespan_manager():
            stdin = cast("anyio.AsyncFile[str]", _StdinFrames(reader, out, gate, grace_s))
            stdout = cast("anyio.AsyncFile[str]", out)
            async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
                low = mcp._mcp_server
                await low.run(read_stream, write_stream, low.create_initialization_options())
    finally:
        # every request read gets an answer, if only that it got none in time
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(_CUT_SETTLE_S),
            contextlib.suppress(OSError),
        ):
            await out.answer_the_rest()
        if feeder is not None:
            feeder.cancel()
        reset_transport(token)
        out.restore()
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(sys.stdin.fileno(), True)  # the event loop made it non-blocking


#: How long calls cancelled at the end of the grace period get to send their answer.
_CUT_SETTLE_S = 1.0


async def _on_signal(
    gate: ServeGate,
    grace_s: float,
    stop: Callable[[], Awaitable[None]],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for sig in signals:
            name = signal.Signals(sig).name
            log.info(
                "%s: draining (up to %.1fs for %d in-flight calls; %s again stops now)",
                name,
                grace_s,
                gate.inflight,
                name,
            )
            hurried = False
            async with anyio.create_task_group() as waiting:

                async def hurry() -> None:
                    nonlocal hurried
                    # A second signal (Ctrl-C again) ends the grace period at once.
                    async for again in signals:
                        log.warning(
                            "%s again: not waiting out the grace period for %d in-flight calls",
                            signal.Signals(again).name,
                            gate.inflight,
                        )
                        hurried = True
                        waiting.cancel_scope.cancel()
                        return

                waiting.start_soon(hurry)
                left = await gate.drain(grace_s)
                waiting.cancel_scope.cancel()
            if hurried:
                left = gate.inflight
            if left:
                if not hurried:
                    log.warning(
                        "%d calls still running after %.1fs: cancelling them", left, grace_s
                    )
                gate.cancel_all()  # each is answered `cancelled`, not cut off
                await gate.settle(_CUT_SETTLE_S)
                await anyio.sleep(_CUT_SETTLE_S / 10)  # the answers' last writes
            await stop()
            return
