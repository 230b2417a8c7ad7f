"""HTTP clients with tokens of their own (``[server.clients.<name>]``): each client's calls
run as its tenant, so one client's call ids never reach another's idempotency records.

Before, every MCP client of a gateway was tenant None: two agents sending the same call id
with the same arguments (``call-1``, say) got each other's stored results, and an agent
could read another's by guessing its call ids."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client
from starlette.routing import Route
from toolwire_mcp_testkit import serving_http

from toolwire import CallContext, ConfigError, Kernel, Tool
from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin
from toolwire_mcp import (
    CALL_ID_META_KEY,
    RESULT_META_KEY,
    BearerAuth,
    ServeConfig,
    resolve_auth,
    resolve_auth_token,
)
from toolwire_mcp._config import auth_switched_off
from toolwire_mcp._serve import (
    SHARED_CLIENT_ID,
    BearerTokenVerifier,
    plugin_http_routes,
)
from toolwire_mcp.cli import serve_config

pytestmark = pytest.mark.anyio

CLIENTS = {
    "alice": {"token": "alice-token-1"},
    "bob": {"token": "bob-token-2", "tenant": "team-b"},
}


def whoami_tool(runs: list[str | None]) -> Tool:
    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        runs.append(ctx.call.tenant)
        return {"tenant": ctx.call.tenant, "run": len(runs)}

    return Tool(
        name="whoami",
        description="the tenant the call ran as",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        executor=executor,
    )


@asynccontextmanager
async def serving(kernel: Kernel, **cfg: Any) -> AsyncIterator[str]:
    async with serving_http(kernel, **cfg) as served:
        yield served.url


async def call(url: str, token: str, call_id: str) -> dict[str, Any]:
    async with Client(url, auth=token, timeout=20) as c:
        r = await c.call_tool_mcp("whoami", {}, meta={CALL_ID_META_KEY: call_id})
    assert not r.is_error, r
    assert r.structured_content is not None and r.meta is not None
    return {**r.structured_content, "replayed": r.meta[RESULT_META_KEY]["replayed"]}


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean-path", "fastmcp-path"])
async def test_each_client_calls_as_its_tenant_and_replays_only_its_own_calls(
    fast_path: bool,
) -> None:
    runs: list[str | None] = []
    plugin = IdempotencyPlugin(IdempotencyConfig(), env={})
    async with (
        Kernel(tools=[whoami_tool(runs)], plugins=[plugin]) as kernel,
        serving(kernel, fast_path=fast_path, auth_token="shared-token-0", clients=CLIENTS) as url,
    ):
        alice = await call(url, "alice-token-1", "call-1")
        bob = await call(url, "bob-token-2", "call-1")  # the same call id, another client
        shared = await call(url, "shared-token-0", "call-1")
        alice_again = await call(url, "alice-token-1", "call-1")
        bob_again = await call(url, "bob-token-2", "call-1")
    assert (alice["tenant"], bob["tenant"], shared["tenant"]) == ("alice", "team-b", None)
    assert runs == ["alice", "team-b", None]  # each ran once, under its own tenant
    assert not (alice["replayed"] or bob["replayed"] or shared["replayed"])
    assert alice_again == {**alice, "replayed": True}
    assert bob_again == {**bob, "replayed": True}


async def test_tokens_of_no_client_get_401_and_clients_alone_turn_auth_on() -> None:
    runs: list[str | None] = []
    async with Kernel(tools=[whoami_tool(runs)]) as kernel, serving(kernel, clients=CLIENTS) as url:
        async with httpx.AsyncClient(timeout=10) as http:
            for headers in ({}, {"authorization": "Bearer shared-token-0"}):
                r = await http.post(url, json={}, headers=headers)
                assert r.status_code == 401
                assert r.headers["www-authenticate"].lower().startswith("bearer")
        assert (await call(url, "bob-token-2", "c"))["tenant"] == "team-b"
    assert runs == ["team-b"]


async def test_a_session_opened_with_one_token_is_refused_to_every_other() -> None:
    """The MCP SDK lets into a handshake-era session only requests whose token has the
    client id of the one that opened it. Before, the shared token's client id was
    ``toolwire-bearer``, a valid client name: a client so named was let into the shared
    token's sessions (and its holders into the client's)."""
    headers = {"accept": "application/json, text/event-stream"}
    version = {"mcp-protocol-version": "2025-11-25"}
    clients = {"toolwire-bearer": {"token": "named-like-it"}, "carol": {"token": "carol-token"}}
    runs: list[str | None] = []
    async with (
        Kernel(tools=[whoami_tool(runs)]) as kernel,
        serving(kernel, fast_path=False, auth_token="shared-token-0", clients=clients) as url,
        httpx.AsyncClient(timeout=10, headers=headers) as http,
    ):

        async def post(token: str, body: dict[str, Any], sid: str | None = None) -> httpx.Response:
            more = {"mcp-session-id": sid, **version} if sid else {}
            auth = {"authorization": f"Bearer {token}"}
            return await http.post(url, json=body, headers={**auth, **more})

        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        r = await post(
            "shared-token-0", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
        )
        sid = r.headers["mcp-session-id"]
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await post("shared-token-0", done, sid)).status_code == 202
        whoami = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "whoami"}}
        for token in ("carol-token", "named-like-it"):
            assert (await post(token, whoami, sid)).status_code == 404, token
        assert (await post("shared-token-0", whoami, sid)).status_code == 200
    assert runs == [None]
    with pytest.raises(ValueError, match="the shared token's client id"):
        BearerTokenVerifier(clients={SHARED_CLIENT_ID: ("some-token", "t")})


def resolved(env: dict[str, str] | None = None, **cfg: Any) -> BearerAuth | None:
    return resolve_auth(ServeConfig(transport="http", **cfg), env or {})


def test_resolution_gives_each_client_its_tenant() -> None:
    auth = resolved(clients=CLIENTS)
    assert auth is not None and auth.token is None
    assert dict(auth.clients) == {
        "alice": ("alice-token-1", "alice"),
        "bob": ("bob-token-2", "team-b"),
    }
    assert sorted(auth.tokens()) == ["alice-token-1", "bob-token-2"]
    # shown (a log line, a traceback), it names the clients and tenants, never a token
    shown = f"{auth} {auth!r} {[auth]}"
    assert "alice-token-1" not in shown and "bob-token-2" not in shown
    assert repr(auth) == (
        "BearerAuth(token=None, clients={'alice': ('***', 'alice'), 'bob': ('***', 'team-b')})"
    )
    shared = resolved({"TOOLS_AUTH_TOKEN": "env-token-9"}, clients=CLIENTS)
    assert shared is not None and shared.token == "env-token-9"
    # switched off: no client is asked for a token, and a warning says so
    assert resolved({"TOOLS_AUTH_ENABLED": "false"}, clients=CLIENTS) is None
    warning = auth_switched_off(ServeConfig(clients=CLIENTS), {"TOOLS_AUTH_ENABLED": "false"})
    assert warning is not None and "anyone who can connect" in warning


def test_the_single_token_resolver_refuses_a_config_with_clients() -> None:
    """``resolve_auth_token`` answers one token, or None for "auth is off". Before, with
    only ``[server.clients]`` it answered None: ``create_server(kernel,
    auth_token=resolve_auth_token(cfg))`` then served every caller without a token."""
    for cfg in ({"clients": CLIENTS}, {"auth_token": "shared-token-0", "clients": CLIENTS}):
        with pytest.raises(ValueError, match=r"call resolve_auth\(config\) instead"):
            resolve_auth_token(ServeConfig(transport="http", **cfg), {})
    assert resolve_auth_token(ServeConfig(transport="http", auth_token="shared-token-0"), {}) == (
        "shared-token-0"
    )
    off = {"TOOLS_AUTH_ENABLED": "false"}
    assert resolve_auth_token(ServeConfig(transport="http", clients=CLIENTS), off) is None


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {"clients": {"a": {"token": "same-token"}, "b": {"token": "same-token"}}},
            r"\[server.clients.b\] token is the same token as \[server.clients.a\] token",
        ),
        (
            {"auth_token": "same-token", "clients": {"a": {"token": "same-token"}}},
            r"\[server.clients.a\] token is the same token as \[server.auth_token\]|"
            r"\[server.clients.a\] token is the same token as \[server\] auth_token",
        ),
        ({"clients": {"a": {"token": ""}}}, r"\[server.clients.a\] token\) is empty"),
        ({"clients": {"a": {"token": "tok\n"}}}, r"\[server.clients.a\] token\) starts or ends"),
    ],
)
def test_tokens_that_clash_or_cannot_be_sent_are_startup_errors(
    cfg: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        resolved(**cfg)
    assert "same-token" not in str(info.value)  # never quoted
    with pytest.raises(ConfigError, match=r"server\.clients"):
        serve_config({"transport": "http", **cfg}, "toolwire.toml", _no_flags())


@pytest.mark.parametrize(
    "clients",
    [
        {"": {"token": "t0123456"}},
        {"a b": {"token": "t0123456"}},
        {"a": {"token": "t0123456", "tenant": ""}},
        {"a": {"token": "t0123456", "extra": 1}},
        {"a": {}},
    ],
)
def test_malformed_client_entries_are_config_errors(clients: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"server\.clients"):
        serve_config({"transport": "http", "clients": clients}, "toolwire.toml", _no_flags())


def test_a_plugin_route_a_client_token_would_open_is_refused() -> None:
    """Every route checking its own token (the approval API) must refuse the clients'
    tokens too: a client could otherwise approve its own calls."""

    async def handler(request: Any) -> Any:
        raise AssertionError("not called")

    route = Route("/approvals", handler)
    route.toolwire_auth = lambda token: token == "bob-token-2"  # type: ignore[attr-defined]

    class Approvals:
        name = "approvals"

        def http_routes(self) -> list[Any]:
            return [route]

    kernel = Kernel(plugins=[Approvals()])
    auth = resolved(auth_token="shared-token-0", clients=CLIENTS)
    with pytest.raises(ConfigError, match="a bearer token of the server"):
        plugin_http_routes(kernel, auth_token=auth)
    assert plugin_http_routes(kernel, auth_token="shared-token-0") == [route]


def test_a_client_token_in_plain_text_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from toolwire import load_config
    from toolwire._config import warn_plain_secrets

    path = tmp_path / "toolwire.toml"
    path.write_text(
        '[server]\ntransport = "http"\n'
        '[server.clients.alice]\ntoken = "plain-token-1"\n'
        '[server.clients.bob]\ntoken = {"$secretRef" = "BOB"}\n'
    )
    cfg = load_config(path, env={"BOB": "bob-token-2"})
    serve = serve_config(cfg.server, cfg.path, _no_flags())
    with caplog.at_level(logging.WARNING):
        warn_plain_secrets(serve, "server", cfg)
    text = caplog.text
    assert "server.clients.alice.token holds a credential in plain text" in text
    assert "bob" not in text and "plain-token-1" not in text


def _no_flags() -> Any:
    import argparse

    return argparse.Namespace()


async def test_toolwire_serve_runs_each_client_as_its_tenant(
    tmp_path: Path, serve_process: Any
) -> None:
    """End to end: `toolwire serve` with the idempotency plugin on its embedded SQLite
    state, clients' tokens from the environment."""
    from toolwire_mcp_testkit import clean_env, write_config

    (tmp_path / "whoami_tools.py").write_text(
        "from toolwire import CallContext, tool\n\n"
        "@tool\n"
        "async def whoami(ctx: CallContext) -> dict:\n"
        '    """The tenant the call ran as."""\n'
        "    with open('runs.txt', 'a') as f:\n"
        "        f.write(f'{ctx.call.tenant}\\n')\n"
        "    return {'tenant': ctx.call.tenant}\n"
    )
    write_config(
        tmp_path / "toolwire.toml",
        {"enabled_plugins": ["idempotency"]},
        {
            "tools": {"modules": ["whoami_tools"]},
            "server": {"transport": "http", "port": 0},
            "server.clients.alice": {"token": {"$secretRef": "ALICE_TOKEN"}},
            "server.clients.bob": {"token": {"$secretRef": "BOB_TOKEN"}, "tenant": "team-b"},
        },
    )
    env = clean_env(ALICE_TOKEN="alice-token-1", BOB_TOKEN="bob-token-2", PYTHONPATH=str(tmp_path))
    p = serve_process("serve", env=env).wait_ready()
    assert p.url is not None
    answers = [
        await call(p.url, token, "call-1")
        for token in ("alice-token-1", "bob-token-2", "alice-token-1")
    ]
    assert [(a["tenant"], a["replayed"]) for a in answers] == [
        ("alice", False),
        ("team-b", False),
        ("alice", True),
    ]
    assert (tmp_path / "runs.txt").read_text().split() == ["alice", "team-b"]
    assert "alice-token-1" not in p.stderr and "bob-token-2" not in p.stderr
    assert p.stop() == 0
