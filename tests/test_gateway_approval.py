"""The gateway and the approval plugin together: what an MCP client learns of a decision."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client

from toolwire import Kernel, tool
from toolwire_approval import ApprovalConfig, ApprovalPlugin, ApprovalRequest, Approve
from toolwire_mcp import RESULT_META_KEY, create_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # FastMCP's client and server are asyncio-only


@tool
def send_note(text: str) -> dict[str, str]:
    """Send a note (a side effect)."""
    return {"sent": text}


@tool(read_only=True)
def read_notes() -> dict[str, int]:
    """Count the notes (no approval needed)."""
    return {"notes": 0}


async def test_a_client_learns_that_its_call_ran_with_edited_arguments() -> None:
    """Before: ``_meta["io.toolwire/result"]`` said nothing of the approval, so an agent
    whose call an approver edited got the result of arguments it never sent, unawares."""

    def fix_typo(req: ApprovalRequest) -> Approve:
        return Approve(by="alice", args={"text": req.args["text"].replace("helo", "hello")})

    approval = ApprovalPlugin(ApprovalConfig(tools={"send_note": "REQUIRED"}), callback=fix_typo)
    kernel = Kernel(tools=[send_note, read_notes], plugins=[approval])
    async with kernel, Client(create_server(kernel)) as client:
        edited = await client.call_tool_mcp("send_note", {"text": "helo"})
        plain = await client.call_tool_mcp("read_notes", {})
    assert edited.structured_content == {"sent": "hello"}
    assert edited.meta is not None
    decided: dict[str, Any] = edited.meta[RESULT_META_KEY]["approval"]
    assert decided["status"] == "approved" and decided["how"] == "approved_with_edits"
    assert decided["edited"] is True and decided["by"] == "alice"
    assert decided["rule"] == "tools.send_note"
    # a call nobody was asked about carries no approval record
    assert plain.meta is not None and "approval" not in plain.meta[RESULT_META_KEY]
