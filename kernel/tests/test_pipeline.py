"""Kernel.call: the call lifecycle of DESIGN §1, step by step."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolwire import (
    CallContext,
    CallRejected,
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


@tool
async def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool
def greet(name: str) -> str:
    """Greet."""
    return f"hi {name}"


def make_kernel(*tools: Any, plugins: tuple[object, ...] = (), **kw: Any) -> Kernel:
    kw.setdefault("clock", FakeClock())
    return Kernel(tools=tools or (add, greet), plugins=plugins, **kw)


# ------------------------------------------------------------ resolve/validate
async def test_success_result_and_meta() -> None:
    k = make_kernel()
    r = await k.call("add", {"a": 1, "b": 2}, call_id="c1")
    assert r.content == {"result": 3}
    assert not r.is_error and r.error is None
    assert r.meta.call_id == "c1" and r.meta.tool == "add" and r.meta.served_by == "add"
    assert len(r.meta.attempts) == 1 and r.meta.attempts[0].error_kind is None
    assert r.meta.duration_ms >= r.meta.attempts[0].duration_ms >= 0
    assert r.meta.started_at == 1_700_000_000.0


async def test_unknown_tool_is_not_found_with_close_names() -> None:
    r = await make_kernel().call("ad", {})
    assert r.is_error and r.error is not None
    assert r.error.kind == "not_found"
    assert "'add'" in r.error.message
    assert r.error.details["close_matches"] == ["add"]
    # for every caller: a model over MCP cannot run `toolwire tools`, a program has no shell
    n = len(make_kernel().list_tools())
    assert r.error.message == (
        f"unknown tool 'ad'; did you mean 'add'? (MCP tools/list, kernel.list_tools() and "
        f"`toolwire tools` list the tools there are: {n})"
    )


async def test_an_empty_catalog_says_so_and_how_to_fill_it() -> None:
    r = await Kernel().call("add", {})
    assert r.error is not None and r.error.kind == "not_found"
    assert "the catalog is empty" in r.error.message
    assert "[tools] modules" in r.error.message and "kernel.add_tool" in r.error.message


async def test_invalid_args_name_the_field_and_the_tool_never_runs() -> None:
    fake = FakeTool(
        "t",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    )
    k = make_kernel(add, fake.tool)
    r = await k.call("add", {"a": "x", "b": 2})
    assert r.error is not None and r.error.kind == "invalid_args"
    assert "field 'a'" in r.error.message and "integer" in r.error.message
    r = await k.call("add", {"a": 1})
    assert r.error is not None and "field 'b': field required" in r.error.message
    r = await k.call("add", {"a": 1, "b": 2, "c": 3})
    assert r.error is not None and "field 'c': unexpected argument" in r.error.message
    # JSON-schema-only tools are validated by the kernel's subset checker
    r = await k.call("t", {"n": "seven"})
    assert r.error is not None and r.error.kind == "invalid_args"
    assert "field 'n': expected integer" in r.error.message
    assert fake.calls == []


async def test_validated_args_are_coerced_and_passed_to_hooks() -> None:
    seen: list[dict[str, Any]] = []

    class P:
        name = "p"

        @hookimpl
        def before_call(self, call: ToolCall) -> None:
            seen.append(call.args)

    k = make_kernel(plugins=(P(),))
    r = await k.call("add", {"a": "1", "b": 2})
    assert r.content == {"result": 3}
    assert seen == [{"a": 1, "b": 2}]


# ------------------------------------------------------------------ before_call
async def test_before_call_short_circuit_skips_tool_and_later_hooks() -> None:
    fake = FakeTool("t")
    log: list[tuple[str, str, str]] = []

    class Replay:
        name = "replay"
        order = 10

        @hookimpl
        async def before_call(self, call: ToolCall) -> ToolResult:
            r = ToolResult.ok({"cached": True})
            r.meta.replayed = True
            return r

    k = make_kernel(fake.tool, plugins=(Replay(), RecordingPlugin("later", 20, log)))
    r = await k.call("t", {}, call_id="x")
    assert r.content == {"cached": True} and r.meta.replayed
    assert r.meta.call_id == "x" and r.meta.tool == "t"
    assert fake.calls == []
    assert log == [("later", "after_call", "t")]  # after_call still runs for everyone


async def test_call_rejected_ends_with_that_kind() -> None:
    fake = FakeTool("t")

    class Deny:
        name = "approval"

        @hookimpl
        def before_call(self) -> None:
            raise CallRejected("denied", "a human said no", details={"rule": "send_*"})

    r = await make_kernel(fake.tool, plugins=(Deny(),)).call("t", {})
    assert r.error is not None
    assert (r.error.kind, r.error.message, r.error.source) == (
        "denied",
        "a human said no",
        "approval",
    )
    assert r.error.details == {"rule": "send_*"}
    assert fake.calls == []


async def test_plugin_raising_in_before_call_is_internal_naming_it_and_tool_not_run() -> None:
    fake = FakeTool("t")

    class Broken:
        name = "broken"

        @hookimpl
        def before_call(self) -> None:
            raise RuntimeError("db down")

    r = await make_kernel(fake.tool, plugins=(Broken(),)).call("t", {})
    assert r.error is not None and r.error.kind == "internal"
    assert "plugin 'broken'" in r.error.message and "db down" in r.error.message
    assert "was not run" in r.error.message
    assert r.meta.plugin_errors[0]["plugin"] == "broken"
    assert fake.calls == []


async def test_before_call_returning_garbage_is_internal() -> None:
    class Odd:
        name = "odd"

        @hookimpl
        def before_call(self) -> str:
            return "yes"

    r = await make_kernel(plugins=(Odd(),)).call("add", {"a": 1, "b": 1})
    assert r.error is not None and r.error.kind == "internal" and "'odd'" in r.error.message


# ------------------------------------------------------------------- after_call
async def test_after_call_runs_once_in_reverse_order_and_may_replace() -> None:
    log: list[tuple[str, str, str]] = []

    class Replace:
        name = "replace"
        order = 50

        @hookimpl
        def after_call(self, result: ToolResult) -> ToolResult:
            log.append(("replace", "after_call", "-"))
            return ToolResult.ok({"wrapped": result.content})

    plugins = (RecordingPlugin("b", 200, log), Replace(), RecordingPlugin("a", 100, log))
    r = await make_kernel(plugins=plugins).call("add", {"a": 1, "b": 1})
    assert [x[0] for x in log if x[1] == "before_call"] == ["a", "b"]
    assert [x[0] for x in log if x[1] == "after_call"] == ["b", "a", "replace"]
    assert r.content == {"wrapped": {"result": 2}}
    assert r.meta.tool == "add"  # the replacement keeps the call's identity


async def test_after_call_exception_is_logged_and_result_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        name = "broken"

        @hookimpl
        async def after_call(self) -> None:
            raise ValueError("disk full")

    with caplog.at_level(logging.ERROR, logger="toolwire"):
        r = await make_kernel(plugins=(Broken(),)).call("add", {"a": 2, "b": 3})
    assert r.content == {"result": 5} and not r.is_error
    assert r.meta.plugin_errors == [
        {"plugin": "broken", "hook": "after_call", "error": "ValueError: disk full"}
    ]
    assert "plugin 'broken': after_call failed" in caplog.text


# ------------------------------------------------------------------ attempts
class Decider:
    """on_error plugin returning scripted decisions."""

    name = "decider"

    def __init__(self, *decisions: Any) -> None:
        self.decisions = list(decisions)
        self.errors: list[ErrorInfo] = []

    @hookimpl
    def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Any:
        self.errors.append(error)
        return self.decisions.pop(0) if self.decisions else None


async def test_failure_without_decision_is_terminal_tool_error() -> None:
    fake = FakeTool("t", script=[RuntimeError("boom")])
    r = await make_kernel(fake.tool).call("t", {})
    assert r.error is not None
    assert r.error.kind == "tool_error" and r.error.message == "RuntimeError: boom"
    assert r.error.retryable is False
    assert isinstance(r.error.exception, RuntimeError)
    assert r.content == {"error": {"kind": "tool_error", "message": "RuntimeError: boom"}}
    assert len(fake.calls) == 1


async def test_tool_error_kind_and_details_are_kept() -> None:
    fake = FakeTool(
        "t", script=[ToolError("slow down", kind="rate_limit", retry_after_s=2, status=429)]
    )
    r = await make_kernel(fake.tool).call("t", {})
    assert r.error is not None
    assert (r.error.kind, r.error.retry_after_s, r.error.details) == (
        "rate_limit",
        2,
        {"status": 429},
    )


async def test_retry_then_success_records_attempts_and_sleeps_on_the_clock() -> None:
    clock = FakeClock()
    fake = FakeTool(
        "t",
        script=[
            ToolError("busy", kind="unavailable"),
            ToolError("busy", kind="unavailable"),
            {"ok": 1},
        ],
    )
    d = Decider(Retry(after_s=0.5), Retry(after_s=1.0))
    r = await make_kernel(fake.tool, plugins=(d,), clock=clock).call("t", {"x": 1})
    assert r.content == {"ok": 1}
    assert [a.error_kind for a in r.meta.attempts] == ["unavailable", "unavailable", None]
    assert [a.decision for a in r.meta.attempts] == ["retry", "retry", None]
    assert clock.sleeps == [0.5, 1.0]
    assert fake.calls == [{"x": 1}] * 3


async def test_retry_with_new_args_revalidates() -> None:
    fake = FakeTool(
        "t",
        script=[ToolError("too big"), lambda a: a],
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    r = await make_kernel(fake.tool, plugins=(Decider(Retry(args={"n": 1})),)).call("t", {"n": 100})
    assert r.content == {"n": 1}
    r = await make_kernel(
        FakeTool("t", script=[ToolError("x")], input_schema=fake.input_schema).tool,
        plugins=(Decider(Retry(args={"n": "bad"})),),
    ).call("t", {"n": 1})
    # The caller's arguments were valid: the call ends with the failure that led to the
    # retry, not an invalid_args blamed on the caller, and says why it went no further.
    assert r.error is not None and r.error.kind == "tool_error" and r.error.message == "x"
    assert "schema rejects the arguments it gave" in r.error.details["gave_up"]
    assert r.error.details["rejected_args"][0]["field"] == "n"


async def test_a_fallback_whose_schema_rejects_the_arguments_keeps_the_real_error() -> None:
    primary = FakeTool("primary", script=[ToolError("slow down", kind="rate_limit")])
    other = FakeTool(
        "other",
        script=[{"never": "runs"}],
        input_schema={
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
            "additionalProperties": False,
        },
    )
    k = make_kernel(primary.tool, other.tool, plugins=(Decider(Fallback("other")),))
    r = await k.call("primary", {"query": "x"})
    assert r.error is not None and r.error.kind == "rate_limit", r.error
    assert (
        "chose fallback to 'other', whose schema rejects the call's arguments"
        in (r.error.details["gave_up"])
    )
    assert other.calls == []


class Watcher:
    """Collects the results ``after_call`` sees."""

    name, order = "watcher", 900

    def __init__(self, seen: list[ToolResult]) -> None:
        self.seen = seen

    @hookimpl
    def after_call(self, call: ToolCall, result: ToolResult) -> None:
        self.seen.append(result)


@pytest.mark.parametrize(
    "decision",
    [
        Retry(after_s="1s"),  # type: ignore[arg-type]
        Retry(after_s=float("nan")),
        Retry(after_s=float("inf")),  # before: slept forever
        Retry(args=["x"]),  # type: ignore[arg-type]
        Fallback(tool=3),  # type: ignore[arg-type]
        "retry please",
        Recover({1, object()}),
    ],
    ids=[
        "after_s-str",
        "after_s-nan",
        "after_s-inf",
        "args-list",
        "tool-int",
        "not-a-decision",
        "recover-not-json",
    ],
)
async def test_a_malformed_decision_leaves_the_tools_error_and_after_call_still_runs(
    decision: Any,
) -> None:
    """Before: Retry(after_s="1s") made kernel.call raise ValueError, and after_call never ran
    (an idempotency claim stayed held for the life of the process); then it became an
    `internal` error, which hid why the tool had failed."""
    seen: list[ToolResult] = []
    fake = FakeTool("t", script=[ToolError("x", kind="unavailable")])
    r = await make_kernel(fake.tool, plugins=(Decider(decision), Watcher(seen))).call("t", {})
    assert r.error is not None and r.error.kind == "unavailable", r.error
    assert r.error.message == "x"
    assert r.error.details["gave_up"].startswith("plugin 'decider': on_error returned ")
    assert [e["plugin"] for e in r.meta.plugin_errors] == ["decider"]
    assert r.meta.plugin_errors[0]["hook"] == "on_error"
    assert seen == [r]


async def test_an_exception_escaping_the_pipeline_is_an_internal_error_with_hooks_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[ToolResult] = []
    fake = FakeTool("t", script=[ToolError("x")])
    k = make_kernel(fake.tool, plugins=(Decider(Retry(0)), Watcher(seen)))

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(k, "_after_failure", broken)
    r = await k.call("t", {})
    assert r.error is not None and r.error.kind == "internal"
    assert "failed inside toolwire: RuntimeError: kaboom" in r.error.message
    assert seen == [r]


async def test_fallback_runs_other_tool_and_on_error_sees_it() -> None:
    primary = FakeTool("primary", script=[ToolError("down", kind="unavailable")])
    backup = FakeTool("backup", script=[{"from": "backup"}])
    d = Decider(Fallback("backup"))
    r = await make_kernel(primary.tool, backup.tool, plugins=(d,)).call("primary", {"q": 1})
    assert r.content == {"from": "backup"}
    assert r.meta.served_by == "backup" and r.meta.tool == "primary"
    assert [(a.tool, a.error_kind, a.decision) for a in r.meta.attempts] == [
        ("primary", "unavailable", "fallback"),
        ("backup", None, None),
    ]
    assert backup.calls == [{"q": 1}]


async def test_fallback_to_unknown_tool_gives_up_with_the_error() -> None:
    fake = FakeTool("t", script=[ToolError("down", kind="unavailable")])
    r = await make_kernel(fake.tool, plugins=(Decider(Fallback("nope")),)).call("t", {})
    assert r.error is not None and r.error.kind == "unavailable"
    assert "'nope'" in r.error.details["gave_up"]


async def test_recover_ends_successfully() -> None:
    fake = FakeTool("t", script=[ToolError("x")])
    r = await make_kernel(fake.tool, plugins=(Decider(Recover([1, 2])),)).call("t", {})
    assert r.content == {"result": [1, 2]} and not r.is_error
    assert r.meta.served_by == "recovered:decider"


async def test_max_attempts_guard_overrides_plugins() -> None:
    fake = FakeTool("t", script=[ToolError("x", kind="unavailable")])
    d = Decider(*[Retry(0)] * 20)
    r = await make_kernel(fake.tool, plugins=(d,), max_attempts=3).call("t", {})
    assert r.error is not None and r.error.details["gave_up"] == "max_attempts (3) reached"
    assert len(fake.calls) == 3 and len(r.meta.attempts) == 3


async def test_default_max_attempts_is_five() -> None:
    fake = FakeTool("t", script=[ToolError("x")])
    await make_kernel(fake.tool, plugins=(Decider(*[Retry(0)] * 20),)).call("t", {})
    assert len(fake.calls) == 5


async def test_deadline_guard_stops_a_retry_that_would_pass_it() -> None:
    fake = FakeTool("t", script=[ToolError("x")])
    clock = FakeClock()
    r = await make_kernel(fake.tool, plugins=(Decider(Retry(0.5), Retry(5)),), clock=clock).call(
        "t", {}, timeout=2
    )
    assert r.error is not None and r.error.details["gave_up"].startswith("deadline")
    assert clock.sleeps == [0.5]
    assert len(fake.calls) == 2


async def test_a_fallback_after_the_deadline_passed_never_starts_the_other_tool() -> None:
    """A fallback has no back-off for the deadline guard to refuse: the attempt itself must
    not start once the call's deadline has passed."""
    clock = FakeClock()

    def slow_failure(args: dict[str, Any]) -> Any:
        clock.advance(3)  # the first attempt used up the whole 2 s deadline, and more
        raise ToolError("down", kind="unavailable")

    primary = FakeTool("primary", script=[slow_failure])
    backup = FakeTool("backup", script=[{"from": "backup"}])
    r = await make_kernel(
        primary.tool, backup.tool, plugins=(Decider(Fallback("backup")),), clock=clock
    ).call("primary", {}, timeout=2)
    assert backup.calls == []
    assert r.error is not None and r.error.kind == "timeout"
    assert "deadline passed before the attempt started" in r.error.message
    assert "call again with a longer timeout" in r.error.message
    # a mark plugins can read without parsing the message (idempotency: nothing ran)
    assert r.error.details["reason"] == "deadline_before_attempt"
    assert [(a.tool, a.error_kind) for a in r.meta.attempts] == [
        ("primary", "unavailable"),
        ("backup", "timeout"),
    ]


async def test_per_tool_timeout_gives_timeout_kind() -> None:
    fake = FakeTool("t", delay=5, timeout_s=0.05)
    with anyio.fail_after(3):
        r = await Kernel(tools=[fake.tool]).call("t", {})
    assert r.error is not None and r.error.kind == "timeout"
    # before: "tool 't' timed out: " (an exception is truthy, its text was empty)
    assert r.error.message.startswith("tool 't' timed out: no answer within 0.05s (")
    assert "timeout_s" in r.error.message


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_caller_cancelling_as_the_attempt_times_out_gets_its_cancellation() -> None:
    """The attempt timeout and the caller's own scope both fire while the tool is in a
    shielded section: the section finishes, then the cancellation is the caller's
    (the call raises it, and the caller's scope catches it), not a `timeout` result."""
    finished: list[bool] = []

    async def stubborn() -> dict[str, bool]:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.3)  # both the 0.05 s timer and the caller's 0.1 s fire
            finished.append(True)
        await anyio.sleep(5)
        return {"late": True}

    results: list[ToolResult] = []
    kernel = Kernel(default_timeout_s=0.05)
    kernel.add_tool(stubborn)
    with anyio.fail_after(3), anyio.move_on_after(0.1) as caller:
        results.append(await kernel.call("stubborn", {}))
    assert caller.cancelled_caught and results == [] and finished == [True]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_tools_own_timeout_error_keeps_its_message() -> None:
    """A TimeoutError the tool raises itself is its own (kind `timeout`, its text), not
    the kernel's 'no answer within' for an attempt that was never timed out."""

    async def own() -> None:
        raise TimeoutError("the upstream took too long")

    kernel = Kernel(default_timeout_s=5)
    kernel.add_tool(own)
    r = await kernel.call("own", {})
    assert r.error is not None and r.error.kind == "timeout"
    assert r.error.message == "tool 'own' timed out: the upstream took too long"


async def test_kernel_default_timeout_and_overall_deadline_apply_to_attempts() -> None:
    fake = FakeTool("t", delay=5)
    with anyio.fail_after(3):
        r = await Kernel(tools=[fake.tool], default_timeout_s=0.05).call("t", {})
        assert r.error is not None and r.error.kind == "timeout"
        r = await Kernel(tools=[fake.tool]).call("t", {}, timeout=0.05)
        assert r.error is not None and r.error.kind == "timeout"


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_tools_shielded_section_finishes_when_its_attempt_times_out() -> None:
    """anyio's semantics under the attempt timeout, on every backend. Before, on asyncio
    the kernel's timeout (asyncio.timeout, a task.cancel()) went through a tool's
    CancelScope(shield=True) and cut its bookkeeping half-way."""
    steps: list[str] = []

    @tool(timeout=0.05)
    async def careful() -> dict[str, str]:
        """Bookkeeping that must finish."""
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.2)
            steps.append("committed")
        await anyio.sleep(5)  # the attempt's cancellation lands here
        steps.append("late")
        return {"ok": "yes"}

    with anyio.fail_after(3):
        r = await Kernel(tools=[careful]).call("careful", {})
    assert steps == ["committed"]
    assert r.error is not None and r.error.kind == "timeout"
    assert r.error.message.startswith("tool 'careful' timed out: no answer within 0.05s")

    @tool(timeout=0.05)
    async def finishes() -> dict[str, str]:
        """A shielded answer, returned as soon as it is ready."""
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.2)
            return {"ok": "kept"}

    with anyio.fail_after(3):
        r = await Kernel(tools=[finishes]).call("finishes", {})
    assert r.content == {"ok": "kept"}  # a result computed in a shield is not thrown away


async def test_non_json_return_is_a_clear_tool_error() -> None:
    @tool
    def bad() -> object:
        """Returns junk."""
        return object()

    r = await Kernel(tools=[bad]).call("bad")
    assert r.error is not None and r.error.kind == "tool_error"
    assert "not JSON-serializable" in r.error.message and "return a dict" in r.error.message


async def test_non_json_return_says_what_inside_it_is_wrong() -> None:
    """Before: a pydantic model holding non-UTF-8 bytes, or a list nested past the
    encoder's limit, was 'a M / a list, which is not JSON-serializable; return ... a
    pydantic model' - nothing said what inside it could not be encoded."""
    import pydantic

    class Blob(pydantic.BaseModel):
        data: bytes

    deep: Any = 1
    for _ in range(5000):
        deep = [deep]

    @tool
    def blob() -> Any:
        """Returns a model holding bytes that are not UTF-8."""
        return Blob(data=b"\xff\xfe")

    @tool
    def nested() -> Any:
        """Returns a list nested 5000 deep."""
        return deep

    k = Kernel(tools=[blob, nested])
    r = await k.call("blob")
    assert r.error is not None and r.error.kind == "tool_error"
    assert "utf-8" in r.error.message.lower()
    r = await k.call("nested")
    assert r.error is not None and "depth exceeded" in r.error.message


async def test_on_error_classifier_mutates_error_before_the_decider() -> None:
    class Classify:
        name = "classify"
        order = 400

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            error.kind = "rate_limit"
            error.retryable = True

    fake = FakeTool("t", script=[RuntimeError("429")])
    d = Decider()
    d.order = 500  # type: ignore[attr-defined]
    r = await make_kernel(fake.tool, plugins=(d, Classify())).call("t", {})
    assert d.errors[0].kind == "rate_limit"
    assert r.error is not None and r.error.kind == "rate_limit" and r.error.retryable
    assert r.meta.attempts[0].error_kind == "rate_limit"  # as classified by on_error


async def test_on_error_exception_is_recorded_and_skipped() -> None:
    class Broken:
        name = "broken"
        order = 1

        @hookimpl
        def on_error(self) -> None:
            raise KeyError("k")

    fake = FakeTool("t", script=[ToolError("x"), {"ok": True}])
    r = await make_kernel(fake.tool, plugins=(Broken(), Decider(Retry(0)))).call("t", {})
    assert r.content == {"ok": True}
    assert r.meta.plugin_errors[0]["plugin"] == "broken"


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_on_error_hooks_are_cut_off_at_the_calls_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hooks.md: with a deadline, the on_error hooks run within it; one still awaiting at
    the deadline is cancelled and the error stands, `details["gave_up"]` naming the
    deadline. Before: a call with timeout=0.2 and a 1 s on_error hook took 1 s."""
    done: list[str] = []

    class Classify:
        name = "classify"
        order = 400

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            error.kind = "unavailable"  # a hook that does not await runs to its end
            done.append("classify")

    class Slow:
        name = "slow"
        order = 500

        @hookimpl
        async def on_error(self) -> Retry:
            await anyio.sleep(30)
            done.append("slow")
            return Retry(0)

    fake = FakeTool("t", script=[ToolError("x")])
    k = Kernel(tools=[fake.tool], plugins=[Slow(), Classify()])
    with anyio.fail_after(10), caplog.at_level(logging.WARNING, logger="toolwire"):
        r = await k.call("t", {}, timeout=0.2)
    assert done == ["classify"] and len(fake.calls) == 1
    assert r.error is not None and r.error.kind == "unavailable"
    assert r.error.details["gave_up"] == (
        "deadline: the call's deadline passed during the on_error hook of plugin 'slow', "
        "which was cancelled; no decision was made"
    )
    assert r.meta.attempts[0].decision is None
    assert "on_error" in caplog.text and "'slow'" in caplog.text


# ------------------------------------------------------- results plugins make
class _Odd:
    """Not JSON: no encoder knows it."""


async def test_a_plugins_result_is_normalized_or_refused_never_left_unserializable() -> None:
    """Before: ``ToolResult(content=...)`` from a plugin went out as it was: an MCP client
    then got a bare "Error calling tool" and the tool's real result was lost."""
    import dataclasses
    import datetime

    @dataclasses.dataclass
    class Note:
        at: datetime.date

    class Annotate:  # a good replacement of another shape: normalized like a tool's return
        name, order = "annotate", 300

        @hookimpl
        def after_call(self, result: ToolResult) -> ToolResult:
            return ToolResult(Note(datetime.date(2026, 1, 2)), meta=result.meta)  # type: ignore[arg-type]

    class Breaks:  # a replacement no transport can send: ignored, the result stands
        name, order = "breaks", 200

        @hookimpl
        def after_call(self, result: ToolResult) -> ToolResult:
            return ToolResult({"wrapped": result.content, "odd": _Odd()}, meta=result.meta)

    r = await make_kernel(FakeTool("t").tool, plugins=(Annotate(),)).call("t", {})
    assert r.content == {"at": "2026-01-02"} and not r.is_error
    r = await make_kernel(FakeTool("t").tool, plugins=(Breaks(),)).call("t", {})
    assert r.content == {"ok": True} and not r.is_error
    (problem,) = r.meta.plugin_errors
    assert problem["plugin"] == "breaks" and problem["hook"] == "after_call"
    assert "content is not JSON-serializable" in problem["error"]
    assert problem["error"].endswith("(ignored)")
    r = await make_kernel(FakeTool("t").tool, plugins=(Annotate(), Breaks())).call("t", {})
    assert r.content == {"at": "2026-01-02"}  # Breaks (inner) ignored, Annotate applied

    class Short:
        name = "short"

        @hookimpl
        def before_call(self) -> ToolResult:
            return ToolResult({"odd": _Odd()})

    fake = FakeTool("t")
    r = await make_kernel(fake.tool, plugins=(Short(),)).call("t", {})
    assert r.error is not None and r.error.kind == "internal" and r.error.source == "short"
    assert "before_call returned a ToolResult whose content is not JSON" in r.error.message
    assert "the tool 't' was not run" in r.error.message and fake.calls == []


# ----------------------------------------------------------------- cancellation
async def test_cancellation_propagates_and_after_call_sees_cancelled() -> None:
    seen: list[ToolResult] = []

    class Watch:
        name = "watch"

        @hookimpl
        async def after_call(self, result: ToolResult) -> None:
            await (
                anyio.lowlevel.checkpoint()
            )  # must work although the scope is cancelled (shielded)
            seen.append(result)

    fake = FakeTool("t", delay=10)
    k = make_kernel(fake.tool, plugins=(Watch(),))
    returned: list[ToolResult] = []
    with anyio.move_on_after(0.05) as scope:
        returned.append(await k.call("t", {}))
    assert scope.cancelled_caught
    assert returned == []
    assert len(seen) == 1 and seen[0].error is not None and seen[0].error.kind == "cancelled"


async def test_a_cancellation_during_after_call_runs_each_hook_once() -> None:
    """Before: hooks that had already run with the real result ran again with a cancelled
    one (a plugin releasing a claim released it twice)."""
    log: list[tuple[str, str]] = []

    class Slow:
        name, order = "slow", 100  # after_call runs in reverse order: last

        @hookimpl
        async def after_call(self, result: ToolResult) -> None:
            log.append(("slow", "ok" if not result.is_error else result.error.kind))  # type: ignore[union-attr]
            await anyio.sleep(10)

    class Quick:
        name, order = "quick", 200

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            log.append(("quick", "ok" if not result.is_error else result.error.kind))  # type: ignore[union-attr]

    class Late:
        name, order = "late", 50  # after slow: never started when the cancel comes

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            log.append(("late", "ok" if not result.is_error else result.error.kind))  # type: ignore[union-attr]

    k = make_kernel(FakeTool("t").tool, plugins=(Slow(), Quick(), Late()))
    with anyio.move_on_after(0.2):
        await k.call("t", {})
    # "late" gets the tool's result, not 'cancelled': the tool ran, and a plugin that keeps
    # results (idempotency) must keep this one, or a replay would run the tool again
    assert log == [("quick", "ok"), ("slow", "ok"), ("late", "ok")]


async def test_a_cancellation_during_after_call_hands_on_the_latest_replacement() -> None:
    """The hooks not yet started get the result the interrupted hook was given: a
    replacement made by an earlier hook stands; none of them sees 'cancelled'."""
    seen: list[Any] = []

    class Replace:
        name, order = "replace", 300

        @hookimpl
        def after_call(self, result: ToolResult) -> ToolResult:
            return ToolResult.ok({"replaced": result.content})

    class Slow:
        name, order = "slow", 200

        @hookimpl
        async def after_call(self, result: ToolResult) -> None:
            seen.append(("slow", result.content))
            await anyio.sleep(10)

    class Late:
        name, order = "late", 100

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            seen.append(("late", result.content, result.meta.call_id))

    k = make_kernel(FakeTool("t").tool, plugins=(Replace(), Slow(), Late()))
    with anyio.move_on_after(0.2) as scope:
        await k.call("t", {}, call_id="c")
    assert scope.cancelled_caught
    replaced = {"replaced": {"ok": True}}
    assert seen == [("slow", replaced), ("late", replaced, "c")]


# ------------------------------------------------------------------ ordering
async def test_ordering_by_order_then_name_regardless_of_install_order() -> None:
    log: list[tuple[str, str, str]] = []
    a = RecordingPlugin("alpha", 300, log)
    b = RecordingPlugin("beta", 100, log)
    c = RecordingPlugin("gamma", 300, log)
    for plugins in [(a, b, c), (c, b, a)]:
        log.clear()
        fake = FakeTool("t", script=[ToolError("x")])
        await make_kernel(fake.tool, plugins=plugins).call("t", {})
        assert [x[0] for x in log if x[1] == "before_call"] == ["beta", "alpha", "gamma"]
        assert [x[0] for x in log if x[1] == "on_error"] == ["beta", "alpha", "gamma"]
        assert [x[0] for x in log if x[1] == "after_call"] == ["gamma", "alpha", "beta"]


async def test_wrappers_and_unknown_hooks_are_rejected() -> None:
    class Wrapper:
        name = "w"

        @hookimpl(wrapper=True)
        def before_call(self) -> Any:
            return (yield)

    with pytest.raises(PluginError, match="wrapper"):
        Kernel(plugins=[Wrapper()])

    class Typo:
        name = "typo"

        @hookimpl
        def befor_call(self) -> None: ...

    with pytest.raises(PluginError, match="typo"):
        Kernel(plugins=[Typo()])

    with pytest.raises(PluginError, match="already registered; register this one under"):
        Kernel(plugins=[RecordingPlugin("x"), RecordingPlugin("x")])


# --------------------------------------------------------------------- events
async def test_events_for_embedders() -> None:
    fake = FakeTool("t", script=[ToolError("x", kind="unavailable"), {"ok": 1}])
    k = make_kernel(fake.tool, FakeTool("u").tool, plugins=(Decider(Retry(0.1)),))
    got: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = k.events.subscribe(lambda e: got.append((e.kind, e.data)))
    async_got: list[str] = []

    async def on_finished(e: Any) -> None:
        async_got.append(e.call.name)

    k.events.subscribe(on_finished, kinds=["call_finished"])
    await k.call("t", {})
    assert [g[0] for g in got] == ["call_started", "attempt_failed", "retry", "call_finished"]
    assert got[1][1]["error"]["kind"] == "unavailable"
    assert (got[1][1]["decision"], got[1][1]["decided_by"]) == ("retry", "decider")
    assert got[2][1] == {"after_s": 0.1, "decided_by": "decider", "attempt": 1}
    assert got[3][1]["result"]["content"] == {"ok": 1}
    assert async_got == ["t"]
    unsubscribe()
    got.clear()
    await k.call("u", {})
    assert got == []


async def test_failing_event_subscriber_does_not_affect_the_call() -> None:
    k = make_kernel()

    def boom(e: Any) -> None:
        raise RuntimeError("subscriber bug")

    k.events.subscribe(boom)
    r = await k.call("add", {"a": 1, "b": 1})
    assert r.content == {"result": 2}


# -------------------------------------------------------------- lifecycle/trio
async def test_startup_and_shutdown_hooks_and_failing_startup_names_plugin() -> None:
    calls: list[str] = []

    class Life:
        name = "life"

        @hookimpl
        async def startup(self, kernel: Kernel) -> None:
            calls.append("up")

        @hookimpl
        def shutdown(self) -> None:
            calls.append("down")

    async with make_kernel(plugins=(Life(),)) as k:
        await k.call("add", {"a": 1, "b": 1})
    assert calls == ["up", "down"]

    class Bad:
        name = "bad"
        order = 2000

        @hookimpl
        def startup(self) -> None:
            raise OSError("port in use")

    calls.clear()
    with pytest.raises(PluginError, match="plugin 'bad': startup failed: OSError: port in use"):
        await make_kernel(plugins=(Life(), Bad())).start()
    assert calls == ["up", "down"]  # what started was shut down again


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_works_on_trio_too(anyio_backend: str) -> None:
    fake = FakeTool("t", delay=5, timeout_s=0.05)
    k = Kernel(tools=[add, greet, fake.tool])
    assert (await k.call("add", {"a": 1, "b": 2})).content == {"result": 3}
    assert (await k.call("greet", {"name": "x"})).content == {"result": "hi x"}
    r = await k.call("t", {})
    assert r.error is not None and r.error.kind == "timeout"


async def test_registration_never_runs_plugin_properties() -> None:
    class WithProperty:
        name = "prop"

        @property
        def kernel(self) -> Kernel:
            raise RuntimeError("not started yet")

        @hookimpl
        def before_call(self) -> None:
            return None

    k = Kernel(plugins=[WithProperty()])
    assert k.plugins.plugins["prop"].hooks() == ["before_call"]


async def test_plugin_chosen_attempt_timeout_wins_over_the_tools() -> None:
    class Adaptive:
        name = "adaptive"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.attempt_timeout_s = 0.05

    fake = FakeTool("t", delay=5, timeout_s=30)
    with anyio.fail_after(3):
        r = await Kernel(tools=[fake.tool], plugins=[Adaptive()]).call("t", {})
    assert r.error is not None and r.error.kind == "timeout"


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_spawned_background_tasks_stop_when_the_kernel_closes(anyio_backend: str) -> None:
    ticks: list[int] = []
    stopped = anyio.Event()

    async def loop(step: int) -> None:
        try:
            while True:
                ticks.append(step)
                await anyio.sleep(0.01)
        finally:
            stopped.set()

    async def boom() -> None:
        raise RuntimeError("background bug")

    class Spawner:
        name = "spawner"

        @hookimpl
        def startup(self, kernel: Kernel) -> None:
            kernel.spawn(loop, 1, name="ticker")
            kernel.spawn(boom)

    k = Kernel(plugins=[Spawner()])
    await k.start()
    await anyio.sleep(0.05)
    assert ticks
    await k.close()
    assert stopped.is_set()
    n = len(ticks)
    await anyio.sleep(0.03)
    assert len(ticks) == n
    assert k.get_plugin("spawner").name == "spawner"
    with pytest.raises(KeyError, match="loaded plugins"):
        k.get_plugin("nope")


async def test_transport_extensions_reach_hooks_and_tools() -> None:
    seen: list[object] = []

    @tool
    async def ask(ctx: CallContext) -> str:
        """Ask the user through the transport."""
        return str(await ctx.extensions["test.ask"]("sure?"))

    class Peek:
        name = "peek"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            seen.append(ctx.extensions.get("test.ask"))

    async def answer(q: str) -> str:
        return f"yes to {q}"

    k = Kernel(tools=[ask], plugins=[Peek()])
    r = await k.call("ask", {}, extensions={"test.ask": answer})
    assert r.content == {"result": "yes to sure?"}
    assert seen == [answer]
    r = await k.call("ask", {})
    assert r.error is not None and "KeyError" in r.error.message


async def test_check_result_turns_a_result_into_a_failure_or_keeps_it() -> None:
    """``ctx.check_result``: a plugin rejects a result (on_error sees it); a crash keeps it."""
    seen: list[str] = []

    class Picky:
        name = "picky"

        def reject_empty(self, tool: Tool, content: dict[str, Any]) -> ToolError | None:
            return ToolError(f"{tool.name}: empty", kind="unavailable") if not content else None

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.check_result = self.reject_empty

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            seen.append(str(error.kind))

    empty = FakeTool("empty", script=[{}])
    async with Kernel(tools=[empty.tool], plugins=[Picky()]) as k:
        r = await k.call("empty", {})
    assert (
        r.error is not None and r.error.kind == "unavailable" and "empty: empty" in r.error.message
    )
    assert seen == ["unavailable"] and [a.error_kind for a in r.meta.attempts] == ["unavailable"]

    class Broken:
        name = "broken"

        def crash(self, tool: Tool, content: dict[str, Any]) -> ToolError | None:
            raise RuntimeError("bug in the check")

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.check_result = self.crash

    ok = FakeTool("ok", script=[{"v": 1}])
    async with Kernel(tools=[ok.tool], plugins=[Broken()]) as k:
        r = await k.call("ok", {})
    assert not r.is_error and r.content == {"v": 1}  # a computed result is never dropped
    assert r.meta.plugin_errors[0]["plugin"] == "broken"
    assert r.meta.plugin_errors[0]["hook"] == "check_result"

    class Inline:
        name = "inline"

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            ctx.check_result = lambda tool, content: 1 / 0  # not a bound method

    async with Kernel(tools=[ok.tool], plugins=[Inline()]) as k:
        r = await k.call("ok", {})
    assert r.content == {"v": 1}
    assert r.meta.plugin_errors[0]["plugin"] == "inline"  # before: the lambda's repr

    class Swapper:  # sets nothing in before_call, swaps in its own check in on_error
        name = "swapper"

        def crash(self, tool: Tool, content: dict[str, Any]) -> ToolError | None:
            raise RuntimeError("bug in the swapped check")

        @hookimpl
        def on_error(self, ctx: CallContext) -> Retry:
            ctx.check_result = self.crash
            return Retry(after_s=0)

    flaky = FakeTool("flaky", script=[ToolError("busy", kind="unavailable"), {"v": 2}])
    async with Kernel(tools=[flaky.tool], plugins=[Inline(), Swapper()]) as k:
        r = await k.call("flaky", {})
    assert r.content == {"v": 2}
    assert r.meta.plugin_errors[-1]["plugin"] == "swapper"  # its own method, its own name


async def test_a_progress_handler_may_be_sync_and_one_that_fails_never_fails_the_tool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a sync handler, or one raising, made the tool fail and its work was lost."""
    ran: list[int] = []

    @tool
    async def work(ctx: CallContext) -> dict[str, Any]:
        """Reports progress twice."""
        await ctx.report_progress(1, 2, "half")
        await ctx.report_progress(2, 2)
        ran.append(1)
        return {"done": True}

    seen: list[tuple[float, float | None, str | None]] = []
    async with Kernel(tools=[work]) as k:
        r = await k.call("work", {}, progress=lambda p, t, m: seen.append((p, t, m)))
        assert r.content == {"done": True} and seen == [(1, 2, "half"), (2, 2, None)]

        calls = 0

        async def broken(p: float, t: float | None, m: str | None) -> None:
            nonlocal calls
            calls += 1
            raise RuntimeError("UI gone")

        with caplog.at_level("WARNING", logger="toolwire"):
            r = await k.call("work", {}, progress=broken)
    assert r.content == {"done": True} and ran == [1, 1]
    assert calls == 1  # after it failed, this call reports no more progress
    assert r.meta.plugin_errors == [
        {"plugin": "caller", "hook": "progress", "error": "RuntimeError: UI gone"}
    ]
    assert any("progress handler" in x.getMessage() for x in caplog.records)


def test_a_method_named_like_a_hook_without_hookimpl_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Forgot:
        name = "forgot"

        def before_call(self, call: ToolCall) -> None:  # no @hookimpl
            return None

    with caplog.at_level("WARNING", logger="toolwire.plugins"):
        Kernel(plugins=[Forgot()])
    assert any(
        "plugin 'forgot': before_call() is named like a hook but not marked @hookimpl"
        in x.getMessage()
        for x in caplog.records
    )


async def test_tracing_plugins_logs_each_hook_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """TOOLWIRE_TRACE_PLUGINS=<names> logs the hook calls of those plugins only."""
    monkeypatch.setenv("TOOLWIRE_TRACE_PLUGINS", "traced")

    class Traced:
        name = "traced"

        @hookimpl
        async def before_call(self, call: ToolCall) -> None:
            return None

        @hookimpl
        def on_error(self, error: ErrorInfo) -> Recover:
            return Recover({"ok": True}, reason="spare value")

    quiet = RecordingPlugin("quiet", 10)
    fake = FakeTool("t", script=[ToolError("boom")])
    with caplog.at_level("INFO", logger="toolwire.trace"):
        async with Kernel(tools=[fake.tool], plugins=[Traced(), quiet]) as k:
            r = await k.call("t", {})
    assert r.content == {"ok": True}
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "toolwire.trace"]
    assert lines[0].startswith("traced.before_call(t) -> None in ")
    assert lines[1].startswith("traced.on_error(t) -> Recover(spare value) in ")
    assert len(lines) == 2 and not any(line.startswith("quiet.") for line in lines)


async def test_tracing_an_unregistered_plugin_is_warned_about_once_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a misspelt name in TOOLWIRE_TRACE_PLUGINS traced nothing, silently."""
    monkeypatch.setenv("TOOLWIRE_TRACE_PLUGINS", "quiet, qiuet ,nope")
    fake = FakeTool("t")
    with caplog.at_level("WARNING", logger="toolwire"):
        k = Kernel(tools=[fake.tool], plugins=[RecordingPlugin("quiet", 10)])
        assert not caplog.records  # checked at start, once the plugins are known
        async with k:
            await k.call("t", {})
            await k.call("t", {})
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "TOOLWIRE_TRACE_PLUGINS names 'nope', 'qiuet', which are not registered (loaded "
        "plugins: quiet); nothing is traced for them - check the spelling against "
        "`toolwire plugins`"
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"args": [1, 2]}, TypeError, "args must be a mapping"),
        ({"timeout": "1"}, ValueError, "timeout must be a positive number"),
        ({"timeout": float("nan")}, ValueError, "timeout must be a positive number"),
        ({"timeout": 0}, ValueError, "timeout must be a positive number"),
        ({"progress": "stdout"}, TypeError, "progress must be a callable"),
        ({"name": 5}, TypeError, "the tool name must be a str, not 5"),
    ],
)
async def test_programming_errors_in_call_say_what_is_wrong(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Before: 'cannot convert dictionary update sequence element #0', 'unsupported operand',
    or a timeout error reading 'no answer within nans'."""
    k = make_kernel(FakeTool("t").tool)
    name = kwargs.pop("name", "t")
    with pytest.raises(error, match=match):
        await k.call(name, **kwargs)


async def test_an_event_subscriber_never_makes_a_call_raise_on_odd_meta_extra() -> None:
    """Before: with a subscriber, a plugin's non-JSON value in meta.extra made call() raise."""

    class Odd:
        name = "odd"

        @hookimpl
        def after_call(self, result: Any) -> None:
            result.meta.extra["obj"] = object()
            result.meta.extra["fine"] = 1

    seen: list[dict[str, Any]] = []
    async with Kernel(tools=[FakeTool("t", script=[{"v": 1}]).tool], plugins=[Odd()]) as k:
        k.events.subscribe(lambda event: seen.append(event.data), kinds=["call_finished"])
        r = await k.call("t", {})
    assert r.content == {"v": 1}
    extra = r.to_dict()["meta"]["extra"]
    assert extra["fine"] == 1 and extra["obj"].startswith("<not JSON: value of type object")
    assert seen and seen[-1]["result"]["meta"]["extra"]["fine"] == 1


# ------------------------------------------- async hooks behind a plain decorator
def _plain_decorator(fn: Any) -> Any:
    """What many tracing/logging decorators do: a sync wrapper returning fn's coroutine."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


async def test_async_hooks_behind_a_sync_decorator_are_awaited() -> None:
    seen: list[str] = []

    class Wrapped:
        name = "wrapped"

        @hookimpl
        @_plain_decorator
        async def startup(self) -> None:
            seen.append("startup")

        @hookimpl
        @_plain_decorator
        async def before_call(self, call: ToolCall) -> None:
            seen.append("before_call")

        @hookimpl
        @_plain_decorator
        async def on_error(self, error: ErrorInfo) -> Recover:
            seen.append("on_error")
            return Recover({"recovered": error.message})

        @hookimpl
        @_plain_decorator
        async def after_call(self, result: ToolResult) -> None:
            seen.append("after_call")
            result.meta.extra["wrapped"] = True

        @hookimpl
        @_plain_decorator
        async def shutdown(self) -> None:
            seen.append("shutdown")

    flaky = FakeTool("flaky", script=[ToolError("boom")])
    k = make_kernel(flaky.tool, plugins=(Wrapped(),))
    async with k:
        r = await k.call("flaky", {})
    assert seen == ["startup", "before_call", "on_error", "after_call", "shutdown"]
    assert r.content == {"recovered": "boom"} and r.meta.extra == {"wrapped": True}
    assert r.meta.plugin_errors == []


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"call_id": 5}, "call_id"),
        ({"session_id": b"s"}, "session_id"),
        ({"tenant": ["t"]}, "tenant"),
        ({"metadata": "x"}, "metadata"),
    ],
)
async def test_call_identity_and_metadata_of_the_wrong_type_are_named(
    kw: dict[str, Any], named: str
) -> None:
    """Before: call_id=5 went through to plugins that key state by it, and
    metadata='x' raised a bare 'dictionary update sequence element' ValueError."""
    k = make_kernel()
    with pytest.raises(TypeError, match=rf"kernel\.call\('add', {named}=\.\.\.\)"):
        await k.call("add", {"a": 1, "b": 2}, **kw)
    await k.close()


async def test_tracing_an_async_hook_behind_a_sync_decorator_reports_its_outcome(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the trace wrapper, sync like the hook, logged the coroutine it got back as the
    hook's outcome ('-> coroutine' in no time) and never saw the hook raise."""
    monkeypatch.setenv("TOOLWIRE_TRACE_PLUGINS", "wrapped")

    class Wrapped:
        name = "wrapped"

        @hookimpl
        @_plain_decorator
        async def before_call(self, call: ToolCall) -> None:
            raise RuntimeError("hook broke")

        @hookimpl
        @_plain_decorator
        async def after_call(self, result: ToolResult) -> ToolResult:
            return result

    k = make_kernel(plugins=(Wrapped(),))
    caplog.set_level(logging.INFO, logger="toolwire.trace")
    async with k:
        r = await k.call("add", {"a": 1, "b": 2})
    assert r.error is not None and "hook broke" in r.error.message
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "toolwire.trace"]
    assert any("before_call" in m and "raised RuntimeError: hook broke" in m for m in lines)
    assert any("after_call" in m and "-> ToolResult" in m for m in lines), lines
    assert not any("coroutine" in m for m in lines), lines


@pytest.mark.parametrize("shape", ["is_error without error", "error without is_error"])
async def test_a_replacement_whose_error_flag_and_error_disagree_is_ignored(shape: str) -> None:
    """A plugin's ``ToolResult(is_error=True)`` with no ``error`` (or an ``error`` with
    ``is_error=False``) reached callers as it was: a failure with no kind (the audit line
    said ``error_kind: null``), or a success carrying an error. Such a replacement is now
    refused like one that is no JSON: the result stands, and the plugin's error is noted."""
    from toolwire import ErrorInfo

    class Odd:
        name, order = "odd", 200

        @hookimpl
        def after_call(self, result: ToolResult) -> ToolResult:
            if shape == "is_error without error":
                return ToolResult({"error": "x"}, is_error=True, meta=result.meta)
            return ToolResult({"ok": 1}, error=ErrorInfo("denied", "no"), meta=result.meta)

    r = await make_kernel(FakeTool("t").tool, plugins=(Odd(),)).call("t", {})
    assert r.content == {"ok": True} and not r.is_error and r.error is None
    (problem,) = r.meta.plugin_errors
    assert problem["plugin"] == "odd" and problem["hook"] == "after_call"
    assert "ToolResult.fail" in problem["error"]
