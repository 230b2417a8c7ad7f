"""The Kernel: catalog, plugins, and the one call pipeline (DESIGN §1)."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import inspect
import logging
import math
import os
import re
import types
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pydantic

from ._background import BackgroundTask
from ._clock import Clock, SystemClock
from ._errors import KernelError, PluginError, ToolCollisionError, collision_advice
from ._events import EventBus
from ._hooks import TRACE_ENV, PluginInfo, PluginRegistry
from ._image import IMAGE_FILE_EXTRA, IMG_PATH_KEY, Image
from ._redact import Redactor
from ._tool import (
    ThreadRun,
    ToolSet,
    build_tool,
    tools_from_module,
    tools_from_object,
)
from ._types import (
    JSON,
    Attempt,
    CallContext,
    CallRejected,
    ErrorInfo,
    ErrorKind,
    Fallback,
    NotJSONError,
    Recover,
    ResultMeta,
    Retry,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    _is_plain_json,
    _seconds_or_none,
    normalize_content,
)
from ._validate import ArgsError, describe_validation_error, validate_json_schema
from .state import StateStore, open_store

if TYPE_CHECKING:
    from ._config import ToolwireConfig

__all__ = ["Kernel"]

log = logging.getLogger("toolwire")

#: ``details["reason"]`` of the ``timeout`` error of an attempt the kernel did not start:
#: the call's deadline had passed before it (the tool did not run).
NOT_STARTED = "deadline_before_attempt"


#: How often a serial tool's next call looks whether a function an earlier call gave up
#: on still runs in its thread (threads cannot signal the event loop once abandoned).
_THREAD_POLL_S = 0.01


class _NotStarted(TimeoutError):
    """The call's deadline passed before the attempt started."""


#: How long a ``close()`` cancelled while it waited for the calls in flight may still take
#: to shut the plugins down and close the state store, shielded.
_CLOSE_CUT_S = 10.0


class _Flight:
    """How many calls that started in one period are still running (``close()`` and
    ``remove_plugin()`` wait for them; a plugin removed starts a new period)."""

    __slots__ = ("idle", "n")

    def __init__(self) -> None:
        self.n = 0
        #: set when ``n`` drops to 0; made only when someone waits (a call pays nothing)
        self.idle: anyio.Event | None = None

    async def wait(self) -> None:
        """Until no call of this period runs."""
        while self.n:
            idle = self.idle
            if idle is None or idle.is_set():  # set earlier, then calls came again
                idle = self.idle = anyio.Event()
            await idle.wait()


def _leave(flight: _Flight) -> None:
    """A call of ``flight`` ended."""
    flight.n -= 1
    if flight.idle is not None and not flight.n:
        flight.idle.set()


class _Calls:
    """The calls in flight (one object: a Kernel past 30 attributes loses CPython's
    shared-key instance dicts, and every ``self.x`` of a call gets slower)."""

    __slots__ = ("closing", "earlier", "now")

    def __init__(self) -> None:
        #: the calls started since the last plugin removal
        self.now = _Flight()
        #: earlier periods' calls, some maybe still running
        self.earlier: list[_Flight] = []
        #: set while close() runs (another close(), or a start, waits for it)
        self.closing: anyio.Event | None = None

    def all(self) -> list[_Flight]:
        return [*self.earlier, self.now]


def _visible(t: Tool) -> tuple[Any, ...]:
    """What a client of the catalog sees of a tool."""
    return (
        t.description,
        repr(t.input_schema),
        repr(t.output_schema),
        t.annotations,
        t.tags,
    )


def _catalog_differs(old: Mapping[str, Tool], new: Mapping[str, Tool]) -> bool:
    if old.keys() != new.keys():
        return True
    return any(old[n] is not t and _visible(old[n]) != _visible(t) for n, t in new.items())


_get_running_loop = asyncio._get_running_loop

_AsyncioCancelScope: type[anyio.CancelScope] | None = None


def _asyncio_cancel_scope() -> anyio.CancelScope:
    """``anyio.CancelScope()`` on asyncio, without its per-call backend lookup (~1.5 µs).

    The class is anyio's asyncio one, taken from the first scope made the usual way.
    """
    global _AsyncioCancelScope
    cls = _AsyncioCancelScope
    if cls is None:
        scope = anyio.CancelScope()
        _AsyncioCancelScope = type(scope)
        return scope
    return cls()


ProgressHandler = Callable[[float, float | None, str | None], Awaitable[None] | None]
Mode = Literal["explicit", "semantic", "hybrid"]


#: Tool names every export accepts the widest of: MCP's rule (OpenAI's and Anthropic's are
#: narrower: at most 64 characters, no '.'; the kernel exports such names to them
#: under an alias that ``call`` accepts).
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
TOOL_NAME_RULE = "1 to 128 ASCII letters, digits, '_', '-' or '.'"


def _check_tool(tool: Tool, source: str) -> None:
    """Refuse a tool no client could be told about: a bad name, or arguments not an object."""
    name = tool.name
    if not isinstance(name, str) or _TOOL_NAME.fullmatch(name) is None:
        raise ValueError(
            f"tool name {name!r} (from {source}) is not a valid tool name: use {TOOL_NAME_RULE}, "
            "as MCP requires; one such name would make every export of the catalog fail"
        )
    schema = tool.input_schema
    if not isinstance(schema, dict):
        raise ValueError(
            f"tool {name!r} (from {source}): input_schema must be a JSON Schema (a dict), "
            f"not {type(schema).__name__}"
        )
    tags = tool.tags
    if isinstance(tags, (str, bytes)) or not all(isinstance(t, str) and t for t in tags):
        raise ValueError(
            f"tool {name!r} (from {source}): tags must be a set of non-empty str, got "
            f"{tags!r}; e.g. tags=frozenset({{'files'}})"
        )
    kind = schema.get("type")
    if kind is not None and kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ValueError(
            f"tool {name!r} (from {source}): input_schema has type {kind!r}, but a tool's "
            'arguments are always one JSON object: give it "type": "object" and "properties" '
            "(MCP, OpenAI and Anthropic refuse any other)"
        )


def _added_twice(held: Tool, local: bool) -> str:
    """What to do when ``add_tool`` meets a name the catalog already holds."""
    where = f"the catalog already holds it (source {held.source!r}): add this one under another "
    where += "name with add_tool(..., name=...) or namespace=..."
    if local:
        return f"{where}, or remove_tool({held.name!r}) first to replace it"
    return where


def _timed_out(seconds: float) -> str:
    return (
        f"no answer within {seconds:.3g}s (the attempt's limit: the smallest of "
        "ctx.attempt_timeout_s, the tool's timeout_s or the kernel's default_timeout_s, "
        "and the time left before the call's deadline)"
    )


def _check_idents(name: str, **idents: Any) -> None:
    """Refuse a ``kernel.call`` identifier that is not a str (a str subclass is one)."""
    for key, ident in idents.items():
        if ident is not None and not isinstance(ident, str):
            raise TypeError(
                f"kernel.call({name!r}, {key}=...): give a str or None, not "
                f"{type(ident).__name__} {ident!r} (plugins key state and records by it)"
            )


def _content_problem(result: ToolResult) -> str | None:
    """Normalize the content of a result a plugin made, as a tool's return is; or say why not
    (an error flag and error that disagree, content that is no JSON).

    A plugin's ``ToolResult(content=...)`` is not normalized by its constructor: content
    that is no JSON object would fail every transport later (an MCP client got a bare
    "Error calling tool"), so it is made one here (a model, a dataclass, a datetime...).
    """
    if result.is_error != (result.error is not None):
        # callers read one or the other: an "error" with no kind, or a "success" carrying
        # an error (the audit line said error_kind null; an MCP client saw no error)
        return (
            "a ToolResult with is_error=True but no error (ErrorInfo)"
            if result.is_error
            else "a ToolResult with an error but is_error=False"
        ) + " (make it with ToolResult.fail / ToolResult.from_error)"
    content = result.content
    if type(content) is dict and _is_plain_json(content):
        return None
    try:
        result.content = normalize_content(content)
    except NotJSONError as exc:
        return f"a ToolResult whose content is not JSON-serializable ({exc})"
    return None


def _foreign_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` is an asyncio ``CancelledError`` that no cancellation of the call caused.

    A tool or hook awaiting something its own library cancelled (a dropped request's
    future) raises ``CancelledError`` though nobody cancelled the call: that is its
    failure, and it must not reach the caller as a cancellation (an asyncio task not
    being cancelled would end silently, its request unanswered). On trio an asyncio
    ``CancelledError`` is never the call's cancellation.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task() if _get_running_loop() is not None else None
    return task is None or task.cancelling() == 0


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, anyio.get_cancelled_exc_class()) and not _foreign_cancel(exc)


def _interrupted(exc: BaseException) -> ErrorInfo:
    """The ``cancelled`` error the after_call hooks of a call that did not end get."""
    if _is_cancel(exc):
        return ErrorInfo(ErrorKind.CANCELLED, "the call was cancelled", source="kernel")
    return ErrorInfo(
        ErrorKind.CANCELLED,
        f"the call was interrupted by {type(exc).__name__}: {exc}",
        source="kernel",
        exception=exc,
    )


def _check_attempt_timeout(seconds: Any) -> None:
    """Refuse a ``ctx.attempt_timeout_s`` a hook set that no timeout can use."""
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0
    ):
        raise ValueError(
            f"it set ctx.attempt_timeout_s = {seconds!r}: give a number of seconds > 0, or None "
            "for the tool's own timeout"
        )


#: When a plugin's lifecycle hook still runs, a WARNING says so (after the first, then
#: every ``_SLOW_HOOK_REPEAT_S``): a hung startup holds the kernel's start, silently before.
_SLOW_HOOK_S = 10.0
_SLOW_HOOK_REPEAT_S = 60.0


async def _warn_while_waiting(plugin: str, hook: str) -> None:
    waited = 0.0
    step = _SLOW_HOOK_S
    while True:
        await anyio.sleep(step)
        waited += step
        step = _SLOW_HOOK_REPEAT_S
        log.warning(
            "plugin %r: its %s hook has not returned after %gs; the kernel waits for it (a "
            "service it connects to may not answer; see that plugin's timeout settings)",
            plugin,
            hook,
            round(waited, 1),
        )


def _rejection(plugin: str, rej: CallRejected) -> ErrorInfo:
    """The error a plugin's ``CallRejected`` stands for (its source: the plugin)."""
    return ErrorInfo(
        rej.kind,
        rej.message,
        rej.retryable,
        _seconds_or_none(rej.retry_after_s),
        plugin,
        rej.details,
    )


def _fallback_failed(ctx: CallContext, nxt: ToolCall, plugin: str, exc: BaseException) -> ErrorInfo:
    """``plugin``'s before_fallback raised something other than ``CallRejected``:
    recorded and logged as any hook failure; the rerouted tool is not run."""
    log.error("plugin %r: before_fallback failed for tool %r", plugin, nxt.name, exc_info=exc)
    error = f"{type(exc).__name__}: {exc}"
    ctx.meta.plugin_errors.append({"plugin": plugin, "hook": "before_fallback", "error": error})
    return ErrorInfo(
        ErrorKind.INTERNAL,
        f"plugin {plugin!r} failed in before_fallback: {error}; the tool {nxt.name!r} was not run",
        source=plugin,
    )


def _decision_problem(decision: Retry | Fallback) -> str | None:
    """What is wrong with a Retry / Fallback a plugin returned, or None."""
    if isinstance(decision, Retry):
        wait = decision.after_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
            return f"Retry(after_s={wait!r}): after_s must be a finite number of seconds"
    elif not isinstance(decision.tool, str):
        return f"Fallback(tool={decision.tool!r}): tool must be a tool's name"
    if decision.args is not None and not isinstance(decision.args, dict):
        return (
            f"{type(decision).__name__}(args={decision.args!r}): args must be a dict of "
            "arguments or None"
        )
    return None


class Kernel:
    """The toolwire kernel: register tools and plugins, then ``await kernel.call(...)``.

    >>> kernel = Kernel(tools=[add])          # doctest: +SKIP
    >>> result = await kernel.call("add", {"a": 1, "b": 2})
    >>> result.content
    {'result': 3}

    Args:
        tools: functions (``@tool`` or plain), ``Tool`` objects, ``ToolSet``
            instances or modules to add as local tools.
        plugins: plugin objects to register (each with a ``name`` and an ``order``).
        state: a ``StateStore`` or a URL (``memory://``, ``sqlite:///path``, ``redis://...``).
        max_attempts: at most this many attempts per call, whatever plugins decide.
        default_timeout_s: per-attempt timeout for tools that set none (None: no timeout).
        deadline_s: overall deadline per call, retries and waits included (None: none).
        close_grace_s: how long ``close()`` (and ``remove_plugin``) waits for the calls
            in flight before shutting plugins down (0: not at all).
        clock: time source (tests pass ``toolwire.testing.FakeClock``).
    """

    def __init__(
        self,
        *,
        tools: Iterable[Any] = (),
        plugins: Iterable[object] = (),
        state: str | StateStore = "memory://",
        max_attempts: int = 5,
        default_timeout_s: float | None = None,
        deadline_s: float | None = None,
        close_grace_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"Kernel(max_attempts={max_attempts!r}): give an int >= 1")
        for key, value in (("default_timeout_s", default_timeout_s), ("deadline_s", deadline_s)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise ValueError(f"Kernel({key}={value!r}): give seconds > 0, or None")
        if (
            isinstance(close_grace_s, bool)
            or not isinstance(close_grace_s, int | float)
            or not 0 <= close_grace_s < math.inf
        ):
            raise ValueError(
                f"Kernel(close_grace_s={close_grace_s!r}): give seconds >= 0 (0: do not wait "
                "for the calls in flight)"
            )
        self.max_attempts = max_attempts
        self.default_timeout_s = default_timeout_s
        self.deadline_s = deadline_s
        self.close_grace_s = close_grace_s
        self.clock: Clock = clock or SystemClock()
        if isinstance(state, str):
            # memory/SQLite expiry follows the kernel's clock (a FakeClock in tests);
            # Redis always uses the server's clock.
            local = state.split(":", 1)[0].lower() in ("memory", "sqlite")
            self.state: StateStore = open_store(state, clock=self.clock.time if local else None)
        else:
            self.state = state
        self.events = EventBus()
        #: Hides secrets in every error the kernel records (``add_secret``).
        self.redactor = Redactor()
        self.plugins = PluginRegistry()
        self.plugins.on_change(self._on_plugins_changed)
        self.config: ToolwireConfig | None = None
        self._local: dict[str, Tool] = {}
        self._catalog: dict[str, Tool] = {}
        #: OpenAI/Anthropic-safe alias -> tool name, for names those APIs refuse
        self._aliases: dict[str, str] = {}
        self._alias_of: dict[str, str] = {}
        self._aliases_stale = False  # made when first needed: rebuilding stays O(changes)
        self._discovered: dict[str, Tool] = {}
        #: which plugin listed each of ``_discovered`` (a removed plugin's tools leave)
        self._discovered_by: dict[str, str] = {}
        self._catalog_lock: anyio.Lock | None = None
        #: tools a query brought in (``discover(query)``), with the plugin that gave them
        self._queried: dict[str, tuple[str, Tool]] = {}
        #: (plugin, name) -> (the plugin's Tool, the catalog's copy recorded under the
        #: plugin's name): the same object listed again keeps the same catalog entry
        self._renamed: dict[tuple[str, str], tuple[Tool, Tool]] = {}
        self._locks: dict[object, anyio.Lock] = {}
        #: serial_key -> functions of the tool given up on while they ran in a thread
        self._thread_runs: dict[object, list[ThreadRun]] = {}
        self._started = False
        self._start_lock: anyio.Lock | None = None
        #: the calls in flight, which close() and remove_plugin() wait for
        self._calls = _Calls()
        self._index: Any = None
        self._background: list[BackgroundTask] = []
        self._catalog_listeners: list[Callable[[], None]] = []
        self._on_plugins_changed()
        for p in plugins:
            self.register(p)
        for t in tools:
            self.add_tool(t)

    # ------------------------------------------------------------ plugins
    def register(
        self, plugin: object, *, name: str | None = None, order: int | None = None
    ) -> PluginInfo:
        """Register a plugin object before the kernel starts (see docs/writing-plugins.md).

        On a running kernel, a plugin with ``startup``, ``shutdown`` or
        ``discover`` hooks is refused (they would not run as they should):
        use ``await kernel.add_plugin(plugin)``.
        """
        info = self.plugins.register(plugin, name=name, order=order)
        lifecycle = self._lifecycle_hooks(info)
        if self._started and lifecycle:
            self.plugins.unregister(info.name)
            raise PluginError(
                info.name,
                f"the kernel is running and the plugin has {'/'.join(lifecycle)} hooks, which "
                "register() would not run: use `await kernel.add_plugin(plugin)`",
            )
        return info

    def unregister(self, name: str) -> None:
        """Remove a plugin by name (before start, or one without lifecycle hooks).

        On a running kernel, a plugin with ``startup``, ``shutdown`` or
        ``discover`` hooks is refused: use ``await kernel.remove_plugin(name)``.
        """
        info = self.plugins.plugins.get(name)
        lifecycle = self._lifecycle_hooks(info) if info is not None else []
        if self._started and lifecycle:
            raise PluginError(
                name,
                f"the kernel is running and the plugin has {'/'.join(lifecycle)} hooks, which "
                "unregister() would not run: use `await kernel.remove_plugin(name)`",
            )
        self.plugins.unregister(name)

    @staticmethod
    def _lifecycle_hooks(info: PluginInfo) -> list[str]:
        return [h for h in info.hooks() if h in ("startup", "shutdown", "discover")]

    async def add_plugin(
        self, plugin: object, *, name: str | None = None, order: int | None = None
    ) -> PluginInfo:
        """Register a plugin on a running kernel (or before start, like ``register``).

        Its ``startup`` hook runs before any of its call hooks see a call; then
        its own tools are listed (its ``discover`` hook) and added. If
        ``startup`` fails, the plugin is not added; if the listing fails or
        one of its tools takes a name the catalog holds, its ``shutdown`` runs
        and it is removed again. The error is raised (``PluginError``,
        ``ToolCollisionError``); the kernel serves on as before. Other sources
        are not asked again.
        """
        info = self.plugins.register(plugin, name=name, order=order)
        if not self._started:
            return info
        own = {
            hook: [i for i in self.plugins.compiled[hook] if i.plugin == info.name]
            for hook in ("startup", "shutdown", "discover")
        }
        self.plugins.unregister(info.name)  # no call meets it before it has started
        for impl in own["startup"]:
            await self._call_impl(impl, "startup", self)
        registered = False
        try:
            info = self.plugins.register(plugin, name=info.name, order=info.order)
            registered = True
            if own["discover"]:
                async with self._catalog_guard():
                    await self._add_listing(info.name, own["discover"])
        except BaseException:
            with anyio.CancelScope(shield=True):
                if registered:
                    self.plugins.unregister(info.name)
                await self._run_shutdown(own["shutdown"])
            raise
        return info

    async def _add_listing(self, plugin: str, impls: list[Any]) -> None:
        """Add one plugin's listing to the catalog; a name held elsewhere is a clash."""
        found: dict[str, Tool] = {}
        for impl in impls:
            res = await self._call_impl(impl, "discover", self, None)
            for t in self._check_tools(impl.plugin, res):
                prev = found.get(t.name) or self._catalog.get(t.name)
                if prev is not None and prev is not t:
                    first = plugin if t.name in found else self._listed_by(t.name)
                    raise ToolCollisionError(t.name, prev.source, t.source, plugins=(first, plugin))
                found[t.name] = t
        if found:
            self._discovered.update(found)
            self._discovered_by.update(dict.fromkeys(found, plugin))
            self._rebuild_catalog()

    async def remove_plugin(self, name: str) -> None:
        """Remove a plugin from a running kernel (or before start, like ``unregister``).

        New calls stop meeting its hooks at once; the tools it contributed
        (listed or found by a query) leave the catalog; then, when it has a
        ``shutdown`` hook and call hooks or tools, the calls that started before
        (they may be in its hooks or its tools) get ``close_grace_s`` to end;
        then its ``shutdown`` hook runs (errors logged). Calls already running finish with the hooks they
        started with. Other sources are not asked again.
        """
        if name not in self.plugins.plugins:
            raise PluginError(name, self.plugins.not_registered())
        if not self._started:
            self.plugins.unregister(name)
            return
        c = self.plugins.compiled
        shutdown = [i for i in c["shutdown"] if i.plugin == name]
        hooked = any(
            i.plugin == name
            for h in ("before_call", "before_fallback", "on_error", "after_call")
            for i in c[h]
        )
        self.plugins.unregister(name)
        before: list[_Flight] = []
        with anyio.CancelScope(shield=True):
            async with self._catalog_guard():
                gone = [n for n, by in self._discovered_by.items() if by == name]
                for n in gone:
                    self._discovered.pop(n, None)
                    del self._discovered_by[n]
                queried = [n for n, (by, _) in self._queried.items() if by == name]
                for n in queried:
                    del self._queried[n]
                if gone or queried:
                    self._rebuild_catalog()
            if shutdown and (hooked or gone or queried):
                # A call starting from now on meets neither its hooks nor its tools: those
                # that started before may be in them.
                calls = self._calls
                before = [f for f in calls.all() if f.n]
                calls.now, calls.earlier = _Flight(), before
        try:
            if before:  # their grace period, which a cancellation of the caller cuts short
                left = await self._drain(before, self.close_grace_s)
                if left:
                    log.warning(
                        "plugin %r: %d call%s that started before its removal still running "
                        "after the close grace period (%gs): running its shutdown under them",
                        name,
                        left,
                        "" if left == 1 else "s",
                        self.close_grace_s,
                    )
        finally:
            with anyio.CancelScope(shield=True):
                await self._run_shutdown(shutdown)

    def _catalog_guard(self) -> anyio.Lock:
        """Serializes catalog listings (refresh, query, a plugin added or removed)."""
        if self._catalog_lock is None:
            self._catalog_lock = anyio.Lock()
        return self._catalog_lock

    async def _run_shutdown(self, impls: list[Any]) -> None:
        for impl in impls:
            try:
                res = impl.invoke(self)
                if impl.is_async or inspect.isawaitable(res):
                    await res
            except Exception:
                log.exception("plugin %r: shutdown failed", impl.plugin)

    def _on_plugins_changed(self) -> None:
        c = self.plugins.compiled
        # Flat (invoke, is_async, plugin) tuples: the cheapest shape to walk per call.
        # One tuple, replaced as a whole: each call takes it once, when it starts.
        self._hooks = (
            [(i.invoke, i.is_async, i.plugin) for i in c["before_call"]],
            [(i.invoke, i.is_async, i.plugin) for i in c["on_error"]],
            [(i.invoke, i.is_async, i.plugin) for i in c["after_call"]],
            [(i.invoke, i.is_async, i.plugin) for i in c["before_fallback"]],
        )

    # -------------------------------------------------------------- tools
    def add_tool(
        self, obj: Any, *, name: str | None = None, namespace: str | None = None
    ) -> list[Tool]:
        """Add local tools: a function, a ``Tool``, a ``ToolSet`` instance or a module.

        Returns the tools added. A name already in the catalog raises
        ``ToolCollisionError`` naming both sources; a name no tool API accepts
        (see ``TOOL_NAME_RULE``) or an empty ``name`` is a ``ValueError``.
        """
        if name is not None and not name:
            raise ValueError("add_tool(name=''): give a name, or None for the function's own")
        one = isinstance(obj, Tool) or (
            callable(obj) and not isinstance(obj, (type, types.ModuleType, ToolSet))
        )
        if name is not None and not one:
            raise ValueError(
                f"add_tool(name={name!r}) names one function or Tool; for the tools of "
                f"{type(obj).__name__} {obj!r} use namespace= (names become <namespace>_<name>)"
            )
        if isinstance(obj, Tool):
            new = [obj if name is None else dataclasses.replace(obj, name=name)]
        elif isinstance(obj, types.ModuleType):
            new = tools_from_module(obj, namespace=namespace)
        elif isinstance(obj, ToolSet):
            new = obj.__toolwire_tools__()
        elif callable(obj) and not isinstance(obj, type):
            new = [build_tool(obj, name=name)]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            new = tools_from_object(obj)
        else:
            raise TypeError(
                f"cannot make tools from {obj!r}: pass a function, a Tool, a ToolSet instance or a module"
            )
        if namespace and not isinstance(obj, types.ModuleType):
            # copies: a Tool the caller passed in keeps its own name
            new = [dataclasses.replace(t, name=f"{namespace}_{t.name}") for t in new]
        seen: dict[str, Tool] = {}
        for t in new:
            _check_tool(t, "local")
            held = self._local.get(t.name) or self._catalog.get(t.name)
            if held is not None and held is not t:
                raise ToolCollisionError(
                    t.name, held.source, t.source, hint=_added_twice(held, t.name in self._local)
                )
            twin = seen.setdefault(t.name, t)
            if twin is not t:
                raise ToolCollisionError(
                    t.name,
                    twin.source,
                    t.source,
                    hint="two tools of this add_tool call have that name: rename one "
                    "(@tool(name=...))",
                )
        for t in new:
            self._local[t.name] = t
        self._rebuild_catalog()
        return new

    def remove_tool(self, name: str) -> None:
        """Remove a local tool."""
        if name not in self._local:
            where = (
                f"it comes from a plugin's discover listing (source "
                f"{self._catalog[name].source!r}): remove that plugin (remove_plugin) "
                "or exclude the tool in its configuration"
                if name in self._catalog
                else "no tool of that name is in the catalog"
            )
            raise KeyError(f"no local tool {name!r} (added with add_tool) to remove; {where}")
        del self._local[name]
        self._rebuild_catalog()

    def _rebuild_catalog(self) -> None:
        cat: dict[str, Tool] = dict(self._local)
        for n, t in self._discovered.items():
            prev = cat.get(n)
            if prev is not None:
                raise ToolCollisionError(
                    n, prev.source, t.source, plugins=(None, self._discovered_by.get(n))
                )
            cat[n] = t
        for n, (_, t) in self._queried.items():
            cat.setdefault(n, t)  # a full listing or a local tool of that name wins
        old, self._catalog = self._catalog, cat
        if self._renamed:  # forget the copies of tools no longer listed
            self._renamed = {k: v for k, v in self._renamed.items() if cat.get(k[1]) is v[1]}
        self._aliases_stale = True
        index = self._index
        if index is not None:  # incremental: ~40 µs per changed tool instead of a rebuild
            for n in old.keys() - cat.keys():
                index.remove(n)
            for n, t in cat.items():
                if old.get(n) is not t:
                    index.add(t)
        if self._catalog_listeners and _catalog_differs(old, cat):
            for fn in list(self._catalog_listeners):
                try:
                    fn()
                except Exception:
                    log.exception("a catalog-change listener raised (ignored)")

    def _fresh_aliases(self) -> dict[str, str]:
        """Export names for tool names OpenAI and Anthropic refuse (``.``, over 64 chars)."""
        if self._aliases_stale:
            from ._discovery import export_alias

            aliases: dict[str, str] = {}
            for n in self._catalog:
                alias = export_alias(n)
                if alias is not None and alias not in self._catalog:
                    aliases[alias] = n
            self._aliases = aliases
            self._alias_of = {n: a for a, n in aliases.items()}
            self._aliases_stale = False
        return self._aliases

    def export_name(self, name: str) -> str:
        """The name ``name`` is exported under to OpenAI and Anthropic (itself when valid).

        Names those APIs refuse (a ``.``, over 64 characters: MCP allows both)
        get an alias; ``kernel.call`` accepts the alias, so a model's tool call
        comes back to the right tool.
        """
        self._fresh_aliases()
        return self._alias_of.get(name, name)

    def add_secret(self, value: str, name: str = "secret") -> None:
        """Hide ``value`` in every error this kernel records (shown as ``[secret:<name>]``).

        The values the configuration resolved from ``$secretRef`` are added
        by ``Kernel.from_config``; add the ones your code holds (API keys read
        elsewhere). Values shorter than 6 characters are not matched in text.
        """
        self.redactor.add(value, name)

    def _scrub_result(self, res: ToolResult) -> None:
        """An error result a plugin made: its error and the content that repeats it."""
        if res.error is not None:
            self._scrub(res.error)
        if len(self.redactor):
            res.content = self.redactor.data(res.content)

    def _scrub(self, err: ErrorInfo) -> None:
        """Known secrets and credential fields out of an error, before anyone sees it."""
        r = self.redactor
        if len(r):
            err.message = r.text(err.message)
        if err.details:
            err.details = r.data(err.details)

    def on_catalog_change(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` after the catalog changes; returns a function that unsubscribes it.

        A change is a tool added or removed, or one whose name, description,
        schemas, annotations or tags changed (a source that rebuilds identical
        tools on every ``discover`` is no change). ``fn`` runs synchronously
        where the change happened (``add_tool``, ``refresh_tools``, ...); one
        that needs to await should schedule it, e.g. with ``kernel.spawn``.
        For transports that tell their clients (MCP's ``tools/list_changed``).
        """
        self._catalog_listeners.append(fn)

        def unsubscribe() -> None:
            if fn in self._catalog_listeners:
                self._catalog_listeners.remove(fn)

        return unsubscribe

    async def refresh_tools(self, *, keep_on_collision: bool = False) -> list[Tool]:
        """Ask every tool source (``discover`` hook, query=None) for its tools.

        A failing source raises ``PluginError`` and the previous catalog stays.
        Two sources claiming one name raise ``ToolCollisionError`` (the catalog
        stays) — unless ``keep_on_collision``: then the tool that held the name
        keeps it (a local tool always does; between two new claims, the first
        source's), the other is left out with a warning naming both, and every
        other change applies. Plugins refreshing while the kernel serves pass it,
        so one clash cannot freeze the catalog; at startup a clash stays an error.
        """
        async with self._catalog_guard():
            return await self._refresh(keep_on_collision)

    async def _refresh(self, keep_on_collision: bool) -> list[Tool]:
        found: dict[str, Tool] = {}
        by: dict[str, str] = {}
        for impl in self.plugins.compiled["discover"]:
            res = await self._call_impl(impl, "discover", self, None)
            for t in self._check_tools(impl.plugin, res):
                if found.get(t.name) is t:
                    continue  # the same tool listed twice (as add_plugin's listing allows)
                prev = found.get(t.name) or self._local.get(t.name)
                if prev is not None:
                    pair = (by.get(t.name), impl.plugin)  # None: a local tool
                    if not keep_on_collision:
                        raise ToolCollisionError(t.name, prev.source, t.source, plugins=pair)
                    held = self._catalog.get(t.name)
                    keep, drop = (prev, t)
                    if t.name not in self._local and held is not None and held.source == t.source:
                        keep, drop = (t, prev)
                        found[t.name] = t
                        by[t.name] = impl.plugin
                    log.warning(
                        "tool name %r is claimed by %s and %s: keeping %s's, leaving out "
                        "%s's until the clash is resolved; give it another name in one of "
                        "them, or leave it out of one: %s",
                        t.name,
                        prev.source,
                        t.source,
                        keep.source,
                        drop.source,
                        collision_advice(t.name, (prev.source, t.source), pair),
                    )
                    continue
                found[t.name] = t
                by[t.name] = impl.plugin
        old = self._discovered, self._discovered_by, self._queried
        self._discovered, self._discovered_by = found, by
        self._queried = self._queried_kept(found)
        try:
            self._rebuild_catalog()
        except ToolCollisionError:
            self._discovered, self._discovered_by, self._queried = old
            raise
        return list(self._catalog.values())

    def _queried_kept(self, found: Mapping[str, Tool]) -> dict[str, tuple[str, Tool]]:
        """The query-found tools a refresh keeps: not relisted, and their plugin still here."""
        kept: dict[str, tuple[str, Tool]] = {}
        for n, (plugin, t) in self._queried.items():
            if plugin not in self.plugins.plugins:
                continue
            listed = found.get(n) or self._local.get(n)
            if listed is None:
                kept[n] = (plugin, t)
            elif listed.source != t.source:
                log.warning(
                    "tool name %r, found by a query from %s, is now listed by %s: keeping %s's",
                    n,
                    t.source,
                    listed.source,
                    listed.source,
                )
        return kept

    async def discover(self, query: str) -> list[Tool]:
        """Query-time discovery: sources may return tools matching ``query``.

        Every source is asked first; then the returned tools not yet in the
        catalog are added to it, all or none: a failing source raises
        ``PluginError`` and a name two sources claim raises
        ``ToolCollisionError``, and in both cases the catalog is unchanged.
        Returns the matching tools (the catalog's own copy of those already in
        it). Tools added this way stay through ``refresh_tools`` until a full
        listing returns the same name (its tool replaces them) or their plugin
        is removed.
        """
        if not isinstance(query, str):
            raise TypeError(f"discover(query) takes a string, not {type(query).__name__}")
        async with self._catalog_guard():
            return await self._discover(query)

    async def _discover(self, query: str) -> list[Tool]:
        new: dict[str, tuple[str, Tool]] = {}
        out: dict[str, Tool] = {}
        for impl in self.plugins.compiled["discover"]:
            res = await self._call_impl(impl, "discover", self, query)
            # not remembered over a listed one: a query's fresh object must not displace
            # the copy of the object the plugin's listing gives (its relisting would
            # re-index the tool)
            for t in self._check_tools(impl.plugin, res, remember=False):
                added = new.get(t.name)
                held = added[1] if added is not None else self._catalog.get(t.name)
                if held is None:
                    new[t.name] = (impl.plugin, t)
                    held = t
                elif held.source != t.source:
                    first = added[0] if added is not None else self._listed_by(t.name)
                    raise ToolCollisionError(
                        t.name, held.source, t.source, plugins=(first, impl.plugin)
                    )
                out.setdefault(t.name, held)
        if new:
            self._queried.update(new)
            self._rebuild_catalog()
        return list(out.values())

    def _listed_by(self, name: str) -> str | None:
        """The plugin that listed the catalog's tool ``name``; None for a local tool."""
        if name in self._local:
            return None
        by = self._discovered_by.get(name)
        if by is None and name in self._queried:
            by = self._queried[name][0]
        return by

    def _check_tools(self, plugin: str, res: Any, *, remember: bool = True) -> list[Tool]:
        """The tools a plugin's ``discover`` returned, checked; those that kept the default
        source ``"local"`` as copies recorded under the plugin's name."""
        if res is None:
            return []
        if not isinstance(res, (list, tuple)) or not all(isinstance(t, Tool) for t in res):
            got = (
                type(res).__name__
                if not isinstance(res, (list, tuple))
                else f"a list holding {type(next(t for t in res if not isinstance(t, Tool))).__name__}"
            )
            raise PluginError(
                plugin,
                f"discover must return a list of Tool objects or None, not {got}; build "
                "each with toolwire.Tool(...) (or toolwire.build_tool(fn))",
            )
        for t in res:
            try:
                _check_tool(t, plugin)
            except ValueError as exc:
                raise PluginError(plugin, str(exc)) from None
        return [self._under(plugin, t, remember) if t.source == "local" else t for t in res]

    def _under(self, plugin: str, tool: Tool, remember: bool = True) -> Tool:
        """``tool`` recorded under ``plugin``'s name: "local" is the source of tools added
        with ``add_tool``, never of a plugin's. A copy (the plugin's object may be in other
        kernels), made once per object, so relisting it changes nothing. ``remember=False``
        (a query): remembered only when nothing is yet, so a later listing of the object
        a query found keeps its entry too."""
        key = (plugin, tool.name)
        held = self._renamed.get(key)
        if held is not None and held[0] is tool:
            return held[1]
        copy = dataclasses.replace(tool, source=plugin)
        if remember or held is None:
            self._renamed[key] = (tool, copy)
        return copy

    async def _call_impl(self, impl: Any, hook: str, *args: Any) -> Any:
        """A lifecycle hook (``startup``, ``shutdown``, ``discover``) of one plugin; one
        that is slow to return is named in a WARNING while the kernel waits for it."""
        try:
            res = impl.invoke(*args)
            if impl.is_async or inspect.isawaitable(res):
                watch = BackgroundTask(_warn_while_waiting, (impl.plugin, hook), "toolwire-watch")
                watch._start()
                try:
                    res = await res
                finally:
                    watch._scope.cancel()
        except (KernelError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            raise PluginError(impl.plugin, f"{hook} failed: {type(exc).__name__}: {exc}") from exc
        return res

    def get_tool(self, name: str) -> Tool | None:
        """The tool named ``name``, or None."""
        return self._catalog.get(name)

    def list_tools(
        self, *, format: Literal["tool", "openai", "anthropic", "mcp"] = "tool"
    ) -> list[Any]:
        """Every tool in the catalog, as ``Tool`` objects or exported definitions."""
        tools = list(self._catalog.values())
        return self._export(tools, format)

    def find_tools(
        self,
        query: str | Sequence[str] | None = None,
        *,
        mode: Mode = "hybrid",
        allowed: Sequence[str] | None = None,
        limit: int = 10,
        format: Literal["tool", "openai", "anthropic", "mcp"] = "tool",
    ) -> list[Any]:
        """Tools matching ``query`` (see docs/discovery.md for the modes)."""
        from ._discovery import ToolIndex, find_tools

        if self._index is None:
            self._index = ToolIndex(self._catalog.values())
        found = find_tools(
            self._catalog, self._index, query, mode=mode, allowed=allowed, limit=limit
        )
        return self._export(found, format)

    def use_ranker(self, ranker: Any) -> None:
        """Replace the lexical ranker behind ``find_tools`` (semantic/hybrid modes).

        ``ranker`` implements ``toolwire._discovery.Ranker`` (``rebuild``,
        ``add``, ``remove``, ``search``); it is rebuilt from the catalog now and
        kept up to date incrementally afterwards.
        """
        ranker.rebuild(self._catalog.values())
        self._index = ranker

    def _export(self, tools: list[Tool], format: str) -> list[Any]:
        if format == "tool":
            return tools
        if format not in ("openai", "anthropic", "mcp"):
            raise ValueError(
                f"unknown format {format!r}; use 'tool', 'openai', 'anthropic' or 'mcp'"
            )
        from ._discovery import export_tool

        if format != "mcp":
            self._fresh_aliases()
        alias = self._alias_of if format != "mcp" else {}
        return [export_tool(t, format, name=alias.get(t.name)) for t in tools]  # type: ignore[arg-type]

    def spawn(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None
    ) -> BackgroundTask:
        """Run ``await fn(*args)`` in the background until it returns or the kernel closes.

        For plugins' refresh loops, lease renewals and periodic flushes: call it
        from ``startup`` (or later, with the event loop running). An exception in
        the task is logged; ``kernel.close()`` cancels the tasks still running
        and waits for them. ``await task.cancel()`` stops one earlier.
        """
        task = BackgroundTask(fn, args, name or str(getattr(fn, "__qualname__", "task")))
        task._start()
        self._background = [t for t in self._background if not t.done]
        self._background.append(task)
        return task

    def get_plugin(self, name: str) -> Any:
        """The registered plugin object named ``name``; ``KeyError`` naming the loaded ones."""
        info = self.plugins.plugins.get(name)
        if info is None:
            raise KeyError(f"no plugin {name!r}; loaded plugins: {sorted(self.plugins.plugins)}")
        return info.plugin

    # ---------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Open the state store, run ``startup`` hooks, build the catalog. Idempotent."""
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            while self._calls.closing is not None:  # a close() is shutting down: then anew
                await self._calls.closing.wait()
            if self._started:
                return
            unknown = self.plugins.untraced()
            if unknown:
                log.warning(
                    "%s names %s, which %s not registered (loaded plugins: %s); nothing is "
                    "traced for %s - check the spelling against `toolwire plugins`",
                    TRACE_ENV,
                    ", ".join(repr(n) for n in unknown),
                    "is" if len(unknown) == 1 else "are",
                    ", ".join(sorted(self.plugins.plugins)) or "none",
                    "it" if len(unknown) == 1 else "them",
                )
            await self.state.open()
            failed: str | None = None  # the plugin whose startup is running
            try:
                for impl in self.plugins.compiled["startup"]:
                    failed = impl.plugin
                    await self._call_impl(impl, "startup", self)
                failed = None
                await self.refresh_tools()
            except BaseException:
                # Every plugin the start got past is shut down again, those without a
                # startup hook too (as close() would); the one that failed is not.
                await self._shutdown(before=failed)
                await self.state.close()
                raise
            self._started = True

    async def close(self) -> None:
        """Wait for the calls in flight, run ``shutdown`` hooks (errors logged) and close
        the state store.

        The calls in flight (and those that start meanwhile) get ``close_grace_s``
        seconds to end; those still running then are not cancelled: a warning says
        how many, and the plugins shut down under them. On a kernel that never
        started, only the tasks ``spawn`` started are cancelled (no hook ran
        ``startup``, so none runs ``shutdown``).
        """
        calls = self._calls
        while calls.closing is not None:  # another close() is running: it closes
            await calls.closing.wait()
        if not self._started:
            for task in self._background:
                await task.cancel()
            self._background.clear()
            return
        closing = calls.closing = anyio.Event()
        try:
            try:
                left = await self._drain(None, self.close_grace_s)
            except BaseException:
                # cancelled while waiting for the calls: the kernel still closes (shielded,
                # bounded), as it did before there was a wait, then the cancellation goes on
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_CUT_S):
                    await self._close_now()
                raise
            if left:
                log.warning(
                    "%d call%s still running after the close grace period (%gs): shutting "
                    "down the plugins and closing the state store under %s; give the kernel "
                    "a longer close_grace_s, or cancel the calls before close()",
                    left,
                    "" if left == 1 else "s",
                    self.close_grace_s,
                    "it" if left == 1 else "them",
                )
            await self._close_now()
        finally:
            calls.closing = None
            closing.set()

    async def _close_now(self) -> None:
        """Shut the plugins down, cancel the background tasks, close the state store."""
        self._started = False
        await self._shutdown(before=None)
        for task in self._background:
            await task.cancel()
        self._background.clear()
        await self.state.close()

    async def _drain(self, flights: list[_Flight] | None, grace_s: float) -> int:
        """Wait up to ``grace_s`` for the calls of ``flights`` to end (None: every call in
        flight, those starting meanwhile included); how many still run."""

        def watched() -> list[_Flight]:
            return flights if flights is not None else self._calls.all()

        with anyio.move_on_after(grace_s):
            while True:
                busy = [f for f in watched() if f.n]
                if not busy:
                    break
                await busy[0].wait()
        return sum(f.n for f in watched())

    async def _shutdown(self, before: str | None) -> None:
        """Run the ``shutdown`` hooks (descending order); with ``before`` (a start that
        failed in that plugin's ``startup``), only those of the plugins that count as
        started: those ordered before it, and those with no ``startup`` hook (nothing to
        wait for: what they hold, they hold since they were made)."""
        impls = self.plugins.compiled["shutdown"]
        if before is not None:
            rank = {p.name: i for i, p in enumerate(self.plugins.ordered())}
            limit = rank.get(before, len(rank))
            waiting = {i.plugin for i in self.plugins.compiled["startup"]}
            impls = [
                i
                for i in impls
                if rank.get(i.plugin, limit) < limit
                or (i.plugin != before and i.plugin not in waiting)
            ]
        await self._run_shutdown(impls)

    async def __aenter__(self) -> Kernel:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()

    # --------------------------------------------------------------- call
    async def call(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        session_id: str | None = None,
        tenant: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's overall deadline
        progress: ProgressHandler | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Run one tool call through the pipeline and return its normalized result.

        Never raises for a tool failure (see ``result.is_error`` /
        ``result.raise_for_error()``); raises only for cancellation and
        programming errors. ``timeout`` is the overall deadline for this call
        (retries included); it overrides the kernel's ``deadline_s``.
        ``progress`` receives the tool's ``ctx.report_progress`` calls;
        ``extensions`` offers transport capabilities to plugins and tools as
        ``ctx.extensions`` (e.g. ``"mcp.elicit"``).
        """
        if not self._started:
            await self.start()
        if type(name) is not str:
            if not isinstance(name, str):
                raise TypeError(f"kernel.call(name=...): the tool name must be a str, not {name!r}")
            name = str(name)  # a StrEnum member, say
        if name not in self._catalog and name in self._fresh_aliases():
            name = self._aliases[name]  # a model calling the OpenAI/Anthropic export's name
        if progress is not None and not callable(progress):
            raise TypeError(
                f"kernel.call({name!r}, progress=...): progress must be a callable "
                f"(progress, total, message), not {type(progress).__name__}"
            )
        if args is not None and type(args) is not dict and not isinstance(args, Mapping):
            hint = (
                ": decode a model's JSON arguments first (json.loads), and answer the model "
                "yourself when they are not JSON or not an object"
                if isinstance(args, str | bytes | bytearray)
                else ""
            )
            raise TypeError(
                f"kernel.call({name!r}, args=...): args must be a mapping of argument names to "
                f"values (a dict), not {type(args).__name__}{hint}"
            )
        if (
            (call_id is not None and type(call_id) is not str)
            or (session_id is not None and type(session_id) is not str)
            or (tenant is not None and type(tenant) is not str)
        ):
            _check_idents(name, call_id=call_id, session_id=session_id, tenant=tenant)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(
                f"kernel.call({name!r}, metadata=...): give a dict (a mapping of names to "
                f"values) or None, not {type(metadata).__name__}"
            )
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not timeout > 0  # also refuses NaN
        ):
            raise ValueError(
                f"kernel.call({name!r}, timeout={timeout!r}): timeout must be a positive number "
                "of seconds, or None"
            )
        t0 = perf_counter()
        call = ToolCall(
            name,
            dict(args) if args is not None else {},
            call_id,
            session_id,
            tenant,
            dict(metadata) if metadata is not None else {},  # a plugin may add keys
        )
        attempts: list[Attempt] = []
        meta = ResultMeta(
            call_id, name, 0.0, attempts, False, None, None, self.clock.time(), [], {}
        )
        dl = timeout if timeout is not None else self.deadline_s
        deadline = None if dl is None else self.clock.monotonic() + dl
        ctx = CallContext(self, call, None, 0, attempts, deadline, t0, {}, meta, progress)
        if extensions:
            ctx.extensions = dict(extensions)
        # The call's hooks, and its count among the calls in flight that close() and
        # remove_plugin() wait for: taken together, with no await between them and the
        # check that the kernel is started (an async call_started subscriber may wait).
        ctx.hooks = self._hooks
        flight = self._calls.now
        flight.n += 1
        events = self.events.active
        if events:
            try:
                await self.events.emit("call_started", call)
            except BaseException:
                _leave(flight)
                raise
        # after_call hooks started, and the result the latest was given: a cancellation
        # that comes while they run gives that result to the others (the tool ran)
        entered: list[Any] = [0, None]
        try:
            try:
                result = await self._run(call, ctx)
            except Exception as exc:  # a bug (kernel or plugin): still an answer, hooks still run
                log.error("call of tool %r failed inside the kernel", name, exc_info=exc)
                result = self._fail(
                    ctx,
                    ErrorKind.INTERNAL,
                    f"the call of tool {name!r} failed inside toolwire: "
                    f"{type(exc).__name__}: {exc} (a bug; the log has the traceback)",
                )
            meta.duration_ms = (perf_counter() - t0) * 1000.0
            if result.meta is not meta:
                self._adopt(result, meta)
            if ctx.hooks[2]:
                result = await self._run_after(call, result, ctx, entered)
        except GeneratorExit:
            raise  # the coroutine is being closed: it may not await the hooks
        except BaseException as exc:
            # A cancellation, or KeyboardInterrupt / SystemExit from a tool or a hook: the
            # plugins still release what they hold for the call, then it goes on.
            await self._after_cancel(call, ctx, t0, entered, exc)
            if events:
                await self._finished_cancelled(call, ctx, t0, exc)
            raise
        finally:
            _leave(flight)
        if events:
            await self.events.emit("call_finished", call, result=result.to_dict())
        return result

    async def _finished_cancelled(
        self, call: ToolCall, ctx: CallContext, t0: float, exc: BaseException
    ) -> None:
        """``call_finished`` for a cancelled call, so a subscriber (a UI) sees every call end.

        Its result is the ``cancelled`` error the caller met, even when the cancellation
        came while the ``after_call`` hooks ran with the tool's result.
        """
        ctx.meta.duration_ms = (perf_counter() - t0) * 1000.0
        res = ToolResult.from_error(_interrupted(exc), ctx.meta)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            await self.events.emit("call_finished", call, result=res.to_dict())

    async def _after_cancel(
        self, call: ToolCall, ctx: CallContext, t0: float, entered: list[Any], exc: BaseException
    ) -> None:
        """Let plugins release what they hold, then let the cancellation go on.

        ``entered``: how many ``after_call`` hooks had already started, and the result
        the latest of them was given. Each hook runs once per call. When the
        cancellation came while they ran, the call's outcome is known (the tool ran, or
        a plugin answered): the hooks not yet started get that result, not ``cancelled``,
        so that it is kept (idempotency records it for a replay) rather than dropped.
        """
        ctx.between_attempts = None  # cancelled in a wait between attempts: no more attempts
        start, res = entered
        if len(ctx.hooks[2]) <= start:
            return
        if res is None:
            ctx.meta.duration_ms = (perf_counter() - t0) * 1000.0
            res = ToolResult.from_error(_interrupted(exc), ctx.meta)
        else:
            log.warning(
                "the call of tool %r was %s while its after_call hooks ran; the "
                "remaining hooks get its result, which the caller does not",
                call.name,
                "cancelled" if _is_cancel(exc) else f"interrupted by {type(exc).__name__}",
            )
        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            await self._run_after(call, res, ctx, [start, res])

    @staticmethod
    def _adopt(result: ToolResult, own: ResultMeta) -> None:
        """Give a plugin-made result the call's identity and the facts gathered so far.

        ``own``: the meta of the result it replaces (the call's own, or an earlier
        replacement's, which holds what the hooks between them recorded).
        """
        m = result.meta
        if m.call_id is None:
            m.call_id = own.call_id
        if m.tool is None:
            m.tool = own.tool
        if m.started_at is None:
            m.started_at = own.started_at
        if not m.duration_ms:
            m.duration_ms = own.duration_ms
        if m.approval is None:
            m.approval = own.approval
        if own.attempts and not m.attempts:
            m.attempts = own.attempts
        for k, v in own.extra.items():
            m.extra.setdefault(k, v)
        if own.plugin_errors and m.plugin_errors is not own.plugin_errors:
            have = {id(e) for e in m.plugin_errors}
            m.plugin_errors[:0] = [e for e in own.plugin_errors if id(e) not in have]

    def _bad_decision(self, err: ErrorInfo, ctx: CallContext, by: str, problem: str) -> ToolResult:
        """A plugin's on_error decision the kernel cannot follow: the tool's own error stands.

        A plugin bug must not hide why the tool failed (it once became ``internal``).
        """
        log.error("plugin %r: on_error returned %s; the tool's own error stands", by, problem)
        ctx.meta.plugin_errors.append(
            {"plugin": by, "hook": "on_error", "error": f"returned {problem}"}
        )
        err.details["gave_up"] = f"plugin {by!r}: on_error returned {problem} (ignored)"
        return ToolResult.from_error(err, ctx.meta)

    def _fail(
        self, ctx: CallContext, kind: str, message: str, *, source: str = "kernel", **details: Any
    ) -> ToolResult:
        err = ErrorInfo(kind, message, source=source, details=details)
        self._scrub(err)
        return ToolResult.from_error(err, ctx.meta)

    def _validate(self, tool: Tool, args: Mapping[str, Any]) -> dict[str, Any]:
        if tool.validator is not None:
            return tool.validator(args)
        return validate_json_schema(args, tool.input_schema)

    def _not_found(self, ctx: CallContext, name: str) -> ToolResult:
        close = difflib.get_close_matches(name, list(self._catalog), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        if not self._catalog:
            cfg = self.config
            where = cfg.path if cfg is not None and cfg.path else "toolwire.toml"
            return self._fail(
                ctx,
                ErrorKind.NOT_FOUND,
                f"unknown tool {name!r}: the catalog is empty (no local tools and no tool "
                f"source answered); add tools with kernel.add_tool(...) or `[tools] modules = "
                f"[...]` in {where}, or configure a tool source (mcp, a2a, search)",
                close_matches=close,
            )
        return self._fail(
            ctx,
            ErrorKind.NOT_FOUND,
            # Said for every caller: a model over MCP, a program, an operator at a shell.
            f"unknown tool {name!r}{hint} (MCP tools/list, kernel.list_tools() and "
            f"`toolwire tools` list the tools there are: {len(self._catalog)})",
            close_matches=close,
        )

    def _invalid_args(
        self, ctx: CallContext, tool: Tool, exc: pydantic.ValidationError | ArgsError
    ) -> ToolResult:
        text, problems = describe_validation_error(exc)
        return self._fail(
            ctx,
            ErrorKind.INVALID_ARGS,
            f"invalid arguments for tool {tool.name!r}: {text}",
            problems=problems,
        )

    async def _run(self, call: ToolCall, ctx: CallContext) -> ToolResult:
        """Steps 1-4 of the lifecycle: resolve, validate, before_call, attempts."""
        tool = self._catalog.get(call.name)
        if tool is None:
            return self._not_found(ctx, call.name)
        ctx.tool = tool
        try:
            validator = tool.validator
            call.args = (
                validator(call.args)
                if validator is not None
                else validate_json_schema(call.args, tool.input_schema)
            )
        except (pydantic.ValidationError, ArgsError) as exc:
            return self._invalid_args(ctx, tool, exc)
        for invoke, is_async, plugin in ctx.hooks[0]:
            check = ctx.check_result
            try:
                res = invoke(call, ctx)
                if is_async or (res is not None and inspect.isawaitable(res)):
                    res = await res
                if ctx.check_result is not check:
                    ctx.check_result_by = plugin
            except CallRejected as rej:
                return self._rejected(ctx, plugin, rej)
            except Exception as exc:
                return self._before_failed(ctx, plugin, exc)
            except asyncio.CancelledError as exc:
                if not _foreign_cancel(exc):
                    raise
                return self._before_failed(ctx, plugin, exc)
            if res is not None:
                if isinstance(res, ToolResult):
                    problem = _content_problem(res)
                    if problem is None:
                        if res.error is not None:
                            self._scrub_result(res)
                        return res
                else:
                    problem = f"{type(res).__name__}, expected ToolResult or None"
                return self._before_returned(ctx, plugin, problem)

        if ctx.attempt_timeout_s is not None:  # set by a before_call hook (checked once)
            try:
                _check_attempt_timeout(ctx.attempt_timeout_s)
            except ValueError as exc:
                # Checked once after the hooks (not after each: that cost every call),
                # so the plugin is one of those whose before_call ran.
                setters = [p for _, _, p in ctx.hooks[0]]
                if len(setters) == 1:
                    return self._before_failed(ctx, setters[0], exc)
                who = ", ".join(repr(p) for p in setters)
                return self._before_failed(ctx, who, exc, f"one of the plugins {who}")

        if ctx.before_first_attempt:
            for plugin, fn in ctx.before_first_attempt:
                ended = await self._run_step(ctx, plugin, fn, self._before_failed)
                if ended is not None:
                    return ended

        # Step 4: the attempt loop, the only retry loop in the system.
        attempts = ctx.attempts
        cur_tool, cur_call = tool, call
        while True:
            ctx.attempt += 1
            ctx.current_tool = cur_tool
            a0 = perf_counter()
            err: ErrorInfo
            try:
                if (
                    cur_tool.serial_key is None
                    and ctx.deadline is None
                    and cur_tool.timeout_s is None
                    and self.default_timeout_s is None
                    and ctx.attempt_timeout_s is None
                ):
                    raw = await cur_tool.executor(cur_call.args, ctx)
                else:
                    raw = await self._execute_guarded(cur_tool, cur_call.args, ctx)
                content = normalize_content(raw)
            except ToolError as exc:
                err = exc.to_info(cur_tool.source)
            except TimeoutError as exc:
                err = ErrorInfo(
                    ErrorKind.TIMEOUT,
                    f"tool {cur_tool.name!r} timed out: {str(exc) or 'timeout'}",
                    source=cur_tool.source,
                    # the tool never ran: nothing it did can be unknown (idempotency reads it)
                    details={"reason": NOT_STARTED} if isinstance(exc, _NotStarted) else {},
                    exception=exc,
                )
            except NotJSONError as exc:
                err = ErrorInfo(
                    ErrorKind.TOOL_ERROR,
                    f"tool {cur_tool.name!r} returned a {exc.type_name}, which is not "
                    f"JSON-serializable ({exc.detail}); return a dict, a pydantic model, a "
                    f"dataclass or JSON-compatible values",
                    source="kernel",
                    exception=exc,
                )
            except Exception as exc:
                err = ErrorInfo(
                    ErrorKind.TOOL_ERROR,
                    f"{type(exc).__name__}: {exc}",
                    source=cur_tool.source,
                    exception=exc,
                )
            except asyncio.CancelledError as exc:
                if not _foreign_cancel(exc):
                    raise
                err = ErrorInfo(
                    ErrorKind.TOOL_ERROR,
                    f"tool {cur_tool.name!r} raised CancelledError though the call was not "
                    "cancelled (something it awaited was cancelled)",
                    source=cur_tool.source,
                    exception=exc,
                )
            else:
                check = ctx.check_result
                rejected = self._check_result(check, cur_tool, content, ctx) if check else None
                if rejected is None:
                    done = Attempt(cur_tool.name, (perf_counter() - a0) * 1000.0)
                    if cur_tool.serial_key is not None:
                        self._took_turn(done, ctx)
                    attempts.append(done)
                    ctx.meta.served_by = cur_tool.name
                    if type(raw) is Image and raw.path is not None:  # vouch for the file
                        ctx.meta.extra[IMAGE_FILE_EXTRA] = content[IMG_PATH_KEY]
                    return ToolResult(content, False, None, ctx.meta)
                err = rejected.to_info(cur_tool.source)
            self._scrub(err)
            attempt = Attempt(cur_tool.name, (perf_counter() - a0) * 1000.0, str(err.kind))
            if cur_tool.serial_key is not None:
                self._took_turn(attempt, ctx)
            attempts.append(attempt)
            try:
                step = await self._after_failure(call, cur_tool, cur_call, err, attempt, ctx)
            except BaseException:  # cancelled in the wait, or a bug (a custom Clock.sleep)
                ctx.between_attempts = None  # after_call must not see the call as waiting
                raise
            if isinstance(step, ToolResult):
                ctx.between_attempts = None
                return step
            if ctx.before_next_attempt:
                refused = await self._before_next_attempt(ctx)
                if refused is not None:
                    ctx.between_attempts = None
                    return refused
            # no await from the last look at before_next_attempt to here: a step added
            # while the call waited has run before the next attempt starts
            ctx.between_attempts = None
            cur_tool, cur_call = step

    async def _before_next_attempt(self, ctx: CallContext) -> ToolResult | None:
        """The ``ctx.before_next_attempt`` steps, each once (those added meanwhile too):
        None lets the next attempt run; a result ends the call."""
        while ctx.before_next_attempt:  # (a plugin may have replaced the list meanwhile)
            plugin, fn = ctx.before_next_attempt.pop(0)
            ended = await self._run_step(ctx, plugin, fn, self._step_failed)
            if ended is not None:
                return ended
        return None

    async def _run_step(
        self,
        ctx: CallContext,
        plugin: str,
        fn: Callable[[], Awaitable[None]],
        failed: Callable[[CallContext, str, BaseException], ToolResult],
    ) -> ToolResult | None:
        """A step a plugin added for the call (``before_first_attempt``,
        ``before_next_attempt``): None lets the call go on; a refusal or a failure (as
        ``failed`` makes it) ends it, the attempt not run."""
        try:
            await fn()
        except CallRejected as rej:
            return self._rejected(ctx, plugin, rej)
        except Exception as exc:
            return failed(ctx, plugin, exc)
        except asyncio.CancelledError as exc:
            if not _foreign_cancel(exc):
                raise
            return failed(ctx, plugin, exc)
        return None

    def _step_failed(self, ctx: CallContext, plugin: str, exc: BaseException) -> ToolResult:
        """A ``ctx.before_next_attempt`` step of ``plugin`` raised: the call ends
        ``internal``, its next attempt not run (fail-closed, as a failed before_call)."""
        name = ctx.call.name
        log.error(
            "plugin %r: a before_next_attempt step failed for tool %r", plugin, name, exc_info=exc
        )
        ctx.meta.plugin_errors.append(
            {
                "plugin": plugin,
                "hook": "before_next_attempt",
                "error": f"{type(exc).__name__}: {exc}",
            }
        )
        return self._fail(
            ctx,
            ErrorKind.INTERNAL,
            f"plugin {plugin!r} failed before attempt {ctx.attempt + 1} of tool {name!r}: "
            f"{type(exc).__name__}: {exc}; that attempt was not run",
            source=plugin,
        )

    @staticmethod
    def _took_turn(attempt: Attempt, ctx: CallContext) -> None:
        """A serial tool's attempt: its wait for its turn out of its duration, into
        ``wait_ms`` (the wait grew with concurrency: profiling's figures and the adaptive
        timeouts made from them measured the queue, not the tool)."""
        wait_ms = ctx._turn_wait * 1000.0
        ctx._turn_wait = 0.0
        attempt.wait_ms = wait_ms
        attempt.duration_ms = max(0.0, attempt.duration_ms - wait_ms)

    @staticmethod
    def _check_result(
        check: Callable[[Tool, JSON], ToolError | None], tool: Tool, content: JSON, ctx: CallContext
    ) -> ToolError | None:
        """A plugin's ``ctx.check_result``; one that crashes keeps the result (never dropped)."""
        try:
            verdict = check(tool, content)
            if verdict is None or isinstance(verdict, ToolError):
                return verdict
            if inspect.iscoroutine(verdict):
                verdict.close()  # never awaited: closed, not left to warn at collection
                problem = (
                    "returned a coroutine: check_result is called, not awaited - make it a "
                    "plain function (def, not async def); the result is kept"
                )
            else:
                problem = (
                    f"returned {type(verdict).__name__} {verdict!r:.100}, expected a ToolError "
                    "(reject) or None (accept); the result is kept"
                )
            exc_info: Exception | None = None
        except Exception as exc:
            problem, exc_info = f"{type(exc).__name__}: {exc}", exc
        own = getattr(getattr(check, "__self__", None), "name", None)  # a plugin's method
        owner = (own if isinstance(own, str) else None) or ctx.check_result_by or repr(check)
        log.error(
            "plugin %r: check_result failed for tool %r: %s",
            owner,
            tool.name,
            problem,
            exc_info=exc_info,
        )
        ctx.meta.plugin_errors.append({"plugin": owner, "hook": "check_result", "error": problem})
        return None

    def _rejected(self, ctx: CallContext, plugin: str, rej: CallRejected) -> ToolResult:
        """The error result of a plugin's ``CallRejected``, scrubbed like every other error
        (a rejection may quote what an upstream said, credentials included)."""
        info = _rejection(plugin, rej)
        self._scrub(info)
        return ToolResult.from_error(info, ctx.meta)

    def _before_failed(
        self, ctx: CallContext, plugin: str, exc: BaseException, who: str | None = None
    ) -> ToolResult:
        """``plugin``'s before_call failed (``who``: how to name it when it is not one
        plugin: the source is then the kernel)."""
        name = ctx.call.name
        source = plugin if who is None else "kernel"
        who = who or f"plugin {plugin!r}"
        log.error("%s: before_call failed for tool %r", who, name, exc_info=exc)
        ctx.meta.plugin_errors.append(
            {"plugin": plugin, "hook": "before_call", "error": f"{type(exc).__name__}: {exc}"}
        )
        return self._fail(
            ctx,
            ErrorKind.INTERNAL,
            f"{who} failed in before_call: {type(exc).__name__}: {exc}; "
            f"the tool {name!r} was not run",
            source=source,
        )

    def _before_returned(self, ctx: CallContext, plugin: str, problem: str) -> ToolResult:
        """``plugin``'s before_call returned what the kernel cannot use: recorded and
        logged as a hook that raised is, and the call ends ``internal``."""
        name = ctx.call.name
        log.error("plugin %r: before_call returned %s for tool %r", plugin, problem, name)
        ctx.meta.plugin_errors.append(
            {"plugin": plugin, "hook": "before_call", "error": f"returned {problem}"}
        )
        return self._fail(
            ctx,
            ErrorKind.INTERNAL,
            f"plugin {plugin!r}: before_call returned {problem}; the tool {name!r} was not run",
            source=plugin,
        )

    async def _execute_guarded(self, tool: Tool, args: dict[str, Any], ctx: CallContext) -> Any:
        """Run one attempt under the serial lock and the timeout, when there are any."""
        timeout = ctx.attempt_timeout_s
        if timeout is None:
            timeout = tool.timeout_s if tool.timeout_s is not None else self.default_timeout_s
        if ctx.deadline is not None:
            left = ctx.deadline - self.clock.monotonic()
            if left <= 0:
                raise _NotStarted(
                    "the call's deadline passed before the attempt started (earlier "
                    "attempts, waits between them or plugins' before_call used it up); the "
                    "tool was not run this time: call again with a longer timeout"
                )
            if tool.serial_key is None:
                timeout = left if timeout is None else min(timeout, left)
        key = tool.serial_key
        if key is None:
            return await self._with_timeout(tool, args, ctx, timeout)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = anyio.Lock()
        # The wait for the lock, and for a function an earlier attempt gave up on that
        # still runs in its thread, counts against the call's deadline (not the attempt's
        # timeout: the tool has not started).
        w0 = perf_counter()
        try:
            await self._serial_enter(lock, key, ctx.deadline)
        finally:
            ctx._turn_wait = perf_counter() - w0  # not the tool's run (Attempt.wait_ms)
        try:
            if ctx.deadline is not None:
                left = ctx.deadline - self.clock.monotonic()
                timeout = left if timeout is None else min(timeout, left)
            runs: list[ThreadRun] = []
            ctx._thread_runs = runs
            try:
                return await self._with_timeout(tool, args, ctx, timeout)
            finally:
                ctx._thread_runs = None
                still = [r for r in runs if r.running]
                if still:  # given up, running on: the next call waits for it
                    self._thread_runs.setdefault(key, []).extend(still)
        finally:
            lock.release()

    async def _serial_enter(self, lock: anyio.Lock, key: object, deadline: float | None) -> None:
        """Take a serial tool's lock, then wait until no function of the tool still runs
        in a thread an earlier attempt gave up on; ``_NotStarted`` if the deadline comes."""
        left = math.inf if deadline is None else deadline - self.clock.monotonic()
        with anyio.move_on_after(left) as scope:
            await lock.acquire()
        if scope.cancelled_caught:
            raise _NotStarted(
                "the call's deadline passed while it waited for its turn at the serial tool "
                "(another call of it was running); the tool was not run this time: call "
                "again with a longer timeout"
            )
        try:
            runs = self._thread_runs.get(key)
            if runs is None:
                return
            if deadline is not None:
                left = deadline - self.clock.monotonic()
            with anyio.move_on_after(left) as scope:
                # polled: a thread its caller gave up on has no event loop to tell
                while any(r.running for r in runs):  # noqa: ASYNC110
                    await anyio.sleep(_THREAD_POLL_S)
            if scope.cancelled_caught:
                raise _NotStarted(
                    "the call's deadline passed while the serial tool's function, given up "
                    "by an earlier call (timeout or cancellation), still ran in its thread; "
                    "the tool was not run this time: call again with a longer timeout"
                )
            del self._thread_runs[key]
        except BaseException:
            lock.release()
            raise

    @staticmethod
    async def _with_timeout(
        tool: Tool, args: dict[str, Any], ctx: CallContext, seconds: float | None
    ) -> Any:
        if seconds is None:
            return await tool.executor(args, ctx)
        loop = _get_running_loop()
        if loop is not None:
            # An anyio scope cancelled by a timer: anyio's semantics (a tool's shielded
            # section finishes; asyncio.timeout's task.cancel() went through it) for
            # ~4.7 µs, where anyio.move_on_after costs ~13 µs.
            scope = _asyncio_cancel_scope()
            timer = loop.call_later(seconds, scope.cancel)
            try:
                with scope:
                    return await tool.executor(args, ctx)
            finally:
                timer.cancel()
            raise TimeoutError(_timed_out(seconds))
        with anyio.move_on_after(seconds):
            return await tool.executor(args, ctx)
        raise TimeoutError(_timed_out(seconds))

    async def _after_failure(
        self,
        call: ToolCall,
        cur_tool: Tool,
        cur_call: ToolCall,
        err: ErrorInfo,
        attempt: Attempt,
        ctx: CallContext,
    ) -> ToolResult | tuple[Tool, ToolCall]:
        """on_error decisions and the kernel's guards: the final result or the next attempt."""
        decision, by = await self._decide(cur_call, err, ctx)
        # Record what classification made of the failure, not the raw exception's kind.
        attempt.error_kind = str(err.kind)
        if decision is not None:
            attempt.decision = type(decision).__name__.lower()
        if self.events.active:
            await self.events.emit(
                "attempt_failed",
                cur_call,
                attempt=ctx.attempt,
                error=err.to_dict(),
                decision=attempt.decision,
                decided_by=by or None,
            )
        if decision is None:
            return ToolResult.from_error(err, ctx.meta)
        if isinstance(decision, Recover):
            if isinstance(decision.result, ToolResult):  # it would "succeed" with its dump
                return self._bad_decision(
                    err,
                    ctx,
                    by,
                    "Recover(result=ToolResult(...)): give the value the call succeeds with "
                    "(e.g. the ToolResult's content), not a ToolResult",
                )
            try:
                content = normalize_content(decision.result)
            except NotJSONError as exc:
                return self._bad_decision(
                    err, ctx, by, f"a Recover value that is not JSON-serializable: {exc}"
                )
            ctx.meta.served_by = f"recovered:{by}"
            return ToolResult(content, False, None, ctx.meta)
        if not isinstance(decision, (Retry, Fallback)):
            return self._bad_decision(err, ctx, by, f"{type(decision).__name__}, not a Decision")
        problem = _decision_problem(decision)
        if problem is not None:
            return self._bad_decision(err, ctx, by, problem)
        if ctx.attempt >= self.max_attempts:
            err.details["gave_up"] = f"max_attempts ({self.max_attempts}) reached"
            return ToolResult.from_error(err, ctx.meta)
        if isinstance(decision, Retry):
            wait = max(0.0, float(decision.after_s))
            left = ctx.time_left()
            if left is not None and wait >= left:
                err.details["gave_up"] = (
                    f"deadline: retry after {wait:.3f}s would pass the call's deadline"
                )
                return ToolResult.from_error(err, ctx.meta)
            ctx.between_attempts = err
            next_tool = cur_tool
            if self.events.active:
                await self.events.emit(
                    "retry", cur_call, after_s=wait, decided_by=by, attempt=ctx.attempt
                )
            if wait > 0:
                await self.clock.sleep(wait)
        else:
            nt = self._catalog.get(decision.tool)
            if nt is None:
                err.details["gave_up"] = (
                    f"plugin {by!r} chose fallback tool {decision.tool!r}, which does not exist"
                )
                return ToolResult.from_error(err, ctx.meta)
            ctx.between_attempts = err
            next_tool = nt
            if self.events.active:
                await self.events.emit(
                    "fallback", cur_call, to=nt.name, decided_by=by, attempt=ctx.attempt
                )
        new_args = decision.args
        if new_args is None and next_tool is cur_tool:
            return cur_tool, cur_call
        try:
            args = self._validate(next_tool, new_args if new_args is not None else cur_call.args)
        except (pydantic.ValidationError, ArgsError) as exc:
            # The plugin's choice does not fit: the caller's arguments were valid, so the
            # call ends with the failure that led here, saying why it went no further.
            text, problems = describe_validation_error(exc)
            which = "the arguments it gave" if new_args is not None else "the call's arguments"
            err.details["gave_up"] = (
                f"plugin {by!r} chose {type(decision).__name__.lower()} to {next_tool.name!r}, "
                f"whose schema rejects {which}: {text}"
            )
            err.details["rejected_args"] = problems
            return ToolResult.from_error(err, ctx.meta)
        nxt = ToolCall(
            next_tool.name, args, call.call_id, call.session_id, call.tenant, call.metadata
        )
        if ctx.hooks[3]:
            refused = await self._before_fallback(call, nxt, cur_tool, err, ctx)
            if refused is not None:
                return refused
        return next_tool, nxt

    async def _before_fallback(
        self, call: ToolCall, nxt: ToolCall, cur_tool: Tool, err: ErrorInfo, ctx: CallContext
    ) -> ToolResult | None:
        """The ``before_fallback`` hooks: None lets the rerouted attempt run; a result
        ends the call (a hook refused it, or failed: fail-closed)."""
        for invoke, is_async, plugin in ctx.hooks[3]:
            try:
                res = invoke(call, nxt, ctx)
                if is_async or (res is not None and inspect.isawaitable(res)):
                    await res
                continue
            except CallRejected as rej:
                info = _rejection(plugin, rej)
            except Exception as exc:
                info = _fallback_failed(ctx, nxt, plugin, exc)
            except asyncio.CancelledError as exc:
                if not _foreign_cancel(exc):
                    raise
                info = _fallback_failed(ctx, nxt, plugin, exc)
            info.details["fallback"] = {
                "from": cur_tool.name,
                "to": nxt.name,
                "after": {"kind": str(err.kind), "message": err.message},
            }
            self._scrub(info)
            return ToolResult.from_error(info, ctx.meta)
        return None

    async def _decide(self, call: ToolCall, err: ErrorInfo, ctx: CallContext) -> tuple[Any, str]:
        """The first on_error decision and its plugin; with a deadline, within it (DESIGN
        §1: the overall deadline is always enforced). A hook still awaiting at the deadline
        is cancelled: no decision, the error stands with ``details["gave_up"]``."""
        if ctx.deadline is None or not ctx.hooks[1]:
            return await self._ask_on_error(call, err, ctx, [])
        running: list[str] = []
        with anyio.move_on_after(ctx.deadline - self.clock.monotonic()):
            return await self._ask_on_error(call, err, ctx, running)
        plugin = running[-1]
        log.warning(
            "plugin %r: on_error was still running at the call's deadline for tool %r: "
            "cancelled; the error stands",
            plugin,
            call.name,
        )
        err.details["gave_up"] = (
            f"deadline: the call's deadline passed during the on_error hook of plugin "
            f"{plugin!r}, which was cancelled; no decision was made"
        )
        return None, ""

    async def _ask_on_error(
        self, call: ToolCall, err: ErrorInfo, ctx: CallContext, running: list[str]
    ) -> tuple[Any, str]:
        for invoke, is_async, plugin in ctx.hooks[1]:
            running.append(plugin)
            limit = ctx.attempt_timeout_s
            try:
                res = invoke(call, err, ctx)
                if is_async or (res is not None and inspect.isawaitable(res)):
                    res = await res
                if ctx.attempt_timeout_s is not limit:
                    try:
                        _check_attempt_timeout(ctx.attempt_timeout_s)
                    except ValueError:
                        ctx.attempt_timeout_s = limit  # the next attempt keeps the last good one
                        raise
            except (Exception, asyncio.CancelledError) as exc:
                if not isinstance(exc, Exception) and not _foreign_cancel(exc):
                    raise
                log.error("plugin %r: on_error failed for tool %r", plugin, call.name, exc_info=exc)
                ctx.meta.plugin_errors.append(
                    {"plugin": plugin, "hook": "on_error", "error": f"{type(exc).__name__}: {exc}"}
                )
                continue
            if res is not None:
                return res, plugin
        return None, ""

    async def _run_after(
        self, call: ToolCall, result: ToolResult, ctx: CallContext, entered: list[Any]
    ) -> ToolResult:
        """The ``after_call`` hooks from ``entered[0]`` on.

        When a cancellation (or another ``BaseException``) leaves a hook, ``entered[0]``
        is set to how many had started and ``entered[1]`` to the result given to the
        latest (what a cancellation hands the others, see ``_after_cancel``).
        """
        started = entered[0]
        try:
            for invoke, is_async, plugin in ctx.hooks[2][started:] if started else ctx.hooks[2]:
                started += 1
                try:
                    res = invoke(call, result, ctx)
                    if is_async or (res is not None and inspect.isawaitable(res)):
                        res = await res
                except (Exception, asyncio.CancelledError) as exc:
                    if not isinstance(exc, Exception) and not _foreign_cancel(exc):
                        raise
                    log.error(
                        "plugin %r: after_call failed for tool %r; the result is kept",
                        plugin,
                        call.name,
                        exc_info=exc,
                    )
                    result.meta.plugin_errors.append(
                        {
                            "plugin": plugin,
                            "hook": "after_call",
                            "error": f"{type(exc).__name__}: {exc}",
                        }
                    )
                    continue
                if res is None:
                    continue
                if isinstance(res, ToolResult):
                    problem = _content_problem(res)
                    if problem is None:
                        if res.meta is not result.meta:
                            self._adopt(res, result.meta)
                        if res.error is not None:
                            self._scrub_result(res)
                        result = res
                        continue
                else:
                    problem = f"{type(res).__name__}, expected ToolResult or None"
                # the result stands: a bad replacement must not lose it
                log.error(
                    "plugin %r: after_call returned %s for tool %r; ignored, the result is kept",
                    plugin,
                    problem,
                    call.name,
                )
                result.meta.plugin_errors.append(
                    {
                        "plugin": plugin,
                        "hook": "after_call",
                        "error": f"returned {problem} (ignored)",
                    }
                )
        except BaseException:
            entered[0], entered[1] = started, result
            raise
        return result

    # ------------------------------------------------------------ config
    @classmethod
    def from_config(
        cls, config: ToolwireConfig | str | os.PathLike[str] | None = None, **overrides: Any
    ) -> Kernel:
        """Build a kernel from a ``toolwire.toml`` (path) or a loaded config.

        Loads the enabled plugins from entry points, validates their sections,
        and adds the configured tool modules.
        """
        from ._config import ToolwireConfig, build_kernel, load_config

        cfg = config if isinstance(config, ToolwireConfig) else load_config(config)
        return build_kernel(cls, cfg, **overrides)
