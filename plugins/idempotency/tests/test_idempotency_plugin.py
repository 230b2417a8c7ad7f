"""The plugin's behaviour, on memory, SQLite and a real Redis (the ``env`` fixture)."""

from __future__ import annotations

import datetime
import functools
import json
import math
from typing import Any

import anyio
import pytest

from toolwire import (
    IMAGE_FILE_EXTRA,
    CallContext,
    Image,
    Retry,
    Tool,
    ToolError,
    ToolResult,
    hookimpl,
    tool,
)
from toolwire.testing import FakeTool, RecordingPlugin
from toolwire_idempotency import IdempotencyPlugin

from .conftest import CountingStore, Env, counting_tool

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {}, "additionalProperties": True}


# -- first call, replay, round trips -------------------------------------------------


async def test_replay_returns_the_stored_result_and_never_runs_twice(env: Env) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin]) as kernel:
        first = await kernel.call("send", {"to": "a"}, call_id="c1")
        again = await kernel.call("send", {"to": "a"}, call_id="c1")
        third = await kernel.call("send", {"to": "a"}, call_id="c1")
    assert len(runs) == 1
    assert not first.is_error and not first.meta.replayed
    for replay in (again, third):
        assert replay.content == first.content == {"run": 1, "args": {"to": "a"}}
        assert replay.meta.replayed is True
        assert replay.meta.started_at == first.meta.started_at
        assert replay.meta.duration_ms == pytest.approx(first.meta.duration_ms)
        assert replay.meta.served_by == "send"
        assert replay.meta.call_id == "c1" and replay.meta.tool == "send"
        assert replay.meta.attempts == []  # nothing ran now
        assert replay.meta.extra["idempotency"]["replayed"] is True
    assert plugin.counters.misses == 1 and plugin.counters.hits == 2


async def test_hit_is_one_store_operation_and_first_call_two(env: Env) -> None:
    tool, _ = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        await kernel.call("send", {"x": 1}, call_id="c1")
        assert store.ops == ["set_if_absent_or_get", "compare_and_set"]  # claim + complete
        store.ops.clear()
        await kernel.call("send", {"x": 1}, call_id="c1")
        assert store.ops == ["set_if_absent_or_get"]  # the replay: one round trip


@pytest.mark.parametrize("value", [0, False, "", [], {}, None, 0.0], ids=repr)
async def test_falsy_results_are_replayed_exactly(env: Env, value: Any) -> None:
    tool, runs = counting_tool(result=lambda args: value)
    async with env.kernel([tool], [env.plugin()]) as kernel:
        first = await kernel.call("send", {}, call_id="f")
        replay = await kernel.call("send", {}, call_id="f")
    assert len(runs) == 1
    assert replay.meta.replayed
    assert replay.content == first.content
    assert json.dumps(replay.content) == json.dumps(first.content)  # types kept: 0 vs false vs 0.0


async def test_stored_record_is_the_result_json(env: Env) -> None:
    content = {"nested": {"list": [1, 2.5, "x", None, True]}, "empty": "", "zero": 0}
    tool, _ = counting_tool(result=content)
    plugin = env.plugin()
    async with env.kernel([tool], [plugin]) as kernel:
        await kernel.call("send", {"a": 1}, call_id="j", tenant="acme")
        entry = await kernel.state.get_entry(plugin.key_for("send", "j", tenant="acme"))
        replay = await kernel.call("send", {"a": 1}, call_id="j", tenant="acme")
    assert entry is not None
    assert entry.key == f"{env.prefix}:idempotency:{entry.key.rsplit(':', 1)[1]}"
    assert len(entry.key.rsplit(":", 1)[1]) == 64  # sha256 hex
    assert entry.value["s"] == "done" and entry.value["c"] == content
    assert entry.owner is None  # completion cleared the claim's owner
    assert replay.content == content


async def test_distinct_tenant_tool_or_call_id_run_separately(env: Env) -> None:
    send, send_runs = counting_tool("send")
    other, other_runs = counting_tool("other")
    async with env.kernel([send, other], [env.plugin()]) as kernel:
        await kernel.call("send", {"a": 1}, call_id="c")
        await kernel.call("send", {"a": 1}, call_id="c", tenant="t1")
        await kernel.call("send", {"a": 1}, call_id="c", tenant="t2")
        await kernel.call("send", {"a": 1}, call_id="d")
        await kernel.call("other", {"a": 1}, call_id="c")
        for _ in range(2):  # and each of them replays
            await kernel.call("send", {"a": 1}, call_id="c", tenant="t1")
            await kernel.call("other", {"a": 1}, call_id="c")
    assert len(send_runs) == 4 and len(other_runs) == 1


# -- payload mismatch, mutation, unencodable args --------------------------------------


async def test_same_call_id_different_args_is_a_conflict_and_nothing_runs(env: Env) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin]) as kernel:
        first = await kernel.call("send", {"amount": 10}, call_id="pay-1")
        key = plugin.key_for("send", "pay-1")
        before = await kernel.state.get_entry(key)
        bad = await kernel.call("send", {"amount": 1000}, call_id="pay-1")
        after = await kernel.state.get_entry(key)
        replay = await kernel.call("send", {"amount": 10}, call_id="pay-1")
    assert len(runs) == 1
    assert bad.is_error and bad.error is not None
    assert bad.error.kind == "conflict" and bad.error.retryable is False
    assert bad.error.details["reason"] == "payload_mismatch"
    assert bad.error.source == "idempotency"
    assert "different arguments" in bad.error.message
    assert after == before  # the stored record is untouched (same version)
    assert replay.meta.replayed and replay.content == first.content
    assert plugin.counters.mismatches == 1 and plugin.counters.conflicts == 1


async def test_other_arguments_while_the_first_call_runs_claim_no_stored_result(
    env: Env,
) -> None:
    """Before: the conflict said "the stored result is kept" while the first call still
    ran (or had left an outcome unknown): there was no result to look for."""
    gate = anyio.Event()
    tool, runs = counting_tool(gate=gate)
    plugin = env.plugin()
    async with env.kernel([tool], [plugin]) as kernel:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(kernel.call, "send", {"amount": 10}, call_id="pay-2"))
            with anyio.fail_after(10):
                while not runs:  # noqa: ASYNC110 - the tool's first run, seen from outside
                    await anyio.sleep(0.01)
            bad = await kernel.call("send", {"amount": 1000}, call_id="pay-2")
            gate.set()
        done = await kernel.call("send", {"amount": 1000}, call_id="pay-2")
    assert bad.error is not None and bad.error.details["reason"] == "payload_mismatch"
    assert "stored result" not in bad.error.message
    assert "has not finished" in bad.error.message
    assert done.error is not None and "the stored result is kept" in done.error.message
    assert len(runs) == 1


async def test_a_tool_mutating_its_args_cannot_move_its_record(env: Env) -> None:
    def mutate(args: dict[str, Any]) -> dict[str, Any]:
        args["items"].append("added-by-tool")
        args["extra"] = True
        del args["to"]
        return {"ok": True}

    tool, runs = counting_tool(result=mutate)
    async with env.kernel([tool], [env.plugin()]) as kernel:
        first = await kernel.call("send", {"to": "a", "items": [1]}, call_id="m")
        replay = await kernel.call("send", {"to": "a", "items": [1]}, call_id="m")
    assert len(runs) == 1
    assert not first.is_error
    assert replay.meta.replayed and not replay.is_error


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=str)
async def test_nan_or_infinity_in_args_is_refused_before_anything_runs(
    env: Env, bad: float
) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        result = await kernel.call("send", {"deep": [{"x": bad}]}, call_id="n")
        assert kernel.state.ops == []  # type: ignore[attr-defined]
    assert runs == []
    assert result.error is not None and result.error.kind == "invalid_args"
    assert result.error.details["reason"] == "unencodable_argument"
    assert result.error.details["path"] == "args['deep'][0]['x']"
    assert plugin.counters.unencodable == 1


async def test_an_unencodable_type_is_refused_before_anything_runs(env: Env) -> None:
    runs: list[Any] = []

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        runs.append(args)
        return {}

    tool = Tool(
        name="odd",
        description="a tool whose validator produces an object",
        input_schema=SCHEMA,
        executor=executor,
        validator=lambda args: {"handle": object()},
    )
    async with env.kernel([tool], [env.plugin()]) as kernel:
        result = await kernel.call("odd", {}, call_id="o")
    assert runs == []
    assert result.error is not None and result.error.kind == "invalid_args"
    assert result.error.details["type"] == "object"
    assert "exempt_tools" in result.error.message


# -- call ids, exemptions, switches --------------------------------------------------


async def test_without_call_id_every_call_runs_and_is_counted(env: Env) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        await kernel.call("send", {"a": 1})
        await kernel.call("send", {"a": 1})
        assert kernel.state.ops == []  # type: ignore[attr-defined]
    assert len(runs) == 2
    assert plugin.counters.no_call_id == 2


async def test_require_call_id_makes_a_missing_one_an_error(env: Env) -> None:
    tool, runs = counting_tool()
    async with env.kernel([tool], [env.plugin(require_call_id=True)]) as kernel:
        result = await kernel.call("send", {"a": 1})
    assert runs == []
    assert result.error is not None and result.error.kind == "invalid_args"
    assert "call_id" in result.error.message


async def test_exempt_tools_cause_zero_store_operations(env: Env) -> None:
    ping, ping_runs = counting_tool("ping")
    search, search_runs = counting_tool("search", read_only=True)
    send, send_runs = counting_tool("send")
    plugin = env.plugin(exempt_tools=["ping"], exempt_read_only=True)
    async with env.kernel([ping, search, send], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        for _ in range(3):
            await kernel.call("ping", {}, call_id="same")
            await kernel.call("search", {"q": "x"}, call_id="same")
        assert store.ops == []
        await kernel.call("send", {}, call_id="same")  # not exempt
        assert store.ops == ["set_if_absent_or_get", "compare_and_set"]
    assert (len(ping_runs), len(search_runs), len(send_runs)) == (3, 3, 1)
    assert plugin.counters.exempt == 6


async def test_read_only_tools_are_deduplicated_unless_exempted(env: Env) -> None:
    search, runs = counting_tool("search", read_only=True)
    async with env.kernel([search], [env.plugin()]) as kernel:
        await kernel.call("search", {"q": "x"}, call_id="s")
        replay = await kernel.call("search", {"q": "x"}, call_id="s")
    assert len(runs) == 1 and replay.meta.replayed


async def test_disabled_by_environment_variable(env: Env) -> None:
    from toolwire_idempotency import IdempotencyConfig

    tool, runs = counting_tool()
    plugin = IdempotencyPlugin(
        IdempotencyConfig(prefix=env.prefix), env={"TOOL_IDEMPOTENCY_ENABLED": "false"}
    )
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        await kernel.call("send", {}, call_id="c")
        await kernel.call("send", {}, call_id="c")
        assert kernel.state.ops == []  # type: ignore[attr-defined]
    assert len(runs) == 2


# -- failures ----------------------------------------------------------------------


async def test_retryable_failure_releases_the_claim(env: Env) -> None:
    outcomes: list[Any] = [ToolError("busy", kind="unavailable"), {"ok": True}]

    class Classify:
        name, order = "classify", 400

        @hookimpl
        def on_error(self, error: Any) -> None:
            error.retryable = error.kind == "unavailable"

    tool, runs = counting_tool(result=lambda args: _next(outcomes))
    plugin = env.plugin()
    async with env.kernel([tool], [plugin, Classify()]) as kernel:
        failed = await kernel.call("send", {}, call_id="r")
        assert failed.is_error and failed.error is not None and failed.error.retryable
        entry = await kernel.state.get_entry(plugin.key_for("send", "r"))
        assert entry is None  # released
        ok = await kernel.call("send", {}, call_id="r")  # the replay re-runs
        replay = await kernel.call("send", {}, call_id="r")
    assert len(runs) == 2
    assert not ok.is_error and not ok.meta.replayed
    assert replay.meta.replayed and replay.content == {"ok": True}
    assert plugin.counters.released == 1


def _next(outcomes: list[Any]) -> Any:
    item = outcomes.pop(0)
    if isinstance(item, BaseException):
        raise item
    return item


@pytest.mark.parametrize("cache_errors", [False, True])
async def test_terminal_failure_is_released_unless_cache_errors(
    env: Env, cache_errors: bool
) -> None:
    tool, runs = counting_tool(
        result=ToolError("card declined", kind="tool_error", details={"code": 51})
    )
    plugin = env.plugin(cache_errors=cache_errors)
    async with env.kernel([tool], [plugin]) as kernel:
        first = await kernel.call("send", {}, call_id="t")
        second = await kernel.call("send", {}, call_id="t")
    assert first.is_error and second.is_error
    if cache_errors:
        assert len(runs) == 1
        assert second.meta.replayed
        assert second.error is not None and first.error is not None
        assert second.error.to_dict() == first.error.to_dict()
        assert second.content == first.content
        assert plugin.counters.errors_cached == 1
    else:
        assert len(runs) == 2
        assert not second.meta.replayed
        assert plugin.counters.released == 2


async def test_retryable_errors_are_never_cached(env: Env) -> None:
    tool, runs = counting_tool(result=ToolError("slow down", kind="rate_limit"))

    class Classify:
        name, order = "classify", 400

        @hookimpl
        def on_error(self, error: Any) -> None:
            error.retryable = True

    async with env.kernel([tool], [env.plugin(cache_errors=True), Classify()]) as kernel:
        await kernel.call("send", {}, call_id="rl")
        await kernel.call("send", {}, call_id="rl")
    assert len(runs) == 2


async def test_cancellation_is_never_recorded_and_releases_the_claim(env: Env) -> None:
    gate = anyio.Event()
    tool, runs = counting_tool(gate=gate)
    plugin = env.plugin()
    async with env.kernel([tool], [plugin]) as kernel:

        async def call() -> None:
            await kernel.call("send", {}, call_id="cx")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                while not runs:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert await kernel.state.get_entry(plugin.key_for("send", "cx")) is None
        gate.set()
        again = await kernel.call("send", {}, call_id="cx")
    assert len(runs) == 2 and not again.meta.replayed and not again.is_error
    assert plugin.counters.released == 1


async def test_a_call_cancelled_while_after_call_hooks_run_keeps_its_result(env: Env) -> None:
    """The tool ran and returned; the caller was cancelled while an inner plugin's
    after_call (an audit write, say) still ran. Before: idempotency saw 'cancelled' and
    released the claim, so the replay ran the side-effecting tool a second time."""
    tool, runs = counting_tool()
    entered = anyio.Event()

    class SlowAudit:
        name, order = "slow_audit", 300  # its after_call runs before idempotency's

        @hookimpl
        async def after_call(self) -> None:
            if not entered.is_set():  # the first call only: it is cancelled here
                entered.set()
                await anyio.sleep(30)

    plugin = env.plugin()
    async with env.kernel([tool], [plugin, SlowAudit()]) as kernel:

        async def call() -> None:
            await kernel.call("send", {"to": "a"}, call_id="ca")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                await entered.wait()
            tg.cancel_scope.cancel()
        again = await kernel.call("send", {"to": "a"}, call_id="ca")
    assert len(runs) == 1
    assert again.meta.replayed and again.content == {"run": 1, "args": {"to": "a"}}
    assert plugin.counters.released == 0


async def test_a_call_cancelled_after_a_failed_attempt_is_not_cached_as_an_error(
    env: Env,
) -> None:
    """With cache_errors, a cancellation after an attempt ran (here: during the retry)
    still releases the claim: caching 'cancelled' would answer every replay with it."""
    gate = anyio.Event()
    runs: list[int] = []

    @tool
    async def send() -> dict[str, int]:
        """Fails once, then waits for the gate on its retry."""
        runs.append(1)
        if len(runs) == 1:
            raise ToolError("busy", kind="unavailable")
        if len(runs) == 2:
            await gate.wait()
        return {"ok": len(runs)}

    class RetryOnce:
        name, order = "retry_once", 400

        @hookimpl
        def on_error(self, error: Any) -> Any:
            return Retry(0) if error.kind == "unavailable" else None

    plugin = env.plugin(cache_errors=True)
    async with env.kernel([send], [plugin, RetryOnce()]) as kernel:

        async def call() -> None:
            await kernel.call("send", {}, call_id="cr")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                while len(runs) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert await kernel.state.get_entry(plugin.key_for("send", "cr")) is None
        assert plugin.counters.errors_cached == 0
        again = await kernel.call("send", {}, call_id="cr")
    assert not again.is_error and not again.meta.replayed and again.content == {"ok": 3}


async def test_oversized_result_leaves_a_marker_and_replays_get_an_error(env: Env) -> None:
    tool, runs = counting_tool(result={"blob": "x" * 500})
    plugin = env.plugin(max_result_bytes=100)
    async with env.kernel([tool], [plugin]) as kernel:
        first = await kernel.call("send", {}, call_id="big")
        replay = await kernel.call("send", {}, call_id="big")
        entry = await kernel.state.get_entry(plugin.key_for("send", "big"))
    assert len(runs) == 1
    assert first.content == {"blob": "x" * 500}  # the first caller still gets it
    assert first.meta.extra["idempotency"]["recorded"] is False  # and is told it is not kept
    assert first.meta.extra["idempotency"]["reason"] == "oversized"
    assert "over max_result_bytes (100)" in first.meta.extra["idempotency"]["message"]
    assert replay.is_error and replay.error is not None
    assert replay.error.kind == "conflict" and not replay.error.retryable
    assert replay.error.details["reason"] == "result_unavailable"
    assert replay.error.details["max_result_bytes"] == 100
    assert entry is not None and entry.value["s"] == "oversized" and "c" not in entry.value
    assert plugin.counters.oversized == 1 and plugin.counters.result_unavailable == 1


class _StampsADatetime:
    """A third-party plugin annotating results in place with a value JSON cannot hold."""

    name = "stamper"
    order = 450  # inside idempotency (200): its after_call runs first

    @hookimpl
    def after_call(self, result: ToolResult) -> None:
        result.content["checked_at"] = datetime.datetime(2026, 1, 1)


async def test_a_result_a_plugin_made_non_json_is_not_called_oversized_on_replay(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the replay answered "its result (-1 bytes) was not kept: it was larger than
    max_result_bytes (1048576) ... or raise plugins.idempotency.max_result_bytes" for a
    30-byte result a plugin's after_call had put a datetime into, and only an INFO line
    was logged: the operator was sent to a setting that cannot help."""
    tool, runs = counting_tool(result={"ok": 1})
    plugin = env.plugin()
    async with env.kernel([tool], [plugin, _StampsADatetime()]) as kernel:
        with caplog.at_level("INFO", logger="toolwire.idempotency"):
            first = await kernel.call("send", {}, call_id="dt")
        replay = await kernel.call("send", {}, call_id="dt")
    assert len(runs) == 1 and first.content["ok"] == 1  # the first caller still gets it
    assert first.meta.extra["idempotency"]["recorded"] is False
    [rec] = [r for r in caplog.records if "is not JSON" in r.getMessage()]
    assert rec.levelname == "WARNING"
    assert replay.is_error and replay.error is not None and replay.error.kind == "conflict"
    assert replay.error.details["reason"] == "result_unavailable"
    assert replay.error.details["not_json"] is True
    assert "its content was not JSON" in replay.error.message
    assert "-1 bytes" not in replay.error.message
    assert "max_result_bytes" not in replay.error.message


async def test_max_stored_bytes_bounds_what_a_window_of_ttl_keeps(env: Env) -> None:
    """Before: the store was bounded by time alone; one client sending large results with
    distinct call ids filled it for a whole ttl_secs (50 MB/s in a review's measurement)."""
    tool, runs = counting_tool(result={"blob": "x" * 400})
    plugin = env.plugin(max_stored_bytes=1200, ttl_secs=60)
    async with env.kernel([tool], [plugin]) as kernel:
        firsts = [await kernel.call("send", {}, call_id=f"c{i}") for i in range(4)]
        replays = [await kernel.call("send", {}, call_id=f"c{i}") for i in range(4)]
        entries = [await kernel.state.get_entry(plugin.key_for("send", f"c{i}")) for i in range(4)]
        if env.clock is not None:  # a later window has a budget of its own
            env.clock.advance(60)
            fresh = await kernel.call("send", {}, call_id="later")
            again = await kernel.call("send", {}, call_id="later")
            assert again.meta.replayed and again.content == fresh.content
    assert len(runs) == 4 + (env.clock is not None)  # nothing ran twice
    assert all(f.content == {"blob": "x" * 400} for f in firsts)  # every caller got its result
    assert [f.meta.extra.get("idempotency") is None for f in firsts] == [True] * 2 + [False] * 2
    assert "max_stored_bytes (1200) is spent" in firsts[3].meta.extra["idempotency"]["message"]
    kept = [r for r in replays if not r.is_error]
    assert len(kept) == 2 and all(r.meta.replayed for r in kept)  # ~590 bytes a record
    for r in replays[2:]:
        assert r.error is not None and r.error.kind == "conflict"
        assert r.error.details["reason"] == "result_unavailable"
        assert r.error.details["max_stored_bytes"] == 1200
        assert "max_stored_bytes (1200), was spent" in r.error.message
    assert [e is not None and e.value["s"] for e in entries] == ["done"] * 2 + ["oversized"] * 2
    assert all("c" not in e.value for e in entries[2:] if e is not None)  # the marker is small
    assert plugin.counters.over_budget == 2 and plugin.counters.result_unavailable == 2


async def test_store_failure_fail_closed_refuses_and_runs_nothing(env: Env) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        kernel.state.fail = {"set_if_absent_or_get"}  # type: ignore[attr-defined]
        result = await kernel.call("send", {}, call_id="s")
    assert runs == []
    assert result.error is not None and result.error.kind == "unavailable"
    assert result.error.retryable is True
    assert result.error.details == {"reason": "store_error", "backend": env.name}
    assert "injected failure" in result.error.message
    assert plugin.counters.store_errors == 1 and plugin.counters.fail_open == 0


@pytest.mark.parametrize("on_store_error", ["fail_closed", "fail_open"])
async def test_a_claim_whose_answer_was_lost_is_taken_back(env: Env, on_store_error: str) -> None:
    """The store wrote the claim, then failed (Redis: the connection broke before the
    reply, "may or may not have been applied"). Before, the claim stood, its owner gone:
    the retry of a call told "not run" (or run unprotected) found it in flight, and once
    its lease lapsed answered 'outcome unknown' for good."""
    tool, runs = counting_tool(result={"charged": 5})
    plugin = env.plugin(on_store_error=on_store_error, wait_secs=0)
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        store.fail_after = {"set_if_absent_or_get"}
        first = await kernel.call("send", {}, call_id="lost")
        store.fail_after = set()
        left = await store.get_entry(plugin.key_for("send", "lost"))
        again = await kernel.call("send", {}, call_id="lost")
        replay = await kernel.call("send", {}, call_id="lost")
    if on_store_error == "fail_closed":
        assert first.error is not None and first.error.kind == "unavailable"
        assert first.error.details["reason"] == "store_error"
    else:
        assert not first.is_error and first.meta.extra["idempotency"]["reason"] == "fail_open"
    assert left is None  # taken back
    assert not again.is_error and not again.meta.replayed
    assert replay.meta.replayed and replay.content == again.content == {"charged": 5}
    assert len(runs) == (1 if on_store_error == "fail_closed" else 2)


async def test_store_failure_fail_open_runs_unprotected_and_counts(env: Env) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin(on_store_error="fail_open")
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        kernel.state.fail = {"set_if_absent_or_get"}  # type: ignore[attr-defined]
        first = await kernel.call("send", {}, call_id="s")
        second = await kernel.call("send", {}, call_id="s")
        assert "compare_and_set" not in kernel.state.ops  # type: ignore[attr-defined]
    assert len(runs) == 2 and not first.is_error and not second.is_error
    assert plugin.counters.fail_open == 2


async def test_failing_to_save_the_result_still_returns_it(env: Env) -> None:
    tool, runs = counting_tool(result={"charged": 10})
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        kernel.state.fail = {"compare_and_set"}  # type: ignore[attr-defined]
        result = await kernel.call("send", {}, call_id="save")
        kernel.state.fail = set()  # type: ignore[attr-defined]
        entry = await kernel.state.get_entry(plugin.key_for("send", "save"))
    assert result.content == {"charged": 10} and not result.is_error
    assert result.meta.plugin_errors == []
    not_kept = result.meta.extra["idempotency"]  # the caller is told a replay will not get it
    assert not_kept["recorded"] is False and not_kept["reason"] == "store_error"
    assert "injected failure of compare_and_set" in not_kept["message"]
    assert len(runs) == 1
    assert plugin.counters.store_errors == 1
    assert entry is not None and entry.value["s"] == "pending"  # outcome unknown after the lease
    assert "still this call's claim" in not_kept["message"]  # read back: not applied
    assert "answers 'outcome unknown'" in not_kept["message"]


async def test_a_completing_write_whose_answer_was_lost_is_read_back(env: Env) -> None:
    """The store wrote the result, then failed (Redis: the connection broke before the
    reply, "may or may not have been applied"). Before, the caller was told the result
    was not kept and a replay would answer 'outcome unknown'; the replay got the result."""
    tool, runs = counting_tool(result={"charged": 10})
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        store.fail_after = {"compare_and_set"}
        result = await kernel.call("send", {}, call_id="lost")
        store.fail_after = set()
        assert store.ops[-1] == "get_entry"  # read back after the failed write
        replay = await kernel.call("send", {}, call_id="lost")
    assert result.content == {"charged": 10} and not result.is_error
    assert "idempotency" not in result.meta.extra  # kept: nothing to tell the caller
    assert replay.meta.replayed and replay.content == {"charged": 10}
    assert len(runs) == 1
    assert plugin.counters.store_errors == 1


@pytest.mark.parametrize("applied", [True, False])
async def test_a_completing_write_that_cannot_be_read_back_says_either_may_be(
    env: Env, applied: bool
) -> None:
    tool, runs = counting_tool(result={"charged": 10})
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        if applied:
            store.fail_after = {"compare_and_set"}
        else:
            store.fail = {"compare_and_set"}
        store.fail |= {"get_entry"}
        result = await kernel.call("send", {}, call_id="unknown")
        store.fail = store.fail_after = set()
        entry = await store.get_entry(plugin.key_for("send", "unknown"))
    assert result.content == {"charged": 10} and not result.is_error
    not_kept = result.meta.extra["idempotency"]
    assert not_kept["recorded"] is None and not_kept["reason"] == "store_error"
    message = not_kept["message"]
    assert "injected" in message and "injected failure of get_entry" in message
    assert "a replay gets this result if it was kept" in message
    assert "else, after lease_secs, answers 'outcome unknown'" in message
    assert entry is not None and entry.value["s"] == ("done" if applied else "pending")
    assert len(runs) == 1 and plugin.counters.store_errors == 1


async def test_a_release_whose_answer_was_lost_is_read_back(env: Env) -> None:
    """A failed call's claim was deleted, then the store failed: the replay runs the call
    again at once. Before, the caller was told a replay would answer 'outcome unknown'."""
    tool, runs = counting_tool(result=ToolError("card declined", kind="tool_error"))
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        store.fail_after = {"compare_and_delete"}
        first = await kernel.call("send", {}, call_id="gone")
        store.fail_after = set()
        again = await kernel.call("send", {}, call_id="gone")
    assert first.is_error and "idempotency" not in first.meta.extra
    assert again.is_error and not again.meta.replayed
    assert len(runs) == 2
    assert plugin.counters.released == 2 and plugin.counters.store_errors == 1


async def test_a_cancellation_during_the_completing_write_still_records_the_result(
    env: Env,
) -> None:
    """Before: the caller cancelled while the completing compare-and-set was on its way
    (a Redis round trip) left the claim pending, so the replay answered 'outcome
    unknown' for a call whose result had come back."""
    tool, runs = counting_tool(result={"charged": 10})
    plugin = env.plugin()
    writing = anyio.Event()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        inner_cas = store.compare_and_set

        async def slow_cas(key: str, value: Any, **kw: Any) -> Any:
            if value.get("s") == "done":
                writing.set()
                await anyio.sleep(0.2)  # the cancellation comes now
            return await inner_cas(key, value, **kw)

        store.compare_and_set = slow_cas  # type: ignore[method-assign]

        async def call() -> None:
            await kernel.call("send", {}, call_id="cw")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                await writing.wait()
            tg.cancel_scope.cancel()
        entry = await store.get_entry(plugin.key_for("send", "cw"))
        again = await kernel.call("send", {}, call_id="cw")
    assert entry is not None and entry.value["s"] == "done"
    assert len(runs) == 1
    assert again.meta.replayed and again.content == {"charged": 10}


async def test_a_completing_write_past_lease_secs_gives_up_and_says_so(env: Env) -> None:
    """The completing write is shielded but bounded by lease_secs: a store that never
    answers costs the caller at most that long (no time is left to read the key back), the
    caller still gets its result and is told it may not be kept, and the record stays
    pending (outcome unknown after the lease)."""
    tool, runs = counting_tool(result={"charged": 10})
    plugin = env.plugin(lease_secs=0.2)
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        store = kernel.state
        assert isinstance(store, CountingStore)
        inner_cas = store.compare_and_set

        async def hanging_cas(key: str, value: Any, **kw: Any) -> Any:
            if value.get("s") == "done":
                await anyio.sleep_forever()
            return await inner_cas(key, value, **kw)

        store.compare_and_set = hanging_cas  # type: ignore[method-assign]
        with anyio.fail_after(10):
            result = await kernel.call("send", {}, call_id="hang")
        store.compare_and_set = inner_cas  # type: ignore[method-assign]
        assert "get_entry" not in store.ops  # no time left: not read back
        entry = await store.get_entry(plugin.key_for("send", "hang"))
    assert not result.is_error and result.content == {"charged": 10}
    not_kept = result.meta.extra["idempotency"]
    assert not_kept["recorded"] is None and not_kept["reason"] == "store_error"
    assert "no answer within lease_secs (0.2s)" in not_kept["message"]
    assert "no time was left within lease_secs to read the key back" in not_kept["message"]
    assert "else, after lease_secs, answers 'outcome unknown'" in not_kept["message"]
    assert json.loads(json.dumps(result.meta.extra)) == result.meta.extra  # JSON-safe
    assert len(runs) == 1
    assert plugin.counters.store_errors == 1 and plugin.counters.lost_claims == 0
    assert entry is not None and entry.value["s"] == "pending"


async def test_failing_to_save_a_read_only_result_says_a_replay_runs_it_again(
    env: Env,
) -> None:
    """A read-only call's lapsed claim is taken over and run again, not answered
    'outcome unknown': the note telling the caller its result is not kept says so."""
    tool, runs = counting_tool(result={"rows": 1}, read_only=True)
    plugin = env.plugin()
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        kernel.state.fail = {"compare_and_set"}  # type: ignore[attr-defined]
        result = await kernel.call("send", {}, call_id="ro")
    assert not result.is_error and len(runs) == 1
    message = result.meta.extra["idempotency"]["message"]
    assert "outcome unknown" not in message
    assert "runs it again" in message


async def test_a_call_run_unprotected_after_a_store_failure_is_told_so(env: Env) -> None:
    """on_store_error = 'fail_open': the tool ran without a claim, so its result is not
    kept and a replay runs it again; the caller is told, as for any result not kept."""
    tool, runs = counting_tool()
    plugin = env.plugin(on_store_error="fail_open")
    async with env.kernel([tool], [plugin], counting=True) as kernel:
        kernel.state.fail = {"set_if_absent_or_get"}  # type: ignore[attr-defined]
        result = await kernel.call("send", {}, call_id="open")
        kernel.state.fail = set()  # type: ignore[attr-defined]
        fine = await kernel.call("send", {}, call_id="fine")
    assert not result.is_error and len(runs) == 2
    not_kept = result.meta.extra["idempotency"]
    assert not_kept["recorded"] is False and not_kept["reason"] == "fail_open"
    assert "injected failure of set_if_absent_or_get" in not_kept["message"]
    assert "idempotency" not in fine.meta.extra


# -- plugins around it -------------------------------------------------------------


async def test_replay_skips_later_plugins_but_every_after_call_sees_it(env: Env) -> None:
    log: list[tuple[str, str, str]] = []
    seen: list[tuple[str, bool]] = []

    class SeeResults:
        name, order = "see", 100  # like profiling: outside idempotency

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            seen.append(("see", result.meta.replayed))

    tool, runs = counting_tool()
    plugins = [
        RecordingPlugin("profiling-like", 100, log),
        RecordingPlugin("approval-like", 300, log),
        SeeResults(),
        env.plugin(),
    ]
    async with env.kernel([tool], plugins) as kernel:
        await kernel.call("send", {}, call_id="p")
        first_log = list(log)
        log.clear()
        await kernel.call("send", {}, call_id="p")
    assert len(runs) == 1
    assert ("approval-like", "before_call", "send") in first_log
    assert log == [
        ("profiling-like", "before_call", "send"),
        ("approval-like", "after_call", "send"),  # after_call runs for every plugin...
        ("profiling-like", "after_call", "send"),
    ]  # ...but approval's before_call did not: a replay is never approved again
    assert seen == [("see", False), ("see", True)]


async def test_audit_plugin_records_the_replay(env: Env, tmp_path: Any) -> None:
    from toolwire_audit import AuditConfig, AuditPlugin

    path = tmp_path / "audit.jsonl"
    tool, _ = counting_tool()
    audit = AuditPlugin(AuditConfig(path=str(path)))
    async with env.kernel([tool], [audit, env.plugin()]) as kernel:
        first = await kernel.call("send", {}, call_id="a1")
        await kernel.call("send", {}, call_id="a1")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["replayed"] for line in lines] == [False, True]
    assert lines[1]["ts"] == first.meta.started_at  # the original timestamp
    assert lines[1]["attempts"] == 0


async def test_approval_recorded_on_the_first_call_is_replayed(env: Env) -> None:
    class Approve:
        name, order = "approval", 300
        asked = 0

        @hookimpl
        def before_call(self, ctx: CallContext) -> None:
            Approve.asked += 1
            ctx.meta.approval = {"by": "alice", "decision": "approved"}

    tool, _ = counting_tool()
    async with env.kernel([tool], [Approve(), env.plugin()]) as kernel:
        await kernel.call("send", {}, call_id="ap")
        replay = await kernel.call("send", {}, call_id="ap")
    assert Approve.asked == 1
    assert replay.meta.approval == {"by": "alice", "decision": "approved"}


async def test_denied_call_is_released_even_with_cache_errors(env: Env) -> None:
    from toolwire import CallRejected

    class Deny:
        name, order = "approval", 300
        deny = True

        @hookimpl
        def before_call(self) -> None:
            if Deny.deny:
                raise CallRejected("denied", "not now")

    tool, runs = counting_tool()
    async with env.kernel([tool], [Deny(), env.plugin(cache_errors=True)]) as kernel:
        denied = await kernel.call("send", {}, call_id="d")
        Deny.deny = False
        ok = await kernel.call("send", {}, call_id="d")
    assert denied.error is not None and denied.error.kind == "denied"
    assert not ok.is_error and len(runs) == 1


# -- TTL ---------------------------------------------------------------------------


async def test_ttl_boundary_follows_the_kernel_clock(env: Env) -> None:
    tool, runs = counting_tool()
    if env.clock is None:  # Redis expires records on the server's clock: real time, smaller
        ttl, before, after = 0.6, 0.4, 0.35
    else:  # memory/SQLite follow the kernel's (fake) clock: exact boundary
        ttl, before, after = 100.0, 99.9, 0.2
    plugin = env.plugin(ttl_secs=ttl)
    async with env.kernel([tool], [plugin]) as kernel:
        await kernel.call("send", {}, call_id="ttl")
        if env.clock is not None:
            env.clock.advance(before)
        else:
            await anyio.sleep(before)
        assert (await kernel.call("send", {}, call_id="ttl")).meta.replayed
        if env.clock is not None:
            env.clock.advance(after)  # 100.1 s after completion: expired
        else:
            await anyio.sleep(after)
        fresh = await kernel.call("send", {}, call_id="ttl")
        assert not fresh.meta.replayed
        assert (await kernel.call("send", {}, call_id="ttl")).meta.replayed
    assert len(runs) == 2


async def test_ttl_from_the_environment_on_real_time(env: Env) -> None:
    from toolwire_idempotency import IdempotencyConfig

    if env.clock is not None:
        env.clock = None  # real time for this one
    tool, runs = counting_tool()
    plugin = IdempotencyPlugin(
        IdempotencyConfig(prefix=env.prefix), env={"TOOL_IDEMPOTENCY_TTL_SECS": "0.3"}
    )
    assert plugin.config.ttl_secs == 0.3
    async with env.kernel([tool], [plugin]) as kernel:
        await kernel.call("send", {}, call_id="rt")
        assert (await kernel.call("send", {}, call_id="rt")).meta.replayed
        await anyio.sleep(0.45)
        assert not (await kernel.call("send", {}, call_id="rt")).meta.replayed
    assert len(runs) == 2


# -- forget ------------------------------------------------------------------------


async def test_forget_lets_the_call_run_again(env: Env) -> None:
    tool, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool], [plugin]) as kernel:
        await kernel.call("send", {}, call_id="fg", tenant="x")
        assert await plugin.forget("send", "fg", tenant="x") is True
        assert await plugin.forget("send", "fg", tenant="x") is False
        await kernel.call("send", {}, call_id="fg", tenant="x")
    assert len(runs) == 2


async def test_fake_tool_from_the_test_kit(env: Env) -> None:
    fake = FakeTool(name="kit", script=[{"n": 1}, {"n": 2}])
    async with env.kernel([fake.tool], [env.plugin()]) as kernel:
        a = await kernel.call("kit", {"q": 1}, call_id="k")
        b = await kernel.call("kit", {"q": 1}, call_id="k")
    assert a.content == b.content == {"n": 1} and len(fake.calls) == 1


async def test_a_replayed_image_file_result_is_still_vouched_for(env: Env, tmp_path: Any) -> None:
    """The kernel marks results made from ``toolwire.Image(path=...)``; a replay keeps the mark,
    so ``toolwire serve`` sends the image on a replay as on the first call."""
    runs: list[int] = []

    @tool
    def plot() -> Image:
        """A plot."""
        runs.append(1)
        return Image(path=tmp_path / "p.png")

    @tool
    def plain() -> dict[str, Any]:
        """An img_path given as data."""
        return {"img_path": str(tmp_path / "p.png")}

    async with env.kernel([plot, plain], [env.plugin()]) as kernel:
        first = await kernel.call("plot", {}, call_id="i1")
        replay = await kernel.call("plot", {}, call_id="i1")
        data = await kernel.call("plain", {}, call_id="i2")
        data_replay = await kernel.call("plain", {}, call_id="i2")
    assert len(runs) == 1 and replay.meta.replayed
    assert first.meta.extra[IMAGE_FILE_EXTRA] == str(tmp_path / "p.png")
    assert replay.meta.extra[IMAGE_FILE_EXTRA] == first.meta.extra[IMAGE_FILE_EXTRA]
    assert IMAGE_FILE_EXTRA not in data.meta.extra
    assert IMAGE_FILE_EXTRA not in data_replay.meta.extra


@pytest.mark.parametrize(
    "record",
    [
        {"req": "x", "s": "done"},  # no content
        {"req": "x", "s": "done", "c": [1, 2]},  # content that is not an object
        {"req": "x", "s": "done", "c": {}, "e": "boom"},
        {"req": "x", "s": "done", "c": {}, "d": "slow"},
        {"req": "x", "s": "pending"},  # no lease
        {"req": "x", "s": "pending", "lease": "soon"},
        ["not", "a", "record"],
    ],
    ids=["no-c", "c-list", "e-str", "d-str", "no-lease", "lease-str", "list"],
)
async def test_a_damaged_record_is_a_corrupt_record_error_naming_the_key(
    env: Env, record: Any
) -> None:
    """Before: bare KeyError / ValueError / AttributeError messages, and a stored list
    replayed as content=[1, 2], breaking "content is always a JSON object"."""
    tool_, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool_], [plugin]) as kernel:
        key = plugin.key_for("send", "dmg")
        first = await kernel.call("send", {}, call_id="dmg")  # learn this call's req hash
        entry = await kernel.state.get_entry(key)
        assert entry is not None and not first.is_error
        if isinstance(record, dict):
            record = {**record, "req": entry.value["req"]}
        await kernel.state.set(key, record)
        r = await kernel.call("send", {}, call_id="dmg")
    assert r.error is not None and r.error.kind == "internal", r
    assert r.error.details["reason"] == "corrupt_record" and r.error.details["key"] == key
    assert key in r.error.message and "not an idempotency record" in r.error.message
    assert len(runs) == 1  # not run again


@pytest.mark.parametrize("env", ["sqlite", "redis"], indirect=True)  # memory holds only ours
async def test_data_toolwire_did_not_write_is_a_corrupt_record_not_an_outage(env: Env) -> None:
    """Text that is not JSON under the key, or (Redis) a key of another data type: before,
    a bare JSONDecodeError inside an 'internal: plugin failed' error, and a WRONGTYPE
    reported as a retryable 'unavailable' that no retry could ever fix."""
    tool_, runs = counting_tool()
    plugin = env.plugin()
    async with env.kernel([tool_], [plugin]) as kernel:
        key = plugin.key_for("send", "raw")
        other = plugin.key_for("send", "typed")
        if env.name == "sqlite":
            import sqlite3

            db = sqlite3.connect(env.url[len("sqlite:///") :])
            db.execute(
                "INSERT OR REPLACE INTO toolwire_state (key, value, version, owner, expires_at) "
                "VALUES (?, ?, 1, NULL, NULL)",
                (key, "{not json"),
            )
            db.commit()
            db.close()
            cases = [key]
        else:
            import redis

            client = redis.Redis.from_url(env.url)
            client.hset(key, mapping={"v": "{not json", "ver": "1"})
            client.set(other, "plain")
            # a hash without toolwire's fields: before, 'unavailable' (and fail_open ran it)
            foreign = plugin.key_for("send", "foreign")
            client.hset(foreign, mapping={"something": "else"})
            client.close()
            cases = [key, other, foreign]
        for k, call_id in zip(cases, ("raw", "typed", "foreign"), strict=False):
            r = await kernel.call("send", {}, call_id=call_id)
            assert r.error is not None and r.error.kind == "internal", r.error
            assert r.error.details["reason"] == "corrupt_record"
            assert not r.error.retryable
            assert k in r.error.message, r.error.message
    assert runs == []
