"""Calling real a2a-sdk agents in process (httpx.ASGITransport): answers, streaming, errors."""

from __future__ import annotations

import base64
import json
from typing import Any

import anyio
import pytest
from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.tasks import TaskUpdater
from starlette.applications import Starlette
from toolwire_a2a_testkit import (
    BLOB,
    NUMBERS,
    RESEARCH,
    Agent,
    KernelFactory,
    Router,
    fixture,
    make_agent,
    make_card,
)

from toolwire import ErrorKind, Kernel
from toolwire_a2a import A2AConfig, A2APlugin
from toolwire_ratelimit import RateLimitPlugin
from toolwire_retry import RetryConfig, RetryPlugin

pytestmark = pytest.mark.anyio

AGENTS = {"agents": [{"url": RESEARCH, "nickname": "research"}]}


async def test_agent_becomes_two_tools_described_by_its_card(make_kernel: KernelFactory) -> None:
    kernel, _ = await make_kernel(AGENTS)
    tool = kernel.get_tool("agent_research")
    task_tool = kernel.get_tool("agent_research_task")
    assert tool is not None and task_tool is not None
    assert tool.source == task_tool.source == "a2a:research"
    assert "Performs multi-source research" in tool.description
    assert "Deep research" in tool.description
    assert "Summarize recent work on solid-state batteries" in tool.description
    assert {"a2a", "specialist", "research"} <= tool.tags
    props = tool.input_schema["properties"]
    assert props["query"]["type"] == "string"
    assert props["hands_off"] == {**props["hands_off"], "type": "boolean", "default": False}
    assert "context_id" in props and tool.input_schema["required"] == ["query"]
    assert tool.annotations.openWorldHint is True
    # discovery finds the agent by what its card says it can do
    found = kernel.find_tools("summarize solid-state batteries research", limit=3)
    assert found and found[0].name == "agent_research"


async def test_blocking_call_returns_the_artifacts(
    make_kernel: KernelFactory, research: Agent
) -> None:
    kernel, _ = await make_kernel({**AGENTS, "streaming": False})
    res = await kernel.call("agent_research", {"query": "solid-state batteries"})
    assert not res.is_error, res.content
    c = res.content
    assert c["state"] == "completed" and c["done"] is True and c["interrupted"] is False
    assert c["text"] == "Findings on: solid-state batteries"
    assert c["artifacts"] == [{"name": "report", "text": "Findings on: solid-state batteries"}]
    assert c["task_id"] and c["context_id"]
    assert res.meta.extra["a2a"]["task_id"] == c["task_id"]
    assert research.executor.seen[-1]["text"] == "solid-state batteries"


async def test_message_reply_and_context_sent_as_metadata(
    make_kernel: KernelFactory, research: Agent
) -> None:
    config = {
        "agents": [{"url": RESEARCH, "nickname": "research", "context": {"team": "blue"}}],
        "context": {"tenant": "acme", "locale": "en", "team": "red"},
    }
    kernel, _ = await make_kernel(config)
    res = await kernel.call("agent_research", {"query": "msg hello"})
    assert not res.is_error, res.content
    assert res.content["state"] == "completed" and res.content["task_id"] is None
    assert res.content["text"].startswith("echo: msg hello")
    # global context with the agent's own context merged over it
    assert research.executor.seen[-1]["metadata"] == {
        "tenant": "acme",
        "locale": "en",
        "team": "blue",
    }


async def test_streaming_reports_progress_and_merges_artifact_chunks(
    make_kernel: KernelFactory, router: Router
) -> None:
    kernel, _ = await make_kernel(AGENTS)
    notes: list[str | None] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notes.append(message)

    res = await kernel.call("agent_research", {"query": "stream"}, progress=progress)
    assert not res.is_error, res.content
    assert res.content["text"] == "part one;\npart two"
    assert res.content["artifacts"] == [{"name": "report", "text": "part one;\npart two"}]
    assert "research: working: reading sources" in notes
    assert notes[-1] == "research: completed"
    rpc = [h for h in router.hits if h.path == "/a2a/jsonrpc"]
    assert rpc and rpc[-1].headers.get("accept") == "text/event-stream"  # SendStreamingMessage
    assert rpc[-1].headers.get("a2a-version") == "1.0"


async def test_progress_notes_are_one_short_line_whatever_the_agent_sends(
    make_kernel: KernelFactory, research: Agent
) -> None:
    """Before: the agent's status text went whole into every progress note (here 200 000
    characters on several lines, to the caller and, through a gateway, to its MCP client
    on each event)."""
    long = "step one\n" + "x" * 200_000

    async def execute(context: Any, event_queue: Any) -> None:
        assert context.message is not None
        task = new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        up = TaskUpdater(event_queue, task.id, task.context_id)
        await up.start_work(up.new_agent_message([new_text_part(long)]))
        await up.add_artifact([new_text_part("done")], name="r" * 5000)
        await up.complete()

    research.executor.execute = execute  # type: ignore[method-assign]
    kernel, _ = await make_kernel(AGENTS)
    notes: list[str] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    res = await kernel.call("agent_research", {"query": "go"}, progress=progress)
    assert not res.is_error, res.content
    assert res.content["text"] == "done"
    assert any(n.startswith("research: working: step one xxx") for n in notes), notes
    assert all(len(n) <= 300 and "\n" not in n for n in notes), [len(n) for n in notes]


async def test_streaming_off_uses_blocking_send_message(
    make_kernel: KernelFactory, router: Router
) -> None:
    kernel, _ = await make_kernel({**AGENTS, "streaming": False})
    notes: list[str | None] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notes.append(message)

    res = await kernel.call("agent_research", {"query": "stream"}, progress=progress)
    assert res.content["text"] == "part one;\npart two"
    assert notes == []
    rpc = [h for h in router.hits if h.path == "/a2a/jsonrpc"]
    assert rpc[-1].headers.get("accept") != "text/event-stream"


@pytest.mark.parametrize("streaming", [False, True])
async def test_failing_agent_is_a_tool_error_with_the_agents_text(
    make_kernel: KernelFactory, streaming: bool
) -> None:
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    res = await kernel.call("agent_research", {"query": "crash"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.TOOL_ERROR
    assert "agent crashed: the database is on fire" in res.error.message
    assert "agent 'research'" in res.error.message
    assert res.error.details["code"] == -32603
    assert res.error.source == "a2a:research"


async def test_failed_task_state_is_a_tool_error(make_kernel: KernelFactory) -> None:
    kernel, _ = await make_kernel(AGENTS)
    res = await kernel.call("agent_research", {"query": "fail"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.TOOL_ERROR
    assert "failed the task: I cannot do that: no data" in res.error.message
    assert res.error.details["state"] == "failed" and res.error.details["task_id"]


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_failed_task_keeps_its_artifacts_and_gives_the_agents_reason(
    make_kernel: KernelFactory, streaming: bool
) -> None:
    """Before: the artifact's text was passed off as the reason ("failed the task: chapter 1
    written"), and the real reason and the artifact were dropped."""
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    res = await kernel.call("agent_research", {"query": "partial"})
    assert res.is_error and res.error is not None
    assert "failed the task: ran out of budget" in res.error.message, res.error.message
    assert "1 artifact(s)" in res.error.message
    details = res.error.details
    assert details["partial_text"] == "chapter 1 written"
    assert [a.get("name") for a in details["artifacts"]] == ["draft"]
    assert details["state"] == "failed" and details["task_id"]


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_large_file_artifact_is_returned_whole(
    make_kernel: KernelFactory, streaming: bool
) -> None:
    """Before: inline files over 64 KiB of base64 were replaced by "too large to return",
    and agent_<nickname>_task read them the same way: the agent's output was lost."""
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    res = await kernel.call("agent_research", {"query": "file"})
    assert not res.is_error, res.error
    [artifact] = res.content["artifacts"]
    [f] = artifact["files"]
    assert f["name"] == "blob.bin" and f["media_type"] == "application/octet-stream"
    assert base64.b64decode(f["base64"]) == BLOB
    again = await kernel.call("agent_research_task", {"task_id": res.content["task_id"]})
    assert base64.b64decode(again.content["artifacts"][0]["files"][0]["base64"]) == BLOB


def exact(value: Any) -> str:
    """``value`` as JSON text: tells 3 from 3.0 and True from 1, which ``==`` does not."""
    return json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("streaming", [False, True])
async def test_integers_in_data_parts_come_back_as_integers(
    make_kernel: KernelFactory, streaming: bool
) -> None:
    """Before: a data part travels as a protobuf Value, whose numbers are doubles, so the
    agent's {"count": 3} came back as {"count": 3.0} (and == hid it: 3 == 3.0)."""
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    res = await kernel.call("agent_research", {"query": "numbers"})
    assert not res.is_error, res.content
    sent = NUMBERS[0]
    expected = [
        {
            **sent,
            "whole_float": 2,  # the agent's 2.0: a double cannot tell it from 2
            "past_exact": float(2**53 + 2),  # past 2**53 a number stays the float it came as
        },
        [10, 1.5, -0.0],  # -0.0 is no integer
    ]
    [artifact] = res.content["artifacts"]
    assert artifact["name"] == "numbers"
    assert exact(artifact["data"]) == exact(expected)
    assert type(artifact["data"][0]["count"]) is int and artifact["data"][0]["flag"] is True
    # the task read back (GetTask) gives the same
    again = await kernel.call("agent_research_task", {"task_id": res.content["task_id"]})
    assert exact(again.content["artifacts"][0]["data"]) == exact(expected)


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_rejected_task_with_a_data_artifact_gives_the_agents_reason(
    make_kernel: KernelFactory, streaming: bool
) -> None:
    """Before: with no text in the artifacts the reason ("not my field") was reported as
    "no reason given" and filed under details.partial_text as if the agent had produced it."""
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    res = await kernel.call("agent_research", {"query": "reject"})
    assert res.is_error and res.error is not None
    assert "rejected the task: not my field" in res.error.message, res.error.message
    details = res.error.details
    assert exact(details["artifacts"]) == exact([{"name": "sample", "data": [{"rows": 3}]}])
    assert details["partial_text"] == ""
    assert details["state"] == "rejected"


@pytest.mark.parametrize("streaming", [False, True])
async def test_input_required_is_surfaced_and_context_id_continues(
    make_kernel: KernelFactory, router: Router, streaming: bool
) -> None:
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    first = await kernel.call("agent_research", {"query": "ask"})
    assert not first.is_error, first.content
    c = first.content
    assert c["state"] == "input-required"
    assert c["done"] is False and c["interrupted"] is True
    assert c["text"] == "Which city?"
    assert c["context_id"] and "context_id" in c["next"]
    # the answer, with only the context_id: the interrupted task is continued
    second = await kernel.call("agent_research", {"query": "Paris", "context_id": c["context_id"]})
    assert not second.is_error, second.content
    assert second.content["state"] == "completed"
    assert second.content["text"] == "Weather in Paris: sunny"
    assert second.content["task_id"] == c["task_id"]
    sent = router.rpc_messages("research.test")[-1]
    assert sent["taskId"] == c["task_id"] and sent["contextId"] == c["context_id"]
    # a further message in the same conversation starts a new task in that context
    third = await kernel.call("agent_research", {"query": "more", "context_id": c["context_id"]})
    assert third.content["context_id"] == c["context_id"]
    assert third.content["task_id"] != c["task_id"]
    sent = router.rpc_messages("research.test")[-1]
    assert "taskId" not in sent and sent["contextId"] == c["context_id"]


async def test_another_task_of_the_conversation_ending_keeps_the_interrupted_one(
    make_kernel: KernelFactory, research: Agent
) -> None:
    """Before: any result of the conversation that was not interrupted forgot its
    interrupted task: reading a hands-off task of the same context that had completed
    made the answer to the agent's question start a new task instead of continuing the
    one that asked it."""
    kernel, _ = await make_kernel(AGENTS)
    handed = await kernel.call("agent_research", {"query": "wait", "hands_off": True})
    context_id = handed.content["context_id"]
    asked = await kernel.call("agent_research", {"query": "ask", "context_id": context_id})
    assert asked.content["state"] == "input-required", asked.content
    research.executor.release()
    done = await kernel.call(
        "agent_research_task", {"task_id": handed.content["task_id"], "wait_s": 10}
    )
    assert done.content["state"] == "completed", done.content
    answer = await kernel.call("agent_research", {"query": "Paris", "context_id": context_id})
    assert not answer.is_error, answer.content
    assert answer.content["task_id"] == asked.content["task_id"]
    assert answer.content["text"] == "Weather in Paris: sunny"
    key = f"a2a:interrupted:research:{context_id}"
    assert await kernel.state.get(key) is None  # answered: forgotten


async def test_explicit_task_id_answers_an_auth_required_task(
    make_kernel: KernelFactory,
) -> None:
    kernel, _ = await make_kernel(AGENTS)
    first = await kernel.call("agent_research", {"query": "login"})
    assert first.content["state"] == "auth-required" and first.content["interrupted"] is True
    assert first.content["text"] == "Sign in first."
    args = {
        "query": "Lyon",
        "context_id": first.content["context_id"],
        "task_id": first.content["task_id"],
    }
    second = await kernel.call("agent_research", args)
    assert second.content["state"] == "completed", second.content
    assert second.content["text"] == "Weather in Lyon: sunny"


async def test_hands_off_then_get_the_task(make_kernel: KernelFactory, research: Agent) -> None:
    kernel, _ = await make_kernel({**AGENTS, "poll_interval_s": 0.02})
    res = await kernel.call("agent_research", {"query": "wait", "hands_off": True})
    assert not res.is_error, res.content
    c = res.content
    assert c["state"] in ("submitted", "working") and c["done"] is False
    assert c["interrupted"] is False
    assert c["task_id"] and c["context_id"]
    assert "agent_research_task" in c["next"]
    now = await kernel.call("agent_research_task", {"task_id": c["task_id"]})
    assert now.content["state"] in ("submitted", "working") and now.content["done"] is False
    research.executor.gate.set()
    later = await kernel.call("agent_research_task", {"task_id": c["task_id"], "wait_s": 10})
    assert not later.is_error, later.content
    assert later.content["state"] == "completed"
    assert later.content["text"] == "Findings on: wait"
    assert later.content["context_id"] == c["context_id"]


async def test_waiting_for_a_task_stops_in_time_to_answer_before_the_deadline(
    make_kernel: KernelFactory, research: Agent
) -> None:
    """Before: wait_s longer than the time the call had ended in a `timeout` error telling
    to use hands_off, instead of the task's state."""
    kernel, _ = await make_kernel({**AGENTS, "poll_interval_s": 0.05})
    res = await kernel.call("agent_research", {"query": "wait", "hands_off": True})
    args = {"task_id": res.content["task_id"], "wait_s": 30}
    with anyio.fail_after(5):
        now = await kernel.call("agent_research_task", args, timeout=1.0)
    assert not now.is_error, now.error
    assert now.content["state"] == "working" and "agent_research_task" in now.content["next"]
    research.executor.gate.set()


async def test_waiting_for_a_task_answers_in_time_when_the_agent_reads_slowly(
    make_kernel: KernelFactory, research: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the wait ended 0.4s before the limit, but a GetTask still running then (a
    slow agent) ran past it: a `timeout` error instead of the state read before."""
    from toolwire_a2a._agent import AgentHandle

    real = AgentHandle._get
    reads: list[str] = []

    async def slow_get(self: AgentHandle, task_id: str, action: str) -> Any:
        reads.append(task_id)
        if len(reads) > 1:
            await anyio.sleep(0.7)
        return await real(self, task_id, action)

    kernel, _ = await make_kernel({**AGENTS, "poll_interval_s": 0.05})
    res = await kernel.call("agent_research", {"query": "wait", "hands_off": True})
    monkeypatch.setattr(AgentHandle, "_get", slow_get)
    args = {"task_id": res.content["task_id"], "wait_s": 30}
    with anyio.fail_after(5):
        now = await kernel.call("agent_research_task", args, timeout=2.0)
    assert not now.is_error, now.error
    assert now.content["state"] == "working" and len(reads) > 2
    research.executor.gate.set()


async def test_a_task_read_cut_by_a_gateway_is_retried(router: Router, research: Agent) -> None:
    """Before: `agent_<nickname>_task` carried no idempotent hint, so a GetTask that a
    gateway answered 502 (in flight: the outcome unknown) was "not retried: may have side
    effects", though reading (or canceling) a task twice does no harm."""
    inner, failed = research.app, []

    async def gateway(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/a2a/jsonrpc" or failed:
            await inner(scope, receive, send)
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if b'"GetTask"' in body:
            failed.append(body)
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b"bad gateway"})
            return
        replay = [{"type": "http.request", "body": body, "more_body": False}]

        async def again() -> Any:
            return replay.pop() if replay else await receive()

        await inner(scope, again, send)

    router.hosts["research.test"] = gateway
    cfg = A2AConfig(agents=AGENTS["agents"], refresh_interval_s=0)
    plugins = [
        A2APlugin(cfg, transport=router),
        RateLimitPlugin(),
        RetryPlugin(RetryConfig(base_s=0.01)),
    ]
    async with Kernel(plugins=plugins) as kernel:
        done = await kernel.call("agent_research", {"query": "report"})
        res = await kernel.call("agent_research_task", {"task_id": done.content["task_id"]})
        tool = kernel.get_tool("agent_research_task")
    assert len(failed) == 1
    assert not res.is_error, res.error
    assert res.content["text"] == "Findings on: report"
    assert res.meta.attempts[0].decision == "retry"
    assert tool is not None and tool.annotations.idempotentHint is True


async def test_cancel_a_handed_off_task(make_kernel: KernelFactory, research: Agent) -> None:
    kernel, _ = await make_kernel(AGENTS)
    res = await kernel.call("agent_research", {"query": "wait", "hands_off": True})
    task_id = res.content["task_id"]
    with anyio.fail_after(10):
        cancelled = await kernel.call("agent_research_task", {"task_id": task_id, "cancel": True})
    assert not cancelled.is_error, cancelled.content
    assert cancelled.content["state"] == "canceled" and cancelled.content["done"] is True
    again = await kernel.call("agent_research_task", {"task_id": task_id, "cancel": True})
    assert again.is_error and again.error is not None
    assert again.error.kind in (ErrorKind.CONFLICT, ErrorKind.TOOL_ERROR)


async def test_unknown_task_is_not_found(make_kernel: KernelFactory) -> None:
    kernel, _ = await make_kernel(AGENTS)
    res = await kernel.call("agent_research_task", {"task_id": "no-such-task"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.NOT_FOUND
    assert res.error.details["code"] == -32001
    assert "no such task" in res.error.message


async def test_unreachable_agent_is_unavailable(make_kernel: KernelFactory, router: Router) -> None:
    kernel, plugin = await make_kernel(AGENTS)
    del router.hosts["research.test"]  # the agent goes away after its card was read
    res = await kernel.call("agent_research", {"query": "anything"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.UNAVAILABLE
    assert "unreachable" in res.error.message
    assert plugin.agents()[RESEARCH + "/.well-known/agent-card.json"]["status"] == "down"


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("http://localhost:9999/a2a", True),
        ("http://0.0.0.0:9999/a2a", True),
        ("http://gone.test/a2a", False),
    ],
)
async def test_an_unreachable_endpoint_is_named_and_a_card_naming_localhost_said(
    make_kernel: KernelFactory, router: Router, endpoint: str, local: bool
) -> None:
    """Before: "the agent is unreachable ...; check the agent's URL", although the URL
    configured worked (the card was read from it): the card named another endpoint,
    often the agent's bind address (localhost, 0.0.0.0), which the error did not say."""
    card = make_card("http://bound.test")
    card.supported_interfaces[0].url = endpoint
    router.hosts["bound.test"] = make_agent("http://bound.test", card=card).app
    kernel, _ = await make_kernel({"agents": {"bound": "http://bound.test"}})
    res = await kernel.call("agent_bound", {"query": "x"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.UNAVAILABLE
    assert res.error.details["endpoint"] == endpoint
    assert f"the endpoint its card names: {endpoint}" in res.error.message
    assert ("an address of the agent's own machine" in res.error.message) is local


async def test_auth_is_refused_without_credentials_and_works_with_them(
    make_kernel: KernelFactory, router: Router
) -> None:
    secure = make_agent("http://secure.test", name="Secure Agent", bearer="s3cret")
    router.hosts["secure.test"] = secure.app
    kernel, _ = await make_kernel({"agents": {"secure": "http://secure.test"}})
    res = await kernel.call("agent_secure", {"query": "x"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.AUTH
    assert res.error.details["status"] == 401
    assert "bearer_token" in res.error.message

    agents: dict[str, Any] = {"secure": {"url": "http://secure.test", "bearer_token": "s3cret"}}
    kernel2, _ = await make_kernel({"agents": agents})
    ok = await kernel2.call("agent_secure", {"query": "x"})
    assert not ok.is_error, ok.content
    assert ok.content["text"] == "Findings on: x"
    assert "s3cret" not in json.dumps(ok.to_dict())


async def test_rest_binding_agent(make_kernel: KernelFactory, router: Router) -> None:
    rest = make_agent("http://rest.test", name="Rest Agent", rest=True)
    router.hosts["rest.test"] = rest.app
    kernel, _ = await make_kernel({"agents": ["http://rest.test"], "streaming": False})
    assert kernel.get_tool("agent_rest_agent") is not None  # nickname from the card name
    res = await kernel.call("agent_rest_agent", {"query": "ping"})
    assert not res.is_error, res.content
    assert res.content["text"] == "Findings on: ping"
    assert any(h.path == "/message:send" for h in router.hits if h.host == "rest.test")


@pytest.mark.parametrize("streaming", [False, True])
async def test_rest_binding_errors_are_the_agents_a2a_errors(
    make_kernel: KernelFactory, router: Router, streaming: bool
) -> None:
    """Before: over HTTP+JSON the HTTP status of an A2A error decided its kind: an unknown
    task was `unavailable` ("the agent's endpoint is not available; try again later"), a
    task that cannot be canceled a bare "HTTP 400", and a stale remembered task blocked
    the conversation (no `details.code`, so no new task was started)."""
    rest = make_agent("http://rest.test", name="Rest Agent", rest=True)
    router.hosts["rest.test"] = rest.app
    kernel, _ = await make_kernel({"agents": {"rest": "http://rest.test"}, "streaming": streaming})

    unknown = await kernel.call("agent_rest_task", {"task_id": "no-such-task"})
    assert unknown.is_error and unknown.error is not None
    assert unknown.error.kind == ErrorKind.NOT_FOUND, unknown.error
    assert unknown.error.details["code"] == -32001 and "no such task" in unknown.error.message

    done = await kernel.call("agent_rest", {"query": "report"})
    assert not done.is_error, done.content
    cancel = await kernel.call(
        "agent_rest_task", {"task_id": done.content["task_id"], "cancel": True}
    )
    assert cancel.is_error and cancel.error is not None
    assert cancel.error.kind == ErrorKind.CONFLICT, cancel.error
    assert cancel.error.details["code"] == -32002

    ask = await kernel.call("agent_rest", {"query": "ask"})
    context_id = ask.content["context_id"]
    # the task remembered for the conversation has ended meanwhile
    await kernel.state.set(f"a2a:interrupted:rest:{context_id}", done.content["task_id"])
    res = await kernel.call("agent_rest", {"query": "again", "context_id": context_id})
    assert not res.is_error, res.content
    assert res.content["text"] == "Findings on: again"

    router.hosts["rest.test"] = Starlette(routes=[])  # a bare 404: the endpoint is gone
    gone = await kernel.call("agent_rest", {"query": "x"})
    assert gone.is_error and gone.error is not None
    assert gone.error.kind == ErrorKind.UNAVAILABLE and gone.error.details["status"] == 404


@pytest.mark.parametrize(
    "task_id", ["../admin/users", "x/../../admin", "x?role=admin", "a#b", ".."]
)
async def test_a_task_id_cannot_reach_another_path_of_a_rest_agents_host(
    make_kernel: KernelFactory, router: Router, task_id: str
) -> None:
    """Before: HTTP+JSON puts the task id in the URL path as it is, so a task_id of
    ``../admin/users`` (a model's argument) sent GET /admin/users and POST
    /admin/users:cancel to the agent's host, with the agent's bearer token."""
    rest = make_agent("http://rest.test", name="Rest Agent", rest=True)
    router.hosts["rest.test"] = rest.app
    agents = {"rest": {"url": "http://rest.test", "bearer_token": "s3cret"}}
    kernel, _ = await make_kernel({"agents": agents})
    before = len(router.hits)
    for args in ({"task_id": task_id}, {"task_id": task_id, "cancel": True}):
        res = await kernel.call("agent_rest_task", args)
        assert res.is_error and res.error is not None
        assert res.error.kind == ErrorKind.INVALID_ARGS, res.error
        assert res.error.details["reason"] == "unsafe_task_id"
    assert router.hits[before:] == []  # nothing was sent
    # over JSON-RPC the id travels in the body: any string is asked for as it is
    kernel2, _ = await make_kernel(AGENTS)
    res = await kernel2.call("agent_research_task", {"task_id": task_id})
    assert res.error is not None and res.error.kind == ErrorKind.NOT_FOUND, res.error


async def test_a_rest_agent_that_crashes_is_not_sent_the_message_twice(router: Router) -> None:
    """Before: the HTTP 500 a REST agent answers when its executor raises was `unavailable`,
    which the ratelimit plugin classifies as retryable: the retry plugin sent the message
    again. It is the agent's failure, `tool_error` with code -32603, as over JSON-RPC."""
    rest = make_agent("http://rest.test", name="Rest Agent", rest=True)
    router.hosts["rest.test"] = rest.app
    cfg = A2AConfig(agents=["http://rest.test"], refresh_interval_s=0)
    plugins = [
        A2APlugin(cfg, transport=router),
        RateLimitPlugin(),
        RetryPlugin(RetryConfig(base_s=0.01)),
    ]
    async with Kernel(plugins=plugins) as kernel:
        res = await kernel.call("agent_rest_agent", {"query": "crash"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.TOOL_ERROR, res.error
    assert res.error.details["code"] == -32603 and "the agent failed" in res.error.message
    assert [s["text"] for s in rest.executor.seen] == ["crash"]


async def test_legacy_v0_3_agent_is_called_with_v0_3_methods(
    make_kernel: KernelFactory, router: Router
) -> None:
    legacy = fixture("agent_card_v0_3_legacy.json")
    legacy["url"] = "http://translator.test/a2a"
    agent = make_agent("http://translator.test", legacy_card=legacy, rpc_path="/a2a")
    router.hosts["translator.test"] = agent.app
    kernel, _ = await make_kernel({"agents": ["http://translator.test"]})
    tool = kernel.get_tool("agent_legacy_translator")
    assert tool is not None and "Translate 'hello' to French" in tool.description
    res = await kernel.call("agent_legacy_translator", {"query": "bonjour"})
    assert not res.is_error, res.content
    assert res.content["text"] == "Findings on: bonjour"
    rpc = [h for h in router.hits if h.host == "translator.test" and h.path == "/a2a"]
    assert rpc and rpc[-1].headers.get("a2a-version") == "0.3"


async def test_arguments_are_validated_before_the_agent_is_called(
    make_kernel: KernelFactory, research: Agent
) -> None:
    kernel, _ = await make_kernel(AGENTS)
    res = await kernel.call("agent_research", {"query": "x", "handsoff": True})
    assert res.is_error and res.error is not None and res.error.kind == ErrorKind.INVALID_ARGS
    res = await kernel.call("agent_research", {"hands_off": True})
    assert res.is_error and res.error is not None and res.error.kind == ErrorKind.INVALID_ARGS
    assert research.executor.seen == []


async def test_a_stale_remembered_task_does_not_block_the_conversation(
    make_kernel: KernelFactory, router: Router
) -> None:
    kernel, _ = await make_kernel(AGENTS)
    first = await kernel.call("agent_research", {"query": "hello"})
    context_id = first.content["context_id"]
    # an interrupted task remembered for this conversation that the agent no longer has
    await kernel.state.set(f"a2a:interrupted:research:{context_id}", "gone-task")
    res = await kernel.call("agent_research", {"query": "again", "context_id": context_id})
    assert not res.is_error, res.content
    assert res.content["text"] == "Findings on: again"
    sent = router.rpc_messages("research.test")[-2:]
    assert sent[0]["taskId"] == "gone-task" and "taskId" not in sent[1]
    assert await kernel.state.get(f"a2a:interrupted:research:{context_id}") is None


async def test_a_crash_while_answering_is_not_sent_twice(
    make_kernel: KernelFactory, router: Router, research: Agent
) -> None:
    kernel, _ = await make_kernel(AGENTS)
    first = await kernel.call("agent_research", {"query": "ask"})
    context_id = first.content["context_id"]
    before = len(router.rpc_messages("research.test"))
    # the answer makes the agent crash: an error, and the message went out exactly once
    res = await kernel.call("agent_research", {"query": "crash", "context_id": context_id})
    assert res.is_error and res.error is not None and res.error.details["code"] == -32603
    sent = router.rpc_messages("research.test")
    assert len(sent) == before + 1 and sent[-1]["taskId"] == first.content["task_id"]
    assert [s["text"] for s in research.executor.seen].count("crash") == 1


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    "text", ["upstream answered 503 Service Unavailable", "connection reset by peer"]
)
async def test_an_agent_that_failed_while_acting_is_not_sent_the_message_again(
    router: Router, research: Agent, text: str, streaming: bool
) -> None:
    """Before: an agent whose executor raised (-32603) with words like these had its
    error reclassified `unavailable` by the ratelimit plugin from the text, and the
    retry plugin sent the message again: the agent ran twice. The error now says the
    agent had the message (``in_flight``), which the retry plugin does not repeat."""
    runs: list[str] = []

    async def execute(context: Any, event_queue: Any) -> None:
        runs.append(context.get_user_input())
        raise RuntimeError(text)

    research.executor.execute = execute  # type: ignore[method-assign]
    cfg = A2AConfig(agents=[RESEARCH], refresh_interval_s=0, streaming=streaming)
    plugins = [
        A2APlugin(cfg, transport=router),
        RateLimitPlugin(),
        RetryPlugin(RetryConfig(base_s=0.01)),
    ]
    async with Kernel(plugins=plugins) as kernel:
        res = await kernel.call("agent_research_specialist", {"query": "book it"})
    assert runs == ["book it"]
    assert res.is_error and res.error is not None
    assert res.error.details["code"] == -32603 and res.error.details["in_flight"] is True


async def test_a_card_offering_only_grpc_answers_unavailable(
    make_kernel: KernelFactory, router: Router
) -> None:
    grpc = make_agent("http://grpc.test", name="Grpc Agent", binding="GRPC")
    router.hosts["grpc.test"] = grpc.app
    kernel, _ = await make_kernel({"agents": ["http://grpc.test"]})
    res = await kernel.call("agent_grpc_agent", {"query": "x"})
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.UNAVAILABLE
    assert "no transport toolwire can use" in res.error.message


async def test_per_agent_settings_and_timeout_reach_the_call_tool(
    make_kernel: KernelFactory,
) -> None:
    agent = {"url": RESEARCH, "nickname": "research", "timeout_s": 42}
    agent["settings"] = {"approval": "REQUIRED"}
    kernel, _ = await make_kernel({"agents": [agent], "timeout_s": 5})
    call = kernel.get_tool("agent_research")
    task = kernel.get_tool("agent_research_task")
    assert call is not None and task is not None
    assert call.settings["approval"] == "REQUIRED" and call.timeout_s == 42
    assert call.settings["a2a"]["agent"] == "research"
    assert "approval" not in task.settings  # polling a task needs no approval


async def test_a_call_cancelled_mid_stream_closes_the_stream_at_once(
    make_kernel: KernelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a call cancelled while it handed progress on left the agent's event stream
    suspended, its connection held until garbage collection."""
    from a2a.client.base_client import BaseClient

    closed: list[bool] = []
    real = BaseClient.send_message

    async def send_message(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            async for event in real(self, *args, **kwargs):
                yield event
        finally:
            closed.append(True)

    monkeypatch.setattr(BaseClient, "send_message", send_message)
    kernel, _ = await make_kernel(AGENTS)
    stuck = anyio.Event()

    async def progress(done: float, total: float | None, message: str | None) -> None:
        stuck.set()
        await anyio.sleep_forever()  # a caller slow to take progress

    with anyio.move_on_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: kernel.call("agent_research", {"query": "stream"}, progress=progress)
            )
            await stuck.wait()
            tg.cancel_scope.cancel()
    assert closed == [True]


async def test_an_empty_answer_says_what_to_check(
    make_kernel: KernelFactory, router: Router
) -> None:
    """Before: "agent 'research': the agent's answer contained neither a task nor a
    message", with nothing to do about it."""
    from starlette.responses import Response

    agent = router.hosts["research.test"]

    async def empty_stream(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            await Response(b"", media_type="text/event-stream")(scope, receive, send)
        else:
            await agent(scope, receive, send)

    router.hosts["research.test"] = empty_stream
    kernel, _ = await make_kernel({**AGENTS, "streaming": True})
    res = await kernel.call("agent_research", {"query": "hello"})
    assert res.error is not None and res.error.kind == ErrorKind.TOOL_ERROR, res.error
    assert "neither a task nor a message" in res.error.message
    assert "check with the agent before sending it again" in res.error.message
    assert res.error.details == {"agent": "research", "reason": "empty_answer"}


@pytest.mark.parametrize("streaming", [False, True])
async def test_an_answer_that_is_not_a2a_json_rpc_says_what_to_check(
    make_kernel: KernelFactory, router: Router, streaming: bool
) -> None:
    """Before: "JSON Decode Error: Expecting value ..." and nothing about what to do."""
    from starlette.responses import HTMLResponse

    agent = router.hosts["research.test"]

    async def html_for_rpc(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":  # a proxy's error page
            await HTMLResponse("<html><body>Welcome to nginx!</body></html>")(scope, receive, send)
        else:
            await agent(scope, receive, send)

    router.hosts["research.test"] = html_for_rpc
    kernel, _ = await make_kernel({**AGENTS, "streaming": streaming})
    res = await kernel.call("agent_research", {"query": "hello"})
    assert res.error is not None and res.error.kind == ErrorKind.TOOL_ERROR, res.error
    assert res.error.message.startswith("agent 'research': sending the message")
    assert "is not A2A 1.0 JSON-RPC" in res.error.message
    assert "plugins.a2a.agents" in res.error.message
    assert res.error.details["reason"] == "malformed_answer"


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_plain_500_after_the_agent_had_the_message_is_not_sent_again(
    router: Router, research: Agent, streaming: bool
) -> None:
    """A server error page (no A2A error in the body: a middleware or a proxy in front of
    the agent failed after the agent got the message) is `unavailable` with status 500.
    Before: the ratelimit plugin took that declared kind as retryable and the retry
    plugin sent the message again: the agent ran twice. A 500 says the server had the
    request (``in_flight``), which the retry plugin does not repeat for a side-effecting
    tool."""
    inner = research.app

    async def failing_middleware(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/a2a/jsonrpc":
            await inner(scope, receive, send)
            return

        async def swallow(message: Any) -> None:  # the agent's answer is lost
            pass

        await inner(scope, receive, swallow)
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})

    router.hosts["research.test"] = failing_middleware
    cfg = A2AConfig(agents=AGENTS["agents"], refresh_interval_s=0, streaming=streaming)
    plugins = [
        A2APlugin(cfg, transport=router),
        RateLimitPlugin(),
        RetryPlugin(RetryConfig(base_s=0.01)),
    ]
    async with Kernel(plugins=plugins) as kernel:
        res = await kernel.call("agent_research", {"query": "book it"})
    assert [s["text"] for s in research.executor.seen] == ["book it"]
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.UNAVAILABLE and res.error.details["status"] == 500
    assert res.error.details["in_flight"] is True and not res.error.retryable
    gave_up = res.error.details["gave_up"]
    assert "failed with HTTP 500 after the request reached the server" in gave_up
    assert "may have side effects" in gave_up
