"""What a framework embedding the kernel meets when it serves a model's tool calls."""

from __future__ import annotations

import json
from typing import Any

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
