"""Through `toolwire serve`: MCP elicitation end to end, and the HTTP API behind its token."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from approval_testkit import Pending, Recorder, plugin
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from pydantic import SecretStr

from toolwire import Kernel
from toolwire_approval import ApprovalPlugin
from toolwire_mcp import CALL_ID_META_KEY, ERROR_META_KEY, ServeConfig, create_server, run_server

pytestmark = pytest.mark.anyio

ARGS = {"to": "a@x"}


def gateway(**cfg: Any) -> tuple[Kernel, ApprovalPlugin, Recorder]:
    p = plugin(**cfg)
    kernel = Kernel(plugins=[p])
    rec = Recorder()
    rec.add_to(kernel)
    return kernel, p, rec


class User:
    """An MCP client's user answering elicitations from a script of answers."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.questions: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, message: str, response_type: Any, params: Any, context: Any) -> Any:
        self.questions.append((message, params.requested_schema))
        return self.answers.pop(0)


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 (input_required) / push
async def test_the_mcp_clients_user_approves_through_elicitation(mode: str) -> None:
    kernel, p, rec = gateway(tools={"send_email": "REQUIRED"})
    pending = Pending(kernel)
    user = User({"decision": "approve", "reason": "expected mail"})
    async with kernel:
        async with Client(create_server(kernel), elicitation_handler=user, mode=mode) as c:
            r = await c.call_tool("send_email", ARGS)
        audit = await p.audit_log()
    assert r.structured_content == {"sent": "a@x", "count": 1}
    assert rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    [(message, schema)] = user.questions
    assert "Approve the call of tool 'send_email'" in message and '"to": "a@x"' in message
    assert schema["properties"]["decision"]["enum"] == ["approve", "reject"]
    decided = [a for a in audit if a["event"] == "approved"]
    assert len(decided) == 1 and decided[0]["via"] == "mcp_elicitation"
    assert decided[0]["by"].startswith("mcp-client") and decided[0]["comment"] == "expected mail"
    assert len([a for a in audit if a["event"] == "requested"]) == 1  # one request, not two
    # 2026-07-28: the call ends with InputRequiredResult and the retried call resumes the
    # same request; handshake era: the server asks the client within the one call.
    resumed = [e.data["resumed"] for e in pending.events]
    assert resumed == ([False, True] if mode == "auto" else [False])


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_declining_or_rejecting_in_the_client_denies_the_call(mode: str) -> None:
    kernel, _, rec = gateway(default="REQUIRED")
    user = User(ElicitResult(action="decline"), {"decision": "reject", "reason": "spam"})
    async with kernel, Client(create_server(kernel), elicitation_handler=user, mode=mode) as c:
        declined = await c.call_tool_mcp("send_email", ARGS)
        rejected = await c.call_tool_mcp("send_email", {"to": "b@x"})
    assert declined.is_error and rejected.is_error and rec.runs == []
    assert declined.meta is not None and rejected.meta is not None
    assert declined.meta[ERROR_META_KEY]["kind"] == "denied"
    assert "declined by the MCP client's user" in declined.meta[ERROR_META_KEY]["message"]
    assert rejected.meta[ERROR_META_KEY]["details"]["reason"] == "spam"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_elicitation_shows_every_argument_however_long_one_is(mode: str) -> None:
    """Before: the arguments were cut at 2,000 characters of their JSON (keys sorted), so
    a long ``body`` hid the ``to`` after it: the user approved a recipient never shown."""
    kernel, _, rec = gateway(tools={"send_email": "REQUIRED"})
    user = User({"decision": "approve"})
    args = {"to": "attacker@evil.example", "body": "Quarterly report. " * 400}
    async with kernel, Client(create_server(kernel), elicitation_handler=user, mode=mode) as c:
        await c.call_tool("send_email", args)
    [(message, _)] = user.questions
    assert '"to": "attacker@evil.example"' in message
    assert "characters not shown" in message and "toolwire approvals show" in message
    assert len(message) < 4000
    assert rec.runs == [{**args, "count": 1}]  # what runs is what was asked, in full


async def test_the_elicitation_shows_invisible_and_reordering_characters_escaped() -> None:
    kernel, _, _ = gateway(tools={"send_email": "REQUIRED"})
    user = User({"decision": "reject"})
    async with kernel, Client(create_server(kernel), elicitation_handler=user) as c:
        await c.call_tool_mcp("send_email", {"to": "ann@corp.example\u202emoc.live@"})
    [(message, _)] = user.questions
    assert "\u202e" not in message and "ann@corp.example\\u202emoc.live@" in message


class SlowUser(User):
    """A user who answers after a second: past a ``lazy_timeout_s`` of 0.5 s."""

    async def __call__(self, *a: Any) -> Any:
        await anyio.sleep(1.0)
        return await super().__call__(*a)


async def test_a_late_rejection_a_2026_client_brings_back_stops_a_lazy_call() -> None:
    """2026-07-28: the call ends at once with the question; nothing runs while the user
    thinks. Before: a user who took longer than lazy_timeout_s to reject saw the retried
    call, which carried their "reject", run the tool (the LAZY timeout had passed)."""
    kernel, p, rec = gateway(tools={"send_email": "LAZY"}, lazy_timeout_s=0.5)
    user = SlowUser({"decision": "reject", "reason": "not this one"})
    async with kernel:
        async with Client(create_server(kernel), elicitation_handler=user) as c:
            r = await c.call_tool_mcp("send_email", ARGS)
        audit = await p.audit_log()
    assert rec.runs == []
    assert r.is_error and r.meta is not None
    assert r.meta[ERROR_META_KEY]["kind"] == "denied"
    assert r.meta[ERROR_META_KEY]["details"]["reason"] == "not this one"
    assert [a["event"] for a in audit] == ["requested", "rejected"]
    assert audit[-1]["via"] == "mcp_elicitation"


async def test_a_late_answer_a_2026_client_brings_back_decides_a_lazy_call() -> None:
    kernel, p, rec = gateway(tools={"send_email": "LAZY"}, lazy_timeout_s=0.5)
    user = SlowUser(
        {"decision": "approve", "args": json.dumps({"to": "a@x", "count": "many"})},
        {"decision": "approve", "args": json.dumps({"to": "b@x"})},
    )
    async with kernel:
        async with Client(create_server(kernel), elicitation_handler=user) as c:
            r = await c.call_tool("send_email", ARGS)
        audit = await p.audit_log()
    # the refused edit is asked again, not run as first sent: the user is there
    assert "Your edited arguments were refused" in user.questions[1][0]
    assert r.structured_content == {"sent": "b@x", "count": 1}
    assert rec.runs == [{"to": "b@x", "body": "hi", "count": 1}]
    assert [a["event"] for a in audit] == ["requested", "refused", "approved", "executed"]
    assert audit[2]["via"] == "mcp_elicitation"


async def test_edited_args_through_elicitation_are_validated_and_asked_again() -> None:
    kernel, p, rec = gateway(default="REQUIRED")
    user = User(
        {"decision": "approve", "args": json.dumps({"to": "b@x", "count": "lots"})},
        {"decision": "approve", "args": json.dumps({"to": "b@x", "count": 2})},
    )
    async with kernel:
        async with Client(create_server(kernel), elicitation_handler=user) as c:
            r = await c.call_tool("send_email", ARGS)
        audit = await p.audit_log()
    assert r.structured_content == {"sent": "b@x", "count": 2}
    assert rec.runs == [{"to": "b@x", "body": "hi", "count": 2}]
    assert len(user.questions) == 2
    assert "Your edited arguments were refused" in user.questions[1][0]
    assert "'count'" in user.questions[1][0]
    assert [a["event"] for a in audit] == ["requested", "refused", "approved", "executed"]


async def test_a_client_without_elicitation_is_not_asked_and_waits_for_another_channel() -> None:
    kernel, p, rec = gateway(default="REQUIRED")
    pending = Pending(kernel)
    async with kernel, Client(create_server(kernel)) as c, anyio.create_task_group() as tg:
        results: list[Any] = []

        async def call() -> None:
            results.append(await c.call_tool("send_email", ARGS))

        tg.start_soon(call)
        req = await pending.next()
        await p.approve(req["id"], by="ops")
    assert results[0].structured_content == {"sent": "a@x", "count": 1} and len(rec.runs) == 1


# ------------------------------------------------------------------ HTTP API
@asynccontextmanager
async def serving(kernel: Kernel, token: str | None, **extra: Any) -> AsyncIterator[str]:
    """``run_server`` over HTTP on a free port; yields the base URL. ``extra``: more
    ``[server]`` keys."""
    cfg = ServeConfig(
        transport="http", port=0, auth_token=SecretStr(token) if token else None, **extra
    )
    ready: list[dict[str, Any]] = []
    up = anyio.Event()

    def on_ready(info: dict[str, Any]) -> None:
        ready.append(info)
        up.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_server(kernel, cfg, on_ready=on_ready, handle_signals=False))
        with anyio.fail_after(20):
            await up.wait()
        yield f"http://127.0.0.1:{ready[0]['port']}"
        tg.cancel_scope.cancel()


APPROVER = "approver-t0ken"


async def test_the_http_api_lists_shows_and_decides_behind_its_own_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOOLS_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("TOOLS_AUTH_ENABLED", raising=False)
    kernel, _, rec = gateway(default="REQUIRED", http_token=APPROVER)
    pending = Pending(kernel)
    auth = {"authorization": f"Bearer {APPROVER}"}
    async with kernel, serving(kernel, "s3cret") as base, httpx.AsyncClient(base_url=base) as http:
        for headers in (
            {},
            {"authorization": "Bearer wrong"},
            {"authorization": APPROVER},
            {"authorization": "Bearer s3cret"},  # the MCP clients' token opens /mcp only
        ):
            denied = await http.get("/approvals", headers=headers)
            assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
            assert denied.json()["error"]["kind"] == "auth"
            assert (await http.post("/approvals/x/approve", headers=headers)).status_code == 401
        assert (await http.get("/approvals", headers=auth)).json() == {"approvals": []}

        async with (
            Client(f"{base}/mcp", auth="s3cret") as mcp_client,
            anyio.create_task_group() as tg,
        ):
            results: list[Any] = []

            async def call(to: str) -> None:
                results.append(await mcp_client.call_tool_mcp("send_email", {"to": to}))

            tg.start_soon(call, "a@x")
            first = await pending.next()
            listed = (await http.get("/approvals", headers=auth)).json()["approvals"]
            assert [r["id"] for r in listed] == [first["id"]]
            assert listed[0]["tool"] == "send_email" and listed[0]["via"] == "mcp"
            one = await http.get(f"/approvals/{first['id']}", headers=auth)
            assert one.json()["status"] == "pending"
            assert [a["event"] for a in one.json()["audit"]] == ["requested"]
            bad = await http.post(
                f"/approvals/{first['id']}/approve", headers=auth, json={"args": {"to": 5}}
            )
            assert bad.status_code == 422 and bad.json()["error"]["problems"][0]["field"] == "to"
            other = await http.post(
                f"/approvals/{first['id']}/approve",
                headers=auth,
                json={"fingerprint": "0" * 64},
            )
            assert other.status_code == 409
            assert other.json()["error"]["kind"] == "fingerprint_mismatch"
            ok = await http.post(
                f"/approvals/{first['id']}",
                headers=auth,
                json={"decision": "approve", "by": "alice", "fingerprint": first["fingerprint"]},
            )
            assert ok.status_code == 200 and ok.json()["status"] == "approved"
            again = await http.post(f"/approvals/{first['id']}/reject", headers=auth)
            assert again.status_code == 409 and again.json()["error"]["kind"] == "already_decided"

            tg.start_soon(call, "b@x")
            second = await pending.next()
            no = await http.post(
                f"/approvals/{second['id']}/reject", headers=auth, json={"reason": "no thanks"}
            )
            assert no.status_code == 200 and no.json()["decision"]["reason"] == "no thanks"

        assert (await http.get("/approvals/nope", headers=auth)).status_code == 404
        assert (await http.post("/approvals/x", headers=auth, content=b"{")).status_code == 400
        decided = (await http.get("/approvals?status=all", headers=auth)).json()["approvals"]
        assert sorted(r["status"] for r in decided) == ["approved", "rejected"]
        approved = next(r for r in decided if r["status"] == "approved")
        assert approved["decision"]["by"] == "alice" and approved["decision"]["via"] == "http"
        assert approved["decision"]["client"] == "127.0.0.1"

    by_to = {json.loads(r.content[0].text).get("sent"): r for r in results if not r.is_error}
    assert list(by_to) == ["a@x"] and rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    [refused] = [r for r in results if r.is_error]
    assert refused.meta[ERROR_META_KEY]["details"]["reason"] == "no thanks"


# no API token configured / one of the approvers' own
@pytest.mark.parametrize("approver", [None, APPROVER])
async def test_an_mcp_client_cannot_approve_its_own_call_over_http(
    monkeypatch: pytest.MonkeyPatch, approver: str | None
) -> None:
    """Before: the API took the gateway's bearer token, which every MCP client holds: an
    agent whose call waited for a person listed the request and approved it itself."""
    monkeypatch.delenv("TOOLS_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("TOOLS_AUTH_ENABLED", raising=False)
    kernel, p, rec = gateway(default="REQUIRED", http_token=approver)
    pending = Pending(kernel)
    mcp_token = {"authorization": "Bearer s3cret"}
    async with (
        kernel,
        serving(kernel, "s3cret") as base,
        httpx.AsyncClient(base_url=base) as http,
        Client(f"{base}/mcp", auth="s3cret") as agent,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(agent.call_tool_mcp, "send_email", ARGS)
        req = await pending.next()
        listed = await http.get("/approvals", headers=mcp_token)
        approved = await http.post(f"/approvals/{req['id']}/approve", headers=mcp_token)
        assert listed.status_code == approved.status_code == (403 if approver is None else 401)
        assert "http_token" in approved.json()["error"]["message"]
        assert (await p.get(req["id"])).status == "pending"
        await p.reject(req["id"], by="ops")
    assert rec.runs == []


async def test_without_http_token_the_http_api_answers_403_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With or without a gateway token: no one holds the approvers' token."""
    monkeypatch.delenv("TOOLS_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("TOOLS_AUTH_ENABLED", raising=False)
    kernel, _, _ = gateway()
    async with kernel, serving(kernel, None) as base, httpx.AsyncClient(base_url=base) as http:
        for r in (
            await http.get("/approvals"),
            await http.post("/approvals/x/approve", json={"by": "me"}),
        ):
            assert r.status_code == 403, r.text
            error = r.json()["error"]
            assert (
                error["kind"] == "forbidden" and "[plugins.approval] http_token" in error["message"]
            )
            assert "toolwire approvals approve" in error["message"]
        assert (await http.get("/mcp")).status_code != 403  # the MCP endpoint is as it was


def test_a_gateway_whose_token_opens_the_approval_api_does_not_start() -> None:
    from toolwire import ConfigError
    from toolwire_mcp import BearerAuth
    from toolwire_mcp._serve import plugin_http_routes

    kernel = Kernel(plugins=[plugin(http_token="same-t0ken")])
    with pytest.raises(ConfigError, match=r"plugins\.approval: .*MCP clients hold") as err:
        plugin_http_routes(kernel, auth_token="same-t0ken", reserved=["/mcp"])
    assert "same-t0ken" not in str(err.value)
    # nor the token of one client of [server.clients]
    clients = BearerAuth("shared-t0ken", {"bot": ("same-t0ken", "acme")})
    with pytest.raises(ConfigError, match=r"plugins\.approval: .*MCP clients hold") as err:
        plugin_http_routes(kernel, auth_token=clients, reserved=["/mcp"])
    assert "same-t0ken" not in str(err.value)
    # its own token: served without the gateway's check (it checks its own)
    routes = plugin_http_routes(kernel, auth_token="other-t0ken", reserved=["/mcp"])
    assert len(routes) == 4 and all(callable(r.toolwire_auth) for r in routes)  # type: ignore[attr-defined]


async def test_the_http_api_bounds_what_it_reads_of_a_body() -> None:
    """Before: a body was read whole into memory, whatever its size (300 MB took 300 MB), and
    one nested too deeply made a 500 with a traceback in the log."""
    from starlette.applications import Starlette

    _, p, _ = gateway(http_token=APPROVER)
    app = Starlette(routes=p.http_routes())
    transport = httpx.ASGITransport(app=app)
    auth = {"authorization": f"Bearer {APPROVER}"}
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while True:  # no Content-Length: only the count of what was read can stop it
            sent.append(1)
            yield b" " * 65536

    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        big = await http.post("/approvals/x/approve", headers=auth, content=endless())
        assert big.status_code == 413 and big.json()["error"]["kind"] == "too_large"
        assert len(sent) <= 20  # stopped at 1 MiB
        declared = await http.post(
            "/approvals/x/approve",
            headers={**auth, "content-length": str(10**9)},
            content=b"{}",
        )
        assert declared.status_code == 413
        deep = await http.post("/approvals/x/approve", headers=auth, content=b"[" * 100_000)
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]
        # no token: refused before the body is read
        sent.clear()
        anon = await http.post("/approvals/x/approve", content=endless())
        assert anon.status_code == 401 and len(sent) <= 2


async def test_edited_args_json_cannot_carry_get_422_not_a_store_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """json.loads takes `Infinity` and nesting a few hundred deep; before, such edited args
    got 503 "the state store failed" and 500 with a traceback, on a real server."""
    from approval_testkit import running_call

    from toolwire import tool

    monkeypatch.delenv("TOOLS_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("TOOLS_AUTH_ENABLED", raising=False)
    kernel, p, _ = gateway(default="REQUIRED", http_token=APPROVER)

    @tool
    def put(x: float, doc: dict[str, Any] | None = None) -> float:
        """Store x."""
        return x

    kernel.add_tool(put)
    pending = Pending(kernel)
    auth = {"authorization": f"Bearer {APPROVER}"}
    deep = '{"a":' * 300 + "1" + "}" * 300
    async with (
        kernel,
        serving(kernel, "s3cret") as base,
        httpx.AsyncClient(base_url=base, headers=auth) as http,
        running_call(kernel, "put", {"x": 1.0}) as result,
    ):
        rid = (await pending.next())["id"]
        for body in ('{"args": {"x": Infinity}}', '{"args": {"x": 2, "doc": ' + deep + "}}"):
            r = await http.post(f"/approvals/{rid}/approve", content=body)
            assert r.status_code == 422, r.text
            assert r.json()["error"]["kind"] == "invalid_args"
            assert r.json()["error"]["request_id"] == rid
        assert (await p.get(rid)).status == "pending"
        ok = await http.post(f"/approvals/{rid}/approve", json={"args": {"x": 2}})
        assert ok.status_code == 200
    assert result().content == {"result": 2.0}


def test_a_plugin_route_clashing_with_the_mcp_endpoint_is_refused() -> None:
    from toolwire import ConfigError
    from toolwire_mcp._serve import plugin_http_routes

    kernel = Kernel(plugins=[plugin(http_prefix="/mcp/approvals")])
    with pytest.raises(
        ConfigError, match="plugin 'approval' offers the HTTP route '/mcp/approvals'"
    ):
        plugin_http_routes(kernel, reserved=["/mcp"])
    assert len(plugin_http_routes(Kernel(plugins=[plugin()]), reserved=["/mcp"])) == 4


async def test_the_http_api_refuses_unknown_body_keys_instead_of_ignoring_them() -> None:
    # Before: {"arguments": {...}} (for "args") approved the call with its original
    # arguments, the edit silently dropped; a non-string comment was dropped too.
    from approval_testkit import running_call
    from starlette.applications import Starlette

    kernel, p, rec = gateway(default="REQUIRED", http_token=APPROVER)
    pending = Pending(kernel)
    app = Starlette(routes=p.http_routes())
    transport = httpx.ASGITransport(app=app)
    auth = {"authorization": f"Bearer {APPROVER}"}
    async with (
        kernel,
        httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth) as http,
        running_call(kernel, "send_email", ARGS) as result,
    ):
        req = await pending.next()
        url = f"/approvals/{req['id']}"
        for path, body, bad in [
            ("/approve", {"arguments": {"to": "b@x"}}, "'arguments'"),
            ("/reject", {"reson": "typo"}, "'reson'"),
            ("", {"decision": "approve", "args": {"to": "b@x"}, "comments": "x"}, "'comments'"),
            ("/approve", {"comment": 5}, "'comment' must be a string"),
        ]:
            r = await http.post(url + path, json=body)
            assert r.status_code == 400, (body, r.text)
            assert bad in r.json()["error"]["message"]
            assert r.json()["error"]["request_id"] == req["id"]
        # Every 400 names the request, as the README's error shape says (these did not).
        for path, raw, bad in [
            ("/approve", b"not json", "not valid JSON"),
            ("/reject", b"[1]", "must be a JSON object"),
            ("", b'{"decision": "maybe"}', '"decision": "approve" or "reject"'),
        ]:
            r = await http.post(url + path, content=raw)
            assert r.status_code == 400, (raw, r.text)
            error = r.json()["error"]
            assert bad in error["message"] and error["request_id"] == req["id"], error
        assert (await p.get(req["id"])).status == "pending"  # nothing was decided
        ok = await http.post(url, json={"decision": "approve", "args": {"to": "b@x"}})
        assert ok.status_code == 200, ok.text
    assert result().content == {"sent": "b@x", "count": 1}
    assert rec.runs == [{"to": "b@x", "body": "hi", "count": 1}]


# ------------------------------------------- a gateway killed while a call waits
TOOLS = '''
import asyncio, json, os
from toolwire import tool

@tool
async def send(to: str, seconds: float = 0.0) -> dict:
    """Send a message (a side effect: every run is logged)."""
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(json.dumps({"to": to}) + "\\n")
    await asyncio.sleep(seconds)
    return {"sent": to}
'''


def start_serve(tmp_path: Path, log: Any) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWIRE_", "TOOLS_AUTH_"))}
    env.update(PYTHONPATH=str(tmp_path), RUNS_LOG=str(tmp_path / "runs.jsonl"))
    cmd = [sys.executable, "-m", "toolwire.cli", "serve", "--config", "tw.toml"]
    return subprocess.Popen(
        [*cmd, "--transport", "http", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


@asynccontextmanager
async def serve_process(tmp_path: Path) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """`toolwire serve --transport http` in a subprocess; yields (MCP URL, process)."""
    log_path = tmp_path / "serve.log"
    with log_path.open("ab") as log:
        start = log.tell()
        proc = start_serve(tmp_path, log)
    try:
        with anyio.fail_after(30):
            while not (
                m := re.search(rb"http://127\.0\.0\.1:\d+/mcp", log_path.read_bytes()[start:])
            ):
                assert proc.poll() is None, log_path.read_text()
                await anyio.sleep(0.05)
        yield m.group(0).decode(), proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


def cli_approve_the_pending_request(tmp_path: Path) -> None:
    def run(*args: str) -> Any:
        out = subprocess.run(
            [sys.executable, "-m", "toolwire.cli", "approvals", "--config", "tw.toml", *args],
            cwd=tmp_path,
            capture_output=True,
            check=True,
        )
        return json.loads(out.stdout)

    [req] = run("list")
    assert run("approve", req["id"])["status"] == "approved"


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # lean path / FastMCP's handler
async def test_a_call_waiting_for_approval_when_the_gateway_dies_runs_once_on_replay(
    tmp_path: Path, mode: str
) -> None:
    (tmp_path / "gw_tools.py").write_text(TOOLS)
    (tmp_path / "tw.toml").write_text(
        'state = "sqlite:///state.db"\nenabled_plugins = ["idempotency", "approval"]\n'
        '[tools]\nmodules = ["gw_tools"]\n[plugins.idempotency]\nlease_secs = 1.0\n'
        '[plugins.approval]\ntools = { send = "REQUIRED" }\n'
    )
    meta = {CALL_ID_META_KEY: "run-1/step-1"}
    runs = tmp_path / "runs.jsonl"

    async def call(url: str, args: dict[str, Any], approve: bool) -> Any:
        async with Client(url, mode=mode, timeout=30) as c, anyio.create_task_group() as tg:
            out: list[Any] = []

            async def go() -> None:
                out.append(await c.call_tool_mcp("send", args, meta=meta))

            tg.start_soon(go)
            if approve:
                await anyio.sleep(1.0)
                await anyio.to_thread.run_sync(cli_approve_the_pending_request, tmp_path)
        return out[0]

    # 1. The call waits for an approval (well past lease_secs / 4); the gateway is killed.
    async with serve_process(tmp_path) as (url, proc):
        with anyio.move_on_after(2.0), contextlib.suppress(Exception):
            await call(url, {"to": "a"}, approve=False)
        proc.kill()
    await anyio.sleep(1.5)  # the claim's lease lapses
    # 2. Restarted, the replay waits on the same request; approved, the tool runs once.
    async with serve_process(tmp_path) as (url, proc):
        r = await call(url, {"to": "a"}, approve=True)
        assert not r.is_error, r.content
        assert r.structured_content == {"sent": "a"} and runs.read_text().count("\n") == 1
        # 3. Killed while the approved tool runs: now the outcome is unknown (never run twice).
        # Killed while its client still waits: a client that goes away first has the gateway
        # cancel the call, which releases the claim (a replay would then run it again).
        meta[CALL_ID_META_KEY] = "run-1/step-2"

        async def doomed() -> None:
            with contextlib.suppress(Exception):
                await call(url, {"to": "b", "seconds": 30}, approve=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            with anyio.fail_after(20):
                while runs.read_text().count("\n") < 2:  # noqa: ASYNC110 (another process writes it)
                    await anyio.sleep(0.02)
            proc.kill()
            tg.cancel_scope.cancel()
        assert runs.read_text().count("\n") == 2
    await anyio.sleep(1.5)
    async with serve_process(tmp_path) as (url, proc):
        r = await call(url, {"to": "b", "seconds": 30}, approve=False)
    assert r.is_error and r.meta[ERROR_META_KEY]["details"]["reason"] == "outcome_unknown"
    assert runs.read_text().count("\n") == 2


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_approval_from_a_client_with_its_own_token_names_that_client(mode: str) -> None:
    """A client with a `[server.clients]` token is recorded by that name (authenticated),
    not by the name it gives itself in clientInfo, which any client may choose."""
    kernel, p, rec = gateway(tools={"send_email": "REQUIRED"})
    user = User({"decision": "approve", "reason": "ok"})
    clients = {"alice": {"token": "alice-token-1"}}
    async with kernel, serving(kernel, None, clients=clients) as base:
        url = f"{base}/mcp"
        async with Client(
            url, auth="alice-token-1", elicitation_handler=user, mode=mode, timeout=20
        ) as c:
            r = await c.call_tool("send_email", ARGS)
        audit = await p.audit_log()
    assert r.structured_content == {"sent": "a@x", "count": 1} and len(rec.runs) == 1
    [decided] = [a for a in audit if a["event"] == "approved"]
    assert decided["by"] == "client:alice" and decided["via"] == "mcp_elicitation"
    assert decided["tenant"] == "alice"
