"""What both serving paths share: the drain gate, reading a call's ``_meta``, running the call.

FastMCP's handler (``KernelTool.run``) and toolwire's lean HTTP path
(``_fastpath``) hand calls to the kernel through these, so an MCP caller gets
the same call id handling, the same drain behaviour and the same result on
either path. Imports no FastMCP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import jsonschema.exceptions  # type: ignore[import-untyped]
import jsonschema.validators  # type: ignore[import-untyped]

from toolwire import ErrorInfo, ErrorKind, Kernel, ResultMeta, Tool, ToolResult, export_tool

from ._convert import quick_check
from ._images import ImageFiles
from ._keys import CALL_ID_META_KEY

__all__ = ["ProgressSender", "ServeGate", "call_id_from_meta", "run_call"]

#: ``progress(progress, total, message)``: sends one MCP progress notification.
ProgressSender = Callable[[float, float | None, str | None], Awaitable[None]]

_DRAINING = "toolwire is shutting down and accepts no new calls; retry on another instance"
_CUT = (
    "toolwire is shutting down: the call was still running when the shutdown grace period "
    "([server] shutdown_grace_s) ended, so it was cancelled; its outcome is unknown: check "
    "whether it took effect before calling it again (idempotency keeps no result of a "
    "cancelled call: a replay with the same call id runs the tool again, unless it had "
    "returned before the cut, or plugins.idempotency.unknown_after_interrupt is on for "
    "this tool: then the replay answers outcome_unknown and does not run it), or give "
    "calls more time with shutdown_grace_s"
)
#: What the kernel makes of numbers JSON cannot carry (``toolwire._types._finite``).
_NON_FINITE: Final = frozenset({"Infinity", "-Infinity", "NaN"})


class ServeGate:
    """Counts in-flight calls and refuses new ones while the server drains.

    Also holds what both paths need to answer alike: ``images``, the reader of
    ``{"img_path": ...}`` results (default roots when not given).
    """

    def __init__(self, *, images: ImageFiles | None = None) -> None:
        self.images = images if images is not None else ImageFiles()
        self.inflight = 0
        self.draining = False
        #: True once ``cancel_all`` ran: a call cancelled from then on is answered ``cancelled``
        self.cutting = False
        self._idle: anyio.Event | None = None
        self._scopes: set[anyio.CancelScope] = set()
        #: Calls running on in tasks of their own after their request was cancelled
        #: (a call with a call id outlives its client, on FastMCP's handler).
        self.detached: set[Any] = set()
        #: tool name -> (the tool, its output schema's checker, quick check); None: no check
        self._outputs: dict[str, tuple[Tool, Any, Any]] = {}

    def enter(self, scope: anyio.CancelScope | None = None) -> None:
        """A call starts; ``scope``: what cancels it when the grace period ends."""
        self.inflight += 1
        if scope is not None:
            self._scopes.add(scope)

    def leave(self, scope: anyio.CancelScope | None = None) -> None:
        """A call ended."""
        self.inflight -= 1
        if scope is not None:
            self._scopes.discard(scope)
        if self.inflight == 0 and self._idle is not None:
            self._idle.set()

    def cancel_all(self) -> int:
        """Cancel every call still in flight (the grace period is over); returns how many.

        Each is answered with a ``cancelled`` error result (``cut_result``), so its
        client learns what happened rather than seeing the connection drop.
        """
        self.cutting = True
        for scope in list(self._scopes):
            scope.cancel()
        return len(self._scopes)

    async def settle(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the calls in flight to end; returns those left."""
        if self.inflight:
            idle = self._idle_event()
            with anyio.move_on_after(timeout_s):
                await idle.wait()
        return self.inflight

    @staticmethod
    def cut_result(name: str | None = None, call_id: str | None = None) -> ToolResult:
        """The answer of a call cancelled because the grace period ended; ``name`` and
        ``call_id`` go to its ``meta``, as the kernel's results carry them."""
        return _fail(ErrorKind.CANCELLED, _CUT, name, call_id)

    def output_problem(self, tool: Tool, content: Mapping[str, Any]) -> str | None:
        """Why ``content`` does not match the output schema ``tool`` is listed with; None when
        it does (or there is no schema, or the schema itself is invalid).

        MCP clients check structured content against the listed schema and reject a
        mismatch on their side, so a result that would not pass goes out as an error
        that says why instead.
        """
        if tool.output_schema is None:
            return None
        cached = self._outputs.get(tool.name)
        if cached is None or cached[0] is not tool:
            schema = export_tool(tool, "mcp")["outputSchema"]  # the schema as listed
            try:
                cls = jsonschema.validators.validator_for(
                    schema, default=jsonschema.Draft202012Validator
                )
                cls.check_schema(schema)
                cached = (tool, cls(schema), quick_check(schema, cls))
            except jsonschema.exceptions.SchemaError:
                cached = (tool, None, None)
            self._outputs[tool.name] = cached
        _, checker, quick = cached
        if checker is None or (quick is not None and quick(content)):
            return None
        error = jsonschema.exceptions.best_match(checker.iter_errors(content))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        problem = f"{error.message} (at {where or 'the top level'})"
        if isinstance(error.instance, str) and error.instance in _NON_FINITE:
            problem += "; JSON has no such number, so the kernel sent it as a string"
        return problem

    async def drain(self, grace_s: float) -> int:
        """Refuse new calls and wait up to ``grace_s`` for in-flight ones; returns those left."""
        self.draining = True
        if self.inflight:
            idle = self._idle_event()
            with anyio.move_on_after(grace_s):
                await idle.wait()
        return self.inflight

    def _idle_event(self) -> anyio.Event:
        """The event set when no call is in flight, shared by all who wait (a signal and
        the end of stdin may drain at once: a second event would orphan the first)."""
        if self._idle is None or self._idle.is_set():
            self._idle = anyio.Event()
        return self._idle


def _fail(
    kind: str, message: str, name: str | None = None, call_id: str | None = None
) -> ToolResult:
    """An error answered without the kernel, with the tool and call id a client sent: every
    result's ``_meta["io.toolwire/result"]`` names them, as the kernel's results do."""
    return ToolResult.from_error(
        ErrorInfo(kind, message, source="mcp"), ResultMeta(call_id=call_id, tool=name)
    )


def call_id_from_meta(
    meta: Mapping[str, Any] | None, name: str | None = None
) -> str | ToolResult | None:
    """The call id a request's ``_meta`` carries; None without one; an error result (for
    tool ``name``) when malformed."""
    if not meta:
        return None
    cid = meta.get(CALL_ID_META_KEY)
    if cid is None:
        return None
    if isinstance(cid, bool) or not isinstance(cid, (str, int)) or cid == "":
        got = "an empty string" if cid == "" else type(cid).__name__
        return _fail(
            ErrorKind.INVALID_ARGS,
            f"_meta[{CALL_ID_META_KEY!r}] must be a non-empty string, got {got}; pass the "
            "tool call's own id (the same on every replay), or leave the key out to call "
            "without de-duplication",
            name,
        )
    return str(cid)


#: The ``AccessToken.claims`` key holding the tenant of a client's calls.
TENANT_CLAIM = "io.toolwire/tenant"


def tenant_of(scope: Mapping[str, Any]) -> str | None:
    """The tenant of the HTTP client that sent the request of ``scope``: the one its bearer
    token was given (``[server.clients.<name>]``), or None (the shared token, no auth)."""
    user = scope.get("user")
    grant = getattr(user, "access_token", None)
    claims = getattr(grant, "claims", None)
    if not claims:
        return None
    tenant = claims.get(TENANT_CLAIM)
    return tenant if isinstance(tenant, str) else None


async def run_call(
    kernel: Kernel,
    gate: ServeGate,
    name: str,
    arguments: dict[str, Any],
    *,
    call_id: str | None,
    request_id: str | int | None,
    session_id: str | None = None,
    tenant: str | None = None,
    progress: ProgressSender | None = None,
    extensions: dict[str, Any] | None = None,
    scope: anyio.CancelScope | None = None,
) -> ToolResult:
    """``kernel.call`` for an MCP caller, counted by ``gate`` (``unavailable`` while draining).

    ``scope``: the caller's cancel scope around this call, which the gate cancels
    when the shutdown grace period ends; the caller then answers
    ``gate.cut_result()``. Without one, the call gets its own and is answered
    here.
    """
    if gate.draining:
        return _fail(ErrorKind.UNAVAILABLE, _DRAINING, name, call_id)
    metadata: dict[str, Any] = {"via": "mcp"}
    if request_id is not None:
        metadata["mcp_request_id"] = request_id
    own = scope is None
    cancel = anyio.CancelScope() if scope is None else scope
    gate.enter(cancel)
    try:
        with cancel if own else contextlib.nullcontext():
            result = await kernel.call(
                name,
                arguments,
                call_id=call_id,
                session_id=session_id,
                tenant=tenant,
                metadata=metadata,
                progress=progress,
                extensions=extensions,
            )
    finally:
        gate.leave(cancel)
    if own and cancel.cancelled_caught:
        return gate.cut_result(name, call_id)
    if not result.is_error:
        tool = kernel.get_tool(name)  # the schema the client was shown (a fallback's may differ)
        if tool is not None and tool.output_schema is not None:
            problem = gate.output_problem(tool, result.content)
            if problem is not None:
                # The tool ran: its result is kept in the error, never dropped.
                info = ErrorInfo(
                    ErrorKind.TOOL_ERROR,
                    f"tool {name!r} returned a result that does not match its output schema: "
                    f"{problem}. The result itself is in this error's details.result; fix "
                    "the tool (or the plugin that made the result) or its output_schema",
                    source="mcp",
                    details={"reason": "output_schema_mismatch", "result": result.content},
                )
                return ToolResult.from_error(info, meta=result.meta)
    return result
