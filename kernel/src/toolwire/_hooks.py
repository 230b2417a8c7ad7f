"""Plugin registry and the kernel's async-aware hook caller.

pluggy registers plugins and checks hook signatures; calling goes through flat
lists compiled here once per (un)registration: each entry knows its plugin's
name, whether to await, and which of the hook's arguments it takes. This keeps
a hook call at roughly the cost of the function call itself (pluggy's own
``pm.hook.x(...)`` costs ~1.4 µs plus ~0.6 µs per implementation and cannot
await).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import pluggy

from . import hookspecs
from ._errors import PluginError

__all__ = ["DEFAULT_ORDER", "HOOK_PARAMS", "HookImpl", "PluginInfo", "PluginRegistry"]

DEFAULT_ORDER = 1000
"""Order of a plugin that declares none: after the first-party ones (100..500, and the
tool sources at 900..910)."""

#: Canonical argument order of each hook.
HOOK_PARAMS: dict[str, tuple[str, ...]] = {
    "startup": ("kernel",),
    "shutdown": ("kernel",),
    "discover": ("kernel", "query"),
    "before_call": ("call", "ctx"),
    "before_fallback": ("call", "next_call", "ctx"),
    "on_error": ("call", "error", "ctx"),
    "after_call": ("call", "result", "ctx"),
}
_REVERSED = {"after_call", "shutdown"}

#: Environment switch: trace every hook call of these plugins (``1``/``all``: every plugin).
TRACE_ENV = "TOOLWIRE_TRACE_PLUGINS"
_trace_log = logging.getLogger("toolwire.trace")
_log = logging.getLogger("toolwire.plugins")


def trace_setting(raw: str | None) -> frozenset[str] | bool:
    """``TOOLWIRE_TRACE_PLUGINS`` parsed: True (all), False (none) or plugin names."""
    if raw is None or raw.strip().lower() in ("", "0", "false", "no", "off"):
        return False
    if raw.strip().lower() in ("1", "true", "yes", "on", "all", "*"):
        return True
    return frozenset(n.strip() for n in raw.split(",") if n.strip())


def _target(hook: str, args: tuple[Any, ...]) -> str:
    if hook == "before_fallback" and len(args) > 1:
        return f"{getattr(args[0], 'name', '')} -> {getattr(args[1], 'name', '')}"
    if hook in ("before_call", "on_error", "after_call") and args:
        return str(getattr(args[0], "name", ""))
    if hook == "discover" and len(args) > 1:
        return "" if args[1] is None else repr(args[1])
    return ""


def _outcome(value: Any) -> str:
    if value is None:
        return "None"
    kind = type(value).__name__
    error = getattr(value, "error", None)
    if error is not None:
        return f"{kind}(error={getattr(error, 'kind', error)})"
    reason = getattr(value, "reason", None)
    return f"{kind}({reason})" if reason else kind


def _traced(plugin: str, hook: str, invoke: Callable[..., Any], is_async: bool) -> Any:
    """``invoke`` logging each call (logger ``toolwire.trace``, INFO): arguments' tool,
    outcome or exception, duration."""

    def note(args: tuple[Any, ...], t0: float, outcome: str) -> None:
        _trace_log.info(
            "%s.%s(%s) -> %s in %.3f ms",
            plugin,
            hook,
            _target(hook, args),
            outcome,
            (perf_counter() - t0) * 1000,
        )

    if is_async:

        async def run_async(*args: Any) -> Any:
            t0 = perf_counter()
            try:
                res = await invoke(*args)
            except BaseException as exc:
                note(args, t0, f"raised {type(exc).__name__}: {exc}")
                raise
            note(args, t0, _outcome(res))
            return res

        return run_async

    async def settle(args: tuple[Any, ...], t0: float, pending: Any) -> Any:
        try:
            res = await pending
        except BaseException as exc:
            note(args, t0, f"raised {type(exc).__name__}: {exc}")
            raise
        note(args, t0, _outcome(res))
        return res

    def run(*args: Any) -> Any:
        t0 = perf_counter()
        try:
            res = invoke(*args)
        except BaseException as exc:
            note(args, t0, f"raised {type(exc).__name__}: {exc}")
            raise
        if res is not None and inspect.isawaitable(res):
            # an async hook behind a sync decorator: the kernel awaits it (see _kernel),
            # and its outcome is what that gives, not the coroutine
            return settle(args, t0, res)
        note(args, t0, _outcome(res))
        return res

    return run


@dataclass(slots=True, frozen=True)
class HookImpl:
    """One compiled implementation: call ``invoke(*canonical_args)``."""

    plugin: str
    invoke: Callable[..., Any]
    is_async: bool


@dataclass(slots=True)
class PluginInfo:
    """A registered plugin."""

    name: str
    plugin: object
    order: int
    version: str | None = None
    dist: str | None = None
    config: Any = None

    def hooks(self) -> list[str]:
        """Names of the hooks this plugin implements."""
        return sorted(n for n in HOOK_PARAMS if _is_impl(self.plugin, n))


def _static(plugin: object, name: str) -> Any:
    """``plugin.<name>`` without running properties (None when absent)."""
    try:
        fn = inspect.getattr_static(plugin, name)
    except AttributeError:
        return None
    return getattr(fn, "__func__", fn)


def _raw(plugin: object, name: str) -> Any:
    """``plugin.<name>`` as stored (a function, a staticmethod...), None when absent."""
    try:
        return inspect.getattr_static(plugin, name)
    except AttributeError:
        return None


def _wants_self(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` is a plain function taking ``self`` (or ``cls``) first:
    pluggy drops that parameter, so called on the class it gets the call's first argument."""
    fn = _raw(cls, name)
    if not inspect.isfunction(fn):
        return False
    params = list(inspect.signature(fn).parameters)
    return bool(params) and params[0] in ("self", "cls")


def _impl_opts(plugin: object, name: str) -> dict[str, Any] | None:
    """The ``@hookimpl`` options on ``plugin.<name>`` (None when it is not marked).

    The marker is looked for where pluggy looks: on a ``staticmethod`` or
    ``classmethod`` wrapper itself (``@hookimpl`` written above ``@staticmethod``),
    then on the function inside it.
    """
    try:
        holder = inspect.getattr_static(plugin, name)
    except AttributeError:
        return None
    attr = f"{hookspecs.PROJECT}_impl"
    opts = getattr(holder, attr, None)
    if opts is None:
        opts = getattr(getattr(holder, "__func__", None), attr, None)
    return opts if isinstance(opts, dict) else None


def _is_impl(plugin: object, name: str) -> bool:
    """Whether ``plugin.<name>`` is a hook implementation, without running properties."""
    return _impl_opts(plugin, name) is not None


def _adapter(
    fn: Callable[..., Any], argnames: tuple[str, ...], canonical: tuple[str, ...]
) -> Callable[..., Any]:
    """A callable taking the hook's canonical args and passing the impl its subset."""
    if argnames == canonical:
        return fn
    idx = tuple(canonical.index(a) for a in argnames)
    if not idx:
        return lambda *_: fn()
    if len(idx) == 1:
        (i,) = idx
        return lambda *a: fn(a[i])
    return lambda *a: fn(*[a[i] for i in idx])


class PluginRegistry:
    """Registered plugins, their order, and the compiled hook lists."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.compiled: dict[str, list[HookImpl]] = {h: [] for h in HOOK_PARAMS}
        self._listeners: list[Callable[[], None]] = []
        #: Plugins whose hook calls are logged (``TOOLWIRE_TRACE_PLUGINS``): True = all.
        self.trace: frozenset[str] | bool = trace_setting(os.environ.get(TRACE_ENV))

    def untraced(self) -> list[str]:
        """Names ``TOOLWIRE_TRACE_PLUGINS`` lists that are not registered (typos), sorted."""
        if isinstance(self.trace, bool):
            return []
        return sorted(self.trace - self.plugins.keys())

    def on_change(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` after every (un)registration (the kernel caches lists)."""
        self._listeners.append(fn)

    def register(
        self,
        plugin: object,
        *,
        name: str | None = None,
        order: int | None = None,
        version: str | None = None,
        dist: str | None = None,
        config: Any = None,
    ) -> PluginInfo:
        """Register ``plugin`` under ``name`` (default: its ``name`` attribute, else a
        module's or class's own name, else its class name)."""
        pname = name or getattr(plugin, "name", None)
        if pname is None:
            own = getattr(plugin, "__name__", None)  # a module (or a class) of hooks
            named = isinstance(plugin, (type, types.ModuleType)) and isinstance(own, str)
            pname = own if named else type(plugin).__name__
        if not isinstance(pname, str) or not pname:
            raise PluginError(repr(plugin), "a plugin needs a non-empty string name")
        if pname in self.plugins:
            raise PluginError(
                pname,
                "a plugin with this name is already registered; register this one under "
                "another name (name=...) or unregister the first",
            )
        if isinstance(plugin, type):
            # a class is a plugin of its static/class methods; its plain methods would get
            # the call in `self`, and every call would fail with a confusing TypeError
            unbound = [n for n in HOOK_PARAMS if _is_impl(plugin, n) and _wants_self(plugin, n)]
            if unbound:
                raise PluginError(
                    pname,
                    f"{plugin.__qualname__} is a class, not an instance, and its hook "
                    f"method(s) {', '.join(unbound)} need one: register an instance "
                    f"({plugin.__name__}(...)), as an entry point's factory returns",
                )
        porder = order if order is not None else getattr(plugin, "order", DEFAULT_ORDER)
        if not isinstance(porder, int) or isinstance(porder, bool):
            raise PluginError(pname, f"order must be an int, got {porder!r}")
        try:
            self.pm.register(plugin, name=pname)
        except pluggy.PluginValidationError as exc:
            takes = ", ".join(
                f"{h}({', '.join(HOOK_PARAMS[h])})" for h in HOOK_PARAMS if _is_impl(plugin, h)
            )
            raise PluginError(
                pname,
                f"invalid hook implementation: {'; '.join(str(exc).splitlines())} (a hook "
                f"takes any subset of its parameters, by name: {takes})",
            ) from exc
        except ValueError as exc:
            raise PluginError(pname, str(exc)) from exc
        for hook in HOOK_PARAMS:
            for impl in getattr(self.pm.hook, hook).get_hookimpls():
                if impl.plugin_name == pname and (
                    impl.hookwrapper or impl.wrapper or impl.tryfirst or impl.trylast
                ):
                    self.pm.unregister(name=pname)
                    raise PluginError(
                        pname,
                        f"hook {hook!r} uses wrapper/hookwrapper/tryfirst/trylast; toolwire orders "
                        f"plugins by their `order` and wraps calls itself - remove those options",
                    )
        unknown = [n for n in dir(plugin) if n not in HOOK_PARAMS and _is_impl(plugin, n)]
        if unknown:
            self.pm.unregister(name=pname)
            renamed = [n for n in unknown if (_impl_opts(plugin, n) or {}).get("specname")]
            hint = (
                f" ({', '.join(renamed)}: hookimpl(specname=...) is not supported; name the "
                "method after its hook)"
                if renamed
                else ""
            )
            meant = [
                f"{n} -> {close[0]}"
                for n in unknown
                if (close := difflib.get_close_matches(n, list(HOOK_PARAMS), n=1, cutoff=0.6))
            ]
            if meant:
                hint += f" (did you mean: {', '.join(meant)}?)"
            raise PluginError(
                pname,
                f"unknown hook(s) {unknown}: a method marked @hookimpl must be named after a "
                f"hook; known hooks: {sorted(HOOK_PARAMS)}{hint}",
            )
        taken = {
            hook
            for hook in HOOK_PARAMS
            for impl in getattr(self.pm.hook, hook).get_hookimpls()
            if impl.plugin_name == pname
        }
        uncalled = [n for n in HOOK_PARAMS if n not in taken and _is_impl(plugin, n)]
        if uncalled:
            # pluggy calls only functions and methods: a marked functools.partial or callable
            # object would be listed as a hook and never run
            self.pm.unregister(name=pname)
            wrapped = [
                n for n in uncalled if isinstance(_raw(plugin, n), staticmethod | classmethod)
            ]
            if wrapped:
                # pluggy < 1.7 reads the marker only from the function inside the wrapper
                raise PluginError(
                    pname,
                    f"{', '.join(wrapped)}: @hookimpl is written above "
                    f"@{type(_raw(plugin, wrapped[0])).__name__}, where this pluggy does not "
                    f"see it; write it below (@{type(_raw(plugin, wrapped[0])).__name__}, then "
                    "@hookimpl on the next line)",
                )
            kinds = ", ".join(f"{n} is a {type(_static(plugin, n)).__name__}" for n in uncalled)
            raise PluginError(
                pname,
                f"hook implementations must be functions or methods (def or async def), "
                f"but {kinds}: define a method that calls it",
            )
        unmarked = [
            n for n in HOOK_PARAMS if not _is_impl(plugin, n) and callable(_static(plugin, n))
        ]
        if unmarked:
            _log.warning(
                "plugin %r: %s named like a hook but not marked @hookimpl, so the kernel "
                "never calls it; decorate it with @toolwire.hookimpl (or rename it)",
                pname,
                ", ".join(f"{n}()" for n in unmarked) + (" is" if len(unmarked) == 1 else " are"),
            )
        info = PluginInfo(pname, plugin, porder, version=version, dist=dist, config=config)
        self.plugins[pname] = info
        self._compile()
        return info

    def not_registered(self) -> str:
        """The message for a plugin name that is not registered: the names that are."""
        return f"not registered; registered plugins: {', '.join(sorted(self.plugins)) or 'none'}"

    def unregister(self, name: str) -> None:
        """Remove a plugin by name."""
        if name not in self.plugins:
            raise PluginError(name, self.not_registered())
        self.pm.unregister(name=name)
        del self.plugins[name]
        self._compile()

    def ordered(self) -> list[PluginInfo]:
        """Plugins sorted by (order, name)."""
        return sorted(self.plugins.values(), key=lambda p: (p.order, p.name))

    def _compile(self) -> None:
        rank = {p.name: i for i, p in enumerate(self.ordered())}
        for hook, canonical in HOOK_PARAMS.items():
            impls = [
                i for i in getattr(self.pm.hook, hook).get_hookimpls() if i.plugin_name in rank
            ]
            impls.sort(key=lambda i: rank[i.plugin_name], reverse=hook in _REVERSED)
            compiled = []
            for i in impls:
                invoke = _adapter(i.function, tuple(i.argnames), canonical)
                is_async = inspect.iscoroutinefunction(i.function)
                trace = self.trace
                if trace is True or (trace and i.plugin_name in trace):
                    invoke = _traced(i.plugin_name, hook, invoke, is_async)
                compiled.append(HookImpl(plugin=i.plugin_name, invoke=invoke, is_async=is_async))
            self.compiled[hook] = compiled
        for fn in self._listeners:
            fn()
