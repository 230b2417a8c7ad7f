"""The promises docs/hooks.md, docs/concepts.md and docs/writing-plugins.md make about hooks.

Each test names the promise it pins. Promises already pinned elsewhere are not repeated
here: test_pipeline.py (the call lifecycle), test_catalog.py (discover, add_plugin,
remove_plugin), test_config.py (entry points, ``order`` overrides).
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import types
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolwire import (
    CallContext,
    CallEvent,
    CallRejected,
    Clock,
    ConfigError,
    ErrorInfo,
    Fallback,
    Kernel,
    PluginError,
    Recover,
    Retry,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    hookimpl,
    tool,
)
from toolwire.testing import FakeClock, FakeTool, RecordingPlugin

pytestmark = pytest.mark.anyio

Log = list[tuple[str, str]]


def lifecycle(name: str, order: int, log: Log, *hooks: str, fail: str = "") -> object:
    """A plugin implementing ``hooks`` (of startup, shutdown, discover), logging each call;
    the hook named by ``fail`` raises."""

    def make(hook: str) -> Any:
        async def impl(query: Any = None) -> None:
            log.append((name, hook if query is None else f"{hook}:{query}"))
            if hook == fail:
                raise OSError(f"{name} {hook} broke")

        if hook == "discover":
            return hookimpl(lambda self, query: impl(query))  # a def returning an awaitable
        return hookimpl(lambda self: impl())

    return type(name, (), {"name": name, "order": order} | {h: make(h) for h in hooks})()


# ----------------------------------------------------------------- rules for every hook
@pytest.mark.parametrize("option", ["hookwrapper", "tryfirst", "trylast", "wrapper"])
def test_pluggy_ordering_and_wrapper_options_are_rejected_at_registration(option: str) -> None:
    """hooks.md: `wrapper=True`, `hookwrapper=True`, `tryfirst` and `trylast` are rejected
    at registration: ordering comes from `order`."""

    def gen(self: object) -> Any:
        return (yield)

    def plain(self: object) -> None:
        return None

    impl = gen if option in ("hookwrapper", "wrapper") else plain
    plugin = type("P", (), {"name": "p", "before_call": hookimpl(**{option: True})(impl)})()
    k = Kernel()
    with pytest.raises(PluginError, match=r"plugin 'p': hook 'before_call' uses .*remove those"):
        k.register(plugin)
    assert k.plugins.plugins == {}
    k.register(RecordingPlugin("p"))  # the refused plugin left nothing behind


def test_firstresult_is_not_a_hookimpl_option() -> None:
    """hooks.md lists `firstresult` among the options the kernel refuses: it is a hookspec
    option, so pluggy refuses it on an implementation before the kernel sees it."""
    with pytest.raises(TypeError, match="firstresult"):
        hookimpl(firstresult=True)  # type: ignore[call-arg]


def test_a_hook_declaring_a_parameter_the_hook_does_not_have_is_refused() -> None:
    """Implementations take any subset of the hook's parameters, by name; another name is a
    PluginError naming the plugin (pluggy's check), not a hook that fails on every call."""

    class Typo:
        name = "typo"

        @hookimpl
        def before_call(self, call: ToolCall, context: CallContext) -> None: ...

    with pytest.raises(PluginError, match=r"plugin 'typo': invalid hook implementation") as err:
        Kernel(plugins=[Typo()])
    assert "\n" not in str(err.value) and "{'context'}" in str(err.value)
    assert str(err.value).endswith("by name: before_call(call, ctx))")


@pytest.mark.parametrize("order", [1.5, "100", True, None])
def test_an_order_that_is_not_an_int_is_refused(order: Any) -> None:
    """hooks.md: each plugin declares an integer `order` (a plugin declaring none gets 1000;
    `order = None` is not "none declared")."""
    plugin = type("P", (), {"name": "p", "order": order})()
    with pytest.raises(PluginError, match=r"plugin 'p': order must be an int"):
        Kernel(plugins=[plugin])


async def test_a_partial_marked_as_a_hook_is_refused_not_silently_never_called() -> None:
    """Before: a `functools.partial` (or a callable object) marked @hookimpl was listed by
    `toolwire plugins` among the plugin's hooks, but pluggy calls only functions and
    methods, so it never ran - and hooks.md said a partial is awaited."""
    seen: list[str] = []

    async def stamp(label: str, result: ToolResult) -> None:
        seen.append(label)

    class Partial:
        name = "partial"
        after_call = hookimpl(functools.partial(stamp, "x"))

    with pytest.raises(PluginError, match=r"after_call is a partial: define a method"):
        Kernel(plugins=[Partial()])

    class Method:  # what to write instead
        name = "method"

        @hookimpl
        def after_call(self, result: ToolResult) -> Any:
            return functools.partial(stamp, "y")(result)  # a def returning an awaitable

    async with Kernel(tools=[FakeTool("t").tool], plugins=[Method()]) as k:
        await k.call("t", {})
    assert seen == ["y"]


def test_specname_is_refused_with_what_to_do() -> None:
    """An implementation under another name (`hookimpl(specname=...)`) is refused, and the
    error says why instead of only calling the method an unknown hook."""

    class Renamed:
        name = "renamed"

        @hookimpl(specname="before_call")
        def check(self, call: ToolCall) -> None: ...

    with pytest.raises(PluginError, match=r"unknown hook.*'check'.*specname=.*name the method"):
        Kernel(plugins=[Renamed()])


def test_a_misspelt_hook_name_is_refused_naming_the_hook_meant() -> None:
    """A third-party author's typo: the error names the hook meant. Before, it listed
    every hook and left the reader to spot which one the method was meant to be."""

    class Typo:
        name = "typo"

        @hookimpl
        def before_cal(self, call: ToolCall) -> None: ...

        @hookimpl
        def aftercall(self, result: ToolResult) -> None: ...

    with pytest.raises(PluginError) as err:
        Kernel(plugins=[Typo()])
    assert "unknown hook(s) ['aftercall', 'before_cal']" in str(err.value)
    assert "did you mean: aftercall -> after_call, before_cal -> before_call?" in str(err.value)


async def test_a_plugin_class_given_instead_of_an_instance_is_refused() -> None:
    """`register_plugin(StampPlugin)` (the class): before, registration passed and every
    call then failed as `internal` with "missing 1 required positional argument", pluggy
    passing the call where the method expects `self`."""

    class StampPlugin:
        name = "stamp"

        @hookimpl
        def before_call(self, call: ToolCall, ctx: CallContext) -> None: ...

    with pytest.raises(PluginError) as err:
        Kernel(plugins=[StampPlugin])
    assert str(err.value) == (
        "plugin 'stamp': test_a_plugin_class_given_instead_of_an_instance_is_refused.<locals>."
        "StampPlugin is a class, not an instance, and its hook method(s) before_call need "
        "one: register an instance (StampPlugin(...)), as an entry point's factory returns"
    )

    seen: list[str] = []

    class Static:  # a class of static hooks is a plugin as it is
        name = "static"

        @staticmethod
        @hookimpl
        def before_call(call: ToolCall) -> None:
            seen.append(call.name)

    async with Kernel(tools=[FakeTool("t").tool], plugins=[Static]) as k:
        assert not (await k.call("t", {})).is_error
    assert seen == ["t"]


async def test_hookimpl_written_above_staticmethod_counts_as_marked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """pluggy reads the marker from the staticmethod wrapper too, and calls the hook. Before,
    the kernel looked only inside the wrapper: it warned that the hook was "not marked
    @hookimpl, so the kernel never calls it" and `toolwire plugins` left it out of `hooks`."""
    seen: list[str] = []

    class Above:
        name = "above"

        @hookimpl
        @staticmethod
        def before_call(call: ToolCall) -> None:
            seen.append(call.name)

    with caplog.at_level("WARNING", logger="toolwire.plugins"):
        k = Kernel(tools=[FakeTool("t").tool], plugins=[Above()])
    assert caplog.records == []
    assert k.plugins.plugins["above"].hooks() == ["before_call"]
    async with k:
        await k.call("t", {})
    assert seen == ["t"]


async def test_a_module_of_hook_functions_is_a_plugin_named_after_the_module() -> None:
    """hookspecs.py: a plugin is any object with hook implementations, or a module of such
    functions. Before: every module was registered as 'module', so a second one was
    refused as already registered and lookups by name could not find either."""
    seen: list[str] = []

    def module(name: str) -> types.ModuleType:
        mod = types.ModuleType(name)

        @hookimpl
        def before_call(call: ToolCall) -> None:
            seen.append(f"{name}:{call.name}")

        mod.before_call = before_call  # type: ignore[attr-defined]
        return mod

    one, two = module("acme_audit"), module("acme_guard")
    k = Kernel(tools=[FakeTool("t").tool], plugins=[one, two])
    assert [p.name for p in k.plugins.ordered()] == ["acme_audit", "acme_guard"]
    assert k.get_plugin("acme_guard") is two
    await k.call("t", {})
    assert seen == ["acme_audit:t", "acme_guard:t"]
    await k.close()


async def test_lifecycle_hooks_run_by_order_then_name_startup_up_and_shutdown_down() -> None:
    """hooks.md: implementations run sorted by `(order, plugin name)` for `startup`,
    `discover`, `before_call` and `on_error`, and in the reverse order for `after_call`
    and `shutdown`. Install order never matters."""
    for reverse in (False, True):
        log: Log = []
        hooks = ("startup", "discover", "shutdown")
        plugins = [
            lifecycle("beta", 200, log, *hooks),
            lifecycle("alpha", 200, log, *hooks),
            lifecycle("first", 100, log, *hooks),
            lifecycle("late", 1000, log, *hooks),
        ]
        k = Kernel(plugins=plugins[::-1] if reverse else plugins)
        async with k:
            await k.discover("q")
        by_hook: dict[str, list[str]] = {}
        for name, hook in log:
            by_hook.setdefault(hook, []).append(name)
        up = ["first", "alpha", "beta", "late"]
        assert by_hook == {
            "startup": up,
            "discover": up,
            "discover:q": up,
            "shutdown": up[::-1],
        }


async def test_the_default_order_puts_a_plugin_after_the_first_party_ones() -> None:
    """hooks.md: `order` defaults to 1000 (innermost): a plugin declaring none runs after
    order 500 in before_call and before it in after_call."""
    log: list[tuple[str, str, str]] = []
    undeclared = RecordingPlugin("aaa", log=log)
    del undeclared.order  # declares nothing at all
    k = Kernel(tools=[FakeTool("t").tool], plugins=[undeclared, RecordingPlugin("zzz", 500, log)])
    assert k.plugins.plugins["aaa"].order == 1000
    await k.call("t", {})
    assert [(p, h) for p, h, _ in log] == [
        ("zzz", "before_call"),
        ("aaa", "before_call"),
        ("aaa", "after_call"),
        ("zzz", "after_call"),
    ]


async def test_register_order_overrides_the_declared_one() -> None:
    """concepts.md: `kernel.register(plugin, name=None, order=None)`; writing-plugins.md:
    the `register_plugin(plugin, name=None, order=None)` fixture."""
    log: list[tuple[str, str, str]] = []
    k = Kernel(tools=[FakeTool("t").tool])
    k.register(RecordingPlugin("a", 100, log), order=900)
    k.register(RecordingPlugin("b", 500, log), name="renamed")
    await k.call("t", {})
    assert [p for p, h, _ in log if h == "before_call"] == ["b", "a"]
    assert sorted(k.plugins.plugins) == ["a", "renamed"]
    await k.close()


# ------------------------------------------------------------------------- startup
async def test_startup_runs_once_when_concurrent_first_calls_start_the_kernel() -> None:
    """hooks.md: startup runs once, when the kernel starts (... implicitly on the first
    `kernel.call`); `kernel.state` is already open."""
    log: Log = []
    opened: list[bool] = []

    class Opener:
        name = "opener"

        @hookimpl
        async def startup(self, kernel: Kernel) -> None:
            await kernel.state.set("opener:probe", "1")  # the store is open
            opened.append(True)
            await anyio.sleep(0.01)  # the other first calls arrive meanwhile

        @hookimpl
        def shutdown(self) -> None:
            log.append(("opener", "shutdown"))

    k = Kernel(tools=[FakeTool("t").tool], plugins=[Opener()])
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(k.call, "t", {})
    assert opened == [True]
    await k.close()
    await k.close()  # closing twice shuts down once
    assert log == [("opener", "shutdown")]


async def test_a_startup_failure_shuts_down_every_plugin_the_start_got_past() -> None:
    """hooks.md: an exception aborts the start with `PluginError("plugin 'x': startup
    failed: ...")`; plugins that already started are shut down again. Before: a plugin
    with a shutdown hook but no startup hook, ordered before the failing one, was never
    shut down (close() then did nothing either, the kernel having never started); nor
    was one ordered after it (it holds what it opened when it was made)."""
    log: Log = []
    k = Kernel(
        plugins=[
            lifecycle("quiet", 100, log, "shutdown"),
            lifecycle("opened", 200, log, "startup", "shutdown"),
            lifecycle("broken", 300, log, "startup", "shutdown", fail="startup"),
            lifecycle("later", 400, log, "startup", "shutdown"),
            lifecycle("quiet_later", 500, log, "shutdown"),
        ]
    )
    with pytest.raises(PluginError, match=r"^plugin 'broken': startup failed: OSError: broken"):
        await k.start()
    assert log == [
        ("opened", "startup"),
        ("broken", "startup"),
        # descending; not the failing plugin, nor 'later', whose startup never ran
        ("quiet_later", "shutdown"),
        ("opened", "shutdown"),
        ("quiet", "shutdown"),
    ]
    log.clear()
    await k.close()  # it never started: nothing more is shut down
    assert log == []


async def test_a_failing_first_listing_at_start_shuts_down_every_plugin() -> None:
    """hooks.md (discover): an exception raises `PluginError` naming the plugin; at start,
    every plugin's startup has run, so every plugin is shut down again."""
    log: Log = []
    k = Kernel(
        plugins=[
            lifecycle("quiet", 100, log, "shutdown"),
            lifecycle("source", 200, log, "startup", "discover", "shutdown", fail="discover"),
        ]
    )
    with pytest.raises(PluginError, match=r"plugin 'source': discover failed: OSError"):
        await k.start()
    assert log == [
        ("source", "startup"),
        ("source", "discover"),
        ("source", "shutdown"),
        ("quiet", "shutdown"),
    ]


async def test_the_first_call_raises_the_startup_failure() -> None:
    """concepts.md: `kernel.call` raises for a kernel that cannot start (the first call
    starts it: its `PluginError`); the tool never runs and no call hook sees the call."""
    log: Log = []
    fake = FakeTool("t")
    calls: list[tuple[str, str, str]] = []
    broken = lifecycle("broken", 300, log, "startup", fail="startup")
    k = Kernel(tools=[fake.tool], plugins=[broken, RecordingPlugin("rec", 1, calls)])
    with pytest.raises(PluginError, match="plugin 'broken': startup failed"):
        await k.call("t", {})
    assert fake.calls == [] and calls == []


async def test_a_config_error_a_plugin_raises_in_startup_is_raised_as_it_is() -> None:
    """hooks.md: an exception aborts the start with a PluginError naming the plugin - but a
    ConfigError (or PluginError) the plugin raises already says what is wrong and where,
    so it is raised as it is (the CLI exits 2 on a ConfigError, as for the file's own)."""

    class Strict:
        name = "strict"

        @hookimpl
        def startup(self) -> None:
            raise ConfigError("must be a URL", key="plugins.strict.endpoint")

    with pytest.raises(ConfigError, match=r"^plugins\.strict\.endpoint: must be a URL$"):
        await Kernel(plugins=[Strict()]).start()


# ------------------------------------------------------------------------ shutdown
async def test_a_failing_shutdown_is_logged_and_the_others_still_shut_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hooks.md: shutdown errors are logged; the remaining plugins still shut down."""
    log: Log = []
    k = Kernel(
        plugins=[
            lifecycle("outer", 100, log, "shutdown"),
            lifecycle("middle", 200, log, "shutdown", fail="shutdown"),
            lifecycle("inner", 300, log, "shutdown"),
        ]
    )
    await k.start()
    with caplog.at_level(logging.ERROR, logger="toolwire"):
        await k.close()
    assert log == [("inner", "shutdown"), ("middle", "shutdown"), ("outer", "shutdown")]
    assert any(
        r.getMessage() == "plugin 'middle': shutdown failed" and r.exc_info for r in caplog.records
    )


class Pool:
    """Holds a resource from startup to shutdown; its after_call uses it and the store."""

    def __init__(self, name: str = "pool") -> None:
        self.name = name
        self.open = False
        self.log: list[str] = []

    @hookimpl
    def startup(self) -> None:
        self.open = True

    @hookimpl
    def shutdown(self) -> None:
        self.open = False
        self.log.append("shutdown")

    @hookimpl
    async def before_call(self, call: ToolCall) -> None:
        self.log.append(f"before_call:{call.name}")

    @hookimpl
    async def after_call(self, call: ToolCall, ctx: CallContext) -> None:
        await ctx.kernel.state.set(f"pool:{call.name}", "done")  # the store is still open
        self.log.append(f"after_call:{call.name}(open={self.open})")


def blocking_tool(entered: anyio.Event, release: anyio.Event) -> Any:
    @tool
    async def slow() -> str:
        """Waits until released."""
        entered.set()
        await release.wait()
        return "ok"

    return slow


async def test_close_waits_for_the_calls_in_flight_before_shutdown_and_the_store() -> None:
    """hooks.md: shutdown runs after the calls in flight ended (within close's grace
    period). Before: shutdown ran, and the store closed, under a running call: its
    after_call found the plugin shut down and could not write to the store."""
    entered, release = anyio.Event(), anyio.Event()
    pool = Pool()
    k = Kernel(tools=[blocking_tool(entered, release), FakeTool("quick").tool], plugins=[pool])
    await k.start()
    results: list[ToolResult] = []

    async def call() -> None:
        results.append(await k.call("slow"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await entered.wait()
        tg.start_soon(k.close)
        await anyio.wait_all_tasks_blocked()
        assert pool.log == ["before_call:slow"]  # close() waits: no shutdown under the call
        quick = await k.call("quick")  # a call while close() waits is served as usual
        assert not quick.is_error
        release.set()
    assert pool.log == [
        "before_call:slow",
        "before_call:quick",
        "after_call:quick(open=True)",
        "after_call:slow(open=True)",
        "shutdown",
    ]
    assert results[0].content == {"result": "ok"} and not results[0].meta.plugin_errors


async def test_close_goes_on_after_its_grace_period_and_says_how_many_calls_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """api.md: calls still running after `close_grace_s` are not waited for: a warning
    names how many, then the plugins shut down and the store closes."""
    entered, release = anyio.Event(), anyio.Event()
    pool = Pool()
    k = Kernel(tools=[blocking_tool(entered, release)], plugins=[pool], close_grace_s=0.05)
    await k.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(k.call, "slow")
        await entered.wait()
        with caplog.at_level(logging.WARNING, logger="toolwire"):
            await k.close()
        assert pool.log == ["before_call:slow", "shutdown"]
        release.set()
    assert "1 call still running after the close grace period (0.05s)" in caplog.text


@pytest.mark.parametrize("grace", [-1, math.nan, math.inf, True, "10"])
def test_a_close_grace_period_that_is_no_number_of_seconds_is_refused(grace: Any) -> None:
    with pytest.raises(ValueError, match=r"Kernel\(close_grace_s=.*\): give seconds >= 0"):
        Kernel(close_grace_s=grace)


async def test_remove_plugin_shuts_it_down_after_the_calls_that_met_its_hooks() -> None:
    """concepts.md: remove_plugin runs the plugin's shutdown once the calls that started
    before it was removed have ended. Before: shutdown ran under a call that was in its
    hooks (its after_call then found it shut down)."""
    entered, release = anyio.Event(), anyio.Event()
    pool = Pool()
    k = Kernel(tools=[blocking_tool(entered, release), FakeTool("quick").tool], plugins=[pool])
    await k.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(k.call, "slow")
        await entered.wait()
        tg.start_soon(k.remove_plugin, "pool")
        await anyio.wait_all_tasks_blocked()
        assert "pool" not in k.plugins.plugins  # new calls no longer meet its hooks
        await k.call("quick")  # a call that started after the removal is not waited for
        assert pool.log == ["before_call:slow"]
        release.set()
    assert pool.log == ["before_call:slow", "after_call:slow(open=True)", "shutdown"]
    await k.close()


async def test_close_waits_for_a_call_held_in_an_async_call_started_subscriber() -> None:
    """Before: a call was counted among the calls in flight only after its call_started
    event, so close() missed a call an async subscriber held, shut the plugins down and
    closed the store, and the call then ran its hooks on both."""
    pool = Pool()
    k = Kernel(tools=[FakeTool("quick").tool], plugins=[pool])
    await k.start()
    in_sub, go = anyio.Event(), anyio.Event()

    async def audit(event: CallEvent) -> None:
        in_sub.set()
        await go.wait()

    k.events.subscribe(audit, ["call_started"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(k.call, "quick")
        await in_sub.wait()
        tg.start_soon(k.close)
        await anyio.wait_all_tasks_blocked()
        assert pool.log == []  # close() waits for the call
        go.set()
    assert pool.log == ["before_call:quick", "after_call:quick(open=True)", "shutdown"]


async def test_remove_plugin_waits_for_a_call_in_its_before_fallback_hook() -> None:
    """Before: only before_call, on_error and after_call counted as the plugin's call
    hooks, so its shutdown ran under a call waiting in its before_fallback."""
    log: list[str] = []
    inside, go = anyio.Event(), anyio.Event()

    class Gate:
        name = "gate"

        @hookimpl
        async def before_fallback(self) -> None:
            log.append("before_fallback")
            inside.set()
            await go.wait()

        @hookimpl
        def shutdown(self) -> None:
            log.append("shutdown")

    class Decide:
        name = "decide"

        @hookimpl
        def on_error(self, ctx: CallContext) -> Any:
            return Fallback("backup") if ctx.attempt == 1 else None

    down = ToolError("down", kind="unavailable")
    tools = [FakeTool("primary", script=[down]).tool, FakeTool("backup").tool]
    k = Kernel(tools=tools, plugins=[Gate(), Decide()])
    await k.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(k.call, "primary")
        await inside.wait()
        tg.start_soon(k.remove_plugin, "gate")
        await anyio.wait_all_tasks_blocked()
        assert log == ["before_fallback"]
        go.set()
    assert log == ["before_fallback", "shutdown"]
    await k.close()


@pytest.mark.parametrize("how", ["close", "remove_plugin"])
async def test_a_cancelled_close_or_remove_plugin_stops_waiting_and_still_shuts_down(
    how: str,
) -> None:
    """Before: remove_plugin's wait for the calls in flight ran shielded (a caller
    cancelling it stayed blocked for the whole close_grace_s), and a close() cancelled
    while it waited left the kernel started, its plugins up and its store open."""
    entered, release = anyio.Event(), anyio.Event()
    pool = Pool()
    k = Kernel(tools=[blocking_tool(entered, release)], plugins=[pool], close_grace_s=30)
    await k.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(k.call, "slow")
        await entered.wait()
        with anyio.move_on_after(0.1) as scope, anyio.fail_after(20):  # a bound, not a speed
            await (k.close() if how == "close" else k.remove_plugin("pool"))
        assert scope.cancelled_caught
        assert pool.log == ["before_call:slow", "shutdown"] and not pool.open
        release.set()
    await k.close()


# ------------------------------------------------------------------------- discover
async def test_discover_may_return_a_tuple_and_a_def_returning_an_awaitable() -> None:
    """hooks.md: discover returns a list of `toolwire.Tool`, or None; a `def` that returns
    an awaitable is awaited too."""

    class Source:
        name = "src"

        @hookimpl
        def discover(self, query: str | None) -> Any:
            async def listing() -> tuple[Tool, ...]:
                return (FakeTool("src_a", source="src").tool,)

            return listing() if query is None else None

    async with Kernel(plugins=[Source()]) as k:
        assert [t.name for t in k.list_tools()] == ["src_a"]
        assert await k.discover("anything") == []


async def test_on_a_clash_kept_while_serving_the_earlier_source_in_order_wins() -> None:
    """concepts.md: with `keep_on_collision=True`, between two new claims the first
    source's wins - first in hook order (order, then name), not in install order."""

    def source(name: str, order: int) -> object:
        @hookimpl
        def discover(self: object, query: str | None) -> list[Tool] | None:
            return [FakeTool("shared", source=name).tool] if query is None else None

        return type(name, (), {"name": name, "order": order, "discover": discover})()

    for plugins in ([source("zed", 10), source("abe", 20)], [source("abe", 20), source("zed", 10)]):
        k = Kernel()
        for p in plugins:
            k.register(p)
        await k.refresh_tools(keep_on_collision=True)
        assert k.get_tool("shared").source == "zed"  # type: ignore[union-attr]


# ---------------------------------------------------------------------- before_call
async def test_before_call_does_not_see_unknown_tools_or_invalid_args_but_after_call_does() -> None:
    """hooks.md: before_call runs after the tool was resolved and its arguments validated;
    after_call runs exactly once per call with the final result - an unknown tool's and
    invalid arguments' results too (an audit plugin records them)."""
    log: list[tuple[str, str, str]] = []
    kinds: list[str | None] = []

    class Kinds:
        name = "kinds"

        @hookimpl
        def after_call(self, result: ToolResult, ctx: CallContext) -> None:
            kinds.append(result.error.kind if result.error else None)

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fake = FakeTool("t", input_schema=schema)
    k = Kernel(tools=[fake.tool], plugins=[RecordingPlugin("rec", 1, log), Kinds()])
    await k.call("nope", {})
    await k.call("t", {"n": "seven"})
    assert log == [("rec", "after_call", "nope"), ("rec", "after_call", "t")]
    assert kinds == ["not_found", "invalid_args"] and fake.calls == []


async def test_args_a_before_call_hook_replaces_reach_the_tool_unvalidated() -> None:
    """hooks.md: a hook may replace `call.args`; they are not validated again."""

    class Rewrite:
        name = "rewrite"

        @hookimpl
        def before_call(self, call: ToolCall) -> None:
            call.args = {"n": "not an int", "added": True}

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fake = FakeTool("t", input_schema=schema, script=[lambda a: a])
    r = await Kernel(tools=[fake.tool], plugins=[Rewrite()]).call("t", {"n": 1})
    assert r.content == {"n": "not an int", "added": True}
    assert fake.calls == [{"n": "not an int", "added": True}]


async def test_a_rejection_reaches_every_after_call_and_skips_later_before_calls() -> None:
    """hooks.md: raise `CallRejected(kind, message)` to end the call with that error;
    CallRejected: `after_call` hooks still see it - of every plugin, including those whose
    before_call never ran."""
    log: list[tuple[str, str, str]] = []

    class Deny:
        name, order = "deny", 300

        @hookimpl
        def before_call(self) -> None:
            raise CallRejected("denied", "no", retryable=True, retry_after_s=3)

    fake = FakeTool("t")
    plugins = [RecordingPlugin("outer", 100, log), Deny(), RecordingPlugin("inner", 500, log)]
    r = await Kernel(tools=[fake.tool], plugins=plugins).call("t", {})
    assert r.error is not None and (r.error.kind, r.error.source) == ("denied", "deny")
    assert (r.error.retryable, r.error.retry_after_s) == (True, 3)
    assert log == [
        ("outer", "before_call", "t"),
        ("inner", "after_call", "t"),
        ("outer", "after_call", "t"),
    ]
    assert fake.calls == []


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ("yes", "returned str, expected ToolResult or None"),
        (ToolResult({"odd": object()}), "returned a ToolResult whose content is not JSON"),
    ],
)
async def test_a_before_call_returning_what_the_kernel_cannot_use_is_recorded_as_a_raise_is(
    caplog: pytest.LogCaptureFixture, returned: Any, problem: str
) -> None:
    """hooks.md: a before_call hook that raises, or returns something else than None or a
    ToolResult that can be made JSON, ends the call `internal` naming the plugin, is logged
    as an ERROR and recorded in `result.meta.plugin_errors` (hook `before_call`). Before: a
    bad return value ended the call but `plugin_errors` stayed empty and nothing was logged."""

    class Raises:
        name = "raises"

        @hookimpl
        def before_call(self) -> None:
            raise RuntimeError("db down")

    class Returns:
        name = "returns"

        @hookimpl
        def before_call(self) -> Any:
            return returned

    for plugin, error in ((Raises(), "RuntimeError: db down"), (Returns(), problem)):
        fake = FakeTool("t")
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="toolwire"):
            r = await Kernel(tools=[fake.tool], plugins=[plugin]).call("t", {})
        assert fake.calls == []
        assert r.error is not None and r.error.kind == "internal"
        assert r.error.source == plugin.name and f"plugin {plugin.name!r}" in r.error.message
        [err] = r.meta.plugin_errors
        assert (err["plugin"], err["hook"]) == (plugin.name, "before_call")
        assert err["error"].startswith(error)
        [rec] = [x for x in caplog.records if x.name.startswith("toolwire")]
        assert rec.levelno == logging.ERROR
        assert f"plugin {plugin.name!r}: before_call" in rec.getMessage()


async def test_ctx_state_is_per_call_and_ctx_meta_facts_end_in_the_result() -> None:
    """hooks.md: per-call state belongs in `ctx.state["<plugin name>"]`, never on `self`:
    one plugin instance serves concurrent calls. hookspecs.py: `ctx.meta` holds facts that
    end in the result - a short-circuit result's too."""

    class Counter:
        name = "counter"

        @hookimpl
        async def before_call(self, call: ToolCall, ctx: CallContext) -> ToolResult | None:
            assert "counter" not in ctx.state  # a fresh dict per call
            ctx.state["counter"] = call.args["i"]
            ctx.meta.extra["counter"] = {"seen": call.args["i"]}
            await anyio.sleep(0.01)  # the other calls run meanwhile
            if call.args["i"] == 0:
                return ToolResult.ok({"short": True})
            return None

        @hookimpl
        def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
            assert ctx.state["counter"] == call.args["i"]

    fake = FakeTool("t", script=[lambda a: {"i": a["i"]}])
    k = Kernel(tools=[fake.tool], plugins=[Counter()])
    results: dict[int, ToolResult] = {}

    async def one(i: int) -> None:
        results[i] = await k.call("t", {"i": i})

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    assert results[0].content == {"short": True}
    for i, r in results.items():
        assert r.meta.extra["counter"] == {"seen": i}
        assert r.meta.plugin_errors == []  # every after_call assertion held
        assert i == 0 or r.content == {"i": i}


async def test_ctx_carries_the_tool_the_deadline_and_the_kernel() -> None:
    """hooks.md: `ctx`: CallContext (`tool`, `state`, `meta`, `deadline`, `kernel`,
    `report_progress()`); `ctx.time_left()` counts down to the call's deadline."""
    seen: list[Any] = []
    clock = FakeClock()

    class Peek:
        name = "peek"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            seen.append((ctx.tool.name if ctx.tool else None, ctx.kernel, ctx.time_left()))

    fake = FakeTool("t")
    k = Kernel(tools=[fake.tool], plugins=[Peek()], clock=clock, deadline_s=30)
    await k.call("t", {})
    await k.call("t", {}, timeout=5)  # the call's own timeout wins over deadline_s
    assert seen == [("t", k, 30), ("t", k, 5)]
    await k.close()


async def test_attempt_timeout_set_in_on_error_applies_to_the_next_attempt() -> None:
    """hooks.md: `ctx.attempt_timeout_s` wins over the tool's and the kernel's default;
    `on_error` may change it for the next attempt."""
    durations: list[float | None] = []

    class Shorten:
        name = "shorten"

        @hookimpl
        def on_error(self, ctx: CallContext) -> Retry | None:
            durations.append(ctx.attempt_timeout_s)
            if ctx.attempt == 1:
                ctx.attempt_timeout_s = 0.05
                return Retry(0)
            return None

    calls = 0

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ToolError("busy", kind="unavailable")
        await anyio.sleep(5)  # the second attempt hangs past the shortened timeout
        return {"late": True}

    slow = Tool("slow", "Fails, then hangs.", {"type": "object"}, executor, timeout_s=30)
    with anyio.fail_after(3):
        r = await Kernel(tools=[slow], plugins=[Shorten()]).call("slow", {})
    assert r.error is not None and r.error.kind == "timeout"
    assert "0.05s" in r.error.message
    assert durations == [None, 0.05]


async def test_attempt_timeout_stays_bounded_by_the_calls_deadline() -> None:
    """hooks.md: the plugin-chosen per-attempt timeout stays bounded by the overall
    deadline."""

    class Generous:
        name = "generous"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.attempt_timeout_s = 60

    fake = FakeTool("t", delay=5)
    with anyio.fail_after(3):
        r = await Kernel(tools=[fake.tool], plugins=[Generous()]).call("t", {}, timeout=0.05)
    assert r.error is not None and r.error.kind == "timeout"


@pytest.mark.parametrize("bad", ["5", float("nan"), 0, -1, True])
async def test_an_attempt_timeout_no_timeout_can_use_is_the_plugins_bug(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: `ctx.attempt_timeout_s = "5"` failed every attempt as the tool's own
    `tool_error` ("unsupported operand type(s)"), which retry plugins then retried; NaN
    silently meant no timeout, 0 or less timed every attempt out at once. Set in
    before_call, it now ends the call as `internal` naming the plugin, before the tool
    runs (as any before_call failure does); set in on_error, the hook counts as None and
    the next attempt keeps the last good value."""

    class Bad:
        name = "bad"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.attempt_timeout_s = bad

    fake = FakeTool("t")
    r = await Kernel(tools=[fake.tool], plugins=[Bad()]).call("t", {})
    assert r.error is not None and r.error.kind == "internal" and r.error.source == "bad"
    assert f"ctx.attempt_timeout_s = {bad!r}" in r.error.message
    assert "seconds > 0" in r.error.message and fake.calls == []

    class Quiet:
        name, order = "quiet", 1

        @hookimpl
        def before_call(self) -> None:
            pass

    # checked once after the before_call hooks: with several, the message names them all
    r = await Kernel(tools=[fake.tool], plugins=[Quiet(), Bad()]).call("t", {})
    assert r.error is not None and r.error.kind == "internal" and fake.calls == []
    assert "one of the plugins 'quiet', 'bad'" in r.error.message
    assert f"ctx.attempt_timeout_s = {bad!r}" in r.error.message

    class LateBad:
        name, order = "late_bad", 10

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.attempt_timeout_s = 30

        @hookimpl
        def on_error(self, ctx: CallContext) -> Retry:
            ctx.attempt_timeout_s = bad
            return Retry(0)

    flaky = FakeTool("flaky", script=[ToolError("busy", kind="unavailable"), {"ok": 1}])
    limits: list[float | None] = []

    class Decide:
        name, order = "decide", 20

        @hookimpl
        def on_error(self, ctx: CallContext) -> Retry:
            limits.append(ctx.attempt_timeout_s)
            return Retry(0)

    with caplog.at_level(logging.ERROR, logger="toolwire"):
        r = await Kernel(tools=[flaky.tool], plugins=[LateBad(), Decide()]).call("flaky", {})
    assert r.content == {"ok": 1}
    assert limits == [30]  # the bad value was not kept, and Decide decided
    [err] = r.meta.plugin_errors
    assert err["plugin"] == "late_bad" and err["hook"] == "on_error"
    assert "ctx.attempt_timeout_s" in err["error"]


async def test_steps_before_the_first_attempt_run_once_and_may_reject() -> None:
    """hooks.md: `(plugin, fn)` added to `ctx.before_first_attempt` while the call is
    still in before_call - even from another task, while a later plugin's hook holds the
    call - is awaited once after the last before_call and before the first attempt; a
    CallRejected or another exception from it ends the call as in before_call."""
    log: list[str] = []
    outcome: dict[str, BaseException | None] = {"step": None}

    class Claim:
        name, order = "claim", 100

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            async def register_later() -> None:  # from another task, while Park holds it
                await anyio.sleep(0.01)
                if ctx.before_first_attempt is None:
                    ctx.before_first_attempt = []
                ctx.before_first_attempt.append(("claim", step))

            async def step() -> None:
                log.append("step")
                if outcome["step"] is not None:
                    raise outcome["step"]

            ctx.kernel.spawn(register_later)

    class Park:
        name, order = "park", 300

        @hookimpl
        async def before_call(self) -> None:
            log.append("park waits")
            await anyio.sleep(0.05)
            log.append("park done")

    def run(args: dict[str, Any]) -> Any:
        log.append("attempt")
        if len([x for x in log if x == "attempt"]) == 1:
            raise ToolError("busy", kind="unavailable")
        return {"ok": True}

    fake = FakeTool("t", script=[run])
    k = Kernel(tools=[fake.tool], plugins=[Claim(), Park(), _RetryOnce()])
    r = await k.call("t", {})
    assert r.content == {"ok": True}
    assert log == ["park waits", "park done", "step", "attempt", "attempt"]  # once, not per try

    log.clear()
    outcome["step"] = CallRejected("conflict", "taken by another call")
    r = await k.call("t", {})
    assert r.error is not None and (r.error.kind, r.error.source) == ("conflict", "claim")
    assert "attempt" not in log

    log.clear()
    outcome["step"] = RuntimeError("store down")
    r = await k.call("t", {})
    assert r.error is not None and r.error.kind == "internal" and r.error.source == "claim"
    assert "plugin 'claim' failed in before_call: RuntimeError: store down" in r.error.message
    assert "attempt" not in log
    await k.close()


async def test_steps_before_the_next_attempt_run_once_after_the_wait() -> None:
    """hooks.md: while the call waits between attempts `ctx.between_attempts` is the
    failed attempt's error; `(plugin, fn)` added to `ctx.before_next_attempt` then (even
    from another task, during the Retry's wait) is awaited once after the wait and before
    the next attempt; a CallRejected or another exception from it ends the call and the
    next attempt does not run. `between_attempts` is None while an attempt runs and after."""
    log: list[str] = []
    outcome: dict[str, BaseException | None] = {"step": None}
    seen: list[Any] = []
    contexts: list[CallContext] = []

    class Waits(Clock):
        """The Retry's wait lasts until the step was added from another task."""

        def __init__(self) -> None:
            self.added = anyio.Event()

        def monotonic(self) -> float:
            return 0.0

        def time(self) -> float:
            return 0.0

        async def sleep(self, seconds: float) -> None:
            log.append("wait")
            await self.added.wait()
            self.added = anyio.Event()

    clock = Waits()

    class Backoff:
        name, order = "backoff", 100

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            contexts.append(ctx)

        @hookimpl
        def on_error(self, ctx: CallContext) -> Retry | None:
            async def register_later() -> None:  # from another task, during the wait
                await wait_for(lambda: ctx.between_attempts is not None)
                seen.append(ctx.between_attempts)
                if ctx.before_next_attempt is None:
                    ctx.before_next_attempt = []
                ctx.before_next_attempt.append(("backoff", step))
                clock.added.set()

            async def step() -> None:
                log.append("step")
                seen.append(ctx.between_attempts)
                if outcome["step"] is not None:
                    raise outcome["step"]

            ctx.kernel.spawn(register_later)
            return Retry(1) if ctx.attempt == 1 else None

    def run(args: dict[str, Any]) -> Any:
        log.append("attempt")
        assert contexts[-1].between_attempts is None
        if log.count("attempt") == 1:
            raise ToolError("slow down", kind="rate_limit")
        return {"ok": True}

    fake = FakeTool("t", script=[run])
    k = Kernel(tools=[fake.tool], plugins=[Backoff()], clock=clock)
    r = await k.call("t", {})
    assert r.content == {"ok": True}, r.error
    assert log == ["attempt", "wait", "step", "attempt"]  # once, before the next attempt
    first, in_step = seen
    assert first is in_step and first.kind == "rate_limit"  # the failed attempt's error
    assert contexts[-1].between_attempts is None

    for failure, kind, source in (
        (CallRejected("conflict", "taken by another call"), "conflict", "backoff"),
        (RuntimeError("store down"), "internal", "backoff"),
    ):
        log.clear()
        seen.clear()
        outcome["step"] = failure
        r = await k.call("t", {})
        assert r.error is not None and (r.error.kind, r.error.source) == (kind, source)
        assert log == ["attempt", "wait", "step"]  # the next attempt did not run
        assert contexts[-1].between_attempts is None
    assert "before attempt 2" in r.error.message and "store down" in r.error.message
    [err] = r.meta.plugin_errors
    assert err["plugin"] == "backoff" and err["hook"] == "before_next_attempt"
    await k.close()


async def test_between_attempts_is_cleared_when_the_wait_itself_fails() -> None:
    """hooks.md: `ctx.between_attempts` is None after the attempt loop. A wait that raised
    (a custom `Clock.sleep` with a bug) left it set, so `after_call` saw the call as
    still waiting between attempts."""
    seen: list[Any] = []

    class Broken(FakeClock):
        async def sleep(self, seconds: float) -> None:
            raise RuntimeError("the clock broke")

    class Watch:
        name, order = "watch", 100

        @hookimpl
        def on_error(self, ctx: CallContext) -> Retry | None:
            return Retry(1) if ctx.attempt == 1 else None

        @hookimpl
        def after_call(self, ctx: CallContext) -> None:
            seen.append(ctx.between_attempts)

    def run(args: dict[str, Any]) -> Any:
        raise ToolError("slow down", kind="rate_limit")

    fake = FakeTool("t", script=[run, run])
    k = Kernel(tools=[fake.tool], plugins=[Watch()], clock=Broken())
    r = await k.call("t", {})  # a bug inside the kernel's loop: an internal error
    assert r.error is not None and r.error.kind == "internal", r.error
    assert seen == [None]
    await k.close()


async def wait_for(predicate: Callable[[], Any]) -> None:
    with anyio.fail_after(10):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.001)


class _RetryOnce:
    name, order = "retry_once", 500

    @hookimpl
    def on_error(self, ctx: CallContext) -> Retry | None:
        return Retry(0) if ctx.attempt == 1 else None


# ------------------------------------------------------------------------- on_error
async def test_the_first_decision_wins_and_later_on_error_hooks_are_skipped() -> None:
    """hooks.md: the first non-None decision wins; later hooks are skipped."""
    log: list[tuple[str, str, str]] = []

    class Decide:
        name, order = "decide", 200

        @hookimpl
        def on_error(self) -> Recover:
            return Recover({"recovered": True})

    plugins = [RecordingPlugin("early", 100, log), Decide(), RecordingPlugin("late", 300, log)]
    fake = FakeTool("t", script=[ToolError("x")])
    r = await Kernel(tools=[fake.tool], plugins=plugins).call("t", {})
    assert r.content == {"recovered": True}
    assert [(p, h) for p, h, _ in log if h == "on_error"] == [("early", "on_error")]


async def test_on_error_sees_each_failed_attempt_with_the_attempts_so_far() -> None:
    """hooks.md: `ctx.attempts` lists the attempts so far (the failed one included); the
    call is that of the failed attempt: its name is the fallback tool after a Fallback,
    and `ctx.current_tool` is the tool of the running attempt (`ctx.tool` the requested)."""
    seen: list[tuple[str, int, int, str | None, str | None]] = []

    class Chain:
        name = "chain"

        @hookimpl
        def on_error(self, call: ToolCall, ctx: CallContext) -> Fallback | None:
            cur = ctx.current_tool.name if ctx.current_tool else None
            seen.append(
                (call.name, ctx.attempt, len(ctx.attempts), cur, ctx.tool and ctx.tool.name)
            )
            return Fallback("backup") if call.name == "primary" else None

    primary = FakeTool("primary", script=[ToolError("down", kind="unavailable")])
    backup = FakeTool("backup", script=[ToolError("also down", kind="unavailable")])
    after: list[str] = []

    class After:
        name = "after"

        @hookimpl
        def after_call(self, call: ToolCall) -> None:
            after.append(call.name)

    k = Kernel(tools=[primary.tool, backup.tool], plugins=[Chain(), After()])
    r = await k.call("primary", {})
    assert r.error is not None and r.error.message == "also down"
    assert seen == [
        ("primary", 1, 1, "primary", "primary"),
        ("backup", 2, 2, "backup", "primary"),
    ]
    assert after == ["primary"]  # after_call gets the call as requested
    assert r.meta.tool == "primary"


async def test_classification_applies_on_the_last_allowed_attempt_and_recover_past_it() -> None:
    """design-notes.md: the kernel runs on_error after every failed attempt and applies
    max_attempts to the decision, so the final error has its classified kind; a Recover
    is always honoured."""

    class Classify:
        name, order = "classify", 400

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            error.kind, error.retryable = "rate_limit", True

    class Decide:
        name, order = "decide", 500

        def __init__(self, last: Any) -> None:
            self.last = last

        @hookimpl
        def on_error(self, ctx: CallContext) -> Any:
            return Retry(0) if ctx.attempt < 2 else self.last

    fake = FakeTool("t", script=[RuntimeError("429")])
    k = Kernel(tools=[fake.tool], plugins=[Classify(), Decide(Retry(0))], max_attempts=2)
    r = await k.call("t", {})
    assert r.error is not None and r.error.kind == "rate_limit" and r.error.retryable
    assert r.error.details["gave_up"] == "max_attempts (2) reached"
    assert [a.error_kind for a in r.meta.attempts] == ["rate_limit", "rate_limit"]

    k = Kernel(tools=[fake.tool], plugins=[Classify(), Decide(Recover("spare"))], max_attempts=2)
    r = await k.call("t", {})
    assert r.content == {"result": "spare"} and r.meta.served_by == "recovered:decide"


async def test_a_failing_on_error_hook_is_logged_and_counts_as_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hooks.md: an on_error exception is logged, recorded in `result.meta.plugin_errors`,
    and counts as None: the call fails with the tool's error when nobody else decides."""

    class Broken:
        name = "broken"

        @hookimpl
        def on_error(self) -> None:
            raise LookupError("no table")

    fake = FakeTool("t", script=[ToolError("down", kind="unavailable")])
    with caplog.at_level(logging.ERROR, logger="toolwire"):
        r = await Kernel(tools=[fake.tool], plugins=[Broken()]).call("t", {})
    assert r.error is not None and (r.error.kind, r.error.message) == ("unavailable", "down")
    assert r.meta.plugin_errors == [
        {"plugin": "broken", "hook": "on_error", "error": "LookupError: no table"}
    ]
    assert "plugin 'broken': on_error failed for tool 't'" in caplog.text


async def test_a_malformed_decision_is_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hooks.md: a decision the kernel cannot follow is a plugin bug: ... and an ERROR
    logged."""

    class Odd:
        name = "odd"

        @hookimpl
        def on_error(self) -> Any:
            return "retry"

    fake = FakeTool("t", script=[ToolError("down")])
    with caplog.at_level(logging.ERROR, logger="toolwire"):
        await Kernel(tools=[fake.tool], plugins=[Odd()]).call("t", {})
    assert any(
        r.levelno == logging.ERROR and "plugin 'odd': on_error returned str" in r.getMessage()
        for r in caplog.records
    )


async def test_a_recover_of_a_tool_result_is_refused_not_a_success_holding_its_dump() -> None:
    """hooks.md: a `Recover` value that is a `ToolResult` is a decision the kernel cannot
    follow. Before: Recover(ToolResult.from_error(...)) made the call a success whose
    content was the error result's dump (`is_error` false outside, true inside)."""

    class Rec:
        name = "rec"

        @hookimpl
        def on_error(self) -> Any:
            return Recover(ToolResult.from_error(ErrorInfo("denied", "no cached answer")))

    fake = FakeTool("t", script=[ToolError("down")])
    r = await Kernel(tools=[fake.tool], plugins=[Rec()]).call("t", {})
    assert r.is_error and r.error is not None and r.error.message == "down"
    assert "Recover(result=ToolResult(...))" in r.error.details["gave_up"]
    assert [(e["plugin"], e["hook"]) for e in r.meta.plugin_errors] == [("rec", "on_error")]


@pytest.mark.parametrize("verdict", [False, True, "empty", 0])
async def test_a_check_result_returning_neither_an_error_nor_none_keeps_the_result(
    verdict: Any,
) -> None:
    """hooks.md: `ctx.check_result`: a returned ToolError turns the attempt into a failure,
    None accepts it, an exception is recorded and the result kept. Before: a check
    returning anything else (`False` for "fine") made the call an `internal` error and the
    tool's computed result was lost."""

    class Check:
        name = "check"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.check_result = lambda tool, content: verdict

    fake = FakeTool("t", script=[{"v": 1}])
    r = await Kernel(tools=[fake.tool], plugins=[Check()]).call("t", {})
    assert not r.is_error and r.content == {"v": 1}
    [err] = r.meta.plugin_errors
    assert (err["plugin"], err["hook"]) == ("check", "check_result")
    assert f"returned {type(verdict).__name__}" in err["error"] and "ToolError" in err["error"]


async def test_an_async_check_result_is_named_and_never_left_unawaited() -> None:
    """`ctx.check_result` is called, not awaited: an `async def` check returns a coroutine.
    Before: recorded as "returned coroutine <coroutine object ...>", and the coroutine
    never awaited (a RuntimeWarning at garbage collection). Now closed, and the record
    says what to write instead."""
    ran: list[str] = []

    async def check(tool: Tool, content: Any) -> ToolError | None:
        ran.append("check")  # never reached: a closed coroutine does not run
        return ToolError("rejected")

    class Check:
        name = "check"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.check_result = check  # type: ignore[assignment]

    fake = FakeTool("t", script=[{"v": 1}])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = await Kernel(tools=[fake.tool], plugins=[Check()]).call("t", {})
        gc.collect()
    assert not r.is_error and r.content == {"v": 1} and ran == []
    [err] = r.meta.plugin_errors
    assert (err["plugin"], err["hook"]) == ("check", "check_result")
    assert "coroutine" in err["error"] and "not async def" in err["error"]


# ----------------------------------------------------------------------- after_call
async def test_after_call_sees_the_complete_meta() -> None:
    """hooks.md: `result.meta` is complete (attempts, duration, served_by)."""
    seen: list[tuple[int, float, str | None]] = []

    class Peek:
        name = "peek"

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            m = result.meta
            seen.append((len(m.attempts), m.duration_ms, m.served_by))

    fake = FakeTool("t", script=[ToolError("x"), {"ok": 1}])
    r = await Kernel(tools=[fake.tool], plugins=[Peek(), _RetryOnce()]).call("t", {})
    [(attempts, duration, served_by)] = seen
    assert attempts == 2 and served_by == "t"
    assert duration == r.meta.duration_ms and duration >= sum(
        a.duration_ms for a in r.meta.attempts
    )


async def test_a_replacement_is_what_the_remaining_hooks_see_and_keeps_their_records() -> None:
    """hooks.md: after_call returns a replacement ToolResult that the remaining hooks see
    and the caller receives (it keeps the call's identity in meta); an exception is
    recorded in `result.meta.plugin_errors`. Before: when a second hook replaced the
    result again, what the hooks between the two replacements recorded on it (their
    `meta.extra`, their `plugin_errors`) was lost."""
    seen: list[Any] = []

    def replacing(name: str, order: int) -> object:
        @hookimpl
        def after_call(self: object, result: ToolResult) -> ToolResult:
            seen.append((name, result.content))
            return ToolResult.ok({name: result.content})

        return type(name, (), {"name": name, "order": order, "after_call": after_call})()

    class Between:
        name, order = "between", 200

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            seen.append(("between", result.content))
            result.meta.extra["between"] = "was here"
            raise RuntimeError("between broke")

    class Early:
        name, order = "early", 400

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            result.meta.extra["early"] = True

    plugins = [replacing("outer", 100), Between(), replacing("inner", 300), Early()]
    fake = FakeTool("t", script=[{"v": 1}])
    r = await Kernel(tools=[fake.tool], plugins=plugins).call("t", {}, call_id="c1")
    assert seen == [
        ("inner", {"v": 1}),
        ("between", {"inner": {"v": 1}}),
        ("outer", {"inner": {"v": 1}}),
    ]
    assert r.content == {"outer": {"inner": {"v": 1}}}
    assert (r.meta.call_id, r.meta.tool, len(r.meta.attempts)) == ("c1", "t", 1)
    assert r.meta.extra == {"early": True, "between": "was here"}
    assert r.meta.plugin_errors == [
        {"plugin": "between", "hook": "after_call", "error": "RuntimeError: between broke"}
    ]


async def test_a_replacement_sharing_records_does_not_repeat_them() -> None:
    """A replacement built from the result it replaces (a copy of its plugin_errors) lists
    each recorded error once."""

    class Broken:
        name, order = "broken", 300

        @hookimpl
        def after_call(self) -> None:
            raise RuntimeError("once")

    class Copy:
        name, order = "copy", 100

        @hookimpl
        def after_call(self, result: ToolResult) -> ToolResult:
            new = ToolResult.ok({"copied": True})
            new.meta.plugin_errors = list(result.meta.plugin_errors)
            return new

    r = await Kernel(tools=[FakeTool("t").tool], plugins=[Broken(), Copy()]).call("t", {})
    assert [e["error"] for e in r.meta.plugin_errors] == ["RuntimeError: once"]


async def test_an_after_call_returning_something_else_is_recorded_and_ignored() -> None:
    """hooks.md: after_call returns None or a replacement ToolResult; anything else is a
    plugin bug recorded in `plugin_errors`, and the result stays."""

    class Odd:
        name = "odd"

        @hookimpl
        def after_call(self) -> dict[str, Any]:
            return {"not": "a result"}

    r = await Kernel(tools=[FakeTool("t").tool], plugins=[Odd()]).call("t", {})
    assert r.content == {"ok": True}
    assert r.meta.plugin_errors == [
        {
            "plugin": "odd",
            "hook": "after_call",
            "error": "returned dict, expected ToolResult or None (ignored)",
        }
    ]


async def test_a_call_cancelled_in_before_call_gives_every_after_call_the_cancelled_result() -> (
    None
):
    """hooks.md: after_call runs once with a `cancelled` error result when the call is
    cancelled, so plugins can release claims; the cancellation is then re-raised."""
    results: list[str] = []

    class Park:
        name, order = "park", 300

        @hookimpl
        async def before_call(self) -> None:
            await anyio.sleep(10)

    class Release:
        name, order = "release", 100

        @hookimpl
        async def after_call(self, result: ToolResult) -> None:
            await anyio.lowlevel.checkpoint()  # shielded: it works although the call is cancelled
            results.append(result.error.kind if result.error else "ok")

    fake = FakeTool("t")
    k = Kernel(tools=[fake.tool], plugins=[Park(), Release()])
    with anyio.move_on_after(0.05) as scope:
        await k.call("t", {})
    assert scope.cancelled_caught
    assert results == ["cancelled"] and fake.calls == []


def raising_plugin(where: str, exc: BaseException) -> object:
    """A plugin (order 200) whose ``where`` hook raises ``exc``."""

    def boom(*_: Any) -> None:
        raise exc

    hooks = {where: hookimpl(lambda self, call: boom())} if where != "tool" else {}
    return type("Raiser", (), {"name": "raiser", "order": 200, **hooks})()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("where", ["before_call", "on_error", "after_call", "tool"])
@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
async def test_an_interrupt_from_a_hook_or_tool_still_runs_every_after_call_once(
    where: str, exc_type: type[BaseException]
) -> None:
    """hooks.md: whatever goes wrong, a plugin holding something for the call gets to
    release it. Before: KeyboardInterrupt or SystemExit raised by a hook or a tool left
    kernel.call with no after_call run (an idempotency claim stayed held)."""
    seen: list[Any] = []

    class Holder:
        name, order = "holder", 100

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            seen.append(result.error.kind if result.error else "ok")

    async def run(args: dict[str, Any], ctx: CallContext) -> Any:
        if where == "tool":
            raise exc_type("stop")
        if where == "on_error":
            raise ToolError("failed")
        return 1

    t = Tool(name="t", description="t", input_schema={"type": "object"}, executor=run)
    k = Kernel(tools=[t], plugins=[Holder(), raising_plugin(where, exc_type("stop"))])
    with pytest.raises(exc_type):
        await k.call("t", {})
    # the result a cancelled call's hooks get; after_call's own raise: the call's result
    assert seen == (["ok"] if where == "after_call" else ["cancelled"])


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("where", "kind"),
    [("before_call", "internal"), ("on_error", "tool_error"), ("after_call", None)],
)
async def test_a_cancelled_error_no_cancellation_caused_is_the_hooks_failure(
    where: str, kind: str | None
) -> None:
    """Before (asyncio): a hook awaiting a future its library cancelled raised
    CancelledError out of kernel.call, though nobody cancelled the call: the caller's
    task ended as if cancelled, its request unanswered. Now it is the hook's failure."""
    import asyncio

    async def run(args: dict[str, Any], ctx: CallContext) -> Any:
        if where == "on_error":
            raise ToolError("failed")
        return 1

    t = Tool(name="t", description="t", input_schema={"type": "object"}, executor=run)
    k = Kernel(tools=[t], plugins=[raising_plugin(where, asyncio.CancelledError())])
    r = await k.call("t", {})
    assert (r.error.kind if r.error else None) == kind
    assert [(e["plugin"], e["hook"]) for e in r.meta.plugin_errors] == [("raiser", where)]
    assert r.meta.plugin_errors[0]["error"].startswith("CancelledError")
    await anyio.lowlevel.checkpoint()  # the caller is not being cancelled


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_tool_raising_cancelled_error_uncancelled_fails_with_tool_error() -> None:
    """kernel.call never raises for a tool failure. Before (asyncio): a tool whose
    client library cancelled a pending request raised CancelledError to the caller."""
    import asyncio

    seen: list[str] = []

    class Watch:
        name = "watch"

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            seen.append(error.kind)

    async def run(args: dict[str, Any], ctx: CallContext) -> Any:
        raise asyncio.CancelledError

    t = Tool(name="t", description="t", input_schema={"type": "object"}, executor=run)
    r = await Kernel(tools=[t], plugins=[Watch()]).call("t", {})
    assert r.error is not None and r.error.kind == "tool_error"
    assert "raised CancelledError though the call was not cancelled" in r.error.message
    assert isinstance(r.error.exception, asyncio.CancelledError)
    assert seen == ["tool_error"]  # on_error decides on it like any failure


# ------------------------------------------------------------------- the test kit
async def test_register_plugin_fixture_orders_like_the_kernel(
    kernel: Kernel, register_plugin: Callable[..., Any]
) -> None:
    """writing-plugins.md: `register_plugin(plugin, name=None, order=None)` registers a
    plugin on the per-test `kernel`, before its first call; `RecordingPlugin` records each
    call hook for ordering assertions."""
    log: list[tuple[str, str, str]] = []
    register_plugin(RecordingPlugin("b", 100, log))
    register_plugin(RecordingPlugin("a", 100, log), order=50)
    kernel.add_tool(FakeTool("t", script=[ToolError("x")]).tool)
    await kernel.call("t", {})
    assert log == [
        ("a", "before_call", "t"),
        ("b", "before_call", "t"),
        ("a", "on_error", "t"),
        ("b", "on_error", "t"),
        ("b", "after_call", "t"),
        ("a", "after_call", "t"),
    ]
    with pytest.raises(PluginError, match=r"await kernel.add_plugin\(plugin\)"):
        register_plugin(lifecycle("late", 1, [], "startup"))  # the kernel has started


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_startup_slow_to_return_is_named_while_the_kernel_waits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin's startup (or discover) that does not return held the kernel's start, and
    `toolwire serve` with it, without a word. A WARNING now names the plugin and the hook
    while the kernel waits (then again, less often), and stops once the hook returns."""
    import toolwire._kernel as kernel_module

    monkeypatch.setattr(kernel_module, "_SLOW_HOOK_S", 0.05)
    monkeypatch.setattr(kernel_module, "_SLOW_HOOK_REPEAT_S", 0.1)

    class Slow:
        name = "slowpoke"

        @hookimpl
        async def startup(self) -> None:
            await anyio.sleep(0.4)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "has not returned" in r.getMessage()]

    caplog.set_level(logging.WARNING, logger="toolwire")
    async with Kernel(plugins=[Slow()]):
        seen = warned()
        assert len(seen) >= 2, seen
        assert seen[0].startswith("plugin 'slowpoke': its startup hook has not returned after")
        await anyio.sleep(0.3)
        assert warned() == seen  # the hook returned: no more warnings
