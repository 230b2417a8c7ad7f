"""The hooks a toolwire plugin can implement.

A plugin is any object with hook implementations marked ``@toolwire.hookimpl``
(or a module of such functions, registered under the module's name). Implementations may be ``def`` or
``async def`` and may accept any subset of a hook's parameters, by name
(pluggy's rule). They run sorted by the plugin's ``order`` (then its name):
ascending for ``startup``, ``discover``, ``before_call``, ``before_fallback``
and ``on_error``; descending for ``after_call`` and ``shutdown``.

The kernel calls these hooks with its own async-aware caller (pluggy has
none): each implementation is awaited before the next one runs. Do not mark
them ``wrapper``, ``hookwrapper``, ``tryfirst`` or ``trylast``: the kernel
rejects such implementations at registration (``order`` is the only ordering;
``firstresult`` is no hookimpl option at all).

Every hook in this module is documented in docs/hooks.md; a test fails when one
is missing there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ._kernel import Kernel
    from ._types import CallContext, Decision, ErrorInfo, Tool, ToolCall, ToolResult

PROJECT = "toolwire"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = [
    "after_call",
    "before_call",
    "before_fallback",
    "discover",
    "hookimpl",
    "hookspec",
    "on_error",
    "shutdown",
    "startup",
]


@hookspec
def startup(kernel: Kernel) -> None:
    """Called once when the kernel starts (``async with kernel`` or the first call).

    Open connections, pools, background tasks. ``kernel.state`` is open.

    :param kernel: the kernel being started.
    :return: ignored.

    Order: ascending. May be async. An exception aborts the start with a
    ``PluginError`` naming the plugin (fail-closed: a plugin that cannot start
    must not be silently absent); a ``ConfigError`` or ``PluginError`` the
    plugin raises itself is raised as it is. The plugins ordered before it, and
    those with no ``startup`` hook, are shut down again.
    """


@hookspec
def shutdown(kernel: Kernel) -> None:
    """Called once when the kernel closes; release what ``startup`` opened.

    :param kernel: the kernel being closed.
    :return: ignored.

    Order: descending. May be async. Exceptions are logged and the remaining
    plugins still shut down.
    """


@hookspec
def discover(kernel: Kernel, query: str | None) -> list[Tool] | None:
    """Contribute tools to the catalog (tool sources implement this).

    Called at startup and on ``await kernel.refresh_tools()`` with
    ``query=None`` (return every tool the source has), and by
    ``await kernel.discover(query)`` with a search string (a source backed by a
    large remote registry may return only the matching tools; others return
    None).

    :param kernel: the kernel building its catalog.
    :param query: None for a full listing, or the user's search string.
    :return: a list of ``Tool`` objects, or None for nothing. Each tool's
        ``source`` should name the contributing source. Two sources giving the
        same tool name is a ``ToolCollisionError`` naming both; sources avoid
        it by namespacing their tool names.

    Order: ascending. May be async. An exception names the plugin and aborts
    the refresh (the previous catalog stays in place).
    """


@hookspec
def before_call(call: ToolCall, ctx: CallContext) -> ToolResult | None:
    """Called once per call, after argument validation, before the tool runs.

    :param call: the call; ``call.args`` are the validated args. A hook may
        replace ``call.args`` (they are NOT validated again; validate yourself).
    :param ctx: per-call context (``ctx.tool``, ``ctx.state`` for per-call
        plugin state, ``ctx.meta`` for facts that end in the result).
    :return: None to continue; a ``ToolResult`` to short-circuit (the tool does
        not run; later ``before_call`` hooks are skipped; ``after_call`` hooks
        of every plugin still run). Raise ``CallRejected(kind, message)`` to end
        the call with an error (e.g. ``denied``).

    Order: ascending. May be async. Any other exception ends the call with kind
    ``internal`` naming the plugin; the tool does not run (fail-closed).
    """


@hookspec
def before_fallback(call: ToolCall, next_call: ToolCall, ctx: CallContext) -> None:
    """Called when an ``on_error`` decision reroutes the call, before the next attempt.

    A reroute is an attempt of another tool (``Fallback``) or of the same tool with
    other arguments (``Retry(args=...)``); a plain ``Retry`` is no reroute. Gates that
    ``before_call`` applied to the requested tool and arguments apply here to the
    rerouted ones (approval asks again, for the tool the fallback would run).

    :param call: the call as requested.
    :param next_call: what the next attempt runs (``next_call.name``, its validated
        ``args``; same ``call_id``, ``session_id`` and ``tenant``). A hook may replace
        ``next_call.args`` (they are NOT validated again; validate yourself).
    :param ctx: per-call context; ``ctx.current_tool`` is the tool that just failed,
        ``ctx.attempts`` the attempts so far (the last one failed).
    :return: None to let the attempt run. Raise ``CallRejected(kind, message)`` to
        refuse it: the call ends with that error (its ``details["fallback"]`` names
        the tools and the failure that led here), later hooks are skipped, and the
        rerouted tool does not run.

    Order: ascending. May be async (it may wait, e.g. for an approval; the call's
    deadline is checked before the attempt). Any other exception refuses the
    attempt too (fail-closed): the call ends with kind ``internal`` naming the
    plugin, recorded in ``result.meta.plugin_errors``.
    """


@hookspec
def on_error(call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Decision | None:
    """Called after each failed attempt; decide what happens next.

    :param call: the call (``call.name`` is the tool of the failed attempt,
        which differs from the requested tool after a fallback).
    :param error: the failure. Mutable: a classifier refines ``kind``,
        ``retryable`` and ``retry_after_s`` and returns None so that later
        plugins decide on the classified error. ``error.exception`` is the
        original exception, if any.
    :param ctx: per-call context; ``ctx.attempts`` lists the attempts so far.
    :return: None (no opinion), or a Decision: ``Retry(after_s, args=None)``,
        ``Fallback(tool, args=None)`` or ``Recover(result)``. The first
        non-None decision wins and the remaining hooks are skipped. With no
        decision the call fails with ``error``.

    The kernel enforces its guards on any decision: ``max_attempts``, the
    overall deadline, cancellation. Order: ascending. May be async. An
    exception is recorded in ``result.meta.plugin_errors`` and counts as None.
    """


@hookspec
def after_call(call: ToolCall, result: ToolResult, ctx: CallContext) -> ToolResult | None:
    """Called exactly once per call with the final result, success or error.

    Also called with a ``cancelled`` error result when the call is cancelled,
    so plugins can release what they hold; the cancellation is then re-raised
    and that result is never returned (do not store it). A cancellation that
    comes while the ``after_call`` hooks run gives the hooks not yet started
    the call's real result instead (the tool ran: it must not be dropped).

    :param call: the call as requested.
    :param result: the final result (``result.meta`` is complete).
    :param ctx: per-call context.
    :return: None, or a replacement ``ToolResult`` that later hooks see (its content
        is normalized like a tool's return; one that cannot be made JSON is ignored).

    Order: descending (the outermost plugin sees the result last). May be
    async. An exception is logged and recorded in ``result.meta.plugin_errors``;
    the result is still returned.
    """


def all_hook_names() -> list[str]:
    """Names of every hook declared here."""
    return sorted(
        name for name, obj in globals().items() if hasattr(obj, f"{PROJECT}_spec") and callable(obj)
    )
