"""The lean ``tools/call`` path answers what FastMCP answers, and leaves the rest to FastMCP.

Two real HTTP servers on loopback serve one kernel: one with the lean path
(``fast_path = true``, the default), one without. The same raw requests go to
both and the answers are compared; the lean path's counters show which path
answered.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Client
from toolwire_mcp_testkit import Served, serving_http

import toolwire_mcp._fastpath as fastpath
from toolwire import CallContext, Kernel, ToolCall, ToolError, hookimpl, tool
from toolwire_mcp import CALL_ID_META_KEY, RESULT_META_KEY, ServeConfig, create_http_app
from toolwire_mcp._calls import ServeGate

pytestmark = pytest.mark.anyio

VERSION = "2026-07-28"
CANCELLED: list[str] = []
CANCEL_SEEN: anyio.Event | None = None


@tool
def profile(name: str, age: int = 0) -> dict[str, Any]:
    """A structured result."""
    return {"name": name, "age": age, "tags": ["a", "b"]}


@tool
def greet(name: str) -> str:
    """A text result."""
    return f"hello {name}"


@tool
def over_quota() -> str:
    """Always over quota."""
    raise ToolError("monthly budget exceeded", kind="quota", retry_after_s=30)


@tool
def stamped() -> dict[str, Any]:
    """A result with values JSON has no type for."""
    return {"at": datetime(2026, 11, 29, 12, 0, tzinfo=UTC), "raw": b"bytes"}


PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC"
)


@tool
def picture(broken: bool = False) -> dict[str, Any]:
    """An image as MCP content (a broken one is just JSON)."""
    if broken:
        return {"content": [{"type": "image", "mimeType": "image/png"}]}  # no data
    return {"content": [{"type": "image", "data": PIXEL, "mimeType": "image/png"}]}


@tool
async def steps(n: int, ctx: CallContext) -> dict[str, int]:
    """Reports progress ``n`` times."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
    return {"done": n}


@tool
async def slow(seconds: float, label: str = "") -> str:
    """Sleeps; notes a cancellation under ``label``."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        CANCELLED.append(label)
        if CANCEL_SEEN is not None:
            CANCEL_SEEN.set()
        raise
    return "slept"


@tool
def scale(x: float, by: float = 10.0) -> float:
    """x times by (1e308 times 10 is infinity, which JSON cannot carry)."""
    return x * by


@tool
def mangled() -> dict[str, Any]:
    """A result holding a lone surrogate (as from bytes decoded with "surrogateescape")."""
    return {"text": b"caf\xe9".decode("utf-8", "surrogateescape")}


TOOLS = [profile, greet, over_quota, stamped, picture, steps, slow, scale, mangled]
serving = serving_http


@asynccontextmanager
async def both(extra_tools: list[Any] | None = None) -> AsyncIterator[tuple[Served, Served]]:
    """The same kernel served with the lean path and without it."""
    tools = [*TOOLS, *(extra_tools or [])]
    async with Kernel(tools=tools) as k, serving(k) as fast, serving(k, fast_path=False) as slow:
        assert fast.fast is not None and slow.fast is None
        yield fast, slow


@asynccontextmanager
async def asgi_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client calling ``app`` in this process, with the app's lifespan running."""
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c,
    ):
        yield c


def envelope(
    name: str,
    arguments: Any = None,
    *,
    rid: Any = 1,
    meta: dict[str, Any] | None = None,
    caps: dict[str, Any] | None = None,
    method: str = "tools/call",
    omit_arguments: bool = False,
) -> dict[str, Any]:
    m = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps or {},
        **(meta or {}),
    }
    params: dict[str, Any] = {"name": name, "_meta": m}
    if not omit_arguments:
        params["arguments"] = arguments if arguments is not None else {}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def headers_for(body: dict[str, Any], **extra: str) -> dict[str, str]:
    h = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": VERSION,
        "mcp-method": str(body.get("method")),
    }
    name = (body.get("params") or {}).get("name")
    if isinstance(name, str):
        h["mcp-name"] = name
    h.update(extra)
    return h


def _scrub(obj: Any) -> Any:
    """Drop what legitimately differs between two runs (durations)."""
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k != "duration_ms"}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


async def post(
    url: str,
    body: Any,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    *,
    raw: bytes | None = None,
) -> tuple[int, str, Any]:
    """(status, content-type, decoded answer: JSON, or the list of SSE data messages)."""
    hdrs = headers if headers is not None else headers_for(body)
    content = raw if raw is not None else json.dumps(body).encode()
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.post(url, content=content, headers=hdrs)
    ctype = r.headers.get("content-type", "").split(";")[0]
    if ctype == "text/event-stream":
        events = [
            json.loads(line[5:].strip()) for line in r.text.splitlines() if line.startswith("data:")
        ]
        return r.status_code, ctype, _scrub(events)
    if ctype == "application/json":
        return r.status_code, ctype, _scrub(r.json())
    return r.status_code, ctype, r.text


LEAN_CASES = {
    "structured": envelope("profile", {"name": "ada", "age": 36}),
    "text": envelope("greet", {"name": "bob"}, rid="req-7"),
    "tool_error": envelope("over_quota"),
    "unknown_tool": envelope("nope", {"x": 1}),
    "invalid_args": envelope("profile", {"name": 5, "extra": True}),
    "call_id": envelope("greet", {"name": "c"}, meta={CALL_ID_META_KEY: "call-42"}),
    "bad_call_id": envelope("greet", {"name": "c"}, meta={CALL_ID_META_KEY: True}),
    "progress_streams": envelope("steps", {"n": 2}, meta={"progressToken": "tok"}),
    "progress_without_token": envelope("steps", {"n": 2}),
    "no_arguments_key": envelope("over_quota", omit_arguments=True),
    "non_json_types": envelope("stamped"),
    "image_content": envelope("picture"),
    "not_quite_image_content": envelope("picture", {"broken": True}),
    "finite_number": envelope("scale", {"x": 1.5}),
    "non_finite_number": envelope("scale", {"x": 1e308}),
    "lone_surrogate_result": envelope("mangled"),
}


@pytest.mark.parametrize("case", sorted(LEAN_CASES))
async def test_the_lean_path_answers_exactly_what_fastmcp_answers(case: str) -> None:
    body = LEAN_CASES[case]
    async with both() as (fast, slow):
        expected = await post(slow.url, body)
        got = await post(fast.url, body)
        assert fast.fast is not None
        assert fast.fast.taken == 1 and fast.fast.passed == 0, "the lean path did not answer"
    assert got == expected
    status, ctype, answer = got
    assert status == 200
    if case == "progress_streams":
        assert ctype == "text/event-stream"
        assert [e.get("method") for e in answer] == [
            "notifications/progress",
            "notifications/progress",
            None,
        ]
        assert answer[0]["params"] == {
            "progressToken": "tok",
            "progress": 1,
            "total": 2,
            "message": "step 1",
        }
    else:
        assert ctype == "application/json"
    result = answer[-1]["result"] if isinstance(answer, list) else answer["result"]
    if case == "call_id":
        assert result["_meta"][RESULT_META_KEY]["call_id"] == "call-42"
    if case == "image_content":
        assert result["content"] == [{"type": "image", "data": PIXEL, "mimeType": "image/png"}]
    if case == "not_quite_image_content":
        assert [b["type"] for b in result["content"]] == ["text"]
    if case in ("tool_error", "unknown_tool", "invalid_args", "bad_call_id", "non_finite_number"):
        assert result["isError"] is True and "structuredContent" not in result
    if case == "lone_surrogate_result":
        assert result["structuredContent"] == {"text": "caf\ufffd"}
    if case == "finite_number":
        assert result["structuredContent"] == {"result": 15.0}
    if case == "non_finite_number":  # the kernel's "Infinity" does not match {"type": "number"}
        error = result["_meta"]["io.toolwire/error"]
        assert error["kind"] == "tool_error"
        assert "does not match its output schema" in error["message"]
        assert "'Infinity' is not of type 'number' (at result)" in error["message"]
        assert "JSON has no such number" in error["message"]
        assert error["details"]["result"] == {"result": "Infinity"}  # kept, not dropped


async def test_a_lone_surrogate_in_a_result_becomes_a_replacement_character() -> None:
    # json.loads reads "\ud800" into a Python string; UTF-8 cannot carry it, so the
    # answer failed to encode and the client got a masked "Error calling tool".
    # pydantic's parser refuses such a body, so FastMCP reads it on both servers.
    structured = envelope("profile", {"name": "a\ud800b"})
    text = envelope("greet", {"name": "a\ud800b"})
    async with both() as (fast, slow):
        for body in (structured, text):
            expected = await post(slow.url, body)
            assert await post(fast.url, body) == expected
            status, _, answer = expected
            result = answer["result"]
            assert status == 200 and result["isError"] is False, answer
            assert "a\ufffdb" in result["content"][0]["text"]
        assert result["structuredContent"] == {"result": "hello a\ufffdb"}


_CALL = envelope("greet", {"name": "x"})


def _twice(headers: dict[str, str], name: str, first: str) -> list[tuple[str, str]]:
    """``headers`` with ``name`` sent twice, ``first`` first."""
    return [(name, first), *headers.items()]


def _raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _with_meta(**meta: Any) -> dict[str, Any]:
    body = envelope("greet", {"name": "x"})
    body["params"]["_meta"].update(meta)
    return body


PASSED_CASES: dict[str, tuple[bytes, dict[str, str] | list[tuple[str, str]]]] = {
    "other_method": (
        json.dumps(envelope("", method="tools/list")).encode(),
        headers_for(envelope("", method="tools/list")) | {"mcp-name": ""},
    ),
    "name_header_mismatch": (json.dumps(_CALL).encode(), headers_for(_CALL, **{"mcp-name": "y"})),
    "version_header_mismatch": (
        json.dumps(envelope("greet", {"name": "x"}, meta={})).encode(),
        headers_for(_CALL, **{"mcp-protocol-version": "2099-01-01"}),
    ),
    "malformed_json": (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/ca', headers_for(_CALL)),
    "batch": (json.dumps([_CALL]).encode(), headers_for(_CALL)),
    "bool_id": (
        json.dumps(envelope("greet", {"name": "x"}, rid=True)).encode(),
        headers_for(_CALL),
    ),
    "arguments_not_object": (
        json.dumps(envelope("greet", ["x"])).encode(),
        headers_for(_CALL),
    ),
    "elicitation_capable_client": (
        json.dumps(envelope("greet", {"name": "x"}, caps={"elicitation": {}})).encode(),
        headers_for(_CALL),
    ),
    "mcp_param_header": (json.dumps(_CALL).encode(), headers_for(_CALL, **{"mcp-param-name": "x"})),
    "no_sse_accept": (json.dumps(_CALL).encode(), headers_for(_CALL, accept="application/json")),
    "wrong_content_type": (
        json.dumps(_CALL).encode(),
        headers_for(_CALL, **{"content-type": "text/plain"}),
    ),
    "client_info_not_an_object": (
        _raw(_with_meta(**{"io.modelcontextprotocol/clientInfo": 5})),
        headers_for(_CALL),
    ),
    "bad_capabilities": (
        _raw(_with_meta(**{"io.modelcontextprotocol/clientCapabilities": {"sampling": 5}})),
        headers_for(_CALL),
    ),
    "bad_log_level": (
        _raw(_with_meta(**{"io.modelcontextprotocol/logLevel": "bogus"})),
        headers_for(_CALL),
    ),
    "content_type_twice": (
        _raw(_CALL),
        _twice(headers_for(_CALL), "content-type", "text/plain"),
    ),
    "accept_twice": (
        _raw(_CALL),
        _twice(headers_for(_CALL), "accept", "text/html"),
    ),
    "extra_param": (
        json.dumps(_CALL | {"params": {**_CALL["params"], "task": {"ttl": 1}}}).encode(),
        headers_for(_CALL),
    ),
}


@pytest.mark.parametrize("case", sorted(PASSED_CASES))
async def test_everything_else_goes_to_fastmcp_unchanged(case: str) -> None:
    raw, hdrs = PASSED_CASES[case]
    async with both() as (fast, slow):
        expected = await post(slow.url, None, hdrs, raw=raw)
        got = await post(fast.url, None, hdrs, raw=raw)
        assert fast.fast is not None
        assert fast.fast.taken == 0 and fast.fast.passed == 1, "the lean path took it"
    assert got == expected


async def test_a_real_fastmcp_client_is_served_by_the_lean_path() -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with both() as (fast, _slow), Client(fast.url) as c:
        r = await c.call_tool_mcp("steps", {"n": 3}, progress_handler=on_progress)
        assert r.structured_content == {"done": 3}
        bad = await c.call_tool_mcp("over_quota", {})
        assert bad.is_error
        assert fast.fast is not None and fast.fast.taken == 2
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_the_bearer_token_is_checked_before_the_lean_path() -> None:
    body = envelope("greet", {"name": "x"})
    async with Kernel(tools=TOOLS) as k, serving(k, token="s3cret") as served:
        assert served.fast is not None
        status, _, _ = await post(served.url, body)
        assert status == 401
        wrong = headers_for(body, authorization="Bearer nope")
        assert (await post(served.url, body, wrong))[0] == 401
        assert served.fast.taken == 0
        good = headers_for(body, authorization="Bearer s3cret")
        status, _, answer = await post(served.url, body, good)
        assert status == 200 and answer["result"]["structuredContent"] == {"result": "hello x"}
        assert served.fast.taken == 1


async def test_a_draining_server_refuses_new_calls_on_the_lean_path() -> None:
    gate = ServeGate()
    async with Kernel(tools=TOOLS) as k, serving(k, gate=gate) as served:
        gate.draining = True
        body = envelope("greet", {"name": "x"}, meta={CALL_ID_META_KEY: "c-9"})
        _, _, answer = await post(served.url, body)
        assert served.fast is not None and served.fast.taken == 1
    result = answer["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("unavailable: toolwire is shutting down")
    # named like every other result (before: call_id and tool were null)
    stamp = result["_meta"][RESULT_META_KEY]
    assert (stamp["call_id"], stamp["tool"]) == ("c-9", "greet")


async def test_a_client_that_goes_away_cancels_its_call() -> None:
    global CANCEL_SEEN
    CANCELLED.clear()
    CANCEL_SEEN = anyio.Event()
    body = envelope("slow", {"seconds": 30, "label": "gone"})
    payload = json.dumps(body).encode()
    async with Kernel(tools=TOOLS) as k, serving(k) as served:
        port = int(served.url.split(":")[2].split("/")[0])
        head = "".join(f"{k}: {v}\r\n" for k, v in headers_for(body).items())
        request = (
            f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request)
            await anyio.sleep(fastpath._WATCH_AFTER_S + 0.4)  # the call is running
        with anyio.fail_after(10):
            await CANCEL_SEEN.wait()
        assert served.fast is not None and served.fast.taken == 1
    assert CANCELLED == ["gone"]


async def test_a_silent_call_commits_to_sse_and_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "_PING_INTERVAL_S", 0.8)
    body = envelope("slow", {"seconds": 1.6})
    async with (
        Kernel(tools=TOOLS) as k,
        serving(k) as served,
        httpx.AsyncClient(timeout=30) as c,
    ):
        r = await c.post(served.url, json=body, headers=headers_for(body))
    assert r.headers["content-type"] == "text/event-stream"
    assert ": ping" in r.text
    data = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    assert data[-1]["result"]["structuredContent"] == {"result": "slept"}


async def test_a_json_only_endpoint_is_left_to_fastmcp() -> None:
    body = envelope("steps", {"n": 1}, meta={"progressToken": "t"})
    async with both() as (fast, _slow):
        assert fast.fast is not None
        # what FASTMCP_JSON_RESPONSE=true sets up: progress is not streamed
        fast.fast.inner.session_manager.json_response = True  # type: ignore[attr-defined]
        status, ctype, _ = await post(fast.url, body)
        assert fast.fast.taken == 0 and fast.fast.passed == 1
    assert (status, ctype) == (200, "application/json")


async def test_a_session_header_reaches_the_kernel_on_both_paths() -> None:
    seen: list[str | None] = []

    class Spy:
        name = "spy"

        @hookimpl
        def before_call(self, call: ToolCall) -> None:
            seen.append(call.session_id)

    body = envelope("greet", {"name": "x"})
    headers = headers_for(body, **{"mcp-session-id": "sess-1"})
    async with (
        Kernel(tools=TOOLS, plugins=[Spy()]) as k,
        serving(k) as fast,
        serving(k, fast_path=False) as slow,
    ):
        assert await post(fast.url, body, headers) == await post(slow.url, body, headers)
        assert fast.fast is not None and fast.fast.taken == 1
    assert seen == ["sess-1", "sess-1"]


async def test_a_kernel_that_raises_is_answered_as_fastmcp_answers_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def boom(self: Kernel, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals")

    body = envelope("greet", {"name": "x"})
    async with both() as (fast, slow):
        monkeypatch.setattr(Kernel, "call", boom)
        expected = await post(slow.url, body)
        got = await post(fast.url, body)
        assert fast.fast is not None and fast.fast.taken == 1
    assert got == expected
    assert got[2]["result"]["isError"] is True
    assert "secret internals" not in json.dumps(got)


async def test_the_host_guard_applies_before_the_lean_path() -> None:
    body = envelope("greet", {"name": "x"})
    hdrs = headers_for(body, host="evil.example")
    async with both() as (fast, slow):
        expected = await post(slow.url, body, hdrs)
        got = await post(fast.url, body, hdrs)
        assert fast.fast is not None and fast.fast.taken == 0
    assert got == expected
    assert got[0] == 421


class Stamp:
    """App middleware that notes each request's path and stamps ``x-stamp: yes`` on answers."""

    seen: list[str] = []

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        Stamp.seen.append(scope["path"])

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], (b"x-stamp", b"yes")]
            await send(message)

        await self.app(scope, receive, stamped)


async def stamped_call(body: dict[str, Any]) -> tuple[httpx.Response, fastpath.FastCallPath]:
    """``body`` POSTed in process to an app with ``Stamp`` added after ``create_http_app``."""
    Stamp.seen.clear()
    async with Kernel(tools=TOOLS) as k:
        app = create_http_app(k, ServeConfig(transport="http", port=0))
        app.add_middleware(Stamp)
        async with asgi_client(app) as c:
            r = await c.post("/mcp", json=body, headers=headers_for(body))
        assert type(app.middleware_stack).__name__ == "_Front"
        fast = app.state.toolwire_fast_path
        assert fast is not None
    return r, fast


async def test_middleware_added_after_create_http_app_sees_lean_calls() -> None:
    """The lean path skips only Starlette's own wrappers: an app's middleware still runs."""
    r, fast = await stamped_call(envelope("greet", {"name": "x"}))
    assert fast.taken == 1
    assert r.status_code == 200 and r.headers["x-stamp"] == "yes"
    assert r.json()["result"]["structuredContent"] == {"result": "hello x"}
    assert Stamp.seen == ["/mcp"]


async def test_a_call_the_lean_path_declines_meets_the_apps_middleware_once() -> None:
    """A tools/call that looks lean by its headers but not by its body (an elicitation-capable
    client) goes on to FastMCP below the middleware it already passed."""
    r, fast = await stamped_call(envelope("greet", {"name": "x"}, caps={"elicitation": {}}))
    assert fast.taken == 0 and fast.passed == 1
    assert Stamp.seen == ["/mcp"]
    assert r.headers.get_list("x-stamp") == ["yes"]
    assert r.status_code == 200 and "hello x" in r.text


async def test_a_mounted_gateway_still_answers_calls_on_the_lean_path() -> None:
    """Under a path prefix (root_path set) Starlette routes the request; the route takes it."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    body = envelope("greet", {"name": "x"})
    async with Kernel(tools=TOOLS) as k:
        app = create_http_app(k, ServeConfig(transport="http", port=0))
        outer = Starlette(
            routes=[Mount("/gw", app)], lifespan=lambda _: app.router.lifespan_context(app)
        )
        async with asgi_client(outer) as c:
            r = await c.post("/gw/mcp", json=body, headers=headers_for(body))
            listed = await c.post(
                "/gw/mcp",
                json=envelope("", method="tools/list"),
                headers=headers_for(envelope("", method="tools/list")) | {"mcp-name": ""},
            )
        fast = app.state.toolwire_fast_path
        assert fast is not None and fast.taken == 1 and fast.passed == 1
    assert r.json()["result"]["structuredContent"] == {"result": "hello x"}
    assert listed.status_code == 200 and "greet" in listed.text


async def test_starlettes_body_limit_applies_to_the_lean_path() -> None:
    body = envelope("greet", {"name": "x" * 200})
    async with Kernel(tools=TOOLS) as k:
        app = create_http_app(k, ServeConfig(transport="http", port=0))
        app.max_body_size = 100
        async with asgi_client(app) as c:
            r = await c.post("/mcp", json=body, headers=headers_for(body))
        fast = app.state.toolwire_fast_path
        assert fast is not None and fast.taken == 0
    assert r.status_code == 413
