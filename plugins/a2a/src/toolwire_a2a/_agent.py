"""One remote agent: its card, its SDK clients, and the two tools it becomes."""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client, ClientCallContext
from a2a.client.transports.rest import RestTransport
from a2a.compat.v0_3.rest_transport import CompatRestTransport
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
)
from a2a.utils.constants import TransportProtocol

from toolwire import CallContext, ErrorKind, Tool, ToolAnnotations, ToolError

from ._cards import CardEntry, _clip, card_name, describe_card
from ._config import A2AConfig
from ._errors import _cause, map_error
from ._limits import capped_client
from ._results import INTERRUPTED, RUNNING, StreamAggregator, task_result

if TYPE_CHECKING:
    from toolwire import Kernel

__all__ = ["CALL_SCHEMA", "TASK_SCHEMA", "AgentHandle", "AgentSpec"]

log = logging.getLogger("toolwire.a2a")

#: A cancellation this close to the attempt's cut (its deadline or timeout) is the cut.
#: (Twice the clock's resolution where that is coarse: Windows' 15.6 ms.)
_CUT_TOLERANCE_S = max(0.01, 2 * time.get_clock_info("monotonic").resolution)
#: Upper bound of the CancelTask sent for an abandoned task (shutdown waits for it).
_ABANDON_CANCEL_S = 5.0
#: The longest progress note of a streamed call (one line).
_MAX_NOTE_CHARS = 300

CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "minLength": 1,
            "description": "What to ask or tell the agent, in natural language.",
        },
        "hands_off": {
            "type": "boolean",
            "default": False,
            "description": "false (default): wait for the agent's answer. true: hand the task "
            "over and return at once with its task_id; get the outcome later with the "
            "companion agent_<nickname>_task tool.",
        },
        "context_id": {
            "type": "string",
            "minLength": 1,
            "description": "Continue an earlier conversation with this agent (the context_id "
            "of an earlier result), e.g. to answer a question it asked.",
        },
        "task_id": {
            "type": "string",
            "minLength": 1,
            "description": "Reply to this interrupted task (input-required / auth-required). "
            "Optional: with context_id alone the interrupted task of that conversation is used.",
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task_id": {
            "type": "string",
            "minLength": 1,
            "description": "The task_id returned by the agent tool.",
        },
        "wait_s": {
            "type": "number",
            "minimum": 0,
            "default": 0,
            "description": "Wait up to this many seconds for the task to finish or to need "
            "input (0: answer at once).",
        },
        "cancel": {
            "type": "boolean",
            "default": False,
            "description": "Ask the agent to cancel the task instead.",
        },
    },
    "required": ["task_id"],
    "additionalProperties": False,
}

_BINDINGS = [TransportProtocol.JSONRPC.value, TransportProtocol.HTTP_JSON.value]
#: Hosts that name the machine itself: a card naming one is only reachable there.
_LOCAL_HOSTS = frozenset({"localhost", "0.0.0.0", "::", "::1"})
#: What a task id must not hold where HTTP+JSON puts it in the URL path (``/tasks/{id}``).
_UNSAFE_PATH_ID = re.compile(r"[/\\?#%\s\x00-\x1f\x7f]")
_INTERRUPTED_KEY = "a2a:interrupted:{agent}:{context}"
#: JSON-RPC errors meaning "that task cannot take this message": TaskNotFound,
#: UnsupportedOperation (terminal task), InvalidRequest, InvalidParams.
_STALE_TASK_CODES = frozenset({-32001, -32004, -32600, -32602})


@dataclass
class AgentSpec:
    """Where an agent is and how to talk to it (from the config or a registry listing)."""

    card_url: str
    origin: Literal["config", "registry"]
    nickname: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    context: dict[str, Any] = field(default_factory=dict)
    streaming: bool | None = None
    timeout_s: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: The agent entry's own ``max_answer_bytes`` (None: the global one).
    max_answer_bytes: int | None = None


# protobuf ships no type information; imported this way it is simply ``Any``.
_json_format: Any = importlib.import_module("google.protobuf.json_format")


def _to_dict(msg: Any) -> dict[str, Any]:
    """A protobuf message as its ProtoJSON dict (camelCase, enums by name)."""
    out: dict[str, Any] = _json_format.MessageToDict(msg)
    return out


def _attempt_limit(ctx: CallContext) -> float | None:
    """Seconds before the kernel cuts this attempt (its deadline or its timeout), or None.

    Measured from now; called as the attempt starts, so the attempt timeout applies whole.
    """
    tool = ctx.current_tool or ctx.tool
    timeout = ctx.attempt_timeout_s
    if timeout is None:
        timeout = tool.timeout_s if tool is not None else None
    if timeout is None:
        timeout = ctx.kernel.default_timeout_s
    left = ctx.time_left()
    if left is None:
        return timeout
    return left if timeout is None else min(left, timeout)


def _time_bounded(ctx: CallContext) -> bool:
    """Whether the kernel will cut this attempt: a deadline or any per-attempt timeout."""
    return _attempt_limit(ctx) is not None


class AgentHandle:
    """A remote agent offered as ``agent_<nickname>`` and ``agent_<nickname>_task``.

    Holds the agent's last known card, an ``httpx.AsyncClient`` for it, and
    two a2a-sdk clients built from the card (one streaming, one not). The
    tools are rebuilt only when the card or the nickname changes, so the
    kernel's catalog keeps the same ``Tool`` objects otherwise.
    """

    def __init__(
        self,
        spec: AgentSpec,
        config: A2AConfig,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self.spec = spec
        self.config = config
        self.entry: CardEntry | None = None
        self.nickname: str | None = spec.nickname
        self.status: Literal["unknown", "up", "down"] = "unknown"
        self.last_error: str | None = None
        self.tools: list[Tool] = []
        if spec.max_answer_bytes is None:
            limit, setting = config.max_answer_bytes, "[plugins.a2a] max_answer_bytes"
        else:
            limit = spec.max_answer_bytes
            setting = f"max_answer_bytes of the agent {spec.card_url} in [plugins.a2a] agents"
        self.limit, self.setting = limit, setting
        # every answer, card and event of this agent is capped at ``limit`` (see _limits)
        self.http = capped_client(
            limit=limit,
            setting=setting,
            transport=transport,
            headers=spec.headers,
            # waiting for a free connection (all busy with calls) is bounded like connecting
            timeout=httpx.Timeout(
                connect=config.request_timeout_s,
                read=None,
                write=60.0,
                pool=config.request_timeout_s,
            ),
        )
        self._plain: Client | None = None
        self._stream: Client | None = None
        self._built: tuple[dict[str, Any], str] | None = None
        self._unusable: str | None = None
        #: CancelTasks sent in the background for abandoned calls, each set when it ends
        self._cancelling: set[anyio.Event] = set()
        #: calls running on this agent's client; ``_retired``: close it when they end
        self._in_use = 0
        self._retired = False

    # ------------------------------------------------------------- setup
    @property
    def card_url(self) -> str:
        """The URL the card is read from (the agent's identity)."""
        return self.spec.card_url

    @property
    def streaming(self) -> bool:
        """Whether blocking calls use SendStreamingMessage (config and card agree)."""
        wanted = self.spec.streaming if self.spec.streaming is not None else self.config.streaming
        return bool(wanted and self.entry is not None and self.entry.card.capabilities.streaming)

    def set_card(self, entry: CardEntry, nickname: str) -> bool:
        """Adopt a (new) card under ``nickname``; True when the tools changed."""
        self.entry = entry
        if self._built == (entry.data, nickname):
            return False
        self._built = (entry.data, nickname)
        self.nickname = nickname
        self._plain = self._stream = None
        self._unusable = None
        try:
            self._plain = self._client(streaming=False)
            self._stream = self._client(streaming=True)
        except ValueError as exc:  # no transport we speak
            offered = sorted({i.protocol_binding for i in entry.card.supported_interfaces})
            self._unusable = (
                f"the card offers no transport toolwire can use (it offers "
                f"{', '.join(offered) or 'none'}; supported: {', '.join(_BINDINGS)}: {exc})"
            )
            self.last_error = self._unusable
            log.warning("plugin 'a2a': agent %r (%s): %s", nickname, self.card_url, self._unusable)
        self.tools = self._build_tools()
        return True

    def _client(self, *, streaming: bool) -> Client:
        assert self.entry is not None
        factory = ClientFactory(
            ClientConfig(
                httpx_client=self.http,
                streaming=streaming,
                supported_protocol_bindings=list(_BINDINGS),
            )
        )
        return factory.create(self.entry.card)

    def _build_tools(self) -> list[Tool]:
        assert self.entry is not None and self.nickname is not None
        card = self.entry.card
        nick = self.nickname
        tags = {"a2a"} | {t.lower() for s in card.skills for t in s.tags}
        source = f"a2a:{nick}"
        timeout = self.spec.timeout_s if self.spec.timeout_s is not None else self.config.timeout_s
        name = card_name(card)
        meta = {"agent": nick, "card_url": self.card_url, "agent_name": card.name}
        call = Tool(
            name=f"agent_{nick}",
            description=describe_card(card, nick, limit=self.config.max_description_chars),
            input_schema=copy.deepcopy(CALL_SCHEMA),
            executor=self.call,
            tags=frozenset(tags),
            source=source,
            annotations=ToolAnnotations(title=name, openWorldHint=True),
            timeout_s=timeout,
            settings={**self.spec.settings, "a2a": {**meta, "role": "call"}},
        )
        task = Tool(
            name=f"agent_{nick}_task",
            description=(
                f"Get the state and the outcome of a task handed to the A2A agent "
                f"{name!r} with agent_{nick} (hands_off=true); optionally wait for it "
                f"(wait_s) or cancel it."
            ),
            input_schema=copy.deepcopy(TASK_SCHEMA),
            executor=self.get_task,
            tags=frozenset({"a2a"}),
            source=source,
            # GetTask and CancelTask are idempotent: a read cut by a gateway's 502 or a
            # timeout may be repeated (the retry plugin reads this hint)
            annotations=ToolAnnotations(
                title=f"{name}: task", idempotentHint=True, openWorldHint=True
            ),
            settings={"a2a": {**meta, "role": "task"}},
        )
        return [call, task]

    async def retire(self) -> None:
        """Close the HTTP client once the calls running on it have ended (an agent that
        left the registry listing: its calls in flight still get their answers)."""
        self._retired = True
        if not self._in_use:
            await self.aclose()

    @contextlib.asynccontextmanager
    async def _using(self) -> AsyncIterator[None]:
        """Counts a call on this agent's client, which ``retire`` closes after the last."""
        if self._retired and not self._in_use:
            raise ToolError(
                f"agent {self.nickname!r} is no longer offered (it left the registry "
                "listing); find another agent for this",
                kind=ErrorKind.UNAVAILABLE,
                details={"agent": self.nickname},
            )
        self._in_use += 1
        try:
            yield
        finally:
            self._in_use -= 1
            if self._retired and not self._in_use:
                with anyio.CancelScope(shield=True):
                    await self.aclose()

    async def aclose(self) -> None:
        """Let the CancelTasks of abandoned calls finish (at most 5 s), close the HTTP client."""
        pending = list(self._cancelling)
        if pending:
            with anyio.move_on_after(_ABANDON_CANCEL_S):
                for done in pending:
                    await done.wait()
        await self.http.aclose()

    # --------------------------------------------------------- executors
    def _require(self, streaming: bool) -> Client:
        client = self._stream if streaming else self._plain
        if client is None:
            raise ToolError(
                f"agent {self.nickname!r}: {self._unusable or 'no usable endpoint in its card'}",
                kind=ErrorKind.UNAVAILABLE,
                details={"agent": self.nickname},
            )
        return client

    def _task_client(self, task_id: str, action: str) -> Client:
        """The client for ``GetTask`` / ``CancelTask`` of ``task_id``.

        Over HTTP+JSON the SDK puts the id in the URL path as it is (``/tasks/{id}``):
        ``../admin`` or ``x?y`` would send the request, with the agent's credentials, to
        another path of its host. Such an id is refused there (JSON-RPC carries it in
        the body, where any string is fine).
        """
        client = self._require(False)
        transport = getattr(client, "_transport", None)
        transport = getattr(transport, "_base", transport)  # under a tenant decorator
        if isinstance(transport, (RestTransport, CompatRestTransport)) and (
            task_id in (".", "..") or _UNSAFE_PATH_ID.search(task_id)
        ):
            raise ToolError(
                f"agent {self.nickname!r}: {action} {task_id!r}: this agent's HTTP+JSON "
                "binding puts the task id in the URL path, where '/', '\\', '?', '#', '%', "
                "spaces and control characters, or an id of '.' or '..', would reach "
                "another path of its host: pass the task_id an agent tool returned",
                kind=ErrorKind.INVALID_ARGS,
                details={"agent": self.nickname, "task_id": task_id, "reason": "unsafe_task_id"},
            )
        return client

    def _message(self, query: str, context_id: str | None, task_id: str | None) -> Message:
        msg = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text=query)])
        if context_id:
            msg.context_id = context_id
        if task_id:
            msg.task_id = task_id
        metadata = {**self.config.context, **self.spec.context}
        if metadata:
            msg.metadata.update(metadata)
        return msg

    async def call(self, args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        """``agent_<nickname>``: send ``query`` and return the answer (or the handed-off task)."""
        async with self._using():  # enters without a checkpoint: the attempt's cut stands
            return await self._call(args, ctx)

    async def _call(self, args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        # First, before anything awaits: the kernel armed the attempt's cut just before it
        # called this, and a cancellation near that time is taken for the cut.
        limit = _attempt_limit(ctx)
        cut_at = math.inf if limit is None else anyio.current_time() + limit
        nick = str(self.nickname)
        query: str = args["query"]
        hands_off = bool(args.get("hands_off", False))
        context_id: str | None = args.get("context_id")
        task_id: str | None = args.get("task_id")
        info: dict[str, Any] = {"agent": nick}
        ctx.meta.extra["a2a"] = info
        remembered = False
        try:
            if context_id and not task_id:
                task_id = await self._recall_interrupted(ctx.kernel, context_id)
                remembered = task_id is not None
            try:
                result = await self._send(query, hands_off, context_id, task_id, ctx, info)
            except ToolError as err:
                if not remembered or err.details.get("code") not in _STALE_TASK_CODES:
                    raise
                # The agent refused the remembered task before doing anything (it was
                # answered elsewhere, ended, or expired): send the message as a new task in
                # the context.
                task_id = None
                info.pop("task_id", None)
                await self._forget_interrupted(ctx.kernel, str(context_id))
                result = await self._send(query, hands_off, context_id, None, ctx, info)
        except anyio.get_cancelled_exc_class():
            # ``task_id``: the interrupted task the message answered, which the caller
            # knows (its id came with the interrupted result): not this call's to cancel.
            started = info.get("task_id") != task_id
            if started and not hands_off and anyio.current_time() < cut_at - _CUT_TOLERANCE_S:
                self._cancel_abandoned(info, ctx.kernel)
            raise
        await self._remember(ctx.kernel, result, answered=task_id)
        return result

    def _cancel_abandoned(self, info: dict[str, Any], kernel: Kernel) -> None:
        """CancelTask, in the background, for the task of a blocking call its caller cancelled.

        The caller never sees the result (nor its task id), and a replay of the call
        starts a new task: the abandoned one would only spend the agent's work. A call cut
        by its deadline or timeout is not abandoned: its error carries the task id. The
        request runs in a kernel background task, so the cancellation goes on at once (a
        gateway's client gets its ``cancelled`` answer without waiting for the agent);
        the plugin's shutdown waits for it (at most 5 s).
        """
        task_id = info.get("task_id")
        if not task_id or not self.config.cancel_abandoned:
            return
        done = anyio.Event()
        self._cancelling.add(done)
        kernel.spawn(self._send_cancel, str(task_id), done, name=f"a2a: cancel task {task_id}")

    async def _send_cancel(self, task_id: str, done: anyio.Event) -> None:
        """CancelTask for ``task_id``, bounded by ``request_timeout_s`` (at most 5 s);
        a failure is logged."""
        nick = str(self.nickname)
        bound = min(self.config.request_timeout_s, _ABANDON_CANCEL_S)
        try:
            with anyio.move_on_after(bound) as scope:
                try:
                    client = self._task_client(task_id, "canceling task")
                    await client.cancel_task(
                        CancelTaskRequest(id=task_id), context=ClientCallContext(timeout=bound)
                    )
                except Exception as exc:
                    err = map_error(exc, nick, f"canceling task {task_id!r}")
                    if err.kind == ErrorKind.CONFLICT:  # not cancelable: it had already ended
                        log.debug(
                            "plugin 'a2a': agent %r: task %s had ended: %s", nick, task_id, err
                        )
                    else:
                        log.warning(
                            "plugin 'a2a': agent %r: the call was cancelled, and canceling its "
                            "task %s failed too: %s; the agent may still be working on it",
                            nick,
                            task_id,
                            err,
                        )
                    return
            if scope.cancelled_caught:
                log.warning(
                    "plugin 'a2a': agent %r: the call was cancelled, and canceling its task %s "
                    "took over %.3g s; the agent may still be working on it",
                    nick,
                    task_id,
                    bound,
                )
                return
            log.info(
                "plugin 'a2a': agent %r: the call was cancelled: canceled its task %s",
                nick,
                task_id,
            )
        finally:
            done.set()
            self._cancelling.discard(done)

    async def _send(
        self,
        query: str,
        hands_off: bool,
        context_id: str | None,
        task_id: str | None,
        ctx: CallContext,
        info: dict[str, Any],
    ) -> dict[str, Any]:
        nick = str(self.nickname)
        streaming = self.streaming and not hands_off
        # A blocking call without a stream learns the task id only with the final answer:
        # cut by its deadline or its attempt timeout, it would lose the task. With either
        # it is sent to return at once and the task is polled, so the id is known at once.
        poll = not streaming and not hands_off and _time_bounded(ctx)
        client = self._require(streaming)
        request = SendMessageRequest(
            message=self._message(query, context_id, task_id),
            configuration=SendMessageConfiguration(return_immediately=hands_off or poll),
        )
        call_ctx = (
            ClientCallContext(timeout=self.config.request_timeout_s) if hands_off or poll else None
        )
        # an answer that comes at once comes whole within request_timeout_s (the SDK's
        # timeout bounds each read only)
        bound = self.config.request_timeout_s if hands_off or poll else None
        agg = StreamAggregator(self.limit, self.setting)
        action = "sending the message" + (" (hands-off)" if hands_off else "")
        try:
            # closed on every way out (a cancelled call too), not when it is collected: an
            # open stream holds its connection
            with anyio.fail_after(bound):
                async with _closing(client.send_message(request, context=call_ctx)) as events:
                    async for event in events:
                        note = agg.apply(_to_dict(event))
                        if agg.task_id:
                            info["task_id"] = agg.task_id
                        if agg.context_id:
                            info["context_id"] = agg.context_id
                        if streaming and note:
                            # a note, not the answer: the agent's status text is the
                            # agent's to size, and goes to the caller on every event
                            note = _clip(f"{nick}: {note}", _MAX_NOTE_CHARS)
                            await ctx.report_progress(float(agg.events), None, note)
                        if agg.state not in RUNNING:
                            # the answer is complete (a reply, a task ended or
                            # interrupted): a stream left open after it (a proxy's
                            # keep-alives) would hold the result until the call's cut
                            break
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            if bound is not None and isinstance(exc, TimeoutError):
                raise self._too_slow(action, sent=True) from exc
            err = self._fail(exc, action)
            if err.details.get("answer_too_large") and agg.task_id:
                # the agent took the task before an event grew too large: say which
                raise ToolError(
                    f"{err}; the agent had taken the task {agg.task_id!r}",
                    kind=err.kind,
                    details={**err.details, "task_id": agg.task_id, "context_id": agg.context_id},
                ) from exc
            if not (
                streaming
                and agg.task_id
                and err.kind == ErrorKind.UNAVAILABLE
                and "status" not in err.details
            ):
                raise err from exc
            # The connection broke after the agent took the task: it may have finished it
            # (its artifacts are on the agent's side), so read the task rather than fail.
            return await self._after_broken_stream(agg, err)
        self.status, self.last_error = "up", None
        if streaming and agg.task_id and agg.state in RUNNING:
            # The stream ended before the task did (connection dropped): read its state,
            # keeping what the stream delivered, as after a stream that broke.
            ended = ToolError(
                f"agent {nick!r}: {action}: the stream ended before the task did",
                kind=ErrorKind.UNAVAILABLE,
                details={"agent": nick},
            )
            return await self._after_broken_stream(agg, ended)
        if poll and agg.task_id and agg.state in RUNNING:
            return await self._until_settled(agg.task_id, agg.context_id, agg.state)
        try:
            result = agg.result(nick)
        except ValueError as exc:
            raise ToolError(
                f"agent {nick!r}: {action}: {exc}; it may or may not have acted on the "
                "message: check with the agent before sending it again, and that the URL "
                "in [[plugins.a2a.agents]] is its A2A endpoint",
                details={"agent": nick, "reason": "empty_answer"},
            ) from exc
        return self._check_outcome(result)

    async def _after_broken_stream(self, agg: StreamAggregator, err: ToolError) -> dict[str, Any]:
        """The task's outcome after its stream broke; if it cannot be read, an error that
        keeps what the stream delivered and says how to get the rest."""
        nick = str(self.nickname)
        task_id = str(agg.task_id)
        try:
            task = await self._get(task_id, "reading the task after its stream broke")
        except ToolError as again:
            got = agg.result(nick)
            details: dict[str, Any] = {
                **err.details,
                "task_id": task_id,
                "context_id": agg.context_id,
                "state": got["state"],
                "artifacts": got["artifacts"],
                "partial_text": got["text"],
            }
            details["in_flight"] = True  # the agent has the message: not to be sent again
            raise ToolError(
                f"{err}; the agent had already taken the task {task_id!r} (state "
                f"{got['state']!r}, {len(got['artifacts'])} artifact(s) received: in details) "
                f"and reading it failed too ({again}); do not send the message again: get its "
                f"outcome later with agent_{nick}_task and task_id={task_id!r}",
                kind=err.kind,
                retry_after_s=err.retry_after_s,
                details=details,
            ) from again
        log.warning(
            "plugin 'a2a': agent %r: the stream of task %s broke (%s); read the task instead",
            nick,
            task_id,
            err,
        )
        result = task_result(nick, _to_dict(task))
        if not result.get("artifacts"):
            # an agent that streams its artifacts need not keep them: what the stream
            # delivered is the computed result, not to be dropped for the task's copy
            got = agg.result(nick)
            if got["artifacts"]:
                result["artifacts"] = got["artifacts"]
                result["text"] = got["text"]  # the artifacts' text, as when they come whole
        return self._check_outcome(result)

    def _check_outcome(self, result: dict[str, Any], *, cancel_ok: bool = False) -> dict[str, Any]:
        """Raise for tasks that ended badly; return the others."""
        state = result["state"]
        if state in ("failed", "rejected") or (state == "canceled" and not cancel_ok):
            # The reason is the agent's status message; ``text`` holds the artifacts' text
            # when there are artifacts, which is what the agent produced, not why it stopped.
            artifacts = result.get("artifacts") or []
            produced = "\n\n".join(a["text"] for a in artifacts if "text" in a)
            # Without artifact text, ``text`` is the status message (task_result's fallback).
            said = result.get("status_message") or (None if produced else result.get("text"))
            verb = {"failed": "failed", "rejected": "rejected", "canceled": "canceled"}[state]
            details: dict[str, Any] = {
                "agent": result["agent"],
                "state": state,
                "task_id": result.get("task_id"),
                "context_id": result.get("context_id"),
            }
            if artifacts:  # what the agent produced before it stopped is kept
                details["artifacts"] = artifacts
                details["partial_text"] = produced
            kept = (
                f" (it produced {len(artifacts)} artifact(s) first: in details)"
                if artifacts
                else ""
            )
            raise ToolError(
                f"agent {result['agent']!r} {verb} the task: {said or 'no reason given'}{kept}",
                kind=ErrorKind.TOOL_ERROR,
                details=details,
            )
        return result

    async def _task_outcome(self, task: Task, *, cancel_ok: bool = False) -> dict[str, Any]:
        return self._check_outcome(
            task_result(str(self.nickname), _to_dict(task)), cancel_ok=cancel_ok
        )

    async def _get(self, task_id: str, action: str) -> Task:
        client = self._task_client(task_id, action)
        try:
            with anyio.fail_after(self.config.request_timeout_s):  # the whole answer
                task = await client.get_task(
                    GetTaskRequest(id=task_id),
                    context=ClientCallContext(timeout=self.config.request_timeout_s),
                )
        except anyio.get_cancelled_exc_class():
            raise
        except TimeoutError as exc:
            raise self._too_slow(f"{action} {task_id!r}") from exc
        except Exception as exc:
            raise self._fail(exc, f"{action} {task_id!r}") from exc
        self.status, self.last_error = "up", None
        return task

    async def get_task(self, args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        """``agent_<nickname>_task``: the task's state and outcome; optionally wait or cancel."""
        async with self._using():
            return await self._get_task(args, ctx)

    async def _get_task(self, args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        nick = str(self.nickname)
        task_id: str = args["task_id"]
        ctx.meta.extra["a2a"] = {"agent": nick, "task_id": task_id}
        if args.get("cancel"):
            client = self._task_client(task_id, "canceling task")
            try:
                with anyio.fail_after(self.config.request_timeout_s):  # the whole answer
                    task = await client.cancel_task(
                        CancelTaskRequest(id=task_id),
                        context=ClientCallContext(timeout=self.config.request_timeout_s),
                    )
            except anyio.get_cancelled_exc_class():
                raise
            except TimeoutError as exc:
                raise self._too_slow(f"canceling task {task_id!r}", sent=True) from exc
            except Exception as exc:
                raise self._fail(exc, f"canceling task {task_id!r}") from exc
            return await self._task_outcome(task, cancel_ok=True)
        wait_s = float(args.get("wait_s") or 0.0)
        wait_s = min(wait_s, self.config.max_wait_s) if math.isfinite(wait_s) else 0.0
        limit = _attempt_limit(ctx)
        start = anyio.current_time()
        # a read still running this close to the kernel's cut is given up for the state read
        # before it, so the call answers with that state rather than a timeout (the margin
        # leaves a busy machine time to write the answer)
        cut_at = math.inf if limit is None else start + limit - min(0.5, limit / 4)
        if limit is not None:  # stop waiting in time to answer with the state, not a timeout
            wait_s = min(wait_s, max(0.0, limit - min(1.0, limit / 5)))
        deadline = start + wait_s
        task = await self._get(task_id, "reading task")
        polls = 0
        while True:
            data = _to_dict(task)
            state = task_result(nick, data)["state"]
            left = deadline - anyio.current_time()
            if state not in RUNNING or left <= 0:
                break
            polls += 1
            await ctx.report_progress(float(polls), None, f"{nick}: task {state}")
            await anyio.sleep(min(self.config.poll_interval_s, left))
            with anyio.move_on_after(cut_at - anyio.current_time()) as read:
                task = await self._get(task_id, "reading task")
            if read.cancelled_caught:
                break  # a slow agent: the state read last stands
        result = await self._task_outcome(task)
        await self._remember(ctx.kernel, result)
        return result

    async def _until_settled(
        self, task_id: str, context_id: str | None, state: str
    ) -> dict[str, Any]:
        """Poll ``task_id`` until it is done or interrupted (the caller's deadline bounds it).

        A read that fails is the call's error, saying that the agent has the task (its
        ``task_id``, ``details.in_flight``): sending the message again would start a
        second task, so neither the retry plugin nor the caller should.
        """
        nick = str(self.nickname)
        while True:
            await anyio.sleep(self.config.poll_interval_s)
            try:
                task = await self._get(task_id, "reading the task")
            except ToolError as err:
                raise ToolError(
                    f"{err}; the agent had already taken the task {task_id!r} (state "
                    f"{state!r}): do not send the message again: get its outcome later with "
                    f"agent_{nick}_task and task_id={task_id!r}",
                    kind=err.kind,
                    retry_after_s=err.retry_after_s,
                    details={
                        **err.details,
                        "task_id": task_id,
                        "context_id": context_id,
                        "state": state,
                        "in_flight": True,
                    },
                ) from err
            result = task_result(nick, _to_dict(task))
            state = result["state"]
            if result["done"] or result["interrupted"]:
                return self._check_outcome(result)

    def _too_slow(self, action: str, *, sent: bool = False) -> ToolError:
        """The ``timeout`` error of a request that answers at once, not answered whole
        within ``request_timeout_s``; ``sent``: the request may have taken effect."""
        nick = str(self.nickname)
        acted = (
            " It may have taken effect on the agent's side: check before sending it again."
            if sent
            else ""
        )
        err = ToolError(
            f"agent {nick!r}: {action}: no complete answer within request_timeout_s = "
            f"{self.config.request_timeout_s:g}s (the agent is slow, or sends its answer "
            f"slowly); try again later, or raise plugins.a2a.request_timeout_s.{acted}",
            kind=ErrorKind.TIMEOUT,
            details={"agent": nick, "request_timeout_s": self.config.request_timeout_s},
        )
        self.last_error = str(err)
        return err

    def _endpoint(self) -> str | None:
        """The URL calls go to: the endpoint the card names (not the card's URL)."""
        transport = getattr(self._plain, "_transport", None)
        transport = getattr(transport, "_base", transport)  # under a tenant decorator
        url = getattr(transport, "url", None)
        return url if isinstance(url, str) else None

    def _unreachable(self, err: ToolError) -> ToolError:
        """``err`` (no connection to the endpoint) naming the endpoint the card names, and
        saying so when that is an address of the agent's own machine (``localhost``,
        ``0.0.0.0``) while the card came from elsewhere: a card published with the
        agent's bind address, which no other machine reaches."""
        endpoint = self._endpoint()
        if endpoint is None:
            return err
        host, card_host = httpx.URL(endpoint).host, httpx.URL(self.card_url).host
        local = host in _LOCAL_HOSTS or host.startswith("127.")
        hint = (
            f"; the card (read from {card_host}) names an address of the agent's own "
            "machine, which toolwire cannot reach there: the agent's owner should publish "
            "its reachable URL in the card's supportedInterfaces"
            if local and card_host != host
            else ""
        )
        return ToolError(
            f"{err} (the endpoint its card names: {endpoint}{hint})",
            kind=err.kind,
            retry_after_s=err.retry_after_s,
            details={**err.details, "endpoint": endpoint},
        )

    def _fail(self, exc: BaseException, action: str) -> ToolError:
        """The ToolError for ``exc``; remembers whether the agent looked down."""
        err = map_error(exc, str(self.nickname), action)
        if isinstance(_cause(exc, httpx.ConnectError), httpx.ConnectError):
            err = self._unreachable(err)
        self.last_error = str(err)
        if err.kind == ErrorKind.UNAVAILABLE:
            self.status = "down"
        return err

    # ------------------------------------------------ interrupted tasks
    def _key(self, context_id: str) -> str:
        return _INTERRUPTED_KEY.format(agent=self.nickname, context=context_id)

    async def _recall_interrupted(self, kernel: Kernel, context_id: str) -> str | None:
        try:
            value = await kernel.state.get(self._key(context_id))
        except Exception as exc:  # state trouble must not fail the call
            log.warning("plugin 'a2a': cannot read interrupted tasks from the state store: %s", exc)
            return None
        return value if isinstance(value, str) and value else None

    async def _forget_interrupted(self, kernel: Kernel, context_id: str) -> None:
        try:
            await kernel.state.delete(self._key(context_id))
        except Exception as exc:
            log.warning("plugin 'a2a': cannot update the state store: %s", exc)

    async def _remember(
        self, kernel: Kernel, result: dict[str, Any], *, answered: str | None = None
    ) -> None:
        """Keep the interrupted task of a conversation, so context_id alone continues it.

        A result that is not interrupted forgets the conversation's task only when it is
        that task (``result``'s, or ``answered``: the one the message was sent to): another
        task of the same conversation that ended (a hands-off one read with
        ``agent_<nickname>_task``) leaves the interrupted one waiting for its answer.
        """
        context_id, task_id = result.get("context_id"), result.get("task_id")
        if not context_id:
            return
        key = self._key(context_id)
        try:
            if result["state"] in INTERRUPTED and task_id:
                await kernel.state.set(key, task_id, ttl=self.config.interrupted_ttl_s)
            else:
                held = await kernel.state.get(key)
                if held is not None and held in (task_id, answered):
                    await kernel.state.delete(key)
        except Exception as exc:
            log.warning("plugin 'a2a': cannot update the state store: %s", exc)


@contextlib.asynccontextmanager
async def _closing(events: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """``events``, closed (``aclose``, when it has one) however the block is left."""
    try:
        yield events
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
