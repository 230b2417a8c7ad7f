"""Handshake-era Streamable-HTTP sessions a server forgets, the way servers in the wild
answer it: the spec's HTTP 404, and the HTTP 400 of servers written after the TypeScript
SDK's early examples (tests/ts_client/forgetful_server.mjs, a real TypeScript SDK server).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_direct import gateway
from toolwire_mcp_testkit import TS_CLIENT, HttpUpstream, call_until_back

pytestmark = pytest.mark.anyio


SERVER = TS_CLIENT / "forgetful_server.mjs"


@pytest.fixture
def forgetful(node: str) -> Iterator[HttpUpstream]:
    """The TypeScript SDK server answering an unknown session 400."""
    server = HttpUpstream(command=[node, str(SERVER)]).start()
    yield server
    server.stop()


SAID = {
    400: "HTTP 400 to the call and to a ping on the session; it answered: MCP error -32000: "
    "Bad Request: No valid session ID provided",
    404: "HTTP 404; it answered: MCP error -32001: Session not found",
}


@pytest.mark.parametrize("status", [400, 404])
async def test_a_restarted_typescript_server_gets_a_new_session(node: str, status: int) -> None:
    """Before: a server answering 400 (not the spec's 404) to the session it forgot kept
    the gateway's session ``up``, and every call failed for good (``tool_error``, "Bad
    Request: No valid session ID provided") until the gateway restarted. A 400 to a call
    is now checked with a ``ping`` on the session: refused too, the session is gone."""
    server = HttpUpstream(command=[node, str(SERVER), *(["--spec"] if status == 404 else [])])
    server.start()
    try:
        await _restart_and_reconnect(server, status)
    finally:
        server.stop()


async def _restart_and_reconnect(server: HttpUpstream, status: int) -> None:
    async with gateway({"url": server.url}, protocol="legacy") as (k, up):
        r = await k.call("up_forecast", {"city": "Oslo"})
        assert r.content == {"result": "sunny in Oslo"}, r.error
        server.start()  # the same port again: a new process, no sessions
        r = await k.call("up_forecast", {"city": "Oslo"})
        assert r.error is not None and r.error.kind == "unavailable", r.error
        assert f"no longer knows toolwire's session ({SAID[status]})" in r.error.message
        assert "the call was not run" in r.error.message
        assert r.error.details["in_flight"] is False
        assert r.error.details["session_expired"] is True
        r = await call_until_back(k, "up_forecast", {"city": "Oslo"})
        assert r.content == {"result": "sunny in Oslo"}
        assert up.status == "up"


async def test_a_400_to_a_call_on_a_live_session_is_that_call_s_error(
    forgetful: HttpUpstream,
) -> None:
    """The server refuses one call with 400 but answers a ping on the session: the 400
    is that call's (``tool_error``, its message passed on), and the session goes on."""
    async with gateway({"url": forgetful.url}, protocol="legacy") as (k, up):
        session = up._client
        assert session is not None
        r = await k.call("up_strict", {})
        assert r.error is not None and r.error.kind == "tool_error", r.error
        assert "Bad Request: this server refuses the call" in r.error.message
        assert "session_expired" not in r.error.details
        r = await k.call("up_forecast", {"city": "Oslo"})
        assert r.content == {"result": "sunny in Oslo"}, r.error
        assert up._client is session and up.status == "up"  # the same session throughout
