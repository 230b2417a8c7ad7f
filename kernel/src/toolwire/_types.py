"""Core types: tools, calls, results, errors and on_error decisions.

The hot-path objects (``ToolCall``, ``CallContext``, ``ToolResult``,
``ErrorInfo``, ``Attempt``) are slotted dataclasses rather than pydantic models:
a call creates several of them and pydantic construction would cost more than
the whole kernel budget (see docs/design-notes.md). pydantic still validates and
serializes them (``pydantic.TypeAdapter(ToolResult)`` works) and builds the
tools' argument validators.
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, cast

import pydantic
import pydantic_core

from ._image import Image

if TYPE_CHECKING:
    from ._kernel import Kernel

_log = logging.getLogger("toolwire")

__all__ = [
    "Attempt",
    "CallContext",
    "CallRejected",
    "Decision",
    "ErrorInfo",
    "ErrorKind",
    "Fallback",
    "Recover",
    "ResultMeta",
    "Retry",
    "Tool",
    "ToolAnnotations",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "normalize_content",
]

JSON = dict[str, Any]

# Lets pydantic validate/serialize ErrorInfo: the exception is kept as-is and dumped as None.
_Exc = Annotated[
    BaseException | None,
    pydantic.PlainValidator(lambda v: v),
    pydantic.PlainSerializer(lambda v: None),
    pydantic.WithJsonSchema({"type": "null"}),
]


class ErrorKind(enum.StrEnum):
    """The error kinds the kernel and the first-party plugins use.

    ``ErrorInfo.kind`` is a plain ``str``: third-party plugins may use their own
    kinds, but should prefer these.
    """

    INVALID_ARGS = "invalid_args"
    NOT_FOUND = "not_found"
    DENIED = "denied"
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    QUOTA = "quota"
    AUTH = "auth"
    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"
    CANCELLED = "cancelled"
    TOOL_ERROR = "tool_error"
    INTERNAL = "internal"
    CONFIG_ERROR = "config_error"


def _seconds_or_none(value: Any) -> float | None:
    """``value`` when it is a usable wait (a finite number >= 0), else ``None``.

    A ``retry_after_s`` of ``math.inf`` ("never"), NaN, a negative number or a
    string would print as ``Infinity`` in ``toolwire call``'s JSON (which then
    does not parse), fail a state store's write (an idempotency record) and give
    a retrying plugin a wait it cannot take: it is dropped, as the mcp plugin
    drops such a value from an upstream gateway.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(slots=True)
class ErrorInfo:
    """What went wrong. Mutable on purpose: ``on_error`` classifiers refine it.

    ``retryable`` is False unless a classification plugin sets it: an
    unclassified error is terminal (the safety gate). ``exception`` keeps the
    original exception for classifiers; it is never serialized.
    """

    kind: str
    message: str
    retryable: bool = False
    retry_after_s: float | None = None
    source: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    exception: _Exc = field(default=None, repr=False, compare=False)

    def to_dict(self) -> JSON:
        """JSON-compatible form (without the exception)."""
        # never let an odd detail lose the error, nor the other details: each detail that
        # cannot be serialized is described in its place
        details = _jsonable_extra(self.details)
        return {
            "kind": str(self.kind),
            "message": self.message,
            "retryable": self.retryable,
            # set by a classifier after the kernel checked it: still JSON here
            "retry_after_s": _seconds_or_none(self.retry_after_s),
            "source": self.source,
            "details": details,
        }


class ToolError(Exception):
    """Raise from a tool (or a tool source) to fail with a given kind.

    Any other exception a tool raises becomes kind ``tool_error``.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = ErrorKind.TOOL_ERROR,
        retry_after_s: float | None = None,
        details: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.details = dict(details or {})
        if status is not None:
            self.details.setdefault("status", status)

    def to_info(self, source: str | None = None) -> ErrorInfo:
        """The ErrorInfo this exception stands for."""
        return ErrorInfo(
            kind=self.kind,
            message=str(self),
            retry_after_s=_seconds_or_none(self.retry_after_s),
            source=source,
            details=dict(self.details),
            exception=self,
        )


class CallRejected(Exception):
    """Raised by a ``before_call`` hook to stop a call before the tool runs.

    The call ends with an error result of this ``kind`` (e.g. ``denied``);
    ``after_call`` hooks still see it.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        retryable: bool = False,
        retry_after_s: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(retryable, bool):  # "yes" would reach callers as a string
            raise TypeError(f"CallRejected(retryable=...) takes True or False, not {retryable!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.details = dict(details or {})


# --------------------------------------------------------------------- tools
@dataclass(slots=True, frozen=True)
class ToolAnnotations:
    """MCP tool annotations (hints, not guarantees)."""

    title: str | None = None
    readOnlyHint: bool | None = None
    destructiveHint: bool | None = None
    idempotentHint: bool | None = None
    openWorldHint: bool | None = None

    def to_dict(self) -> JSON:
        """Only the hints that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


Executor = Callable[[dict[str, Any], "CallContext"], Awaitable[Any]]
ArgsValidator = Callable[[Mapping[str, Any]], dict[str, Any]]


@dataclass(slots=True)
class Tool:
    """A callable tool in the kernel's catalog.

    ``executor(args, ctx)`` runs the tool with validated args and returns any
    JSON-compatible value (normalized into ``ToolResult.content``).
    ``validator(args)`` returns the validated (possibly coerced) args or raises
    ``pydantic.ValidationError``; None means "validate against input_schema
    with the kernel's minimal JSON-Schema checker".
    """

    name: str
    description: str
    input_schema: JSON
    executor: Executor
    output_schema: JSON | None = None
    validator: ArgsValidator | None = None
    tags: frozenset[str] = frozenset()
    source: str = "local"
    annotations: ToolAnnotations = field(default_factory=ToolAnnotations)
    timeout_s: float | None = None
    serial_key: object | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def definition(self) -> JSON:
        """The tool's public definition (name, description, schemas, hints)."""
        out: JSON = {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "source": self.source,
            "tags": sorted(self.tags),
        }
        if self.output_schema is not None:
            out["output_schema"] = self.output_schema
        ann = self.annotations.to_dict()
        if ann:
            out["annotations"] = ann
        return out


# --------------------------------------------------------------------- calls
@dataclass(slots=True)
class ToolCall:
    """One requested call. ``args`` are the validated args once validation ran."""

    name: str
    args: dict[str, Any]
    call_id: str | None = None
    session_id: str | None = None
    tenant: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Attempt:
    """One execution attempt of a tool inside a call.

    ``duration_ms`` is the attempt's run; ``wait_ms`` the time it waited for its turn
    at a serial tool before that (not part of ``duration_ms``).
    """

    tool: str
    duration_ms: float
    error_kind: str | None = None
    decision: str | None = None
    wait_ms: float = 0.0

    def to_dict(self) -> JSON:
        """JSON-compatible form."""
        return {
            "tool": self.tool,
            "duration_ms": self.duration_ms,
            "error_kind": self.error_kind,
            "decision": self.decision,
            "wait_ms": self.wait_ms,
        }


@dataclass(slots=True)
class ResultMeta:
    """Facts about how a result came to be.

    ``extra`` is where plugins put their own facts (``meta.extra["profiling"]``);
    ``plugin_errors`` lists hooks that raised (plugin, hook, message).
    """

    call_id: str | None = None
    tool: str | None = None
    duration_ms: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    replayed: bool = False
    served_by: str | None = None
    approval: dict[str, Any] | None = None
    started_at: float | None = None
    plugin_errors: list[dict[str, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> JSON:
        """JSON-compatible form."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "duration_ms": self.duration_ms,
            "attempts": [a.to_dict() for a in self.attempts],
            "replayed": self.replayed,
            "served_by": self.served_by,
            "approval": self.approval,
            "started_at": self.started_at,
            "plugin_errors": list(self.plugin_errors),
            "extra": _jsonable_extra(self.extra),
        }


def _jsonable_extra(extra: dict[str, Any]) -> JSON:
    """``meta.extra`` as JSON; a plugin's odd value is described, never lets the result fail."""
    try:
        return cast("JSON", _jsonable(extra))
    except NotJSONError:
        out: JSON = {}
        for k, v in extra.items():
            try:
                out[str(k)] = _jsonable(v)
            except NotJSONError as exc:
                out[str(k)] = f"<not JSON: {exc}>"[:500]
        return out


@dataclass(slots=True)
class ToolResult:
    """The normalized outcome of a call: always a JSON object in ``content``."""

    content: JSON
    is_error: bool = False
    error: ErrorInfo | None = None
    meta: ResultMeta = field(default_factory=ResultMeta)

    @classmethod
    def ok(cls, value: Any = None, **meta: Any) -> ToolResult:
        """A success result from any value (normalized like a tool's return)."""
        return cls(content=normalize_content(value), meta=ResultMeta(**meta))

    @classmethod
    def fail(cls, kind: str, message: str, **fields: Any) -> ToolResult:
        """An error result; ``fields`` go to ``ErrorInfo``."""
        info = ErrorInfo(kind=kind, message=message, **fields)
        return cls.from_error(info)

    @classmethod
    def from_error(cls, info: ErrorInfo, meta: ResultMeta | None = None) -> ToolResult:
        """An error result carrying ``info``."""
        return cls(
            content={"error": {"kind": str(info.kind), "message": info.message}},
            is_error=True,
            error=info,
            meta=meta if meta is not None else ResultMeta(),
        )

    def raise_for_error(self) -> ToolResult:
        """Raise ``ToolCallError`` for an error result; return self otherwise."""
        if self.is_error:
            from ._errors import ToolCallError

            raise ToolCallError(self)
        return self

    def to_dict(self) -> JSON:
        """JSON-compatible form: content, is_error, error, meta."""
        return {
            "content": self.content,
            "is_error": self.is_error,
            "error": self.error.to_dict() if self.error else None,
            "meta": self.meta.to_dict(),
        }


# ----------------------------------------------------------------- decisions
@dataclass(slots=True, frozen=True)
class Retry:
    """on_error decision: run the same tool again after ``after_s`` seconds.

    ``args`` replaces the args (validated again) when given.
    """

    after_s: float = 0.0
    args: dict[str, Any] | None = None
    reason: str | None = None


@dataclass(slots=True, frozen=True)
class Fallback:
    """on_error decision: run another tool instead (args validated for it)."""

    tool: str
    args: dict[str, Any] | None = None
    reason: str | None = None


@dataclass(slots=True, frozen=True)
class Recover:
    """on_error decision: end the call successfully with this value."""

    result: Any
    reason: str | None = None


Decision = Retry | Fallback | Recover


# ------------------------------------------------------------------- context
@dataclass(slots=True)
class CallContext:
    """Per-call state shared by the hooks of one call.

    Plugins keep their per-call state in ``ctx.state[plugin_name]``, never on
    the plugin object (plugins serve concurrent calls).
    """

    kernel: Kernel
    call: ToolCall
    tool: Tool | None = None
    attempt: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    deadline: float | None = None
    started_at: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)
    meta: ResultMeta = field(default_factory=ResultMeta)
    progress: Callable[[float, float | None, str | None], Awaitable[None] | None] | None = None
    #: Per-attempt timeout a plugin chose for this call (e.g. adaptive timeouts from
    #: profiling), set in ``before_call`` or ``on_error``; it wins over the tool's and
    #: the kernel's default timeout and stays bounded by the overall deadline.
    attempt_timeout_s: float | None = None
    #: The tool of the attempt running now (differs from ``tool`` after a Fallback).
    current_tool: Tool | None = None
    #: Capabilities the caller's transport offers for this call, by namespaced key
    #: (e.g. ``"mcp.elicit"``: ask the MCP client's user). Not JSON: live objects.
    extensions: dict[str, Any] = field(default_factory=dict)
    #: Set by a plugin (``before_call``): ``check_result(tool, content)`` runs on each
    #: successful attempt's normalized content; a returned ``ToolError`` turns the
    #: attempt into a failure (``on_error`` sees it; e.g. retry's ``fallback_on_empty``).
    check_result: Callable[[Tool, JSON], ToolError | None] | None = None
    #: The plugin whose ``before_call`` set ``check_result`` (named when it crashes).
    check_result_by: str | None = None
    #: ``(plugin, fn)`` pairs a plugin adds while the call is still in ``before_call`` (e.g.
    #: waiting in a later plugin's hook): the kernel awaits each ``fn()`` once, after the
    #: last ``before_call`` let the call through and before the tool's first attempt. A
    #: ``CallRejected`` (or another exception) ends the call as in ``before_call``: the tool
    #: is not run. The idempotency plugin uses it to record that a parked call now runs.
    before_first_attempt: list[tuple[str, Callable[[], Awaitable[None]]]] | None = None
    #: Set by the kernel while the call waits between two attempts (a ``Retry``'s
    #: ``after_s``, a ``Fallback``'s ``before_fallback`` hooks): the failed attempt's error
    #: as ``on_error`` left it; ``None`` while an attempt runs and outside the attempt loop.
    between_attempts: ErrorInfo | None = None
    #: ``(plugin, fn)`` pairs a plugin adds while ``between_attempts`` is set: the kernel
    #: awaits each ``fn()`` once, after the wait and before the next attempt (then clears
    #: ``between_attempts``); a ``CallRejected`` (or another exception) ends the call with
    #: that error, the next attempt not run. The idempotency plugin uses it to take back
    #: the "nothing applied" mark it put on a call backing off after a rate limit.
    before_next_attempt: list[tuple[str, Callable[[], Awaitable[None]]]] | None = None
    #: The kernel's (before_call, on_error, after_call, before_fallback) lists as the
    #: call started: a plugin added or removed meanwhile does not change this call's hooks.
    hooks: tuple[list[Any], list[Any], list[Any], list[Any]] = field(
        default=((), (), (), ()),  # type: ignore[assignment]
        repr=False,
    )
    #: Seconds the running attempt waited for its turn at a serial tool (the kernel's).
    _turn_wait: float = field(default=0.0, init=False, repr=False)
    #: Set by the kernel around each attempt of a serial tool: the sync runs the tool's
    #: executor hands to threads (on this call's context: a call the tool makes through
    #: the kernel has its own, so its threads are not the serial tool's).
    _thread_runs: list[Any] | None = field(default=None, init=False, repr=False)

    def time_left(self) -> float | None:
        """Seconds left before the call's overall deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return self.deadline - self.kernel.clock.monotonic()

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress; forwarded to the caller's progress handler if any.

        The handler may be sync or async. One that raises never fails the tool:
        the error is logged and noted in ``meta.plugin_errors`` (hook
        ``progress``), and this call reports no more progress.
        """
        handler = self.progress
        if handler is None:
            return
        try:
            res = handler(progress, total, message)
            if inspect.isawaitable(res):
                await res
        except Exception as exc:
            self.progress = None
            _log.warning(
                "the progress handler of the call of %r raised %s: %s; this call reports no "
                "more progress",
                self.call.name,
                type(exc).__name__,
                exc,
            )
            self.meta.plugin_errors.append(
                {"plugin": "caller", "hook": "progress", "error": f"{type(exc).__name__}: {exc}"}
            )


# ------------------------------------------------------------ normalization
_SCALARS = (str, int, float, bool, type(None))


def _is_plain_json(value: Any, depth: int = 0) -> bool:
    """Fast check that value is made of JSON-native Python types only (finite floats)."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return True
    if t is float:
        return bool(value - value == 0.0)  # False for nan and +-inf
    if depth > 64:
        return False
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                return False
            tv = type(v)
            if tv is str or tv is int or tv is bool or v is None:
                continue
            if not _is_plain_json(v, depth + 1):
                return False
        return True
    if t is list:
        for v in value:
            tv = type(v)
            if tv is str or tv is int or tv is bool or v is None:
                continue
            if not _is_plain_json(v, depth + 1):
                return False
        return True
    return False


def _jsonable(value: Any) -> Any:
    """value as JSON-native types; raises NotJSONError when impossible."""
    if _is_plain_json(value):
        return value
    try:
        out = pydantic_core.to_jsonable_python(value)
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
        raise NotJSONError(type(value).__name__, str(exc)) from exc
    return _finite(out)


def _finite(value: Any) -> Any:
    """Non-finite floats (not representable in JSON) become "NaN"/"Infinity"/"-Infinity"."""
    t = type(value)
    if t is float and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if t is dict:
        return {k: _finite(v) for k, v in value.items()}
    if t is list:
        return [_finite(v) for v in value]
    return value


class NotJSONError(TypeError):
    """A tool returned a value that cannot be turned into JSON."""

    def __init__(self, type_name: str, detail: str) -> None:
        super().__init__(f"value of type {type_name} is not JSON-serializable ({detail})")
        self.type_name = type_name
        #: What the encoder found wrong (a type it cannot encode, bytes not UTF-8, a cycle...).
        self.detail = detail


def normalize_content(value: Any) -> JSON:
    """Normalize a tool's return value into a JSON object.

    - a dict passes through (made JSON-compatible),
    - an ``Image`` becomes ``{"img_path": ..., "mime_type": ...}`` (a file) or
      MCP image content (bytes),
    - a pydantic model or dataclass is dumped to a dict,
    - anything else (scalars, lists, None) becomes ``{"result": value}``.

    Raises ``NotJSONError`` for values that cannot be encoded.
    """
    if type(value) is Image:
        return value.to_content()
    if type(value) is dict and _is_plain_json(value):
        return value
    if hasattr(value, "model_dump") or hasattr(value, "__dataclass_fields__"):
        dumped = _jsonable(value)
        if isinstance(dumped, dict):
            return dumped
        return {"result": dumped}
    out = _jsonable(value)
    if isinstance(out, dict) and isinstance(value, Mapping):
        return out
    return {"result": out}
