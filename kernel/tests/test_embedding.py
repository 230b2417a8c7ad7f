"""What a framework embedding the kernel meets when it serves a model's tool calls."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import anyio
import pytest

from toolwire import CallContext, Kernel, Tool, export_tool, tool

pytestmark = pytest.mark.anyio


@tool(name="files.read", read_only=True)
def files_read(path: str) -> str:
    """Read a file (a dotted name, as a remote MCP server's tool has)."""
    return f"contents of {path}"


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
async def test_export_tool_refusing_a_name_says_how_to_export_it(fmt: str) -> None:
    """Before: 'rename the tool', though the kernel exports the same tool under an alias
    that kernel.call accepts; the error now points to it."""
    async with Kernel(tools=[files_read]) as kernel:
        held = kernel.get_tool("files.read")
        assert held is not None
        with pytest.raises(ValueError, match="cannot be exported") as err:
            export_tool(held, fmt)  # type: ignore[arg-type]
        msg = str(err.value)
        assert "name=kernel.export_name('files.read')" in msg
        assert f"kernel.list_tools(format={fmt!r})" in msg
        # the advice works: the alias exports, and the model's call reaches the tool
        alias = kernel.export_name("files.read")
        exported = export_tool(held, fmt, name=alias)  # type: ignore[arg-type]
        assert exported in kernel.list_tools(format=fmt)  # type: ignore[arg-type]
        result = await kernel.call(alias, {"path": "a.txt"}, call_id="call_1")
        assert result.content == {"result": "contents of a.txt"}


def test_export_tool_to_mcp_still_says_rename() -> None:
    async def run(args: dict[str, Any], ctx: CallContext) -> None:
        return None

    with pytest.raises(ValueError, match="rename the tool") as err:
        export_tool(Tool("a b", "d", {"type": "object"}, run), "mcp")
    assert "export_name" not in str(err.value)  # MCP has no alias: the name must change


@pytest.mark.parametrize("raw", ['{"path": "a.txt"}', b'{"path": "a.txt"}'])
async def test_json_arguments_passed_as_args_are_refused_with_what_to_do(
    raw: str | bytes,
) -> None:
    """OpenAI hands a tool call's arguments as a JSON string; passing it on as is used to
    say only 'not str'. The error now says to decode it first."""
    async with Kernel(tools=[files_read]) as kernel:
        with pytest.raises(TypeError, match="args must be a mapping") as err:
            await kernel.call("files.read", raw)  # type: ignore[arg-type]
        assert "json.loads" in str(err.value)
        result = await kernel.call("files.read", json.loads(raw))
        assert result.content == {"result": "contents of a.txt"}


async def test_other_non_mappings_get_no_json_advice() -> None:
    async with Kernel(tools=[files_read]) as kernel:
        with pytest.raises(TypeError, match="not list") as err:
            await kernel.call("files.read", [("path", "a")])  # type: ignore[arg-type]
        assert "json.loads" not in str(err.value)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_cancelled_call_ends_with_call_finished_for_subscribers() -> None:
    """Before: a cancelled call emitted call_started and never call_finished, so a UI
    following calls by their events showed it running for ever."""
    started = anyio.Event()

    @tool
    async def slow() -> dict[str, bool]:
        """Waits far longer than the caller."""
        started.set()
        await anyio.sleep(60)
        return {"done": True}

    seen: list[tuple[str, Any]] = []
    async with Kernel(tools=[slow]) as kernel:
        kernel.events.subscribe(lambda e: seen.append((e.kind, e.data.get("result"))))
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(kernel.call, "slow", call_id="c-1"))
            with anyio.fail_after(10):
                await started.wait()
            tg.cancel_scope.cancel()
        assert [kind for kind, _ in seen] == ["call_started", "call_finished"]
        finished = seen[1][1]
        assert finished["is_error"] is True
        assert finished["error"]["kind"] == "cancelled"
        assert finished["meta"]["call_id"] == "c-1" and finished["meta"]["tool"] == "slow"
        # and a call that finishes still has exactly one call_finished
        seen.clear()
        kernel.add_tool(files_read)
        await kernel.call("files.read", {"path": "a"})
        assert [kind for kind, _ in seen] == ["call_started", "call_finished"]
