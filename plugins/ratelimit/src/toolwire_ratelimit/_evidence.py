"""Gather what a failure says about itself, from any source, within fixed bounds.

Sources, outermost first: the ``ErrorInfo`` (message, ``details``), then the
exception and its whole cause chain (``__cause__``, else ``__context__``;
exception groups too). From each: the message, the class names (with their
bases), an HTTP status, headers and a body where one is known:

- ``ToolError(..., status=429, details={"headers": {...}, "body": ...})`` (the
  documented way for a tool to report an HTTP failure);
- ``httpx.HTTPStatusError`` and anything shaped like it (``exc.response`` with
  ``status_code``, ``headers``, ``content``) — duck-typed, httpx is never imported;
- ``exc.status_code`` / ``exc.status`` / ``exc.headers`` / ``exc.body``
  (aiohttp, openai-style SDK errors);
- remote error results of the MCP plugin (``details["remote_text"]``,
  ``details["remote_structured_content"]``).

Bounds: at most 16 exceptions, 64 headers of 512 characters, 2 KiB per message
and ``max_body`` bytes of body. A body that is bytes is decoded (invalid UTF-8
is replaced, never an error); a body that is already JSON (dict/list) is
serialized compactly up to the bound, at most 32 levels deep; a text body that
fits the bound and looks like JSON is parsed (deep nesting gives up quietly).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolwire import ErrorInfo, ToolError

__all__ = ["Evidence", "gather", "json_excerpt"]

MAX_CHAIN = 16
MAX_HEADERS = 64
MAX_HEADER_VALUE = 512
MAX_MESSAGE = 2048
MAX_JSON_DEPTH = 32
BODY_KEYS = ("body", "response_body", "remote_text", "remote_structured_content", "error_body")
_SKIP_BASES = frozenset({"object", "BaseException", "Exception"})


@dataclass(slots=True)
class Evidence:
    """The bounded facts classification works on."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    body_text: str = ""
    body_json: Any = None
    exc_names: set[str] = field(default_factory=set)
    declared_kind: str | None = None
    declared_retry_after: float | None = None
    provider: str | None = None
    _text: str | None = None

    @property
    def text(self) -> str:
        """What regular expressions search: the messages and the body excerpt."""
        if self._text is None:
            self._text = "\n".join([*self.messages, self.body_text])
        return self._text


class _Full(Exception):
    pass


def json_excerpt(obj: Any, limit: int) -> str:
    """Compact JSON text of ``obj``, cut at ``limit`` characters and 32 levels.

    Never raises (cycles and odd objects included) and never does more work
    than the limit needs.
    """
    out: list[str] = []
    size = 0

    def w(s: str) -> None:
        nonlocal size
        out.append(s)
        size += len(s)
        if size >= limit:
            raise _Full

    def rec(o: Any, depth: int) -> None:
        if depth > MAX_JSON_DEPTH:
            w('"..."')
            return
        if isinstance(o, Mapping):
            w("{")
            for i, (k, v) in enumerate(o.items()):
                if i:
                    w(",")
                w(json.dumps(str(k)[:limit]))
                w(":")
                rec(v, depth + 1)
            w("}")
        elif isinstance(o, (list, tuple)):
            w("[")
            for i, v in enumerate(o):
                if i:
                    w(",")
                rec(v, depth + 1)
            w("]")
        elif isinstance(o, str):
            w(json.dumps(o[:limit]))
        elif o is None or isinstance(o, (bool, int, float)):
            w(json.dumps(o))
        elif isinstance(o, (bytes, bytearray, memoryview)):
            w(json.dumps(bytes(o[:limit]).decode("utf-8", "replace")))
        else:
            try:
                s = str(o)
            except Exception:
                s = f"<{type(o).__name__}>"
            w(json.dumps(s[:limit]))

    try:
        rec(obj, 0)
    except _Full:
        pass
    except (RecursionError, ValueError, TypeError):
        pass
    return "".join(out)[:limit]


def _charset(headers: Mapping[str, str]) -> str:
    ctype = headers.get("content-type", "")
    for part in ctype.split(";")[1:4]:
        k, _, v = part.partition("=")
        if k.strip().lower() == "charset":
            cs = v.strip().strip('"').lower()[:32]
            try:
                "".encode(cs)
            except LookupError:
                return "utf-8"
            return cs
    return "utf-8"


def _body(raw: Any, headers: Mapping[str, str], limit: int) -> tuple[str, Any]:
    """(text excerpt, parsed JSON or None) of a body of any type."""
    if raw is None:
        return "", None
    if isinstance(raw, (bytes, bytearray, memoryview)):
        complete = len(raw) <= limit
        chunk = bytes(raw[:limit])
        try:
            text = chunk.decode(_charset(headers), "replace")
        except LookupError:
            text = chunk.decode("utf-8", "replace")
        return text, _maybe_json(text) if complete else None
    if isinstance(raw, str):
        complete = len(raw) <= limit
        text = raw[:limit]
        return text, _maybe_json(text) if complete else None
    if isinstance(raw, (Mapping, list, tuple)):
        return json_excerpt(raw, limit), raw
    try:
        text = str(raw)[:limit]
    except Exception:
        text = ""
    return text, None


def _maybe_json(text: str) -> Any:
    s = text.lstrip()[:1]
    if s not in ("{", "["):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _headers(raw: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        items = raw.items() if hasattr(raw, "items") else raw
        for i, (k, v) in enumerate(items):
            if i >= MAX_HEADERS:
                break
            key = str(k).lower()[:128]
            val = (v.decode("latin-1") if isinstance(v, bytes) else str(v))[:MAX_HEADER_VALUE]
            out[key] = f"{out[key]}, {val}" if key in out else val
    except Exception:
        return out
    return out


def _status(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    return None


class _Sink:
    """Collects first-found status/headers/body while walking the sources."""

    def __init__(self, ev: Evidence, limit: int) -> None:
        self.ev = ev
        self.limit = limit
        self.body_found = False

    def details(self, details: Mapping[str, Any]) -> None:
        ev = self.ev
        if ev.status is None:
            ev.status = _status(details.get("status")) or _status(details.get("http_status"))
        if not ev.headers and details.get("headers") is not None:
            ev.headers = _headers(details["headers"])
        if ev.provider is None and isinstance(details.get("provider"), str):
            ev.provider = details["provider"]
        if not self.body_found:
            for k in BODY_KEYS:
                if details.get(k) is not None:
                    self.body(details[k])
                    break

    def body(self, raw: Any) -> None:
        text, parsed = _body(raw, self.ev.headers, self.limit)
        if text or parsed is not None:
            self.ev.body_text, self.ev.body_json = text, parsed
            self.body_found = True

    def message(self, text: str) -> None:
        if text:
            self.ev.messages.append(text[:MAX_MESSAGE])

    def exception(self, exc: BaseException) -> None:
        ev = self.ev
        for cls in type(exc).__mro__:
            if cls.__name__ not in _SKIP_BASES:
                ev.exc_names.add(cls.__name__)
        try:
            self.message(str(exc))
        except Exception:
            pass
        if isinstance(exc, ToolError):
            self.details(exc.details)
            if ev.declared_retry_after is None:
                ev.declared_retry_after = exc.retry_after_s
        resp = getattr(exc, "response", None)
        if ev.status is None:
            ev.status = (
                _status(getattr(exc, "status_code", None))
                or _status(getattr(exc, "status", None))
                or _status(getattr(resp, "status_code", None))
                or _status(getattr(resp, "status", None))
            )
        if not ev.headers:
            raw_headers = getattr(resp, "headers", None)
            if raw_headers is None:
                raw_headers = getattr(exc, "headers", None)
            if raw_headers is not None:
                ev.headers = _headers(raw_headers)
        if not self.body_found:
            body = getattr(exc, "body", None)
            if body is None and resp is not None:
                try:
                    body = resp.content
                except Exception:  # a streamed response that was never read
                    body = None
            if body is not None:
                self.body(body)


def _chain(exc: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    queue: list[BaseException] = [exc] if exc is not None else []
    while queue and len(out) < MAX_CHAIN:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        nxt = (
            e.__cause__
            if e.__cause__ is not None
            else (None if e.__suppress_context__ else e.__context__)
        )
        if nxt is not None:
            queue.append(nxt)
        if isinstance(e, BaseExceptionGroup):
            queue.extend(e.exceptions[:8])
    return out


def gather(
    info: ErrorInfo | None = None,
    exc: BaseException | None = None,
    *,
    max_body: int = 8192,
) -> Evidence:
    """Evidence from an ``ErrorInfo`` and/or an exception (with its cause chain)."""
    ev = Evidence()
    sink = _Sink(ev, max_body)
    if info is not None:
        ev.declared_kind = str(info.kind)
        ev.declared_retry_after = info.retry_after_s
        sink.message(info.message)
        sink.details(info.details)
        if exc is None:
            exc = info.exception
    elif isinstance(exc, ToolError):
        ev.declared_kind = str(exc.kind)
    for e in _chain(exc):
        sink.exception(e)
    return ev
