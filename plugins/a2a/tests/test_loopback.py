"""A real agent on a loopback port (uvicorn, started and stopped by the test), real HTTP."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from google.protobuf.json_format import MessageToDict
from toolwire_a2a_testkit import Agent, Registry, eventually, make_agent, make_card

from toolwire import ErrorKind, Kernel
from toolwire.state import Entry, MemoryStore
from toolwire_a2a import A2AConfig, A2APlugin
from toolwire_ratelimit import RateLimitPlugin
from toolwire_retry import RetryConfig, RetryPlugin

pytestmark = pytest.mark.anyio


class LoopbackAgent:
    """An a2a-sdk agent served by uvicorn on 127.0.0.1 in a thread of its own."""

    def __init__(self, wrap: Any = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent: Agent = make_agent(self.url, name="Loopback Specialist")
        app = self.agent.app if wrap is None else wrap(self.agent.app)
        config = uvicorn.Config(app, log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> LoopbackAgent:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError("the loopback agent did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.agent.executor.release()
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()
        assert not self.thread.is_alive(), "the loopback agent did not stop"


@pytest.fixture
def loopback() -> Iterator[LoopbackAgent]:
    agent = LoopbackAgent().start()
    try:
        yield agent
    finally:
        if agent.thread.is_alive():
            agent.stop()


async def cut_by_its_deadline_then_found_again(kernel: Kernel, loopback: LoopbackAgent) -> None:
    """A blocking call cut by its deadline still says which task keeps running, and
    ``agent_x_task`` finds that task's answer later."""
    loopback.agent.executor.hold()
    cut = await kernel.call("agent_loopback_specialist", {"query": "wait"}, timeout=1.0)
    assert cut.is_error and cut.error is not None and cut.error.kind == ErrorKind.TIMEOUT
    running = cut.meta.extra["a2a"]["task_id"]
    # the error itself says so, for callers that never see meta.extra (MCP, the CLI)
    assert cut.error.details["task_id"] == running
    assert cut.to_dict()["error"]["details"]["task_id"] == running
    assert (
        f"do not send the message again, get its outcome with agent_loopback_specialist_task "
        f"and task_id={running!r}"
    ) in cut.error.message
    loopback.agent.executor.release()
    done = await kernel.call("agent_loopback_specialist_task", {"task_id": running, "wait_s": 10})
    assert done.content["text"] == "Findings on: wait", done.content


def kernel_from_toml(tmp_path: Path, body: str) -> Kernel:
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text('enabled_plugins = ["a2a"]\n\n[plugins.a2a]\n' + body)
    return Kernel.from_config(str(cfg))


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_configured_by_toml_streaming_hands_off_and_shutdown(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    kernel = kernel_from_toml(
        tmp_path,
        f'agents = ["{loopback.url}"]\npoll_interval_s = 0.05\ncontext = {{tenant = "acme"}}\n',
    )
    async with kernel:
        tool = kernel.get_tool("agent_loopback_specialist")
        assert tool is not None and tool.source == "a2a:loopback_specialist"

        notes: list[str | None] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            notes.append(message)

        res = await kernel.call("agent_loopback_specialist", {"query": "stream"}, progress=progress)
        assert not res.is_error, res.content
        assert res.content["text"] == "part one;\npart two"
        assert "loopback_specialist: working: reading sources" in notes

        res = await kernel.call("agent_loopback_specialist", {"query": "msg hi"})
        assert res.content["text"] == 'echo: msg hi; metadata={"tenant": "acme"}'

        started = await kernel.call(
            "agent_loopback_specialist", {"query": "wait", "hands_off": True}
        )
        assert started.content["done"] is False, started.content
        loopback.agent.executor.release()
        done = await kernel.call(
            "agent_loopback_specialist_task",
            {"task_id": started.content["task_id"], "wait_s": 10},
        )
        assert done.content["state"] == "completed", done.content
        assert done.content["text"] == "Findings on: wait"

        await cut_by_its_deadline_then_found_again(kernel, loopback)

        loopback.stop()  # the agent goes away: calls answer unavailable, nothing crashes
        res = await kernel.call("agent_loopback_specialist", {"query": "x"})
        assert res.is_error and res.error is not None
        assert res.error.kind == ErrorKind.UNAVAILABLE


async def test_without_a_stream_a_blocking_call_cut_by_its_deadline_keeps_the_task_id(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    """Before: with ``streaming = false`` the task id came only with the final answer, so a
    call cut by its deadline left ``meta.extra["a2a"] == {"agent": ...}`` and the task that
    kept running could not be found again."""
    kernel = kernel_from_toml(
        tmp_path, f'agents = ["{loopback.url}"]\npoll_interval_s = 0.05\nstreaming = false\n'
    )
    async with kernel:
        quick = await kernel.call("agent_loopback_specialist", {"query": "report"}, timeout=10)
        assert quick.content["state"] == "completed", quick.content  # polled to the end
        assert quick.content["text"] == "Findings on: report"
        plain = await kernel.call("agent_loopback_specialist", {"query": "report"})
        assert plain.content["text"] == "Findings on: report"  # no deadline: one blocking call
        await cut_by_its_deadline_then_found_again(kernel, loopback)


@pytest.mark.parametrize("where", ["plugin", "agent", "kernel"])
async def test_without_a_stream_a_call_cut_by_its_attempt_timeout_keeps_the_task_id(
    tmp_path: Path, loopback: LoopbackAgent, where: str
) -> None:
    """Before: only a deadline made the call poll; cut by a per-attempt timeout
    (plugins.a2a.timeout_s, the agent's timeout_s, the kernel's default_timeout_s) the
    single blocking request lost the task id of the task that kept running."""
    agent = (
        f'{{url = "{loopback.url}", timeout_s = 1}}' if where == "agent" else f'"{loopback.url}"'
    )
    body = f"agents = [{agent}]\npoll_interval_s = 0.05\nstreaming = false\n"
    if where == "plugin":
        body += "timeout_s = 1\n"
    cfg = tmp_path / "toolwire.toml"
    top = "default_timeout_s = 1\n" if where == "kernel" else ""
    cfg.write_text(top + 'enabled_plugins = ["a2a"]\n\n[plugins.a2a]\n' + body)
    kernel = Kernel.from_config(str(cfg))
    async with kernel:
        loopback.agent.executor.hold()
        cut = await kernel.call("agent_loopback_specialist", {"query": "wait"})
        assert cut.is_error and cut.error is not None and cut.error.kind == ErrorKind.TIMEOUT
        running = cut.meta.extra["a2a"].get("task_id")
        assert running, cut.meta.extra
        assert cut.error.details["task_id"] == running and running in cut.error.message
        loopback.agent.executor.release()
        done = await kernel.call(
            "agent_loopback_specialist_task", {"task_id": running, "wait_s": 0.9}
        )
        assert done.content["text"] == "Findings on: wait", done.content


def _last_task(loopback: LoopbackAgent) -> str:
    task = loopback.agent.executor.seen[-1]["task"]
    assert task, loopback.agent.executor.seen
    return str(task)


async def _cancel_once_working(kernel: Kernel, **args: Any) -> None:
    """Start a blocking ``wait`` call (``args`` added) and cancel it once the agent reports
    it working."""
    working = anyio.Event()

    async def progress(done: float, total: float | None, message: str | None) -> None:
        working.set()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: kernel.call(
                    "agent_loopback_specialist", {"query": "wait", **args}, progress=progress
                )
            )
            await working.wait()
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_call_its_caller_cancels_cancels_the_agents_task(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    """Before: the caller's cancellation closed the stream and left the task running on
    the agent, where nobody could follow it up (the result, with its task id, is never
    returned), and a replay of the call started a second task."""
    kernel = kernel_from_toml(tmp_path, f'agents = ["{loopback.url}"]\n')
    async with kernel:
        loopback.agent.executor.hold()
        await _cancel_once_working(kernel)
        task_id = _last_task(loopback)
        with anyio.fail_after(10):  # sent in the background: the cancellation went on at once
            while True:
                listed = await kernel.call("agent_loopback_specialist_task", {"task_id": task_id})
                if listed.is_error:
                    break
                await anyio.sleep(0.02)
        assert listed.error is not None and listed.error.details["state"] == "canceled"
        assert loopback.agent.executor.cancels == [task_id]


async def test_shutdown_waits_for_the_canceltask_of_an_abandoned_call(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    """The CancelTask runs in the background (a gateway's client is answered at once);
    closing the kernel right after the cancellation still lets it reach the agent."""
    kernel = kernel_from_toml(tmp_path, f'agents = ["{loopback.url}"]\n')
    async with kernel:
        loopback.agent.executor.hold()
        await _cancel_once_working(kernel)
    assert loopback.agent.executor.cancels == [_last_task(loopback)]


@pytest.mark.parametrize("named", [True, False], ids=["task_id", "context_id"])
async def test_a_cancelled_answer_to_an_interrupted_task_leaves_that_task_be(
    tmp_path: Path, loopback: LoopbackAgent, named: bool
) -> None:
    """Before: the call cancelled the task it answered, which it had not started: a task
    its caller knows (the interrupted result gave its id) and can still follow up."""
    kernel = kernel_from_toml(tmp_path, f'agents = ["{loopback.url}"]\n')
    async with kernel:
        asked = await kernel.call("agent_loopback_specialist", {"query": "ask"})
        assert asked.content["interrupted"] is True, asked.content
        task_id, context_id = asked.content["task_id"], asked.content["context_id"]
        loopback.agent.executor.hold()
        answer = {"task_id": task_id} if named else {"context_id": context_id}
        await _cancel_once_working(kernel, **answer)
        assert _last_task(loopback) == task_id  # the answer went to that task
        loopback.agent.executor.release()
        done = await kernel.call(
            "agent_loopback_specialist_task", {"task_id": task_id, "wait_s": 5}
        )
        assert not done.is_error, done.to_dict()  # not canceled
        assert done.content["state"] == "completed", done.content


async def test_with_cancel_abandoned_off_the_task_runs_on(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    kernel = kernel_from_toml(tmp_path, f'agents = ["{loopback.url}"]\ncancel_abandoned = false\n')
    async with kernel:
        loopback.agent.executor.hold()
        await _cancel_once_working(kernel)
        loopback.agent.executor.release()
        done = await kernel.call(
            "agent_loopback_specialist_task", {"task_id": _last_task(loopback), "wait_s": 5}
        )
        assert done.content["state"] == "completed", done.content


class _SlowReads(MemoryStore):
    """A store whose reads take ``delay_s`` (a remote store on a loaded machine)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def get_entry(self, key: str) -> Entry | None:
        await anyio.sleep(self.delay_s)
        return await super().get_entry(key)


async def test_a_call_cut_by_its_timeout_after_a_slow_state_read_keeps_its_task(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    """Before: the attempt's cut was measured from after the state read of ``context_id``
    (its interrupted task), not from when the kernel armed the timeout, so a read that
    took a while made the cut look like the caller's cancellation: the task the timeout
    error names was canceled."""
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(
        f'enabled_plugins = ["a2a"]\n\n[plugins.a2a]\nagents = ["{loopback.url}"]\ntimeout_s = 1\n'
    )
    async with Kernel.from_config(str(cfg), state=_SlowReads(0.4)) as kernel:
        loopback.agent.executor.hold()
        cut = await kernel.call(
            "agent_loopback_specialist", {"query": "wait", "context_id": "ctx-slow"}
        )
        assert cut.is_error and cut.error is not None and cut.error.kind == ErrorKind.TIMEOUT
        running = cut.error.details["task_id"]
        loopback.agent.executor.release()
        done = await kernel.call(
            "agent_loopback_specialist_task", {"task_id": running, "wait_s": 0.9}
        )
        assert not done.is_error, done.to_dict()  # not canceled
        assert done.content["state"] == "completed", done.content


async def test_nothing_listening_at_start_does_not_stop_the_kernel(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    kernel = kernel_from_toml(
        tmp_path, f'agents = ["http://127.0.0.1:{port}"]\nrequest_timeout_s = 5\n'
    )
    async with kernel:
        assert kernel.list_tools() == []


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_calls_and_scheduled_refresh_under_trio(
    tmp_path: Path, loopback: LoopbackAgent
) -> None:
    kernel = kernel_from_toml(
        tmp_path, f'agents = ["{loopback.url}"]\nstreaming = false\nrefresh_interval_s = 0.05\n'
    )
    async with kernel:
        res = await kernel.call("agent_loopback_specialist", {"query": "trio"})
        assert res.content["text"] == "Findings on: trio", res.content
        card = copy.deepcopy(loopback.agent.card)
        card.description = "Rewritten while running."
        loopback.agent.card = card  # the scheduled refresh (a trio system task) picks it up
        await eventually(
            lambda: (
                "Rewritten"
                in getattr(kernel.get_tool("agent_loopback_specialist"), "description", "")
            )
        )
        plugin = kernel.get_plugin("a2a")
    assert plugin._refresher is None  # stopped at shutdown
    hits = loopback.agent.card_requests
    await anyio.sleep(0.2)
    assert loopback.agent.card_requests == hits


class StreamCutter:
    """Wraps an agent: the SSE connection is cut right after the first artifact event;
    with ``refuse_reads`` the agent also answers HTTP 503 to every later request; with
    ``forget_artifacts`` its later answers (GetTask) hold no artifacts, as an agent that
    streams them without keeping them."""

    def __init__(
        self, refuse_reads: bool = False, forget_artifacts: bool = False, end: bool = False
    ) -> None:
        self.refuse_reads = refuse_reads
        self.forget_artifacts = forget_artifacts
        self.end = end
        self.cut = False

    def __call__(self, inner: Any) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"] != "/a2a/jsonrpc":
                await inner(scope, receive, send)
                return
            if self.cut and self.refuse_reads:
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b"down"})
                return
            if self.cut and self.forget_artifacts:
                held: list[Any] = []

                async def forgetting_send(msg: Any) -> None:
                    held.append(msg)
                    if msg["type"] != "http.response.body" or msg.get("more_body"):
                        return
                    body = b"".join(m.get("body", b"") for m in held[1:])
                    answer = json.loads(body)
                    if isinstance(answer.get("result"), dict):
                        answer["result"].pop("artifacts", None)
                    body = json.dumps(answer).encode()
                    headers = [(k, v) for k, v in held[0]["headers"] if k != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    await send({**held[0], "headers": headers})
                    await send({"type": "http.response.body", "body": body})

                await inner(scope, receive, forgetting_send)
                return

            ended = False

            async def cutting_send(msg: Any) -> None:
                nonlocal ended
                if ended:
                    return  # the stream was ended or cut: the agent's later events go nowhere
                await send(msg)
                if msg["type"] == "http.response.body" and b"artifactUpdate" in msg["body"]:
                    self.cut = ended = True

            await inner(scope, receive, cutting_send)
            # once the agent is done, so that the task read finds it done (not a race)
            if ended and self.end:  # the stream ends (a proxy ending it), without an error
                await send({"type": "http.response.body", "body": b""})
            elif ended:
                raise RuntimeError("the connection is cut")  # uvicorn drops it

        return app


@pytest.mark.parametrize("end", [False, True])
async def test_a_stream_cut_keeps_the_artifacts_the_agent_did_not_keep(
    tmp_path: Path, end: bool
) -> None:
    """Before: the task read after the cut replaced the answer; an agent that streams its
    artifacts without keeping them answered it with none, and the artifact received was lost.
    A stream that ends (no error) before the task did is read the same way."""
    cutter = StreamCutter(forget_artifacts=True, end=end)
    agent = LoopbackAgent(wrap=cutter).start()
    try:
        kernel = kernel_from_toml(tmp_path, f'agents = ["{agent.url}"]\n')
        async with kernel:
            res = await kernel.call("agent_loopback_specialist", {"query": "stream"})
    finally:
        agent.stop()
    assert cutter.cut
    assert not res.is_error, res.content
    assert res.content["state"] == "completed"
    assert res.content["artifacts"] == [{"name": "report", "text": "part one;"}]
    assert res.content["text"] == "part one;"


@pytest.mark.parametrize("end", [False, True])
@pytest.mark.parametrize("refuse_reads", [False, True])
async def test_a_stream_cut_after_an_artifact_keeps_the_artifact(
    tmp_path: Path, refuse_reads: bool, end: bool
) -> None:
    """Before: the broken stream was an `unavailable` error without task_id or artifact,
    although the agent had taken (and here finished) the task: the artifact was lost, and
    the error invited sending the message again. So was a stream that ended (no error)
    before the task did, when the task could not be read."""
    cutter = StreamCutter(refuse_reads, end=end)
    agent = LoopbackAgent(wrap=cutter).start()
    try:
        kernel = kernel_from_toml(tmp_path, f'agents = ["{agent.url}"]\n')
        async with kernel:
            res = await kernel.call("agent_loopback_specialist", {"query": "stream"})
    finally:
        agent.stop()
    assert cutter.cut
    if not refuse_reads:  # the task is read instead: the whole answer
        assert not res.is_error, res.content
        assert res.content["state"] == "completed"
        assert res.content["text"] == "part one;\npart two"
        return
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.UNAVAILABLE
    details = res.error.details
    assert details["task_id"] == res.meta.extra["a2a"]["task_id"]
    assert details["artifacts"] == [{"name": "report", "text": "part one;"}]
    assert "agent_loopback_specialist_task" in res.error.message
    assert "do not send the message again" in res.error.message


class TaskReadFailsOnce:
    """Wraps an agent: its first ``GetTask`` answers HTTP 503 (a proxy restarting) and
    lets the agent's ``wait`` tasks finish; with ``end_stream`` the first SSE answer ends
    (no error) right after its first artifact event, before the task did."""

    def __init__(self, end_stream: bool = False) -> None:
        self.end_stream = end_stream
        self.failed = 0
        self.agent: Agent | None = None

    def __call__(self, inner: Any) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"] != "/a2a/jsonrpc":
                await inner(scope, receive, send)
                return
            chunks = []
            while True:
                msg = await receive()
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body"):
                    break
            body = b"".join(chunks)
            replayed = False

            async def again() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            if b'"GetTask"' in body and not self.failed:
                self.failed += 1
                assert self.agent is not None
                self.agent.executor.release()
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b"restarting"})
                return
            if not (self.end_stream and b'"SendStreamingMessage"' in body and not self.failed):
                await inner(scope, again, send)
                return
            ended = False

            async def ending_send(msg: Any) -> None:
                nonlocal ended
                if ended:
                    return
                await send(msg)
                if msg["type"] == "http.response.body" and b"artifactUpdate" in msg["body"]:
                    ended = True

            await inner(scope, again, ending_send)
            if ended:
                await send({"type": "http.response.body", "body": b""})

        return app


@pytest.mark.parametrize("way", ["polled", "stream ended"])
async def test_a_failed_task_read_after_the_agent_took_the_task_is_not_sent_again(
    way: str,
) -> None:
    """Before: a blocking call that polls its task (no stream, a timeout) failed on one
    503 of a GetTask with an `unavailable` that named no task and did not say the agent
    had the message, and so did a stream that ended before its task when the task read
    failed: the retry plugin (with ratelimit classifying) sent the message again, and the
    agent did the work twice. Now the error is `in_flight` and carries the task id."""
    polled = way == "polled"
    wrap = TaskReadFailsOnce(end_stream=not polled)
    agent = LoopbackAgent(wrap=wrap)
    wrap.agent = agent.agent
    agent.start()
    query = "wait" if polled else "stream"
    if polled:
        agent.agent.executor.hold()
    try:
        cfg = A2AConfig(
            agents=[agent.url],
            streaming=not polled,
            timeout_s=30 if polled else None,
            poll_interval_s=0.05,
            refresh_interval_s=0,
        )
        plugins = [A2APlugin(cfg), RateLimitPlugin(), RetryPlugin(RetryConfig(base_s=0.01))]
        async with Kernel(plugins=plugins) as kernel:
            res = await kernel.call("agent_loopback_specialist", {"query": query})
    finally:
        agent.stop()
    assert wrap.failed == 1
    assert [s["text"] for s in agent.agent.executor.seen] == [query]  # sent once
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.UNAVAILABLE
    task_id = agent.agent.executor.seen[0]["task"]
    assert res.error.details["task_id"] == task_id
    assert res.error.details["in_flight"] is True
    assert "do not send the message again" in res.error.message
    assert f"agent_loopback_specialist_task and task_id={task_id!r}" in res.error.message


async def test_an_agent_leaving_the_registry_mid_call_still_answers_that_call() -> None:
    """Before: a refresh that found the agent gone from the listing closed its HTTP client
    at once, under the calls in flight: they failed with "the agent is unreachable
    (ReadError)", the answer the agent computed was lost, and the error pointed at a task
    tool about to disappear. Now the client is closed once those calls have ended."""
    agent = LoopbackAgent().start()
    registry = Registry({"agents": [{"nickname": "lb", "card_url": agent.url}]})
    listing = LoopbackAgent(wrap=lambda _: registry.app()).start()
    try:
        cfg = A2AConfig(registry={"url": listing.url + "/agents"}, refresh_interval_s=0)
        plugin = A2APlugin(cfg)
        async with Kernel(plugins=[plugin]) as kernel:
            handle = plugin._handles[agent.url + "/.well-known/agent-card.json"]
            agent.agent.executor.hold()
            working = anyio.Event()
            out: dict[str, Any] = {}

            async def progress(done: float, total: float | None, message: str | None) -> None:
                working.set()

            async def call() -> None:
                out["res"] = await kernel.call("agent_lb", {"query": "wait"}, progress=progress)

            with anyio.fail_after(15):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await working.wait()
                    registry.listing = {"agents": []}
                    assert await plugin.refresh() is True  # its tools are gone
                    assert kernel.get_tool("agent_lb") is None
                    assert not handle.http.is_closed  # a call still runs on it
                    agent.agent.executor.release()
            res = out["res"]
            assert not res.is_error, res.error
            assert res.content["text"] == "Findings on: wait"
            assert handle.http.is_closed  # closed after the last call
    finally:
        agent.stop()
        listing.stop()


async def test_a_call_finding_every_connection_busy_says_nothing_was_sent() -> None:
    """Before: with 100 calls to one agent running (httpx's connection limit), the next
    waited 60 s for a connection, then failed as "sending the message timed out; the
    agent may still be working" — although nothing had been sent, and a `timeout` without
    ``in_flight = false`` is an unknown outcome that the retry plugin does not repeat. Now
    the wait is ``request_timeout_s`` and the error says the message was not sent."""
    posts = 0
    done = asyncio.Event()
    card: dict[str, Any] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal posts
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            path = head[0].split(" ")[1]
            length = next(
                (int(h.split(":")[1]) for h in head if h.lower().startswith("content-length")), 0
            )
            await reader.readexactly(length)
            if path.endswith("agent-card.json"):
                body = json.dumps(card).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close"
                    b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                return
            posts += 1
            await done.wait()  # the agent never answers
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    card.update(MessageToDict(make_card(url, streaming=False)))
    cfg = A2AConfig(agents=[{"url": url, "nickname": "busy"}], request_timeout_s=0.5)
    try:
        async with Kernel(plugins=[A2APlugin(cfg)]) as kernel, anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(kernel.call, "agent_busy", {"query": f"call {i}"})
            await eventually(lambda: posts == 100, within=30)
            with anyio.fail_after(30):  # bounds a hang, not a speed
                res = await kernel.call("agent_busy", {"query": "one more"})
            tg.cancel_scope.cancel()
    finally:
        done.set()
        server.close()
        await server.wait_closed()
    assert posts == 100  # the 101st message never went out
    assert res.is_error and res.error is not None
    assert res.error.kind == ErrorKind.TIMEOUT
    assert res.error.details["in_flight"] is False
    assert "every connection to the agent stayed busy" in res.error.message
    assert "the request was not sent" in res.error.message
