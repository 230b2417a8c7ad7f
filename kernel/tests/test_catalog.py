"""The catalog: local tools, tool sources via `discover`, collisions, exports."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from toolwire import Kernel, PluginError, Tool, ToolCollisionError, hookimpl, tool
from toolwire.testing import FakeTool

pytestmark = pytest.mark.anyio


@tool
def ping() -> str:
    """Reply pong."""
    return "pong"


class Source:
    """A tool source plugin contributing namespaced tools."""

    def __init__(
        self, name: str, tools: list[str], *, by_query: dict[str, list[str]] | None = None
    ) -> None:
        self.name = name
        self.tools = tools
        self.by_query = by_query or {}
        self.calls: list[str | None] = []

    def _make(self, n: str) -> Tool:
        return FakeTool(n, script=[{"from": self.name, "tool": n}], source=self.name).tool

    @hookimpl
    async def discover(self, query: str | None) -> list[Tool] | None:
        self.calls.append(query)
        if query is None:
            return [self._make(n) for n in self.tools]
        names = self.by_query.get(query)
        return [self._make(n) for n in names] if names else None


class Flaky(Source):
    """A source whose registry goes down when ``fail`` is set."""

    fail = False

    @hookimpl
    async def discover(self, query: str | None) -> list[Tool] | None:
        if self.fail:
            raise ConnectionError("registry down")
        return await super().discover(query)


async def test_sources_contribute_tools_at_start_and_calls_reach_them() -> None:
    src = Source("remote", ["remote_search", "remote_fetch"])
    async with Kernel(tools=[ping], plugins=[src]) as k:
        assert sorted(t.name for t in k.list_tools()) == ["ping", "remote_fetch", "remote_search"]
        r = await k.call("remote_search", {})
        assert r.content == {"from": "remote", "tool": "remote_search"}
        assert k.get_tool("remote_fetch").source == "remote"  # type: ignore[union-attr]


async def test_collision_between_sources_names_both() -> None:
    k = Kernel(plugins=[Source("alpha", ["search"]), Source("beta", ["search"])])
    with pytest.raises(ToolCollisionError) as ei:
        await k.start()
    assert "'search'" in str(ei.value) and "'alpha'" in str(ei.value) and "'beta'" in str(ei.value)


async def test_the_same_tool_listed_twice_is_no_collision_at_start_or_refresh() -> None:
    """Before: a listing holding one Tool object twice was accepted by add_plugin, but
    every refresh, and so a start, raised ToolCollisionError naming the source twice."""
    shared = FakeTool("search", source="dup").tool

    class Dup:
        name = "dup"

        @hookimpl
        def discover(self, query: str | None) -> list[Tool] | None:
            return None if query else [shared, shared]

    async with Kernel(plugins=[Dup()]) as k:
        assert [t.name for t in k.list_tools()] == ["search"]
        await k.refresh_tools()
        assert k.get_tool("search") is shared
    async with Kernel() as k:
        await k.add_plugin(Dup())
        await k.refresh_tools()
        assert [t.name for t in k.list_tools()] == ["search"]
    two = Source("two", ["search"])
    two.tools = ["search", "search"]  # two distinct objects of one name still collide
    with pytest.raises(ToolCollisionError):
        await Kernel(plugins=[two]).start()


async def test_collision_with_a_local_tool_names_both() -> None:
    k = Kernel(tools=[ping], plugins=[Source("remote", ["ping"])])
    with pytest.raises(ToolCollisionError, match=r"'local'.*'remote'|'remote'.*'local'"):
        await k.start()


async def test_a_refresh_may_keep_the_holder_of_a_clashing_name_and_apply_the_rest() -> None:
    alpha, beta = Source("alpha", ["search"]), Source("beta", ["fetch"])
    async with Kernel(tools=[ping], plugins=[alpha, beta]) as k:
        beta.tools = ["fetch", "search", "ping", "news"]  # two clashes appear, and a new tool
        with pytest.raises(ToolCollisionError):
            await k.refresh_tools()  # the default: all or nothing
        assert k.get_tool("news") is None
        await k.refresh_tools(keep_on_collision=True)
        assert k.get_tool("news") is not None  # the rest applies
        assert k.get_tool("search").source == "alpha"  # type: ignore[union-attr]  # the holder
        assert k.get_tool("ping").source == "local"  # type: ignore[union-attr]
        alpha.tools, beta.tools = ["search"], ["search"]
        await k.refresh_tools(keep_on_collision=True)
        assert k.get_tool("search").source == "alpha"  # type: ignore[union-attr]
        assert k.get_tool("news") is None  # gone from its source: gone from the catalog


def test_local_collision_and_namespacing() -> None:
    k = Kernel(tools=[ping])
    with pytest.raises(ToolCollisionError):
        k.add_tool(FakeTool("ping").tool)
    k.add_tool(FakeTool("ping").tool, namespace="other")
    assert sorted(t.name for t in k.list_tools()) == ["other_ping", "ping"]


async def test_refresh_keeps_the_old_catalog_when_a_source_fails() -> None:
    src = Flaky("reg", ["reg_a"])
    async with Kernel(plugins=[src]) as k:
        src.fail = True
        with pytest.raises(PluginError, match="plugin 'reg': discover failed: ConnectionError"):
            await k.refresh_tools()
        assert [t.name for t in k.list_tools()] == ["reg_a"]


async def test_query_time_discovery_adds_matching_tools() -> None:
    src = Source("reg", ["reg_a"], by_query={"weather": ["reg_weather"]})
    async with Kernel(plugins=[src]) as k:
        found = await k.discover("weather")
        assert [t.name for t in found] == ["reg_weather"]
        assert k.get_tool("reg_weather") is not None
        assert (await k.call("reg_weather", {})).content["tool"] == "reg_weather"
        assert await k.discover("nothing") == []
    assert src.calls == [None, "weather", "nothing"]


async def test_a_query_clash_adds_nothing_and_names_both_sources() -> None:
    alpha = Source("alpha", [], by_query={"news": ["news_a", "news_b", "shared"]})
    beta = Source("beta", [], by_query={"news": ["shared"]})
    async with Kernel(plugins=[alpha, beta]) as k:
        with pytest.raises(ToolCollisionError, match=r"'alpha'.*'beta'|'beta'.*'alpha'"):
            await k.discover("news")
        assert k.list_tools() == []  # all or nothing: news_a and news_b were not kept


async def test_a_failing_source_in_a_query_adds_nothing() -> None:
    class Down(Source):
        @hookimpl
        async def discover(self, query: str | None) -> list[Tool] | None:
            if query is not None:
                raise ConnectionError("registry down")
            return None

    ok = Source("a_ok", [], by_query={"news": ["news_a"]})  # asked first
    async with Kernel(plugins=[ok, Down("z_down", [])]) as k:
        with pytest.raises(PluginError, match="plugin 'z_down'"):
            await k.discover("news")
        assert k.get_tool("news_a") is None


async def test_tools_a_query_found_survive_a_refresh_until_listed_or_removed() -> None:
    reg = Source("reg", ["reg_a"], by_query={"weather": ["reg_weather", "reg_a"]})
    other = Source("other", ["other_x"])
    async with Kernel(plugins=[reg, other]) as k:
        found = await k.discover("weather")
        assert [t.name for t in found] == ["reg_weather", "reg_a"]
        assert found[1] is k.get_tool("reg_a")  # already listed: the catalog's own copy
        await k.refresh_tools()
        assert k.get_tool("reg_weather") is not None  # a refresh keeps what a query found
        assert (await k.call("reg_weather", {})).content["tool"] == "reg_weather"
        other.tools = ["other_x", "reg_weather"]  # now a full listing claims the name
        await k.refresh_tools()
        assert k.get_tool("reg_weather").source == "other"  # type: ignore[union-attr]
        other.tools = ["other_x"]
        await k.refresh_tools()
        assert k.get_tool("reg_weather") is None  # the query's tool was replaced, not kept aside
        await k.discover("weather")
        await k.remove_plugin("reg")  # its listed and its queried tools leave at once
        assert sorted(t.name for t in k.list_tools()) == ["other_x"]


async def test_discover_wants_a_string() -> None:
    async with Kernel() as k:
        with pytest.raises(TypeError, match="takes a string"):
            await k.discover(None)  # type: ignore[arg-type]


async def test_discover_returning_garbage_names_the_plugin() -> None:
    class Bad:
        name = "bad"

        @hookimpl
        def discover(self) -> Any:
            return ["not a tool"]

    with pytest.raises(
        PluginError, match=r"plugin 'bad': discover must return .*, not a list holding str; build"
    ):
        await Kernel(plugins=[Bad()]).start()

    class One:
        name = "one"

        @hookimpl
        def discover(self) -> Any:
            return FakeTool("lone").tool  # a Tool, not a list of them

    with pytest.raises(PluginError, match=r"discover must return .* or None, not Tool;"):
        await Kernel(plugins=[One()]).start()


async def test_removing_what_is_not_there_says_what_is() -> None:
    async with Kernel(tools=[ping], plugins=[Source("s", ["a"])]) as k:
        with pytest.raises(KeyError, match=r"discover listing \(source 's'\): remove that plugin"):
            k.remove_tool("a")
        with pytest.raises(KeyError, match="no tool of that name is in the catalog"):
            k.remove_tool("nope")
        with pytest.raises(PluginError, match="'nope': not registered; registered plugins: s"):
            await k.remove_plugin("nope")
        with pytest.raises(PluginError, match="registered plugins: s"):
            k.unregister("nope")


def test_exports_in_three_shapes() -> None:
    k = Kernel(tools=[ping])
    assert k.list_tools(format="openai")[0]["function"]["name"] == "ping"
    assert k.list_tools(format="anthropic")[0]["input_schema"]["type"] == "object"
    assert "inputSchema" in k.list_tools(format="mcp")[0]
    with pytest.raises(ValueError, match="unknown format"):
        k.list_tools(format="xml")  # type: ignore[arg-type]


def test_find_tools_over_the_catalog_and_after_changes() -> None:
    from toolwire import examples

    k = Kernel(tools=[examples])
    assert k.find_tools("add two numbers", limit=1)[0].name == "add"
    k.add_tool(FakeTool("translate_text", description="Translate text between languages.").tool)
    assert k.find_tools("translate a sentence into French", limit=1)[0].name == "translate_text"
    k.remove_tool("translate_text")
    assert all(t.name != "translate_text" for t in k.find_tools("translate", limit=5))


async def test_catalog_change_listeners_hear_real_changes_only() -> None:
    src = Source("s", ["a"])
    k = Kernel(plugins=[src])
    seen: list[list[str]] = []
    unsubscribe = k.on_catalog_change(lambda: seen.append(sorted(t.name for t in k.list_tools())))
    async with k:
        assert seen == [["a"]]  # the start built the catalog
        seen.clear()
        await k.refresh_tools()  # the source rebuilds identical tools: no change
        assert seen == []
        src.tools = ["a", "b"]
        await k.refresh_tools()
        assert len(seen) == 1 and len(seen[0]) == 2
        k.add_tool(ping)
        assert "ping" in seen[-1]
        k.remove_tool("ping")
        assert "ping" not in seen[-1] and len(seen) == 3

        def broken() -> None:
            raise RuntimeError("listener bug")

        k.on_catalog_change(broken)  # a raising listener is logged, the change still lands
        k.add_tool(ping)
        assert k.get_tool("ping") is not None and len(seen) == 4
        unsubscribe()
        k.remove_tool("ping")
        assert len(seen) == 4


@pytest.mark.parametrize("bad", ["has space", "slash/name", "x" * 129, "naïve", ""])
def test_a_tool_name_no_export_accepts_is_refused_when_added(bad: str) -> None:
    """Before: accepted, and later every list_tools(format=...) of the catalog raised."""
    k = Kernel()
    with pytest.raises(ValueError, match=r"is not a valid tool name|give a name"):
        k.add_tool(ping, name=bad)
    assert k.list_tools() == []


async def test_a_source_offering_a_bad_tool_name_is_a_plugin_error() -> None:
    class Bad:
        name = "bad"

        @hookimpl
        def discover(self, query: str | None) -> list[Tool] | None:
            return [FakeTool("bad name", source="bad").tool] if query is None else None

    k = Kernel(plugins=[Bad()])
    with pytest.raises(PluginError, match=r"'bad name' .* is not a valid tool name"):
        await k.start()


async def _noop(args: dict[str, Any], ctx: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "array", "items": {"type": "string"}}, "has type 'array'"),
        ({"type": ["string", "null"]}, "has type \\['string', 'null'\\]"),
        ("{}", "must be a JSON Schema \\(a dict\\), not str"),
    ],
)
async def test_a_tool_whose_arguments_are_not_an_object_is_refused(schema: Any, why: str) -> None:
    """Before: accepted, exported as it was (MCP, OpenAI and Anthropic refuse such a schema),
    and no call could ever pass its validation (a tool's arguments are always an object)."""
    odd = Tool(name="odd", description="d", input_schema=schema, executor=_noop)
    k = Kernel()
    with pytest.raises(ValueError, match=rf"tool 'odd' \(from local\): input_schema {why}"):
        k.add_tool(odd)
    assert k.list_tools() == []

    class Source_:
        name = "src"

        @hookimpl
        def discover(self, query: str | None) -> list[Tool] | None:
            return [odd] if query is None else None

    k2 = Kernel(plugins=[Source_()])
    with pytest.raises(PluginError, match=rf"tool 'odd' \(from src\): input_schema {why}"):
        await k2.start()
    # an object, or types that include one, are fine
    for ok in ({"type": "object"}, {"type": ["object", "null"]}, {"anyOf": [{"type": "object"}]}):
        Kernel().add_tool(Tool(name="fine", description="d", input_schema=ok, executor=_noop))


class Lifecycle(Source):
    def __init__(self, name: str, tools: list[str], *, fail_startup: bool = False) -> None:
        super().__init__(name, tools)
        self.fail_startup = fail_startup
        self.events: list[str] = []

    @hookimpl
    async def startup(self) -> None:
        if self.fail_startup:
            raise ConnectionError("registry down")
        self.events.append("startup")

    @hookimpl
    async def shutdown(self) -> None:
        self.events.append("shutdown")


async def test_add_plugin_on_a_running_kernel_starts_it_and_lists_its_tools() -> None:
    async with Kernel(tools=[ping]) as k:
        src = Lifecycle("reg", ["reg_a"])
        with pytest.raises(PluginError, match=r"await kernel.add_plugin\(plugin\)"):
            k.register(src)  # its startup and discover would not run
        assert "reg" not in k.plugins.plugins
        await k.add_plugin(src)
        assert src.events == ["startup"]
        assert (await k.call("reg_a", {})).content["tool"] == "reg_a"
        with pytest.raises(PluginError, match=r"await kernel.remove_plugin\(name\)"):
            k.unregister("reg")
        await k.remove_plugin("reg")
        assert src.events == ["startup", "shutdown"]
        assert k.get_tool("reg_a") is None
        r = await k.call("reg_a", {})
        assert r.error is not None and r.error.kind == "not_found"
    assert src.events == ["startup", "shutdown"]  # not shut down twice at close


async def test_add_plugin_that_fails_leaves_the_kernel_as_it_was() -> None:
    async with Kernel(tools=[ping], plugins=[Source("alpha", ["search"])]) as k:
        with pytest.raises(PluginError, match="plugin 'reg': startup failed: ConnectionError"):
            await k.add_plugin(Lifecycle("reg", ["reg_a"], fail_startup=True))
        clash = Lifecycle("beta", ["search"])
        with pytest.raises(ToolCollisionError):
            await k.add_plugin(clash)
        assert clash.events == ["startup", "shutdown"]  # started, then shut down again
        assert set(k.plugins.plugins) == {"alpha"}
        assert sorted(t.name for t in k.list_tools()) == ["ping", "search"]


async def test_hook_only_plugins_may_still_be_registered_on_a_running_kernel() -> None:
    class Stamp:
        name = "stamp"

        @hookimpl
        def after_call(self, result: Any) -> None:
            result.meta.extra["stamp"] = True

    async with Kernel(tools=[ping]) as k:
        k.register(Stamp())
        assert (await k.call("ping", {})).meta.extra["stamp"] is True
        k.unregister("stamp")
        assert "stamp" not in (await k.call("ping", {})).meta.extra


def test_add_tool_name_renames_one_tool_and_is_refused_for_many() -> None:
    """Before: name= was silently ignored for a Tool, a ToolSet or a module."""
    k = Kernel()
    added = k.add_tool(FakeTool("t").tool, name="renamed")
    assert [t.name for t in added] == ["renamed"] and k.get_tool("t") is None
    import toolwire.examples

    with pytest.raises(ValueError, match="use namespace="):
        k.add_tool(toolwire.examples, name="x")


def test_two_tools_of_one_add_tool_with_one_name_collide() -> None:
    """Before: the last of two same-named tools of a ToolSet silently won."""
    from toolwire import ToolSet

    class Twins(ToolSet):
        @tool(name="same")
        def first(self) -> str:
            """One."""
            return "1"

        @tool(name="same")
        def second(self) -> str:
            """Two."""
            return "2"

    k = Kernel()
    with pytest.raises(ToolCollisionError, match="'same'"):
        k.add_tool(Twins())
    assert k.list_tools() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"max_attempts": 2.5}, "max_attempts=2.5"),
        ({"default_timeout_s": 0}, "default_timeout_s=0"),
        ({"deadline_s": -1}, "deadline_s=-1"),
        ({"deadline_s": float("nan")}, "deadline_s=nan"),
    ],
)
def test_kernel_settings_are_checked_when_built(kwargs: dict[str, Any], match: str) -> None:
    """Before: default_timeout_s=0 made every call fail with `timeout`."""
    with pytest.raises(ValueError, match=match):
        Kernel(**kwargs)


async def test_close_cancels_spawned_tasks_of_a_kernel_that_never_started() -> None:
    import anyio

    k = Kernel()
    ended = anyio.Event()

    async def forever() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            ended.set()

    k.spawn(forever, name="forever")
    await anyio.lowlevel.checkpoint()
    await k.close()
    with anyio.fail_after(2):
        await ended.wait()


class Counting:
    """Counts its call hooks; its startup takes a while."""

    def __init__(self, name: str, startup_s: float = 0.0) -> None:
        self.name = name
        self.startup_s = startup_s
        self.started = False
        self.before = self.after = 0
        self.early: list[str] = []

    @hookimpl
    async def startup(self) -> None:
        import anyio

        await anyio.sleep(self.startup_s)
        self.started = True

    @hookimpl
    def before_call(self, call: Any) -> None:
        self.before += 1
        if not self.started:
            self.early.append(call.name)

    @hookimpl
    def after_call(self, call: Any) -> None:
        self.after += 1


async def test_calls_in_flight_keep_the_hooks_they_started_with() -> None:
    """Before: a plugin added during a call ran only its after_call on it (before 0, after
    1), and one removed ran only before_call (a slot taken there was never given back)."""
    import anyio

    slow = FakeTool("slow", script=[{"ok": 1}, {"ok": 2}], delay=0.3)
    async with Kernel(tools=[slow.tool]) as k:
        added = Counting("added")
        async with anyio.create_task_group() as tg:
            tg.start_soon(k.call, "slow", {})
            await anyio.sleep(0.1)
            await k.add_plugin(added)
        assert (added.before, added.after) == (0, 0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(k.call, "slow", {})
            await anyio.sleep(0.1)
            await k.remove_plugin("added")
        assert (added.before, added.after) == (1, 1)


async def test_an_added_plugin_meets_no_call_before_its_startup_ends() -> None:
    import anyio

    async with Kernel(tools=[ping]) as k:
        late = Counting("late", startup_s=0.3)
        async with anyio.create_task_group() as tg:
            tg.start_soon(k.add_plugin, late)
            await anyio.sleep(0.1)
            await k.call("ping", {})  # while its startup runs
        assert late.early == [] and late.before == 0
        await k.call("ping", {})
        assert late.before == 1


async def test_remove_plugin_takes_its_tools_out_whatever_other_sources_do() -> None:
    """Before: removing asked every source again, so another source failing (or a refresh
    running at the same time) left the removed plugin's tools callable."""

    a = Lifecycle("a", ["a_tool"])
    b = Flaky("b", ["b_tool"])
    async with Kernel(plugins=[a, b]) as k:
        b.fail = True
        await k.remove_plugin("a")
        assert k.get_tool("a_tool") is None and k.get_tool("b_tool") is not None
        assert a.events == ["startup", "shutdown"]


async def test_a_refresh_running_while_a_plugin_is_removed_does_not_bring_its_tools_back() -> None:
    import anyio

    class Slow(Source):
        @hookimpl
        async def discover(self, query: str | None) -> list[Tool] | None:
            await anyio.sleep(0.2)
            return await super().discover(query)

    async with Kernel(plugins=[Source("a", ["a_tool"]), Slow("b", ["b_tool"])]) as k:
        async with anyio.create_task_group() as tg:
            tg.start_soon(k.refresh_tools)
            await anyio.sleep(0.05)
            await k.remove_plugin("b")
        assert sorted(t.name for t in k.list_tools()) == ["a_tool"]


async def test_add_plugin_is_not_stopped_by_a_clash_between_other_sources() -> None:
    """Before: adding any tool source re-listed every source, so an existing clash (kept
    apart with keep_on_collision while serving) or another source being down failed it."""
    x, y = Source("x", ["x_only"]), Source("y", ["y_only"])
    async with Kernel(plugins=[x, y]) as k:
        y.tools = ["y_only", "x_only"]  # a clash appears while serving
        await k.refresh_tools(keep_on_collision=True)
        await k.add_plugin(Source("z", ["z_tool"]))
        assert k.get_tool("z_tool") is not None
        with pytest.raises(ToolCollisionError, match="'x_only'") as ei:
            await k.add_plugin(Source("w", ["x_only"]))  # its own clash still fails
        assert ei.value.plugins == ("x", "w")
        assert "w" not in k.plugins.plugins


async def test_calling_a_tool_by_a_str_enum_member_works() -> None:
    import enum

    class Names(enum.StrEnum):
        PING = "ping"

    async with Kernel(tools=[ping]) as k:
        assert (await k.call(Names.PING, {})).content == {"result": "pong"}


def test_a_module_naming_one_tool_twice_adds_it_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "aliasmod.py").write_text(
        "from toolwire import tool\n\n"
        "@tool(name='lookup')\n"
        "def search(q: str) -> str:\n"
        "    '''Look it up.'''\n"
        "    return q\n\n"
        "find = search\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import aliasmod  # type: ignore[import-not-found]

    k = Kernel()
    assert [t.name for t in k.add_tool(aliasmod)] == ["lookup"]


async def test_adding_a_held_name_says_how_to_add_it_anyway() -> None:
    k = Kernel(tools=[ping])

    def other() -> str:
        return "other"

    with pytest.raises(ToolCollisionError, match=r"already holds it.*remove_tool\('ping'\)") as ei:
        k.add_tool(other, name="ping")
    assert "namespace=" in str(ei.value) and "tools.modules" not in str(ei.value)
    assert ei.value.name == "ping"
    async with Kernel(plugins=[Source("s", ["a"])]) as k2:
        # a plugin's tool cannot be removed with remove_tool: not suggested
        with pytest.raises(ToolCollisionError, match="source 's'") as ei:
            k2.add_tool(other, name="a")
        assert "remove_tool" not in str(ei.value)
    assert k.add_tool(k.get_tool("ping")) == [k.get_tool("ping")]  # the same Tool: no clash


async def test_a_source_tool_with_non_str_tags_is_refused() -> None:
    async def ex(args: dict[str, Any], ctx: Any) -> Any:
        return 1

    bad = Tool(name="t", description="", input_schema={"type": "object"}, executor=ex)
    bad.tags = frozenset({1})  # type: ignore[arg-type]
    k = Kernel()
    with pytest.raises(ValueError, match="tags must be a set of non-empty str"):
        k.add_tool(bad)
    assert k.find_tools("t") == []  # the catalog, and its index, stay usable


# ---------------------------------------------------------- sources of listed tools
def _bare(name: str) -> Tool:
    """A tool built as a plugin might, without a ``source``."""
    return Tool(name=name, description=f"{name}.", input_schema={"type": "object"}, executor=_noop)


class Bare:
    """A tool source that returns the same ``Tool`` objects every time, sources as built."""

    def __init__(
        self, name: str, tools: list[Tool], *, by_query: dict[str, list[Tool]] | None = None
    ) -> None:
        self.name = name
        self.tools = tools
        self.by_query = by_query or {}

    @hookimpl
    def discover(self, query: str | None) -> list[Tool] | None:
        return list(self.tools) if query is None else self.by_query.get(query)


async def test_a_listed_tool_without_a_source_is_recorded_under_its_plugin() -> None:
    """Before: it kept source 'local', so `source:<plugin>` found none of a plugin's tools."""
    now, alerts, extra = _bare("weather_now"), _bare("weather_alerts"), _bare("extra_x")
    maps = dataclasses.replace(_bare("weather_map"), source="weather:maps")
    src = Bare("weather", [now, maps], by_query={"alerts": [alerts]})
    async with Kernel(tools=[ping], plugins=[src]) as k:
        await k.discover("alerts")
        await k.add_plugin(Bare("extra", [extra]))
        sources = {t.name: t.source for t in k.list_tools()}
        assert sources == {
            "ping": "local",
            "weather_now": "weather",
            "weather_map": "weather:maps",  # a source the plugin set is kept
            "weather_alerts": "weather",  # found by a query
            "extra_x": "extra",  # listed by a plugin added while running
        }
        found = k.find_tools("source:weather", mode="explicit")
        assert [t.name for t in found] == ["weather_now", "weather_alerts"]
        assert (await k.call("weather_now", {})).error is None
    assert now.source == "local"  # the plugin's own Tool is left as it was


async def test_one_tool_object_listed_in_two_kernels_gets_each_plugins_name() -> None:
    shared = _bare("lookup")
    ka, kb = Kernel(plugins=[Bare("a", [shared])]), Kernel(plugins=[Bare("b", [shared])])
    async with ka, kb:
        assert ka.get_tool("lookup").source == "a"  # type: ignore[union-attr]
        assert kb.get_tool("lookup").source == "b"  # type: ignore[union-attr]


async def test_relisting_the_same_tool_keeps_its_catalog_entry() -> None:
    """The entry the kernel records a listed tool under is made once per tool object: a
    refresh returning the same objects changes nothing (not even the ranker's index)."""
    tool_ = _bare("lookup")
    src = Bare("a", [tool_])
    async with Kernel(plugins=[src]) as k:
        held = k.get_tool("lookup")
        await k.refresh_tools()
        assert k.get_tool("lookup") is held
        src.tools = [dataclasses.replace(tool_, description="Changed.")]
        await k.refresh_tools()
        new = k.get_tool("lookup")
        assert new is not held and new is not None
        assert (new.source, new.description) == ("a", "Changed.")


async def test_a_query_returning_a_fresh_object_of_a_listed_tool_changes_no_entry() -> None:
    """Before: the query's object displaced the listed one in the kernel's memory, so the
    next refresh, relisting the very same object, replaced and re-indexed the entry."""
    tool_ = _bare("lookup")
    src = Bare("a", [tool_], by_query={"look": [_bare("lookup")]})
    async with Kernel(plugins=[src]) as k:
        held = k.get_tool("lookup")
        assert [t.name for t in await k.discover("look")] == ["lookup"]
        assert k.get_tool("lookup") is held
        await k.refresh_tools()
        assert k.get_tool("lookup") is held


async def test_a_tool_a_query_found_keeps_its_entry_when_the_plugin_lists_it() -> None:
    """Before: the query's copy was not remembered at all (so that it would not displace a
    listed one), so the listing of that very object made a new copy and re-indexed it."""
    tool_ = _bare("lookup")
    src = Bare("a", [], by_query={"look": [tool_]})
    async with Kernel(plugins=[src]) as k:
        [held] = await k.discover("look")
        assert k.get_tool("lookup") is held and held.source == "a"
        src.tools = [tool_]
        await k.refresh_tools()
        assert k.get_tool("lookup") is held


async def test_a_query_finding_a_name_another_plugin_listed_is_a_clash() -> None:
    """Before: both tools were 'local', so b's was taken for a's and silently dropped."""
    a = Bare("a", [_bare("lookup")])
    b = Bare("b", [], by_query={"look": [_bare("lookup")]})
    async with Kernel(plugins=[a, b]) as k:
        with pytest.raises(ToolCollisionError) as ei:
            await k.discover("look")
        assert ei.value.sources == ("a", "b")
        assert ei.value.plugins == ("a", "b")


async def test_a_clash_between_two_plugins_names_the_plugins() -> None:
    """Before: both sources were 'local'."""
    k = Kernel(plugins=[Bare("alpha", [_bare("lookup")]), Bare("beta", [_bare("lookup")])])
    with pytest.raises(ToolCollisionError) as ei:
        await k.start()
    assert ei.value.sources == ("alpha", "beta")
    assert ei.value.plugins == ("alpha", "beta")


# ---------------------------------------------------------------- collision advice
def _sourced(plugin: str, source: str, *names: str) -> Bare:
    return Bare(plugin, [dataclasses.replace(_bare(n), source=source) for n in names])


async def _clash(*plugins: Bare, tools: list[Any] | None = None) -> ToolCollisionError:
    k = Kernel(tools=tools or [], plugins=plugins)
    with pytest.raises(ToolCollisionError) as ei:
        await k.start()
    await k.close()
    return ei.value


async def test_a_clash_between_third_party_plugins_says_to_configure_them() -> None:
    """Before: any source not `mcp:<server>` was told to set `tools.modules = [{module = ...,
    namespace = ...}]`, a setting of local tool modules that cannot rename a plugin's tools."""
    msg = str(await _clash(Source("alpha", ["lookup"]), Source("beta", ["lookup"])))
    assert "tools.modules" not in msg, msg
    assert "for source 'alpha', configure the tool names of plugin 'alpha'" in msg, msg
    assert "for source 'beta', configure the tool names of plugin 'beta'" in msg, msg


async def test_a_clash_with_a_local_tool_says_how_to_rename_each() -> None:
    err = await _clash(Source("remote", ["ping"]), tools=[ping])
    assert err.plugins == (None, "remote")  # None: a local tool
    msg = str(err)
    assert "for source 'local', add it under another name: add_tool(..., name=...)" in msg, msg
    assert "configure the tool names of plugin 'remote'" in msg, msg
    assert "tools.modules" not in msg, msg
    from toolwire import examples

    msg = str(await _clash(Source("remote", ["add"]), tools=[examples]))
    assert 'tools.modules = [{module = "toolwire.examples", namespace = ...}]' in msg, msg


async def test_a_clash_with_an_a2a_agent_points_at_its_nickname() -> None:
    msg = str(
        await _clash(
            _sourced("a2a", "a2a:research", "agent_research"), Source("x", ["agent_research"])
        )
    )
    assert "give agent 'research' another `nickname` in [plugins.a2a] agents" in msg, msg
    assert "tools.modules" not in msg and "namespace" not in msg, msg


@pytest.mark.parametrize(
    ("name", "advice"),
    [
        ("search_docs", "rename [plugins.search.collections.docs]"),
        (
            "web_search_brave",
            "its name is fixed: turn backend 'brave' off with "
            "[plugins.search.brave] enabled = false",
        ),
        (
            "web_search_mine",
            "its name is fixed: turn backend 'mine' off with "
            "[plugins.search.backends.mine] enabled = false",
        ),
        ("web_search", "web_search is a fixed name of the search plugin: rename the other tool"),
    ],
)
async def test_a_clash_with_a_search_tool_says_what_the_search_plugin_can_change(
    name: str, advice: str
) -> None:
    msg = str(await _clash(_sourced("search", "search", name), Source("x", [name])))
    assert f"for source 'search', {advice}" in msg, msg
    assert "tools.modules" not in msg and "namespace" not in msg, msg


def test_a_collision_error_built_without_plugins_goes_by_the_sources() -> None:
    e = ToolCollisionError("t", "mcp:a", "mcp:b")
    assert e.plugins is None
    assert "`namespace` of [plugins.mcp.servers.a]" in str(e)
    assert "`namespace` of [plugins.mcp.servers.b]" in str(e)
    odd = str(ToolCollisionError("t", "local", "vendor"))
    assert "add_tool(..., name=...)" in odd  # 'local' is only ever a local tool
    assert "for source 'vendor', rename or namespace it where that source is set up" in odd


async def test_a_refresh_keeping_the_holder_logs_the_advice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    alpha, beta = Source("alpha", ["search"]), Source("beta", [])
    async with Kernel(plugins=[alpha, beta]) as k:
        beta.tools = ["search"]
        await k.refresh_tools(keep_on_collision=True)
    logged = [r.getMessage() for r in caplog.records if "claimed by" in r.getMessage()]
    assert len(logged) == 1 and "configure the tool names of plugin 'beta'" in logged[0], logged
