"""A2A tasks, messages and stream events (ProtoJSON dicts) -> toolwire result content."""

from __future__ import annotations

import json
import math
from typing import Any

from ._limits import AnswerTooLarge

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


def _size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON in UTF-8: what keeping it costs, near enough."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


class StreamAggregator:
    """Folds ``SendStreamingMessage`` events into the final task (or message).

    Events are ProtoJSON dicts of ``StreamResponse``: ``{"task": ...}``,
    ``{"message": ...}``, ``{"statusUpdate": ...}`` or ``{"artifactUpdate": ...}``.

    What it keeps (the task, its status and artifacts, the message; ``kept``, in bytes
    as compact JSON) is bounded by ``limit`` (the agent's ``max_answer_bytes``, named
    by ``setting``): each event is capped as it arrives, but a stream of many events
    would otherwise add up without bound. Past it, ``apply`` raises ``AnswerTooLarge``.
    """

    def __init__(self, limit: int | None = None, setting: str = "max_answer_bytes") -> None:
        self.task: dict[str, Any] | None = None
        self.message: dict[str, Any] | None = None
        self.events = 0
        self.limit = limit
        self.setting = setting
        #: bytes kept: the task without artifacts and status, its status, the message,
        #: and each artifact (``_art_sizes``, by position in the task's artifact list)
        self.kept = 0
        self._base = self._status = self._message = 0
        self._art_sizes: list[int] = []
        self._arts = 0  # sum(_art_sizes), kept up to date
        self._art_at: dict[str, int] = {}  # artifactId -> position in the task's list

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
            self._set_task({"id": ev.get("taskId", ""), "contextId": ev.get("contextId", "")})
        assert self.task is not None
        return self.task

    def _set_task(self, task: dict[str, Any]) -> None:
        """Keep ``task`` (a new dict): its artifacts copied, so that appends extend them."""
        arts = [self._own(a) for a in task.get("artifacts") or [] if isinstance(a, dict)]
        if arts or "artifacts" in task:
            task["artifacts"] = arts
        self.task = task
        self._base = _size({k: v for k, v in task.items() if k not in ("artifacts", "status")})
        self._status = _size(task.get("status") or {})
        self._art_sizes = [_size(a) for a in arts]
        self._arts = sum(self._art_sizes)
        self._art_at = {}
        for i, art in enumerate(arts):
            if art.get("artifactId"):
                self._art_at.setdefault(art["artifactId"], i)  # the first one, as before

    @staticmethod
    def _own(art: dict[str, Any]) -> dict[str, Any]:
        return {**art, "parts": list(art.get("parts") or [])}

    def _count(self) -> None:
        self.kept = self._base + self._status + self._message + self._arts
        if self.limit is not None and self.kept > self.limit:
            raise AnswerTooLarge(self.limit, self.setting, kept=True)

    def apply(self, event: dict[str, Any]) -> str | None:
        """Fold one event in; returns a short progress note, or None.

        Raises ``AnswerTooLarge`` when what is kept grows past ``limit``.
        """
        self.events += 1
        if "task" in event:
            self._set_task(dict(event["task"]))
            self._count()
            return f"task {self.state}"
        if "message" in event:
            self.message = event["message"]
            self._message = _size(self.message)
            self._count()
            return "reply received"
        if "statusUpdate" in event:
            su = event["statusUpdate"]
            task = self._ensure_task(su)
            task["status"] = su.get("status") or {}
            self._status = _size(task["status"])
            self._count()
            note = _message_text(task["status"].get("message"))
            return self.state + (f": {note}" if note else "")
        if "artifactUpdate" in event:
            au = event["artifactUpdate"]
            task = self._ensure_task(au)
            art = self._own(au.get("artifact") or {})
            arts: list[dict[str, Any]] = task.setdefault("artifacts", [])
            key = art.get("artifactId")
            at = self._art_at.get(key) if key else None
            if at is None:
                arts.append(art)
                self._art_sizes.append(0)
                at = len(arts) - 1
                if key:
                    self._art_at[key] = at
                size = _size(art)
            elif au.get("append"):  # extended in place: no copy of what came before
                added = art["parts"]
                arts[at].setdefault("parts", []).extend(added)
                size = self._art_sizes[at] + _size(added)
            else:
                arts[at] = art
                size = _size(art)
            self._arts += size - self._art_sizes[at]
            self._art_sizes[at] = size
            self._count()
            return f"artifact {art.get('name') or art.get('artifactId') or ''}".rstrip()
        return None

    def result(self, agent: str) -> dict[str, Any]:
        """The result content for what was received (raises ValueError when nothing was)."""
        if self.task is not None:
            return task_result(agent, self.task)
        if self.message is not None:
            return message_result(agent, self.message)
        raise ValueError("the agent's answer contained neither a task nor a message")
