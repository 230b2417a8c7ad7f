from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from toolwire import CallContext, Kernel, ToolSet, build_tool, tool, tools_from_module
from toolwire._tool import parse_docstring

pytestmark = pytest.mark.anyio


@tool(tags=["math"], read_only=True, timeout=3, approval="REQUIRED")
async def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Longer explanation that stays in the description.

    Args:
        a: The first number.
        b: The second number,
            continued on a second line.

    Returns:
        The sum.
    """
    return a + b


def sphinx_style(city: str, units: Literal["c", "f"] = "c") -> str:
    """Weather for a city.

    :param city: City name.
    :param units: Temperature units.
    :returns: a sentence.
    """
    return f"{city}:{units}"


class Out(BaseModel):
    total: int


def test_schema_description_and_param_docs_from_hints_and_docstring() -> None:
    t = build_tool(add)
    assert t.name == "add"
    assert t.description.startswith("Add two integers.")
    assert "Longer explanation" in t.description
    assert "Returns" not in t.description
    props = t.input_schema["properties"]
    assert props["a"] == {"type": "integer", "description": "The first number."}
    assert props["b"]["default"] == 2
    assert props["b"]["description"] == "The second number, continued on a second line."
    assert t.input_schema["required"] == ["a"]
    assert t.input_schema["additionalProperties"] is False
    assert t.tags == frozenset({"math"})
    assert t.annotations.readOnlyHint is True
    assert t.timeout_s == 3
    assert t.settings == {"approval": "REQUIRED"}
    assert t.output_schema == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }


def test_sphinx_docstrings_and_literal_enum() -> None:
    t = build_tool(sphinx_style)
    assert t.description == "Weather for a city."
    assert t.input_schema["properties"]["city"]["description"] == "City name."
    assert t.input_schema["properties"]["units"]["enum"] == ["c", "f"]


def test_pydantic_return_type_gives_object_output_schema() -> None:
    def f(x: Annotated[int, Field(ge=0)]) -> Out:
        return Out(total=x)

    t = build_tool(f)
    assert t.output_schema is not None
    assert t.output_schema["properties"]["total"]["type"] == "integer"
    assert t.input_schema["properties"]["x"]["minimum"] == 0


def test_docstring_parser_edge_cases() -> None:
    assert parse_docstring(None) == ("", {})
    desc, params = parse_docstring("Only a line.")
    assert (desc, params) == ("Only a line.", {})


def test_varargs_are_rejected_with_a_clear_error() -> None:
    def f(*args: int) -> None: ...

    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        build_tool(f)


async def test_context_parameter_is_injected_and_hidden_from_schema() -> None:
    seen: list[CallContext] = []

    @tool
    async def whoami(ctx: CallContext, x: int) -> str:
        seen.append(ctx)
        return ctx.call.name

    k = Kernel(tools=[whoami])
    assert "ctx" not in k.get_tool("whoami").input_schema["properties"]  # type: ignore[union-attr]
    r = await k.call("whoami", {"x": 1})
    assert r.content == {"result": "whoami"}
    assert seen[0].call.args == {"x": 1}


async def test_sync_tool_runs_in_a_worker_thread_without_blocking_the_loop() -> None:
    main_thread = threading.get_ident()
    ran_in: list[int] = []

    @tool
    def slow() -> str:
        ran_in.append(threading.get_ident())
        time.sleep(0.3)
        return "done"

    k = Kernel(tools=[slow])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        for _ in range(10):
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        r = await k.call("slow")
    assert r.content == {"result": "done"}
    assert ran_in and ran_in[0] != main_thread
    assert ticks == 10  # the loop kept running while the tool slept


class Browser(ToolSet):
    serial = True

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self.pages: list[str] = []

    @tool
    async def open(self, url: str) -> int:
        """Open a page."""
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await anyio.sleep(0.01)
        self.pages.append(url)
        self.active -= 1
        return len(self.pages)

    @tool(name="page_count")
    def count(self) -> int:
        """How many pages were opened."""
        return len(self.pages)

    def not_a_tool(self) -> None: ...


async def test_toolset_methods_share_one_instance_and_serial_runs_one_at_a_time() -> None:
    b = Browser()
    k = Kernel(tools=[b])
    assert sorted(t.name for t in k.list_tools()) == ["open", "page_count"]
    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(k.call, "open", {"url": f"u{i}"})
    assert b.max_active == 1
    assert (await k.call("page_count")).content == {"result": 5}


async def test_non_serial_toolset_runs_concurrently() -> None:
    class Free(Browser):
        serial = False

    b = Free()
    k = Kernel(tools=[b])
    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(k.call, "open", {"url": f"u{i}"})
    assert b.max_active > 1


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_serial_sync_tool_given_up_keeps_its_turn_until_its_function_returns() -> None:
    """Before: a cancelled (or timed-out) call released the serial lock while its function
    ran on in its thread, so the next call ran the function beside it."""
    started, release = threading.Event(), threading.Event()
    guard = threading.Lock()
    running: list[int] = [0]
    peak: list[int] = [0]

    class Doc(ToolSet):
        serial = True

        @tool
        def edit(self, wait: bool) -> str:
            """Edits the document."""
            with guard:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            try:
                if wait:
                    started.set()
                    release.wait(10)
            finally:
                with guard:
                    running[0] -= 1
            return "edited"

    try:
        async with Kernel(tools=[Doc()]) as k:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(k.call, "edit", {"wait": True})
                    await anyio.to_thread.run_sync(started.wait, 10)
                    scope.cancel()  # the first call leaves; its function runs on
            # the second call waits for that function, here until its own deadline
            second = await k.call("edit", {"wait": False}, timeout=0.2)
            assert second.error is not None and second.error.kind == "timeout"
            assert second.error.details == {"reason": "deadline_before_attempt"}
            assert "still ran in its thread" in second.error.message
            assert peak[0] == 1
            release.set()
            third = await k.call("edit", {"wait": False}, timeout=10)
            assert third.content == {"result": "edited"}
            assert peak[0] == 1
    finally:
        release.set()  # never leave a thread blocked (pytest would not exit)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_serial_tool_does_not_wait_for_the_threads_of_tools_it_called() -> None:
    """A serial tool calling a sync tool through the kernel: that tool's thread, given up
    by its own timeout, is not the serial tool's. Before: counted as the serial tool's
    (a context variable reached the nested call), so its next call waited for it and,
    with a deadline, failed "still ran in its thread"."""
    release = threading.Event()

    @tool(timeout=0.05)
    def lookup(q: str) -> str:
        """A slow sync lookup (not serial)."""
        release.wait(10)
        return q

    @tool(serial=True)
    async def edit(q: str, ctx: CallContext) -> str:
        """A serial tool that consults `lookup` through the kernel."""
        if q == "consult":
            r = await ctx.kernel.call("lookup", {"q": q})
            assert r.error is not None and r.error.kind == "timeout"
        return "edited"

    try:
        async with Kernel(tools=[lookup, edit]) as k:
            first = await k.call("edit", {"q": "consult"})
            assert first.content == {"result": "edited"}
            second = await k.call("edit", {"q": "plain"}, timeout=0.5)
            assert second.error is None, second.error and second.error.message
    finally:
        release.set()


async def test_the_wait_for_a_serial_tools_turn_counts_against_the_calls_deadline() -> None:
    """Before: a call with timeout=0.2 waited for the lock as long as the running call
    took, then ran the tool: its deadline was not enforced."""
    release, entered = anyio.Event(), anyio.Event()
    runs: list[str] = []

    class Doc(ToolSet):
        serial = True

        @tool
        async def edit(self, who: str) -> str:
            """Edits the document."""
            runs.append(who)
            if who == "first":
                entered.set()
                await release.wait()
            return who

    async with Kernel(tools=[Doc()]) as k:
        results: dict[str, Any] = {}

        async def call(who: str, **kw: Any) -> None:
            results[who] = await k.call("edit", {"who": who}, **kw)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "first")
                await entered.wait()
                await call("second", timeout=0.2)
                release.set()
    second = results["second"]
    assert second.error is not None and second.error.kind == "timeout"
    assert second.error.details == {"reason": "deadline_before_attempt"}
    assert "waited for its turn at the serial tool" in second.error.message
    assert runs == ["first"]  # the second call never ran the tool
    assert results["first"].content == {"result": "first"}


async def test_a_serial_tools_attempt_lasts_its_run_and_its_wait_for_its_turn_apart() -> None:
    """api.md: `Attempt.duration_ms` is the tool's run; `wait_ms` the wait for its turn at
    a serial tool. Before: the wait was in `duration_ms` (a 50 ms serial tool called 8 at
    a time recorded a p50 of 206 ms in profiling, and adaptive timeouts grew with it)."""
    release, entered = anyio.Event(), anyio.Event()

    class Doc(ToolSet):
        serial = True

        @tool
        async def edit(self, who: str) -> str:
            """Edits the document."""
            if who == "first":
                entered.set()
                await release.wait()
            return who

    results: dict[str, Any] = {}
    async with Kernel(tools=[Doc()]) as k:

        async def call(who: str, **kw: Any) -> None:
            results[who] = await k.call("edit", {"who": who}, **kw)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "first")
                await entered.wait()
                tg.start_soon(call, "second")
                await call("late", timeout=0.05)  # gives up waiting: the tool never ran
                await anyio.sleep(0.3)
                release.set()
    (first,) = results["first"].meta.attempts
    (second,) = results["second"].meta.attempts
    (late,) = results["late"].meta.attempts
    assert first.duration_ms >= 300 and first.wait_ms < first.duration_ms
    # the second waited as long as the first ran, then ran at once
    assert second.wait_ms >= 300 and second.duration_ms < 300
    assert late.error_kind == "timeout" and late.duration_ms < late.wait_ms
    assert second.to_dict()["wait_ms"] == second.wait_ms


def test_module_loading_with_namespace_and_toolset_instances() -> None:
    from toolwire import examples

    names = sorted(t.name for t in tools_from_module("toolwire.examples"))
    assert names == [
        "add",
        "counter_get",
        "counter_increment",
        "echo",
        "now",
        "text_stats",
        "word_hash",
    ]
    ns = sorted(t.name for t in tools_from_module(examples, namespace="ex"))
    assert ns[0] == "ex_add"
    assert all(t.source == "toolwire.examples" for t in tools_from_module(examples))


def test_decorated_function_is_still_callable() -> None:
    import asyncio

    assert asyncio.run(add(1, 2)) == 3


def test_positional_only_parameters_are_rejected_when_the_tool_is_built() -> None:
    """Before: the tool registered, and every call failed (tools get keyword arguments)."""

    def f(a: int, /, b: int) -> int:
        return a + b

    with pytest.raises(TypeError, match="'a' is positional-only"):
        build_tool(f)
    with pytest.raises(TypeError, match="'a' is positional-only"):
        Kernel(tools=[tool(f)])


async def test_generator_tools_run_in_their_thread_under_the_timeout() -> None:
    """Before: a sync generator's body ran on the event loop while its result was normalized,
    outside the timeout; an async generator tool failed every call."""

    @tool
    def count(n: int) -> Iterator[int]:
        """Counts, slowly."""
        for i in range(n):
            time.sleep(0.1)
            yield i

    @tool
    async def acount(n: int) -> AsyncIterator[int]:
        """Counts."""
        for i in range(n):
            yield i

    @tool(timeout=0.2)
    def endless() -> Iterator[int]:
        """Takes a second: past its timeout. (Its thread cannot be killed, so it must end by
        itself, or the test process could not exit.)"""
        for _ in range(20):
            time.sleep(0.05)
            yield 1

    async with Kernel(tools=[count, acount, endless]) as k:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.01)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            r = await k.call("count", {"n": 5})
            tg.cancel_scope.cancel()
        assert r.content == {"result": [0, 1, 2, 3, 4]}
        assert ticks >= 20  # the loop kept running during the 0.5 s the generator took
        assert (await k.call("acount", {"n": 3})).content == {"result": [0, 1, 2]}
        slow = await k.call("endless", {})
        assert slow.error is not None and slow.error.kind == "timeout"


def test_field_descriptions_and_field_defaults_reach_the_schema_and_the_tool() -> None:
    """Before: Annotated[..., Field(description=...)] lost its description (the builder passed
    description=None over it), and `x: int = Field(3)` gave a schema without its default or
    `required`, and the tool received FieldInfo objects."""

    @tool
    def f(
        city: Annotated[str, Field(description="City name, e.g. Paris")],
        days: Annotated[int, Field(ge=1, le=7, description="Forecast length")] = 3,
        x: int = Field(3, description="how many"),
        y: str = Field(description="required y"),
        w: float = float("inf"),
    ) -> dict[str, Any]:
        """Weather.

        Args:
            city: from the docstring (the Field's own description wins)
            x: from the docstring too
        """
        return {"x": x, "y": y, "days": days, "w": w}

    t = build_tool(f)
    props = t.input_schema["properties"]
    assert props["city"]["description"] == "City name, e.g. Paris"
    assert props["days"] == {
        "default": 3,
        "description": "Forecast length",
        "maximum": 7,
        "minimum": 1,
        "type": "integer",
    }
    assert props["x"] == {"default": 3, "description": "how many", "type": "integer"}
    assert props["y"]["description"] == "required y"
    assert sorted(t.input_schema["required"]) == ["city", "y"]
    assert "default" not in props["w"]  # JSON has no infinity: SDKs refuse the request
    assert t.validator is not None
    assert t.validator({"city": "Oslo", "y": "Y"})["x"] == 3


async def test_abandoned_sync_calls_are_counted_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: each timed-out or cancelled call of a blocking sync tool left its thread
    running and freed its slot, so dropped calls piled up threads without bound."""
    import toolwire._tool as tool_mod

    for _ in range(1000):  # abandoned calls of earlier tests end by themselves (< 1 s)
        if not tool_mod._THREADS.alive:
            break
        await anyio.sleep(0.01)
    base = tool_mod._THREADS.alive
    assert base == 0, f"{base} sync tool threads of earlier tests are still running"
    monkeypatch.setattr(tool_mod, "MAX_TOOL_THREADS", 3)
    release = threading.Event()

    @tool
    def block() -> str:
        """Blocks until released."""
        release.wait(10)
        return "done"

    try:
        async with Kernel(tools=[block]) as k:
            for _ in range(3):
                r = await k.call("block", {}, timeout=0.05)
                assert r.error is not None and r.error.kind == "timeout"
            full = await k.call("block", {}, timeout=0.05)
            assert full.error is not None and full.error.kind == "unavailable"
            assert "3 sync tool calls are still running in threads" in full.error.message
            release.set()
            for _ in range(500):  # the released threads end
                if not tool_mod._THREADS.alive:
                    break
                await anyio.sleep(0.01)
            assert (await k.call("block", {})).content == {"result": "done"}
    finally:
        release.set()  # never leave a thread blocked (pytest would not exit)


async def test_sync_calls_waiting_for_a_worker_thread_do_not_count_against_the_cap() -> None:
    """Before: 150 concurrent calls of a quick sync tool gave 50 `unavailable`: calls
    queued for anyio's 40 worker threads counted as running."""

    @tool
    def nap() -> str:
        """Sleeps briefly."""
        time.sleep(0.02)
        return "ok"

    async with Kernel(tools=[nap]) as k:
        results: list[Any] = []

        async def one() -> None:
            results.append(await k.call("nap", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(150):
                tg.start_soon(one)
    assert [r.error for r in results if r.is_error] == []


def test_a_field_alias_is_refused_when_the_tool_is_built() -> None:
    def f(h: int = Field(5, alias="hh")) -> int:
        """Aliased."""
        return h

    with pytest.raises(TypeError, match="Field alias"):
        build_tool(f)


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"tags": "files"}, TypeError, r"tags=\['files'\]"),
        ({"tags": ["files", 1]}, TypeError, "every tag must be a non-empty str, got 1"),
        ({"tags": [""]}, TypeError, "non-empty str"),
        ({"tags": 3}, TypeError, "give a list of str, not int"),
        ({"timeout": -1}, ValueError, r"timeout=-1\): give the per-attempt limit in seconds"),
        ({"timeout": 0}, ValueError, "a number > 0"),
        ({"timeout": "5"}, ValueError, "a number > 0"),
        ({"timeout": True}, ValueError, "a number > 0"),
        ({"timeout": float("nan")}, ValueError, "a number > 0"),
        ({"read_only": "yes"}, TypeError, r"read_only='yes'\): give True, False or None"),
        ({"destructive": 1}, TypeError, "destructive=1"),
        ({"annotations": {"readOnlyHint": True}}, TypeError, "give a toolwire.ToolAnnotations"),
        ({"name": 3}, TypeError, r"@tool\(name=...\): give a str or None, not int"),
        ({"title": 3}, TypeError, r"@tool\(title=...\)"),
    ],
)
def test_bad_tool_options_are_refused_where_written(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    # Accepted, they broke later and elsewhere: tags="files" became five
    # one-letter tags, an int tag made every find_tools of the catalog raise,
    # read_only="yes" went to MCP clients as a non-boolean hint.
    with pytest.raises(error, match=says):
        tool(**options)


def test_good_tool_options_still_pass() -> None:
    @tool(tags=("files", "io"), timeout=2.5, read_only=True, destructive=False, title="T")
    def f(x: int) -> int:
        return x

    t = build_tool(f)
    assert t.tags == frozenset({"files", "io"})
    assert t.timeout_s == 2.5
    assert t.annotations.to_dict() == {"title": "T", "readOnlyHint": True, "destructiveHint": False}
