"""The public fallback API: set_fallbacks / clear_fallbacks / fallbacks_for, and the
per-call candidates (set_call_fallbacks, ctx.state["retry"]["fallbacks"])."""

from __future__ import annotations

from typing import Any

import pytest

from toolwire import CallContext, Kernel, Tool, ToolCall, ToolError, build_tool, hookimpl, tool
from toolwire.testing import FakeClock, FakeTool
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin
from toolwire_retry import FallbackSpec, RetryConfig, RetryPlugin

pytestmark = pytest.mark.anyio


def busy() -> ToolError:
    return ToolError("Service Unavailable", status=503)


def fake(name: str, script: list[Any], provider: str | None = None) -> tuple[FakeTool, Tool]:
    ft = FakeTool(name, script=script, read_only=True)
    t = ft.tool
    if provider:
        t.settings["provider"] = provider
    return ft, t


def retry_plugin(**cfg: Any) -> RetryPlugin:
    return RetryPlugin(RetryConfig.model_validate({"seed": 3, "max_provider_attempts": 1, **cfg}))


def kernel(tools: list[Tool], retry: RetryPlugin, *extra: object) -> Kernel:
    return Kernel(
        clock=FakeClock(),
        tools=tools,
        plugins=[RateLimitPlugin(RateLimitConfig()), retry, *extra],
    )


def served(result: Any) -> list[str]:
    return [a.tool for a in result.meta.attempts]


def abc() -> tuple[FakeTool, FakeTool, FakeTool, list[Tool]]:
    """``a`` always fails (503, classified unavailable); ``b`` and ``c`` answer."""
    a, ta = fake("a", [busy()])
    b, tb = fake("b", [{"by": "b"}])
    c, tc = fake("c", [lambda args: {"by": "c", "args": args}])
    return a, b, c, [ta, tb, tc]


# ------------------------------------------------------------------ set_fallbacks
async def test_a_plugin_sets_the_default_chain_of_a_tool() -> None:
    _a, b, _c, tools = abc()
    retry = retry_plugin()
    assert retry.set_fallbacks("a", ["c"], source="search") is True
    async with kernel(tools, retry) as k:
        res = await k.call("a", {"q": 1})
    assert served(res) == ["a", "c"] and res.content["by"] == "c"
    assert not b.calls and retry.config.fallbacks == {}  # the config is not touched


@pytest.mark.parametrize(
    "operator",
    [
        {"fallbacks": {"a": ["b"]}},
        {"tools": {"a": {"fallbacks": ["b"]}}},
        {"fallbacks": {"a": ["b"]}, "tools": {"a": {"fallbacks": ["b"]}}},
    ],
)
async def test_the_operators_configuration_wins_over_set_fallbacks(
    operator: dict[str, Any],
) -> None:
    _a, _b, c, tools = abc()
    retry = retry_plugin(**operator)
    assert retry.set_fallbacks("a", ["c"], source="search") is False
    assert retry.fallbacks_for("a") == [FallbackSpec(tool="b")]
    async with kernel(tools, retry) as k:
        res = await k.call("a", {})
    assert served(res) == ["a", "b"] and not c.calls


async def test_an_operators_empty_list_wins_too() -> None:
    _a, b, c, tools = abc()
    retry = retry_plugin(tools={"a": {"fallbacks": []}})
    assert retry.set_fallbacks("a", ["c"], source="search") is False
    assert retry.fallbacks_for("a") == []
    async with kernel(tools, retry) as k:
        res = await k.call("a", {})
    assert res.is_error and served(res) == ["a"] and not b.calls and not c.calls


async def test_the_same_source_replaces_its_chain_another_source_does_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _a, b, _c, tools = abc()
    retry = retry_plugin()
    assert retry.set_fallbacks("a", ["b"], source="search")
    assert retry.set_fallbacks(
        "a", [FallbackSpec(tool="c", args={"mode": "lite"})], source="search"
    )
    assert retry.fallbacks_for("a") == [FallbackSpec(tool="c", args={"mode": "lite"})]
    # another plugin does not take over a chain silently
    assert retry.set_fallbacks("a", ["b"], source="other") is False
    assert "'search' set them first" in caplog.text
    assert retry.clear_fallbacks("a", source="other") is False
    async with kernel(tools, retry) as k:
        res = await k.call("a", {"q": "x"})
        assert res.content == {"by": "c", "args": {"q": "x", "mode": "lite"}} and not b.calls
        # once the owner clears it, the next plugin may set one
        assert retry.clear_fallbacks("a", source="search") is True
        assert retry.fallbacks_for("a") == []
        assert retry.set_fallbacks("a", ["b"], source="other") is True
        res = await k.call("a", {})
    assert served(res) == ["a", "b"]


async def test_set_fallbacks_copies_its_input_and_fallbacks_for_returns_copies() -> None:
    retry = retry_plugin(fallbacks={"x": [{"tool": "y", "args": {"k": 1}}]})
    mine = [FallbackSpec(tool="c", args={"k": 1})]
    retry.set_fallbacks("a", mine, source="p")
    mine[0].args["k"] = 2
    view = retry.fallbacks_for("a")
    assert view == [FallbackSpec(tool="c", args={"k": 1})]
    view[0].args["k"] = 3
    retry.fallbacks_for("x")[0].args["k"] = 3
    assert retry.fallbacks_for("a")[0].args == {"k": 1}
    assert retry.fallbacks_for("x")[0].args == {"k": 1}
    assert retry.config.fallbacks["x"][0].args == {"k": 1}


async def test_fallbacks_for_shows_the_chain_order_view() -> None:
    _, ta = fake("s_alpha", [busy()], provider="alpha")
    _, tb = fake("s_beta", [{"ok": 1}], provider="beta")
    retry = retry_plugin(chain_order=["alpha", "beta", "gamma"])
    assert retry.fallbacks_for("s_alpha") == []  # before startup: the tool's provider is unknown
    assert retry.fallbacks_for("alpha") == [FallbackSpec(tool="beta"), FallbackSpec(tool="gamma")]
    async with kernel([ta, tb], retry) as k:
        await k.start()
        assert [s.tool for s in retry.fallbacks_for("s_alpha")] == ["beta", "gamma"]
        assert [s.tool for s in retry.fallbacks_for("s_beta")] == ["gamma"]
        assert retry.fallbacks_for("unknown") == []
        retry.set_fallbacks("s_alpha", [], source="p")  # a plugin's list beats chain_order
        assert retry.fallbacks_for("s_alpha") == []
        res = await k.call("s_alpha", {})
    assert served(res) == ["s_alpha"]


@pytest.mark.parametrize(
    ("tool_name", "targets", "source", "error", "match"),
    [
        ("", ["b"], "p", ValueError, "empty tool name"),
        ("  ", ["b"], "p", ValueError, "empty tool name"),
        (None, ["b"], "p", TypeError, "tool must be a str"),
        ("a", ["b"], "", ValueError, "empty source"),
        ("a", ["b"], 3, TypeError, "source must be a str"),
        ("a", "b", "p", TypeError, r"got str 'b'; write \['b'\]"),
        ("a", None, "p", TypeError, "expected a list of fallback targets"),
        ("a", {"b": 1}, "p", TypeError, "expected a list"),
        ("a", ["b", 3], "p", TypeError, r"targets\[1\]: .* not int"),
        ("a", [""], "p", ValueError, "empty tool name"),
        ("a", ["a"], "p", ValueError, "cannot fall back to itself"),
        ("a", ["b", FallbackSpec(tool="b")], "p", ValueError, "listed more than once"),
        ("a", [{"tool": "b", "argz": {}}], "p", ValueError, "not a fallback target"),
    ],
)
def test_set_fallbacks_rejects_bad_input_clearly(
    tool_name: Any, targets: Any, source: Any, error: type[Exception], match: str
) -> None:
    retry = retry_plugin()
    with pytest.raises(error, match=match):
        retry.set_fallbacks(tool_name, targets, source=source)
    assert retry._defaults == {}  # nothing half-registered


def test_mappings_are_accepted_as_targets() -> None:
    retry = retry_plugin()
    assert retry.set_fallbacks("a", [{"tool": "b", "args": {"m": 1}}, "c"], source="p")
    assert retry.fallbacks_for("a") == [
        FallbackSpec(tool="b", args={"m": 1}),
        FallbackSpec(tool="c"),
    ]


# --------------------------------------------------------------- per-call candidates
def chooser(calls: list[dict[str, Any]]) -> Any:
    """``pick`` fails (503) after setting this call's candidates from its ``to`` argument."""

    @tool(name="pick", read_only=True)
    async def pick(to: list[str], ctx: CallContext) -> dict[str, Any]:
        """Fail over to the named tools."""
        calls.append({"to": to})
        RetryPlugin.set_call_fallbacks(ctx, to)
        raise busy()

    return pick


async def test_a_tool_sets_the_candidates_of_this_call_only() -> None:
    _a, b, _c, tools = abc()
    calls: list[dict[str, Any]] = []
    retry = retry_plugin(fallbacks={"pick": ["b"]})  # the configured chain: b
    async with kernel([*tools, chooser(calls)], retry) as k:
        to_c = await k.call("pick", {"to": ["c"]})
        nowhere = await k.call("pick", {"to": []})
        to_a_then_c = await k.call("pick", {"to": ["a", "c"]})
    assert served(to_c) == ["pick", "c"] and to_c.content["args"] == {"to": ["c"]}
    assert not b.calls  # the override replaced the configured chain (operator's included)
    assert nowhere.is_error and served(nowhere) == ["pick"]
    # a failing candidate is followed by the next one; the tool itself is never re-run
    assert served(to_a_then_c) == ["pick", "a", "c"] and len(calls) == 3
    assert retry.fallbacks_for("pick") == [FallbackSpec(tool="b")]  # the default is unchanged


async def test_without_an_override_the_configured_chain_is_walked() -> None:
    _a, _b, c, tools = abc()
    retry = retry_plugin(fallbacks={"a": ["b"]})
    async with kernel(tools, retry) as k:
        res = await k.call("a", {})
    assert served(res) == ["a", "b"] and not c.calls


class Planner:
    """Sets the fallback candidates of calls of ``a`` in before_call, by writing the
    documented key directly (no import of the retry plugin needed)."""

    name = "planner"
    order = 100

    def __init__(self, value: Any) -> None:
        self.value = value

    @hookimpl
    def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        if call.name == "a":
            ctx.state.setdefault("retry", {})["fallbacks"] = self.value


async def test_a_plugin_sets_the_candidates_in_before_call_through_ctx_state() -> None:
    _a, b, _c, tools = abc()
    retry = retry_plugin(fallbacks={"a": ["b"]})
    # written directly, the tool itself and repeats are skipped rather than rejected
    planner = Planner(["a", {"tool": "c", "args": {"mode": "lite"}}, "c"])
    async with kernel(tools, retry, planner) as k:
        res = await k.call("a", {"q": "x"})
    assert res.content == {"by": "c", "args": {"q": "x", "mode": "lite"}} and not b.calls
    # the retry plugin's own bookkeeping still works (elapsed time, attempts per provider)
    assert res.meta.extra["attempt_details"][0]["to"] == "c"


async def test_per_call_candidates_respect_retry_false_and_the_budget() -> None:
    _a, _b, c, tools = abc()
    retry = retry_plugin(tools={"c": {"retry": False}}, budget={"burst": 1, "ratio": 0})
    # "c" is skipped by retry = false: the next candidate, b, serves; then no budget is left
    async with kernel(tools, retry, Planner(["c", "b"])) as k:
        first = await k.call("a", {})
        second = await k.call("a", {})
    assert served(first) == ["a", "b"] and not c.calls
    assert served(second) == ["a"] and "retry budget" in second.error.details["gave_up"]  # type: ignore[union-attr]


async def test_a_bad_per_call_value_is_reported_and_nothing_falls_over() -> None:
    _a, b, c, tools = abc()
    retry = retry_plugin(fallbacks={"a": ["b"]})
    async with kernel(tools, retry, Planner("c")) as k:
        res = await k.call("a", {})
    assert res.is_error and served(res) == ["a"] and not b.calls and not c.calls
    (err,) = res.meta.plugin_errors
    assert err["plugin"] == "retry" and "ctx.state['retry']['fallbacks']" in err["error"]


async def test_the_chain_is_fixed_at_the_first_fallback_decision() -> None:
    results: list[bool] = []

    @tool(name="late", read_only=True)
    async def late(ctx: CallContext) -> dict[str, Any]:
        """A fallback target that tries to change the call's chain."""
        results.append(RetryPlugin.set_call_fallbacks(ctx, ["c"]))
        raise busy()

    _a, _b, c, tools = abc()
    retry = retry_plugin(fallbacks={"a": ["late", "b"]})
    async with kernel([*tools, late], retry) as k:
        res = await k.call("a", {})
    assert results == [False] and served(res) == ["a", "late", "b"] and not c.calls


def test_set_call_fallbacks_validates_and_clears() -> None:
    ctx = CallContext(kernel=Kernel(), call=ToolCall("a", {}, "id"))
    with pytest.raises(TypeError, match="expected a list"):
        RetryPlugin.set_call_fallbacks(ctx, "b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot fall back to itself"):
        RetryPlugin.set_call_fallbacks(ctx, ["a"])
    assert RetryPlugin.set_call_fallbacks(ctx, ["b"]) is True
    assert ctx.state["retry"]["fallbacks"] == [FallbackSpec(tool="b")]
    assert RetryPlugin.set_call_fallbacks(ctx, None) is True
    assert "fallbacks" not in ctx.state["retry"]


async def test_a_candidate_whose_schema_rejects_the_arguments_is_skipped() -> None:
    """Before: the chain stopped at such a candidate with an ``invalid_args`` blamed on the
    caller's (valid) arguments, and the next candidate, which would have served, was never
    tried."""
    _a, ta = fake("a", [busy()])
    picky = FakeTool(
        "picky",
        script=[{"never": "runs"}],
        read_only=True,
        input_schema={
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
            "additionalProperties": False,
        },
    )
    _c, tc = fake("c", [lambda args: {"by": "c", "args": args}])
    retry = retry_plugin(fallbacks={"a": ["picky", "c"]})
    async with kernel([ta, picky.tool, tc], retry) as k:
        res = await k.call("a", {"q": 1})
    assert served(res) == ["a", "c"] and res.content["by"] == "c", res.error
    assert picky.calls == []
    # with nothing else to try, the aggregated error says why the candidate was skipped
    retry = retry_plugin(fallbacks={"a": ["picky"]})
    async with kernel([ta, picky.tool], retry) as k:
        res = await k.call("a", {"q": 1})
    assert res.error is not None and res.error.kind == "unavailable", res.error
    why = res.error.details["providers"]["picky"]["reason"]
    assert why.startswith("skipped: its schema rejects the arguments (")
    assert "only after an operator fixes it" in res.error.message


async def test_a_candidate_without_the_requested_tools_optional_parameters_serves() -> None:
    """Before: the call's arguments carried the requested tool's defaults, filled in by the
    kernel (``model = "big"``), so a candidate without that parameter was skipped as
    "its schema rejects the arguments" although the caller only gave ``text``."""

    @tool(read_only=True)
    def summarize(text: str, model: str = "big") -> str:
        """Summarize."""
        raise ToolError("Service Unavailable", status=503)

    @tool(read_only=True)
    def summarize_local(text: str) -> dict[str, Any]:
        """Summarize locally."""
        return {"by": "local", "text": text}

    retry = retry_plugin(fallbacks={"summarize": ["summarize_local"]})
    async with kernel([build_tool(summarize), build_tool(summarize_local)], retry) as k:
        res = await k.call("summarize", {"text": "x"})
        given = await k.call("summarize", {"text": "x", "model": "small"})
    assert res.content == {"by": "local", "text": "x"}, res.error
    # a value the caller chose is never dropped: that candidate still cannot serve it
    assert given.error is not None and given.error.kind == "unavailable"
    assert "schema rejects the arguments" in given.error.message


async def test_a_chain_cut_by_max_attempts_says_so_and_may_be_retried_now() -> None:
    """Before: "no provider could serve 'a': ... | c: not tried", with the attempt limit
    only in details["gave_up"] and retry_after_s None although c could be tried at once."""
    _a, ta = fake("a", [busy()])
    _b, tb = fake("b", [busy()])
    c, tc = fake("c", [{"by": "c"}])
    retry = retry_plugin(fallbacks={"a": ["b", "c"]})
    k = Kernel(
        clock=FakeClock(),
        tools=[ta, tb, tc],
        plugins=[RateLimitPlugin(RateLimitConfig()), retry],
        max_attempts=2,
    )
    async with k:
        res = await k.call("a", {})
    assert served(res) == ["a", "b"] and c.calls == []
    err = res.error
    assert err is not None and err.kind == "unavailable"
    assert err.message.startswith(
        "no provider could serve 'a' (gave up: max_attempts (2, the kernel's) reached): "
    )
    assert "c: not tried; may be tried again now" in err.message
    assert err.retryable and err.retry_after_s == 0.0
