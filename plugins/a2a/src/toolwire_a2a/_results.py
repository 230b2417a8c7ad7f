"""A2A tasks, messages and stream events (ProtoJSON dicts) -> toolwire result content."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "EXACT_INT",
    "INTERRUPTED",
    "RUNNING",
    "TERMINAL",
    "StreamAggregator",
    "message_result",
    "restore_ints",
    "state_name",
    "task_result",
]

TERMINAL = frozenset({"completed", "failed", "canceled", "rejected"})
INTERRUPTED = frozenset({"input-required", "auth-required"})
RUNNING = frozenset({"submitted", "working", "unknown"})


def state_name(raw: Any) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` (1.0) or ``input-required`` (0.3) -> ``input-required``."""
    if not isinstance(raw, str) or not raw or raw == "TASK_STATE_UNSPECIFIED":
        return "unknown"
    name = raw.removeprefix("TASK_STATE_").lower().replace("_", "-")
    return "canceled" if name == "cancelled" else name


#: Every integer up to this magnitude is exactly a double; past it doubles skip integers.
EXACT_INT = 2**53


def restore_ints(value: Any) -> Any:
    """``value`` with its integral numbers as ``int`` again, in nested dicts and lists.

    A data part travels as a ``google.protobuf.Value``, whose numbers are all
    doubles: the ``{"count": 3}`` an agent sends arrives as ``{"count": 3.0}``.
    A float that is integral and at most 2**53 in magnitude becomes an ``int``;
    a fraction, a larger number (already rounded on the way: it stays the
    float it arrived as), ``-0.0``, NaN and infinities stay floats. Booleans
    are their own kind of ``Value`` and come back as booleans.
    """
    if type(value) is float:
        if (
            value.is_integer()
            and abs(value) <= EXACT_INT
            and not (value == 0 and math.copysign(1.0, value) < 0)
        ):
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: restore_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_ints(v) for v in value]
    return value


def _parts(parts: Any) -> tuple[list[str], list[Any], list[dict[str, Any]]]:
    """(texts, data values, files) of a list of A2A parts."""
    texts: list[str] = []
    data: list[Any] = []
    files: list[dict[str, Any]] = []
    if not isinstance(parts, list):
        return texts, data, files
    for p in parts:
        if not isinstance(p, dict):
            continue
        if isinstance(p.get("text"), str):
            texts.append(p["text"])
        elif "data" in p:
            data.append(restore_ints(p["data"]))
        elif "url" in p or "raw" in p:
            f: dict[str, Any] = {}
            if p.get("filename"):
                f["name"] = p["filename"]
            if p.get("mediaType"):
                f["media_type"] = p["mediaType"]
            if "url" in p:
                f["url"] = p["url"]
            else:  # whatever its size: the agent produced it and nothing else holds it
                f["base64"] = p.get("raw") or ""
            files.append(f)
    return texts, data, files


def _message_text(msg: Any) -> str:
    if not isinstance(msg, dict):
        return ""
    return "\n".join(_parts(msg.get("parts"))[0])


def _artifacts(task: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for a in task.get("artifacts") or []:
        if not isinstance(a, dict):
            continue
        texts, data, files = _parts(a.get("parts"))
        item: dict[str, Any] = {"name": a.get("name") or a.get("artifactId") or "artifact"}
        if a.get("description"):
            item["description"] = a["description"]
        if texts:
            item["text"] = "\n".join(texts)
        if data:
            item["data"] = data
        if files:
            item["files"] = files
        out.append(item)
    return out


def _next_step(agent: str, state: str, task_id: str | None, context_id: str | None) -> str | None:
    if state in INTERRUPTED:
        what = "your answer" if state == "input-required" else "the credentials it asks for"
        return (
            f"the agent is waiting for {what}: call agent_{agent} again with query=<answer> "
            f"and context_id={context_id!r}"
        )
    if state in RUNNING and task_id:
        return (
            f"the task is still running: call agent_{agent}_task with task_id={task_id!r} "
            f"(and wait_s to wait for it)"
        )
    if state == "completed" and context_id:
        return f"to follow up in the same conversation pass context_id={context_id!r}"
    return None


def task_result(agent: str, task: dict[str, Any]) -> dict[str, Any]:
    """The result content for a task (ProtoJSON dict, 1.0 shape).

    ``text`` is the answer: the artifacts' text when there is any, else the
    agent's status message (the question when the task is interrupted), else
    the last agent message of the history.
    """
    status = task.get("status") or {}
    state = state_name(status.get("state"))
    artifacts = _artifacts(task)
    status_text = _message_text(status.get("message"))
    text = "\n\n".join(a["text"] for a in artifacts if "text" in a)
    if state in INTERRUPTED or not text:
        text = status_text or text
    if not text:
        for m in reversed(task.get("history") or []):
            if isinstance(m, dict) and m.get("role") in ("ROLE_AGENT", "agent"):
                text = _message_text(m)
                break
    task_id = task.get("id") or None
    context_id = task.get("contextId") or None
    out: dict[str, Any] = {
        "agent": agent,
        "state": state,
        "done": state in TERMINAL,
        "interrupted": state in INTERRUPTED,
        "text": text,
        "artifacts": artifacts,
        "task_id": task_id,
        "context_id": context_id,
    }
    if status_text and status_text != text:
        out["status_message"] = status_text
    hint = _next_step(agent, state, task_id, context_id)
    if hint:
        out["next"] = hint
    return out


def message_result(agent: str, message: dict[str, Any]) -> dict[str, Any]:
    """The result content for a direct message reply (no task: the exchange is complete)."""
    texts, data, files = _parts(message.get("parts"))
    artifacts: list[dict[str, Any]] = []
    if data or files:
        item: dict[str, Any] = {"name": "message"}
        if data:
            item["data"] = data
        if files:
            item["files"] = files
        artifacts.append(item)
    context_id = message.get("contextId") or None
    out: dict[str, Any] = {
        "agent": agent,
        "state": "completed",
        "done": True,
        "interrupted": False,
        "text": "\n".join(texts),
        "artifacts": artifacts,
        "task_id": message.get("taskId") or None,
        "context_id": context_id,
    }
    hint = _next_step(agent, "completed", None, context_id)
    if hint:
        out["next"] = hint
    return out


class StreamAggregator:
    """Folds ``SendStreamingMessage`` events into the final task (or message).

    Events are ProtoJSON dicts of ``StreamResponse``: ``{"task": ...}``,
    ``{"message": ...}``, ``{"statusUpdate": ...}`` or ``{"artifactUpdate": ...}``.
    """

    def __init__(self) -> None:
        self.task: dict[str, Any] | None = None
        self.message: dict[str, Any] | None = None
        self.events = 0

    @property
    def task_id(self) -> str | None:
        """The task's id, once known."""
        return (self.task or {}).get("id") or None

    @property
    def context_id(self) -> str | None:
        """The conversation's id, once known."""
        src = self.task or self.message or {}
        return src.get("contextId") or None

    @property
    def state(self) -> str:
        """The task's state so far (``completed`` for a message reply)."""
        if self.message is not None and self.task is None:
            return "completed"
        return state_name(((self.task or {}).get("status") or {}).get("state"))

    def _ensure_task(self, ev: dict[str, Any]) -> dict[str, Any]:
        if self.task is None:
            self.task = {"id": ev.get("taskId", ""), "contextId": ev.get("contextId", "")}
        return self.task

    def apply(self, event: dict[str, Any]) -> str | None:
        """Fold one event in; returns a short progress note, or None."""
        self.events += 1
        if "task" in event:
            self.task = dict(event["task"])
            return f"task {self.state}"
        if "message" in event:
            self.message = event["message"]
            return "reply received"
        if "statusUpdate" in event:
            su = event["statusUpdate"]
            task = self._ensure_task(su)
            task["status"] = su.get("status") or {}
            note = _message_text(task["status"].get("message"))
            return self.state + (f": {note}" if note else "")
        if "artifactUpdate" in event:
            au = event["artifactUpdate"]
            task = self._ensure_task(au)
            art = dict(au.get("artifact") or {})
            arts: list[dict[str, Any]] = list(task.get("artifacts") or [])
            for i, old in enumerate(arts):
                if old.get("artifactId") and old.get("artifactId") == art.get("artifactId"):
                    if au.get("append"):
                        merged = dict(old)
                        merged["parts"] = [*(old.get("parts") or []), *(art.get("parts") or [])]
                        arts[i] = merged
                    else:
                        arts[i] = art
                    break
            else:
                arts.append(art)
            task["artifacts"] = arts
            return f"artifact {art.get('name') or art.get('artifactId') or ''}".rstrip()
        return None

    def result(self, agent: str) -> dict[str, Any]:
        """The result content for what was received (raises ValueError when nothing was)."""
        if self.task is not None:
            return task_result(agent, self.task)
        if self.message is not None:
            return message_result(agent, self.message)
        raise ValueError("the agent's answer contained neither a task nor a message")
