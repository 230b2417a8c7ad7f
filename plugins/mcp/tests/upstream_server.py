"""A small, real FastMCP server the tests use as an upstream (stdio, or HTTP with --http PORT).

Tools: ``forecast`` (text), ``stats`` (structured), ``fail`` (ToolError),
``limited`` (a rate-limit error in words), ``steps`` (progress notifications),
``big`` (a long answer), ``crash`` (the process dies mid-call), ``grow`` (adds a tool and announces
``tools/list_changed``), ``seen_meta`` (echoes the request ``_meta``),
``hidden`` (for include/exclude tests), ``slow`` (sleeps; ``slow_state`` counts
how such calls ended), ``envelope`` (the request's ``_meta`` and MCP headers),
``chatty`` (log notifications), ``stall_listing`` (announces a tool change,
then holds every ``tools/list`` answer back for a while), ``ask`` and ``come_back`` (``input_required``
results: an elicitation, a bare retry request), ``regional`` (an
``x-mcp-header`` argument: the client must send ``Mcp-Param-Region``) and
``http_401``, ``http_429``, ``http_503`` (over HTTP, a gate in front of the
server answers their calls with that status, as an API gateway would).

Over HTTP, ``UPSTREAM_TOKEN=<token>`` in the environment requires that bearer token,
``UPSTREAM_BASIC=<user>:<password>`` that HTTP Basic credential,
``UPSTREAM_FORCE_GZIP=1`` gzips every answer whatever the client asked for, and
``http_503_page`` / ``http_503_json`` are refused with a 40 kB / 100 kB body.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import time
from typing import Annotated, Any

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import Middleware
from fastmcp.utilities.types import Image
from mcp_types import ToolAnnotations
from pydantic import Field


def _auth() -> Any:
    token = os.environ.get("UPSTREAM_TOKEN")
    if not token:
        return None
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

    return StaticTokenVerifier(tokens={token: {"client_id": "toolwire-test", "scopes": []}})


mcp = FastMCP("upstream", auth=_auth())
PIXEL_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC"
)


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def forecast(city: str) -> str:
    """Get the forecast for a city."""
    return f"sunny in {city}"


@mcp.tool
def stats(text: str, times: int = 1) -> dict[str, Any]:
    """Count words."""
    return {"words": len(text.split()) * times, "chars": len(text) * times}


@mcp.tool
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@mcp.tool
def limited() -> str:
    """Fails like a rate-limited API."""
    raise ToolError("Rate limit exceeded, slow down")


@mcp.tool
async def steps(n: int, ctx: Context) -> dict[str, int]:
    """Reports n progress steps."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1} of {n}")
    return {"steps": n}


@mcp.tool
async def big(size: int, ctx: Context, stream: bool = False) -> str:
    """Answers ``size`` characters; ``stream``: after a progress notification (an SSE answer)."""
    if stream:
        await ctx.report_progress(0, 1, "starting")
    return "x" * size


@mcp.tool
def crash() -> str:
    """Kills the server process in the middle of the call."""
    sys.stderr.write("upstream: fatal: simulated crash\n")
    sys.stderr.flush()
    os._exit(3)


@mcp.tool
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool called ``name`` and tells the client the list changed."""

    def extra() -> str:
        return f"I am {name}"

    from fastmcp.tools import Tool

    mcp.add_tool(Tool.from_function(extra, name=name, description="A tool added at runtime."))
    await ctx.send_notification(mcp_types.ToolListChangedNotification())
    return f"added {name}"


@mcp.tool
def seen_meta(ctx: Context) -> dict[str, Any]:
    """Returns the request's _meta keys from toolwire."""
    rc = ctx.request_context
    meta = dict(rc.meta or {}) if rc is not None else {}
    return {"call_id": meta.get("io.toolwire/call-id")}


@mcp.tool
def snapshot() -> Image:
    """A one-pixel PNG (image content)."""
    return Image(data=base64.b64decode(PIXEL_PNG), format="png")


@mcp.tool
def hidden() -> str:
    """Excluded by some configs."""
    return "hidden"


_SLOW = {"started": 0, "finished": 0, "cancelled": 0}


@mcp.tool
async def slow(seconds: float) -> str:
    """Sleeps, then answers (``slow_state`` counts how these calls ended)."""
    _SLOW["started"] += 1
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _SLOW["cancelled"] += 1
        raise
    _SLOW["finished"] += 1
    return f"slept {seconds}"


_STALL = {"until": 0.0}


class _StallListing(Middleware):
    async def on_list_tools(self, context: Any, call_next: Any) -> Any:
        wait = _STALL["until"] - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        return await call_next(context)


mcp.add_middleware(_StallListing())


@mcp.tool
async def stall_listing(seconds: float, ctx: Context) -> str:
    """Announces a tool change, then answers ``tools/list`` only after ``seconds``."""
    _STALL["until"] = time.monotonic() + seconds
    await ctx.send_notification(mcp_types.ToolListChangedNotification())
    return f"stalling {seconds}"


@mcp.tool
def slow_state() -> dict[str, int]:
    """How many ``slow`` calls started, finished, were cancelled."""
    return dict(_SLOW)


@mcp.tool
def envelope(ctx: Context) -> dict[str, Any]:
    """The request's _meta (without the progress token) and its MCP and auth headers."""
    from fastmcp.server.dependencies import get_http_headers

    rc = ctx.request_context
    meta = {k: v for k, v in dict(rc.meta or {}).items() if k != "progressToken"} if rc else {}
    headers = get_http_headers(include_all=True)
    keep = {"accept", "content-type", "authorization", "x-tenant"}
    return {
        "meta": meta,
        "headers": {k: v for k, v in headers.items() if k in keep or k.startswith("mcp-")},
    }


@mcp.tool
async def chatty(ctx: Context) -> str:
    """Sends log notifications before answering."""
    await ctx.info("chatty: thinking")
    await ctx.debug("chatty: details")
    return "said it"


@mcp.tool
def ask(ctx: Context) -> Any:
    """Asks the client's user (input_required with an elicitation) before answering."""
    answers = ctx.input_responses
    if answers:
        return f"answered {answers}"
    return mcp_types.InputRequiredResult(
        input_requests={
            "confirm": mcp_types.ElicitRequest(
                params=mcp_types.ElicitRequestFormParams(
                    message="Proceed?",
                    requested_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
                )
            )
        },
        request_state="asked",
    )


@mcp.tool
def come_back(ctx: Context) -> Any:
    """First answers input_required with only a request state; the retry completes."""
    if ctx.request_state == "round-1":
        return "came back"
    return mcp_types.InputRequiredResult(request_state="round-1")


@mcp.tool
def regional(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
    """Routed by region: the client mirrors the argument into the Mcp-Param-Region header."""
    return f"served in {region}"


def _gated() -> str:
    return "the gate let this through"


for _status in (401, 429, 503):
    mcp.tool(_gated, name=f"http_{_status}", description=f"Refused with HTTP {_status} over HTTP.")
#: 429 with Retry-After as an HTTP-date 30 s ahead, or as "nan" (which float() would take)
_RETRY_AFTER_FORMS = {"http_429_date": "date", "http_429_nan": "nan"}
for _name in _RETRY_AFTER_FORMS:
    mcp.tool(_gated, name=_name, description="Refused with HTTP 429 over HTTP.")
#: 503 with a large body: a 40 kB HTML error page, or a 100 kB JSON-RPC error
_BIG_REFUSALS = ("http_503_page", "http_503_json")
for _name in _BIG_REFUSALS:
    mcp.tool(_gated, name=_name, description="Refused with HTTP 503 and a large body.")


class Gate:
    """ASGI middleware: a ``tools/call`` of ``http_<status>`` gets that HTTP status."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            basic = os.environ.get("UPSTREAM_BASIC")
            if basic and headers.get(b"authorization", b"") != (
                b"Basic " + base64.b64encode(basic.encode())
            ):
                from starlette.responses import PlainTextResponse

                await PlainTextResponse("basic auth required", 401)(scope, receive, send)
                return
            name = headers.get(b"mcp-name", b"").decode()
            if name in _BIG_REFUSALS:
                from starlette.responses import JSONResponse, PlainTextResponse

                big = "x" * 100_000
                page = (  # a page under 64 kB: small enough to be read to its end
                    PlainTextResponse(f"<html>{big[:40_000]}</html>", 503)
                    if name == "http_503_page"
                    else JSONResponse(
                        {"jsonrpc": "2.0", "id": None, "error": {"code": -1, "message": big}},
                        503,
                    )
                )
                await page(scope, receive, send)
                return
            form = _RETRY_AFTER_FORMS.get(name)
            if form is not None or (name.startswith("http_") and name[5:].isdigit()):
                from email.utils import formatdate

                from starlette.responses import PlainTextResponse

                status = int(name[5:8])
                extra = {"Retry-After": "7"} if status == 429 else {}
                if form is not None:
                    extra["Retry-After"] = (
                        formatdate(time.time() + 30, usegmt=True) if form == "date" else "nan"
                    )
                if status == 401:
                    extra["WWW-Authenticate"] = "Bearer"
                await PlainTextResponse("refused by the gate", status, headers=extra)(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


class ForceGzip:
    """ASGI middleware (``UPSTREAM_FORCE_GZIP=1``): every answer gzip-compressed, whatever
    the request's Accept-Encoding says (a faulty or hostile server); an event stream
    compressed as it goes, each part flushed."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        import zlib

        packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)  # gzip

        async def packed(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in msg.get("headers", []) if k.lower() != b"content-length"
                ]
                headers.append((b"content-encoding", b"gzip"))
                await send({**msg, "headers": headers})
                return
            if msg["type"] == "http.response.body":
                more = msg.get("more_body", False)
                body = packer.compress(msg.get("body", b""))
                body += packer.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)
                await send({**msg, "body": body})
                return
            await send(msg)

        await self.app(scope, receive, packed)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        from starlette.middleware import Middleware

        middleware = [Middleware(Gate)]
        if os.environ.get("UPSTREAM_FORCE_GZIP") == "1":
            middleware.append(Middleware(ForceGzip))
        mcp.run(
            transport="http",
            host="127.0.0.1",
            port=int(sys.argv[2]),
            show_banner=False,
            middleware=middleware,
        )
    else:
        mcp.run(transport="stdio", show_banner=False)
