"""Test kit: real a2a-sdk 1.3 agents, an httpx transport routing hosts to ASGI apps, helpers.

The agents are built exactly as an A2A server author builds them
(``DefaultRequestHandler`` + ``create_agent_card_routes`` + JSON-RPC or REST
routes); only the executor is scripted by the text it receives.

conftest.py loads this file as the module ``toolwire_a2a_testkit`` (test
directories are not packages here: several distributions have a ``tests``
directory), so test modules ``from toolwire_a2a_testkit import ...``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from a2a.helpers import (
    new_data_part,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Role,
    TaskState,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

FIXTURES = Path("/work/shared/fixtures/a2a")
RESEARCH = "http://research.test"
#: The file the ``file`` command returns (256 KiB).
BLOB = bytes(range(256)) * 1024
#: The data parts the ``numbers`` command returns, as the agent's code writes them.
NUMBERS: list[Any] = [
    {
        "count": 3,
        "negative": -7,
        "zero": 0,
        "ratio": 0.25,
        "whole_float": 2.0,  # indistinguishable from 2 once it is a double
        "largest_exact": 2**53,
        "smallest_exact": -(2**53),
        "past_exact": 2**53 + 2,  # a double still, but past where every integer is one
        "flag": True,
        "off": False,
        "nothing": None,
        "label": "3",
        "rows": [1, 2.5, {"n": 4, "ok": True}],
    },
    [10, 1.5, -0.0],
]

Scope = dict[str, Any]
KernelFactory = Callable[..., Any]


def fixture(name: str) -> Any:
    """A payload from the shared A2A fixtures."""
    return json.loads((FIXTURES / name).read_text())


async def eventually(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until ``predicate()`` holds; fail after ``within`` seconds."""
    with anyio.fail_after(within):
        while True:
            if predicate():
                return
            await anyio.sleep(0.02)


ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class ScriptedExecutor(AgentExecutor):
    """Does what the user's text says.

    - ``msg ...``: replies with one message (no task), echoing the metadata it got.
    - ``crash``: raises (the SDK answers JSON-RPC -32603 with the text).
    - ``ask``: needs input ("Which city?"); the answer completes the task (the answer
      ``wait`` works until ``gate`` is set first).
    - ``login``: needs auth.
    - ``fail``: the task fails with a reason.
    - ``partial``: an artifact ("chapter 1 written"), then the task fails with a reason.
    - ``reject``: a data artifact (``{"rows": 3}``), then the task is rejected with a reason.
    - ``wait``: works until ``gate`` is set, then completes.
    - ``file``: an artifact with a 256 KiB file (``BLOB``), inline.
    - ``numbers``: an artifact with the data parts ``NUMBERS``.
    - ``stream``: a status message, then an artifact in two appended chunks.
    - ``big <n>``: an artifact of ``n`` characters ("x" repeated).
    - anything else: one artifact "Findings on: <text>".
    """

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.seen: list[dict[str, Any]] = []
        self.cancels: list[str] = []  # the ids of the tasks CancelTask reached
        self.loop: asyncio.AbstractEventLoop | None = None

    def release(self) -> None:
        """Let ``wait`` tasks finish (safe from another thread than the server's)."""
        if self.loop is None:
            self.gate.set()
        else:
            self.loop.call_soon_threadsafe(self.gate.set)

    def hold(self) -> None:
        """Make ``wait`` tasks wait again (done when this returns, from any thread)."""
        if self.loop is None:
            self.gate.clear()
            return

        async def clear() -> None:
            self.gate.clear()

        asyncio.run_coroutine_threadsafe(clear(), self.loop).result(5)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.loop = asyncio.get_running_loop()
        text = context.get_user_input()
        msg = context.message
        assert msg is not None
        metadata = MessageToDict(msg.metadata) if msg.HasField("metadata") else {}
        self.seen.append(
            {
                "text": text,
                "metadata": metadata,
                "context_id": context.context_id,
                "task_id": msg.task_id,
                "task": context.task_id,  # the task this message runs in (new or named)
            }
        )
        current = context.current_task
        if text.startswith("msg"):
            reply = f"echo: {text}; metadata={json.dumps(metadata, sort_keys=True)}"
            await event_queue.enqueue_event(
                new_text_message(reply, role=Role.ROLE_AGENT, context_id=context.context_id)
            )
            return
        if text == "crash":
            raise RuntimeError("agent crashed: the database is on fire")
        task = current or new_task_from_user_message(msg)
        if current is None:
            await event_queue.enqueue_event(task)
        up = TaskUpdater(event_queue, task.id, task.context_id)
        if current is not None and current.status.state in (
            TaskState.TASK_STATE_INPUT_REQUIRED,
            TaskState.TASK_STATE_AUTH_REQUIRED,
        ):
            if text == "wait":  # an answer the agent works on until ``gate`` is set
                await up.start_work()
                await asyncio.wait_for(self.gate.wait(), 30)
            await up.add_artifact([new_text_part(f"Weather in {text}: sunny")], name="forecast")
            await up.complete()
            return
        await up.start_work()
        if text == "ask":
            await up.requires_input(up.new_agent_message([new_text_part("Which city?")]))
        elif text == "login":
            await up.requires_auth(up.new_agent_message([new_text_part("Sign in first.")]))
        elif text == "fail":
            await up.failed(up.new_agent_message([new_text_part("I cannot do that: no data")]))
        elif text == "partial":
            await up.add_artifact([new_text_part("chapter 1 written")], name="draft")
            await up.failed(up.new_agent_message([new_text_part("ran out of budget")]))
        elif text == "reject":
            await up.add_artifact([new_data_part({"rows": 3})], name="sample")
            await up.reject(up.new_agent_message([new_text_part("not my field")]))
        elif text == "file":
            part = Part(raw=BLOB, media_type="application/octet-stream", filename="blob.bin")
            await up.add_artifact([part], name="blob")
            await up.complete()
        elif text == "numbers":
            await up.add_artifact([new_data_part(d) for d in NUMBERS], name="numbers")
            await up.complete()
        elif text.startswith("big "):
            size = int(text.split()[1])
            await up.add_artifact([new_text_part("x" * size)], name="big")
            await up.complete()
        elif text == "stream":
            await up.update_status(
                TaskState.TASK_STATE_WORKING,
                message=up.new_agent_message([new_text_part("reading sources")]),
            )
            await up.add_artifact([new_text_part("part one;")], artifact_id="r1", name="report")
            await up.add_artifact(
                [new_text_part("part two")], artifact_id="r1", name="report", append=True
            )
            await up.complete()
        else:
            if text == "wait":
                await asyncio.wait_for(self.gate.wait(), 30)
            await up.add_artifact([new_text_part(f"Findings on: {text}")], name="report")
            await up.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        assert task is not None
        self.cancels.append(task.id)
        await TaskUpdater(event_queue, task.id, task.context_id).cancel()


def make_card(
    base: str,
    *,
    name: str = "Research Specialist",
    description: str = "Performs multi-source research and returns a cited report.",
    skills: list[AgentSkill] | None = None,
    streaming: bool = True,
    binding: str = "JSONRPC",
    rpc_path: str = "/a2a/jsonrpc",
) -> AgentCard:
    """An A2A 1.0 card for an agent served at ``base``."""
    if skills is None:
        skills = [
            AgentSkill(
                id="deep-research",
                name="Deep research",
                description="Researches a topic across many sources and writes a cited report.",
                tags=["specialist", "research"],
                examples=["Summarize recent work on solid-state batteries"],
            )
        ]
    url = base + rpc_path if binding == "JSONRPC" else base
    return AgentCard(
        name=name,
        description=description,
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(protocol_binding=binding, protocol_version="1.0", url=url)
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )


@dataclass
class Agent:
    """A running test agent: its ASGI app, its executor and its (mutable) card."""

    app: ASGIApp
    executor: ScriptedExecutor
    card: AgentCard
    card_requests: int = 0


def _bearer_guard(app: ASGIApp, token: str, open_paths: set[str]) -> ASGIApp:
    async def guarded(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in open_paths:
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if headers.get("authorization") != f"Bearer {token}":
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def make_agent(
    base: str,
    *,
    card: AgentCard | None = None,
    legacy_card: dict[str, Any] | None = None,
    rpc_path: str = "/a2a/jsonrpc",
    rest: bool = False,
    bearer: str | None = None,
    **card_kw: Any,
) -> Agent:
    """A real a2a-sdk agent at ``base`` (JSON-RPC with 0.3 compatibility, or REST).

    ``legacy_card``: serve this v0.3 card (no ETag) instead of the SDK's card route.
    """
    if card is None:
        card_kw.setdefault("binding", "HTTP+JSON" if rest else "JSONRPC")
        card = make_card(base, rpc_path=rpc_path, **card_kw)
    executor = ScriptedExecutor()
    handler = DefaultRequestHandler(
        agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card
    )
    agent = Agent(app=None, executor=executor, card=card)  # type: ignore[arg-type]

    async def current_card(_: AgentCard) -> AgentCard:
        agent.card_requests += 1
        return agent.card

    routes: list[Any] = []
    if legacy_card is not None:

        async def legacy(_: Request) -> Response:
            agent.card_requests += 1
            return JSONResponse(legacy_card)

        routes.append(Route("/.well-known/agent-card.json", legacy))
    else:
        routes += create_agent_card_routes(card, card_modifier=current_card)
    if rest:
        routes += create_rest_routes(handler)
    else:
        routes += create_jsonrpc_routes(handler, rpc_url=rpc_path, enable_v0_3_compat=True)
    app: ASGIApp = Starlette(routes=routes)
    if bearer is not None:
        app = _bearer_guard(app, bearer, {"/.well-known/agent-card.json"})
    agent.app = app
    return agent


@dataclass
class Registry:
    """A registry listing served with an ETag; records the query strings it got."""

    listing: Any
    queries: list[str] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    def app(self) -> ASGIApp:
        async def agents(request: Request) -> Response:
            self.queries.append(request.url.query)
            body = json.dumps(self.listing, sort_keys=True)
            etag = f'"{hashlib.sha256(body.encode()).hexdigest()[:16]}"'
            if request.headers.get("if-none-match") == etag:
                self.statuses.append(304)
                return Response(status_code=304, headers={"ETag": etag})
            self.statuses.append(200)
            return Response(body, media_type="application/json", headers={"ETag": etag})

        return Starlette(routes=[Route("/agents", agents)])


@dataclass
class Hit:
    """One request the router handled."""

    method: str
    host: str
    path: str
    status: int | None
    if_none_match: str | None
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        """The request body as JSON."""
        return json.loads(self.body)


class Router(httpx.AsyncBaseTransport):
    """Routes requests by host to ASGI apps; an unknown host is unreachable (ConnectError)."""

    def __init__(self, hosts: dict[str, ASGIApp] | None = None) -> None:
        self.hosts: dict[str, ASGIApp] = dict(hosts or {})
        self.hits: list[Hit] = []

    def rpc_messages(self, host: str) -> list[dict[str, Any]]:
        """The ``params.message`` of every JSON-RPC request sent to ``host``."""
        out = []
        for h in self.hits:
            if h.host == host and h.method == "POST" and h.body.startswith(b"{"):
                body = h.json()
                if isinstance(body.get("params"), dict) and "message" in body["params"]:
                    out.append(body["params"]["message"])
        return out

    def card_hits(self, host: str) -> list[Hit]:
        """Requests for the agent card of ``host``."""
        return [h for h in self.hits if h.host == host and h.path.endswith("agent-card.json")]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        hit = Hit(
            request.method,
            host,
            request.url.path,
            None,
            request.headers.get("if-none-match"),
            dict(request.headers),
            await request.aread(),
        )
        self.hits.append(hit)
        app = self.hosts.get(host)
        if app is None:
            raise httpx.ConnectError(f"[Errno 111] Connection refused: {host}", request=request)
        response = await httpx.ASGITransport(app=app).handle_async_request(request)
        hit.status = response.status_code
        return response
