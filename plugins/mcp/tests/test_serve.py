"""The kernel served over MCP, checked with a real FastMCP client in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from mcp.client.subscriptions import ToolsListChanged, listen
from pydantic import BaseModel

import toolwire.examples as examples
from toolwire import (
    CallContext,
    CallRejected,
    Kernel,
    ToolCall,
    ToolError,
    ToolResult,
    hookimpl,
    tool,
)
from toolwire_mcp import CALL_ID_META_KEY, ERROR_META_KEY, RESULT_META_KEY, create_server

pytestmark = pytest.mark.anyio


@tool
async def reporter(steps: int, ctx: CallContext) -> dict[str, Any]:
    """Reports progress, then returns what the kernel saw of the call.

    Args:
        steps: How many progress notifications to send.
    """
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
    return {
        "call_id": ctx.call.call_id,
        "session_id": ctx.call.session_id,
        "via": ctx.call.metadata.get("via"),
    }


@tool
def throttled() -> str:
    """Always rate limited."""
    raise ToolError("slow down", kind="rate_limit", retry_after_s=2.5)


@tool(destructive=True, tags=["danger"])
def wipe(confirm: bool) -> str:
    """Pretends to wipe.

    Args:
        confirm: Must be true.
    """
    return "wiped" if confirm else "kept"


class Replay:
    """An idempotency stand-in: the second call with the same call id is replayed."""

    name, order = "replay", 200

    def __init__(self) -> None:
        self.seen: dict[str, ToolResult] = {}

    @hookimpl
    def before_call(self, call: ToolCall) -> ToolResult | None:
        if call.call_id and call.call_id in self.seen:
            first = self.seen[call.call_id]
            return ToolResult(dict(first.content), meta=type(first.meta)(replayed=True))
        return None

    @hookimpl
    def after_call(self, call: ToolCall, result: ToolResult) -> None:
        if call.call_id and not result.is_error:
            self.seen.setdefault(call.call_id, result)


class Deny:
    name, order = "deny", 300

    @hookimpl
    def before_call(self, call: ToolCall) -> None:
        if call.name == "wipe":
            raise CallRejected("denied", "wiping needs approval")


@pytest.fixture
async def kernel() -> AsyncIterator[Kernel]:
    k = Kernel(tools=[examples, reporter, throttled, wipe], plugins=[Replay(), Deny()])
    async with k:
        yield k


@pytest.fixture
async def client(kernel: Kernel) -> AsyncIterator[Client[Any]]:
    async with Client(create_server(kernel)) as c:
        yield c


async def test_catalog_passes_through_with_schemas_and_annotations(
    kernel: Kernel, client: Client[Any]
) -> None:
    tools = {t.name: t for t in await client.list_tools()}
    assert set(tools) == {t.name for t in kernel.list_tools()}
    add = tools["add"]
    assert add.input_schema == kernel.get_tool("add").input_schema  # type: ignore[union-attr]
    assert add.output_schema == {
        "type": "object",
        "properties": {"result": {"type": "number"}},
        "required": ["result"],
    }
    assert add.annotations is not None
    assert add.annotations.read_only_hint is True and add.annotations.idempotent_hint is True
    wipe_ann = tools["wipe"].annotations
    assert wipe_ann is not None and wipe_ann.destructive_hint is True
    assert add.description == "Add two numbers."


async def test_tools_added_later_appear_on_the_next_list(
    kernel: Kernel, client: Client[Any]
) -> None:
    @tool
    def late(x: int) -> int:
        """Added after the client connected."""
        return x * 2

    assert "late" not in {t.name for t in await client.list_tools()}
    kernel.add_tool(late)
    assert "late" in {t.name for t in await client.list_tools()}
    r = await client.call_tool("late", {"x": 21})
    assert r.structured_content == {"result": 42}
    kernel.remove_tool("late")
    assert "late" not in {t.name for t in await client.list_tools()}


async def test_success_is_structured_content_plus_text(client: Client[Any]) -> None:
    r = await client.call_tool_mcp("add", {"a": 2, "b": 3})
    assert not r.is_error
    assert r.structured_content == {"result": 5.0}
    assert [c.text for c in r.content if isinstance(c, mcp_types.TextContent)] == ['{"result":5.0}']
    stats = await client.call_tool_mcp("text_stats", {"text": "a b\nc"})
    assert stats.structured_content == {"characters": 5, "words": 3, "lines": 2}
    now = await client.call_tool_mcp("now", {})
    text = now.content[0]
    assert isinstance(text, mcp_types.TextContent) and now.structured_content == {
        "result": text.text
    }
    assert r.meta is not None and r.meta[RESULT_META_KEY]["served_by"] == "add"


async def test_error_results_carry_the_kind(client: Client[Any]) -> None:
    r = await client.call_tool_mcp("throttled", {})
    assert r.is_error
    assert r.structured_content is None  # clients would check it against the output schema
    assert isinstance(r.content[0], mcp_types.TextContent)
    assert r.content[0].text == "rate_limit: slow down"
    assert r.meta is not None
    info = r.meta[ERROR_META_KEY]
    assert info["kind"] == "rate_limit" and info["retry_after_s"] == 2.5


async def test_a_result_that_breaks_its_output_schema_is_an_error_the_client_can_read(
    client: Client[Any],
) -> None:
    # 1e308 + 1e308 is infinity: the kernel sends it as "Infinity", which the listed
    # schema ({"result": {"type": "number"}}) rejects; the FastMCP client used to raise
    # ("Invalid structured content") instead of returning the result.
    r = await client.call_tool_mcp("add", {"a": 1e308, "b": 1e308})
    assert r.is_error and r.structured_content is None and r.meta is not None
    info = r.meta[ERROR_META_KEY]
    assert info["kind"] == "tool_error" and info["source"] == "mcp"
    assert "'Infinity' is not of type 'number'" in info["message"]
    assert "details.result" in info["message"] and "output_schema" in info["message"]
    # the tool ran: its result is kept, not dropped
    assert info["details"] == {"reason": "output_schema_mismatch", "result": {"result": "Infinity"}}
    assert r.meta[RESULT_META_KEY]["served_by"] == "add"  # the call's own record stays
    ok = await client.call_tool_mcp("add", {"a": 1e308, "b": 0})
    assert not ok.is_error and ok.structured_content == {"result": 1e308}


async def test_plugins_apply_to_mcp_callers(client: Client[Any]) -> None:
    r = await client.call_tool_mcp("wipe", {"confirm": True})
    assert r.is_error and r.meta is not None
    assert r.meta[ERROR_META_KEY]["kind"] == "denied"
    assert "needs approval" in r.meta[ERROR_META_KEY]["message"]


async def test_wrong_argument_types_are_rejected_by_the_kernel(client: Client[Any]) -> None:
    r = await client.call_tool_mcp("add", {"a": "two", "b": 3})
    assert r.is_error and r.meta is not None
    err = r.meta[ERROR_META_KEY]
    assert err["kind"] == "invalid_args"
    assert [p["field"] for p in err["details"]["problems"]] == ["a"]
    missing = await client.call_tool_mcp("echo", {})
    assert missing.meta is not None
    assert "field 'message': field required" in missing.meta[ERROR_META_KEY]["message"]
    extra = await client.call_tool_mcp("echo", {"message": "x", "bogus": 1})
    assert extra.is_error and "bogus" in extra.meta[ERROR_META_KEY]["message"]  # type: ignore[index]


async def test_unknown_tool_is_an_error_result_with_suggestions(client: Client[Any]) -> None:
    r = await client.call_tool_mcp("ad", {"a": 1})
    assert r.is_error and r.meta is not None
    err = r.meta[ERROR_META_KEY]
    assert err["kind"] == "not_found" and "did you mean 'add'" in err["message"]
    assert "ad" not in {t.name for t in await client.list_tools()}


async def test_call_id_travels_in_meta_and_deduplicates(client: Client[Any]) -> None:
    first = await client.call_tool_mcp(
        "counter_increment", {"by": 5}, meta={CALL_ID_META_KEY: "job-1/step-3"}
    )
    again = await client.call_tool_mcp(
        "counter_increment", {"by": 5}, meta={CALL_ID_META_KEY: "job-1/step-3"}
    )
    other = await client.call_tool_mcp("counter_increment", {"by": 5})
    assert first.structured_content == again.structured_content
    assert again.meta is not None and again.meta[RESULT_META_KEY]["replayed"] is True
    assert first.meta is not None and first.meta[RESULT_META_KEY]["call_id"] == "job-1/step-3"
    assert first.structured_content is not None
    assert other.structured_content == {"result": first.structured_content["result"] + 5}
    seen = await client.call_tool_mcp("reporter", {"steps": 0}, meta={CALL_ID_META_KEY: "c-9"})
    assert seen.structured_content is not None
    assert seen.structured_content["call_id"] == "c-9" and seen.structured_content["via"] == "mcp"
    bad = await client.call_tool_mcp("reporter", {"steps": 0}, meta={CALL_ID_META_KEY: ["x"]})
    assert bad.is_error and bad.meta is not None
    assert CALL_ID_META_KEY in bad.meta[ERROR_META_KEY]["message"]
    assert "got list" in bad.meta[ERROR_META_KEY]["message"]
    assert bad.meta[RESULT_META_KEY]["tool"] == "reporter"  # before: null
    empty = await client.call_tool_mcp("reporter", {"steps": 0}, meta={CALL_ID_META_KEY: ""})
    assert empty.is_error and empty.meta is not None
    message = empty.meta[ERROR_META_KEY]["message"]
    assert "got an empty string" in message and "leave the key out" in message


async def test_tool_progress_becomes_mcp_progress_notifications(client: Client[Any]) -> None:
    got: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        got.append((progress, total, message))

    r = await client.call_tool_mcp("reporter", {"steps": 3}, progress_handler=on_progress)
    assert not r.is_error
    assert got == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_legacy_sessions_pass_a_stable_session_id(kernel: Kernel) -> None:
    async with Client(create_server(kernel), mode="legacy") as c:
        a = await c.call_tool_mcp("reporter", {"steps": 0})
        b = await c.call_tool_mcp("reporter", {"steps": 0})
    assert a.structured_content is not None and b.structured_content is not None
    assert a.structured_content["session_id"]
    assert a.structured_content["session_id"] == b.structured_content["session_id"]


async def test_concurrent_calls_are_independent(client: Client[Any]) -> None:
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        r = await client.call_tool_mcp("add", {"a": i, "b": 1})
        results[i] = r.structured_content

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    assert results == {i: {"result": float(i + 1)} for i in range(20)}


@tool
def late_tool() -> str:
    """Added while clients are connected."""
    return "late"


async def test_2026_clients_hear_tools_list_changed_on_a_listen_stream(kernel: Kernel) -> None:
    server = create_server(kernel)
    async with Client(server) as c:
        assert c.protocol_version == "2026-07-28"
        caps = c.server_capabilities
        assert caps is not None and caps.tools is not None and caps.tools.list_changed
        async with listen(c.session, tools_list_changed=True) as sub:
            kernel.add_tool(late_tool)
            kernel.remove_tool("late_tool")  # a burst: one notification
            with anyio.fail_after(10):
                event = await sub.__anext__()
            assert isinstance(event, ToolsListChanged)
            with anyio.move_on_after(0.3):
                await sub.__anext__()
                pytest.fail("a burst of changes sent a second notification")
        assert "late_tool" not in {t.name for t in await c.list_tools()}


async def test_handshake_sessions_hear_tools_list_changed(kernel: Kernel) -> None:
    heard = anyio.Event()

    class Handler(MessageHandler):
        async def on_tool_list_changed(
            self, message: mcp_types.ToolListChangedNotification
        ) -> None:
            heard.set()

    async with Client(create_server(kernel), mode="legacy", message_handler=Handler()) as c:
        assert c.protocol_version != "2026-07-28"
        await c.list_tools()  # the session is remembered once it listed
        kernel.add_tool(late_tool)
        with anyio.fail_after(10):
            await heard.wait()
        assert "late_tool" in {t.name for t in await c.list_tools()}
        kernel.remove_tool("late_tool")


async def test_notifications_survive_a_kernel_closed_mid_burst() -> None:
    k = Kernel(tools=[examples])
    server = create_server(k)
    await k.start()
    k.add_tool(late_tool)  # a notification is pending...
    await k.close()  # ...and the kernel closes before it goes out
    async with k, Client(server) as c, listen(c.session, tools_list_changed=True) as sub:
        k.remove_tool("late_tool")
        with anyio.fail_after(10):
            assert isinstance(await sub.__anext__(), ToolsListChanged)


class Weather(BaseModel):
    city: str
    temp_c: float


async def test_odd_schemas_are_served_as_object_schemas_and_checked_as_listed() -> None:
    """Before: one tool with an empty input schema made the whole tools/list fail ("Handler
    returned an invalid result"); an array output schema was listed unwrapped, so every
    call failed its check; and a result breaking an object schema crashed the check
    (TypeError: unhashable type: 'dict')."""
    from toolwire import Tool

    @tool
    def weather(city: str) -> Weather:
        """Weather, missing a field."""
        return {"city": city}  # type: ignore[return-value]

    async def run(args: dict[str, Any], ctx: CallContext) -> Any:
        return [1, 2]

    bare = Tool(name="bare", description="No schema at all.", input_schema={}, executor=run)
    listy = Tool(
        name="listy",
        description="Returns a list.",
        input_schema={"type": "object", "properties": {}},
        output_schema={"type": "array", "items": {"type": "integer"}},
        executor=run,
    )
    async with Kernel(tools=[weather, bare, listy]) as k, Client(create_server(k)) as c:
        listed = {t.name: t for t in await c.list_tools()}
        assert listed["bare"].input_schema["type"] == "object"
        assert listed["listy"].output_schema is not None
        assert listed["listy"].output_schema["properties"]["result"]["type"] == "array"
        ok = await c.call_tool_mcp("listy", {})
        assert not ok.is_error and ok.structured_content == {"result": [1, 2]}
        bad = await c.call_tool_mcp("weather", {"city": "Oslo"})
        assert bad.is_error and bad.meta is not None
        message = bad.meta[ERROR_META_KEY]["message"]
        assert "'temp_c' is a required property" in message


@pytest.mark.parametrize(("setting", "expected"), [(600.0, 600.0), (None, 10 * 365 * 24 * 3600.0)])
async def test_session_idle_timeout_none_means_never(
    monkeypatch: pytest.MonkeyPatch, setting: float | None, expected: float
) -> None:
    """Before: None reached FastMCP, which reads it as the SDK's default (30 minutes)."""
    import fastmcp.server.http as fastmcp_http

    from toolwire_mcp import ServeConfig, create_http_app

    seen: list[float | None] = []
    manager = fastmcp_http.FastMCPStreamableHTTPSessionManager
    original = manager.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen.append(self.session_idle_timeout)

    monkeypatch.setattr(manager, "__init__", spy)
    cfg = ServeConfig(transport="http", session_idle_timeout_s=setting)
    app = create_http_app(Kernel(), cfg)
    async with app.router.lifespan_context(app):
        pass
    assert seen == [expected]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_run_server_under_trio_says_it_needs_asyncio() -> None:
    """Before: an ExceptionGroup around 'RuntimeError: no running event loop', after the
    HTTP socket was already bound."""
    from toolwire_mcp import ServeConfig, run_server

    ready: list[dict[str, Any]] = []
    for transport in ("http", "stdio"):
        cfg = ServeConfig(transport=transport, port=0)
        with pytest.raises(RuntimeError, match=r"needs an asyncio event loop.*not trio") as info:
            await run_server(Kernel(tools=[reporter]), cfg, on_ready=ready.append)
        assert "toolwire serve" in str(info.value) and "anyio.run(main)" in str(info.value)
    assert ready == []


async def test_run_server_stopped_by_cancellation_shuts_uvicorn_down() -> None:
    """Before: cancelling ``run_server`` (how an embedder stops a task) skipped uvicorn's
    exit, closing the listening socket under the event loop and leaving the app's
    lifespan running; the next server in that process was given the same file
    descriptor and never answered a request."""
    import asyncio

    import httpx
    from toolwire_mcp_testkit import running_server

    from toolwire_mcp import ServeConfig

    for _ in range(2):
        cfg = ServeConfig(transport="http", port=0)
        async with Kernel(tools=[reporter]) as kernel, running_server(kernel, cfg) as info:
            async with httpx.AsyncClient() as client:
                answer = await client.get(f"http://127.0.0.1:{info['port']}/nowhere")
            assert answer.status_code == 404
        left = [t for t in asyncio.all_tasks() if "uvicorn" in repr(t.get_coro())]
        assert left == []


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean_path", "fastmcp_handler"])
async def test_a_cancelled_run_server_cuts_the_calls_in_flight(fast_path: bool) -> None:
    """Cancelling ``run_server`` cuts a call with a call id on both paths. Before, on
    FastMCP's handler such a call (it runs in a task of its own, so that it outlives its
    client) ran on after ``run_server`` had ended, until the kernel closed."""
    from toolwire_mcp_testkit import running_server

    from toolwire_mcp import ServeConfig

    started, cut = anyio.Event(), anyio.Event()

    @tool(name="nap")
    async def nap() -> dict[str, Any]:
        """Sleep for a minute."""
        started.set()
        try:
            await anyio.sleep(60)
        finally:
            cut.set()
        return {"rested": True}

    async def call(url: str) -> None:
        async with Client(url, timeout=30) as c:
            await c.call_tool_mcp("nap", {}, meta={CALL_ID_META_KEY: "run-1"})

    cfg = ServeConfig(transport="http", port=0, fast_path=fast_path)
    async with Kernel(tools=[nap]) as kernel, anyio.create_task_group() as tg:
        async with running_server(kernel, cfg) as info:
            tg.start_soon(call, info["url"])
            with anyio.fail_after(30):
                await started.wait()
        with anyio.fail_after(10):  # cut with run_server, not at the kernel's close
            await cut.wait()
        tg.cancel_scope.cancel()
