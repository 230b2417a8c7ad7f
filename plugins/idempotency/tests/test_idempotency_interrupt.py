"""``unknown_after_interrupt``: a side-effecting call cut by a timeout or a cancellation
while it ran keeps its record, and a replay answers "outcome unknown" as for a dead owner.

Off by default: such a call's claim is released and a replay runs the tool again
(test_idempotency_plugin.py checks that default). On memory, SQLite and a real Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from toolwire import Kernel, Retry, ToolError, ToolResult, hookimpl, tool
from toolwire.state import StateStoreError
from toolwire.testing import FakeClock
from toolwire_idempotency import IdempotencyPlugin

from .conftest import CountingStore, Env, counting_tool

pytestmark = pytest.mark.anyio


async def wait_until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The plugin's warnings (not the one about a memory store)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "keeps its records in memory" not in r.getMessage()
    ]


def kernel_on(env: Env, store: CountingStore, tools: list[Any], plugins: list[Any]) -> Kernel:
    kernel = Kernel(tools=tools, plugins=plugins, state=store, clock=env.clock)
    env.kernels.append(kernel)
    return kernel


async def cancel_once_running(kernel: Kernel, runs: list[Any], call_id: str, **kw: Any) -> None:
    """Call ``send`` and cancel the caller once the tool has run (and waits)."""

    async def call() -> None:
        await kernel.call("send", {"to": "bob"}, call_id=call_id, **kw)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await wait_until(lambda: runs)
        tg.cancel_scope.cancel()


def assert_outcome_unknown(result: ToolResult, interrupted: str) -> None:
    assert result.error is not None, result.content
    assert result.error.kind == "conflict" and not result.error.retryable
    details = result.error.details
    assert details["reason"] == "outcome_unknown"
    assert details["interrupted"] == interrupted
    assert isinstance(details["interrupted_at"], float)
    message = result.error.message
    what = {
        "timeout": "timed out while it ran",
        "lost": "lost its connection while it ran",
    }.get(interrupted, "was cancelled while it ran")
    assert "outcome unknown" in message and what in message, message
    assert "unknown_after_interrupt" in message and "forget(" in message, message


# -- cancellation ------------------------------------------------------------------


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
async def test_an_async_tool_cancelled_after_its_side_effect(env: Env, on: bool) -> None:
    """The tool sent the email, then was cancelled at its next await. Before (and with
    the option off): the claim was released and the replay sent it again."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin = env.plugin(unknown_after_interrupt=on)
    async with env.kernel([tool_], [plugin]) as kernel:
        await cancel_once_running(kernel, runs, "c1")
        replay = await kernel.call("send", {"to": "bob"}, call_id="c1")
        if on:
            again = await kernel.call("send", {"to": "bob"}, call_id="c1")
            assert await plugin.forget("send", "c1")  # the user checked: not sent
            after_forget = await kernel.call("send", {"to": "bob"}, call_id="c1")
    if not on:
        assert len(runs) == 2 and not replay.is_error and not replay.meta.replayed
        assert plugin.counters.released == 1 and plugin.counters.interrupted == 0
        return
    for res in (replay, again):
        assert_outcome_unknown(res, "cancelled")
        assert "attempt 1" in res.error.message  # type: ignore[union-attr]
    assert not after_forget.is_error and len(runs) == 2
    assert plugin.counters.interrupted == 1 and plugin.counters.released == 0
    assert plugin.counters.outcome_unknown == 2


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
async def test_a_call_that_lost_its_connection_mid_call(env: Env, on: bool) -> None:
    """An upstream that crashed after the request went out (``details.in_flight``: the
    mcp plugin's "connection lost during the call") leaves the outcome unknown as a
    timeout does. Before: released even with the option on, and the replay ran again."""
    runs: list[int] = []

    @tool(name="send")
    def send(to: str) -> dict[str, Any]:
        runs.append(1)
        if len(runs) == 1:
            raise ToolError(
                "the connection was lost during the call; the outcome is unknown",
                kind="unavailable",
                details={"in_flight": True},
            )
        return {"sent": to}

    plugin = env.plugin(unknown_after_interrupt=on)
    async with env.kernel([send], [plugin]) as kernel:
        first = await kernel.call("send", {"to": "bob"}, call_id="lost")
        replay = await kernel.call("send", {"to": "bob"}, call_id="lost")
    assert first.error is not None and first.error.kind == "unavailable"
    if not on:
        assert len(runs) == 2 and replay.content == {"sent": "bob"}
        return
    assert len(runs) == 1
    assert_outcome_unknown(replay, "lost")
    # nothing was sent (in_flight false): an outage, released as before
    refused = ToolError("refused", kind="unavailable", details={"in_flight": False})
    tries: list[int] = []

    @tool(name="post")
    def post(to: str) -> dict[str, Any]:
        tries.append(1)
        if len(tries) == 1:
            raise refused
        return {"posted": to}

    async with env.kernel([post], [env.plugin(unknown_after_interrupt=True)]) as kernel:
        await kernel.call("post", {"to": "bob"}, call_id="refused")
        again = await kernel.call("post", {"to": "bob"}, call_id="refused")
    assert len(tries) == 2 and again.content == {"posted": "bob"}


async def test_a_timeout_before_the_request_was_sent_is_released(env: Env) -> None:
    """A timeout whose error says nothing was sent (``in_flight`` false: the mcp plugin's
    "timed out waiting for a connection; the request was not sent") is no unknown
    outcome. Before: counted as one, so the replay answered "outcome unknown"."""
    tries: list[int] = []

    @tool(name="post")
    def post(to: str) -> dict[str, Any]:
        tries.append(1)
        if len(tries) == 1:
            raise ToolError(
                "timed out waiting for a connection; the request was not sent",
                kind="timeout",
                details={"in_flight": False},
            )
        return {"posted": to}

    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([post], [plugin]) as kernel:
        first = await kernel.call("post", {"to": "bob"}, call_id="unsent")
        again = await kernel.call("post", {"to": "bob"}, call_id="unsent")
    assert first.error is not None and first.error.kind == "timeout"
    assert len(tries) == 2 and again.content == {"posted": "bob"}
    assert plugin.counters.interrupted == 0


async def test_a_waiting_duplicate_is_answered_outcome_unknown(env: Env) -> None:
    """A duplicate waiting for the original when it is cancelled does not run it."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin]) as kernel:
        got: list[ToolResult] = []

        async def original() -> None:
            await kernel.call("send", {"to": "bob"}, call_id="w")

        async def duplicate() -> None:
            got.append(await kernel.call("send", {"to": "bob"}, call_id="w"))

        async with anyio.create_task_group() as outer, anyio.create_task_group() as tg:
            tg.start_soon(original)
            await wait_until(lambda: runs)
            outer.start_soon(duplicate)
            await wait_until(lambda: plugin.counters.waits == 1)
            tg.cancel_scope.cancel()
        (dup,) = got
    assert len(runs) == 1
    assert_outcome_unknown(dup, "cancelled")


async def test_a_call_cancelled_while_waiting_for_approval_is_released(env: Env) -> None:
    """The tool never started: there is nothing unknown, the replay runs it."""
    waiting = anyio.Event()
    hold: list[bool] = [True]

    class Approval:
        name, order = "approval", 300

        @hookimpl
        async def before_call(self) -> None:
            if hold[0]:
                waiting.set()
                await anyio.sleep(3600)

    tool_, runs = counting_tool()
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin, Approval()]) as kernel:

        async def call() -> None:
            await kernel.call("send", {"to": "bob"}, call_id="ap")

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await waiting.wait()
            tg.cancel_scope.cancel()
        assert await kernel.state.get_entry(plugin.key_for("send", "ap")) is None
        hold[0] = False
        replay = await kernel.call("send", {"to": "bob"}, call_id="ap")
    assert runs == [{"to": "bob"}] and not replay.is_error and not replay.meta.replayed
    assert plugin.counters.released == 1 and plugin.counters.interrupted == 0


async def test_a_call_cancelled_while_marked_not_started_is_released(env: Env) -> None:
    """Held in before_call past lease_secs / 4, the record is marked "not started" by the
    renewal: a cancellation then is still a release, not an outcome unknown."""
    tool_, runs = counting_tool()
    plugin = env.plugin(unknown_after_interrupt=True, lease_secs=0.2)

    class Hold:
        name, order = "hold", 300

        @hookimpl
        async def before_call(self) -> None:
            await anyio.sleep(3600)

    async with env.kernel([tool_], [plugin, Hold()]) as kernel:

        async def call() -> None:
            await kernel.call("send", {}, call_id="parked")

        async def tick() -> None:  # renewals are due on the kernel's clock
            while env.clock is not None:
                env.clock.advance(0.05)
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            tg.start_soon(tick)
            await wait_until(lambda: any(c.parked for c in plugin._active.values()))
            await wait_until(lambda: plugin.counters.renewals >= 1)  # the record says so
            tg.cancel_scope.cancel()
        assert await kernel.state.get_entry(plugin.key_for("send", "parked")) is None
    assert runs == [] and plugin.counters.released == 1


async def test_a_failure_in_before_call_is_released(env: Env) -> None:
    class Broken:
        name, order = "broken", 300

        @hookimpl
        def before_call(self) -> None:
            raise RuntimeError("boom")

    tool_, runs = counting_tool()
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin, Broken()]) as kernel:
        res = await kernel.call("send", {}, call_id="b")
        assert res.error is not None and res.error.kind == "internal"
        assert await kernel.state.get_entry(plugin.key_for("send", "b")) is None
    assert runs == [] and plugin.counters.released == 1


# -- timeouts ----------------------------------------------------------------------


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
async def test_a_sync_tool_timing_out_while_its_thread_finishes(env: Env, on: bool) -> None:
    """The kernel gives up after 0.2 s; the tool's thread runs on and charges the card.
    Before (and with the option off): the replay charged it a second time."""
    charged: list[int] = []
    finished = threading.Event()

    @tool(timeout=0.2)
    def charge(amount: int) -> dict[str, int]:
        """Charges a card; slow the first time."""
        first = not charged
        charged.append(amount)
        if first:
            time.sleep(0.6)
            finished.set()
        return {"charged": len(charged)}

    plugin = env.plugin(unknown_after_interrupt=on)
    async with env.kernel([charge], [plugin]) as kernel:
        first = await kernel.call("charge", {"amount": 5}, call_id="t1")
        await anyio.to_thread.run_sync(finished.wait, 10)  # the thread ran on and finished
        replay = await kernel.call("charge", {"amount": 5}, call_id="t1")
    assert first.error is not None and first.error.kind == "timeout"
    if not on:
        assert charged == [5, 5] and not replay.is_error
        assert "idempotency" not in first.meta.extra
        return
    assert charged == [5]
    assert_outcome_unknown(replay, "timeout")
    assert "thread" in replay.error.message  # type: ignore[union-attr]
    told = first.meta.extra["idempotency"]  # the caller of the first call is told too
    assert told["recorded"] is False and told["reason"] == "outcome_unknown"
    assert "timed out while it ran" in told["message"]
    assert plugin.counters.interrupted == 1 and plugin.counters.released == 0


async def test_the_calls_deadline_cutting_a_running_attempt_counts(env: Env) -> None:
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin]) as kernel:
        first = await kernel.call("send", {}, call_id="dl", timeout=0.2)
        replay = await kernel.call("send", {}, call_id="dl")
    assert first.error is not None and first.error.kind == "timeout"
    assert len(runs) == 1
    assert_outcome_unknown(replay, "timeout")


async def test_a_timeout_the_tool_reports_itself_counts(env: Env) -> None:
    """An MCP server or an HTTP API that did not answer in time: the request may have
    been carried out all the same."""
    tool_, runs = counting_tool(result=ToolError("upstream did not answer", kind="timeout"))
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin]) as kernel:
        first = await kernel.call("send", {}, call_id="up")
        replay = await kernel.call("send", {}, call_id="up")
    assert first.error is not None and first.error.kind == "timeout"
    assert len(runs) == 1
    assert_outcome_unknown(replay, "timeout")


async def test_a_deadline_spent_before_the_tool_started_is_released(env: Env) -> None:
    """A later plugin's before_call (an approval) used up the call's deadline: the kernel
    ends the call with `timeout` without starting the tool. Nothing is unknown."""

    class SlowApproval:
        name, order = "approval", 300

        @hookimpl
        async def before_call(self) -> None:
            if env.clock is not None:
                env.clock.advance(1.0)  # the kernel's deadline follows the fake clock
            else:
                await anyio.sleep(0.5)

    tool_, runs = counting_tool()
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin, SlowApproval()]) as kernel:
        first = await kernel.call("send", {}, call_id="late", timeout=0.3)
        assert first.error is not None and first.error.kind == "timeout"
        assert "before the attempt started" in first.error.message  # the kernel's wording
        assert await kernel.state.get_entry(plugin.key_for("send", "late")) is None
        replay = await kernel.call("send", {}, call_id="late")
    assert runs == [{}] and not replay.is_error and not replay.meta.replayed
    assert plugin.counters.released == 1 and plugin.counters.interrupted == 0


class RetryTimeouts:
    """Retries a timed-out attempt at once (as the retry plugin does for a tool that is
    safe to repeat), and an `unavailable` one."""

    name, order = "retry_timeouts", 500

    @hookimpl
    def on_error(self, error: Any) -> Any:
        return Retry(0) if error.kind in ("timeout", "unavailable") else None


async def test_a_timed_out_attempt_retried_to_success_stores_the_success(env: Env) -> None:
    outcomes: list[Any] = ["hang", {"ok": True}]
    runs: list[int] = []

    @tool(timeout=0.2)
    async def send() -> Any:
        """Hangs the first time, then answers."""
        runs.append(1)
        outcome = outcomes.pop(0)
        if outcome == "hang":
            await anyio.sleep(3600)
        return outcome

    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([send], [plugin, RetryTimeouts()]) as kernel:
        first = await kernel.call("send", {}, call_id="rs")
        replay = await kernel.call("send", {}, call_id="rs")
    assert not first.is_error and first.content == {"ok": True}
    assert [a.error_kind for a in first.meta.attempts] == ["timeout", None]
    assert "idempotency" not in first.meta.extra  # kept as usual
    assert replay.meta.replayed and replay.content == {"ok": True}
    assert len(runs) == 2
    assert plugin.counters.interrupted == 0 and plugin.counters.released == 0


async def test_the_retry_plugin_retrying_a_timeout_to_success_stores_the_success(
    env: Env,
) -> None:
    """The first-party ratelimit + retry plugins: a timeout of a tool safe to repeat
    (idempotentHint) is retried within the call; the success is what replays get."""
    from toolwire_ratelimit import RateLimitPlugin
    from toolwire_retry import RetryConfig, RetryPlugin

    runs: list[int] = []

    @tool(timeout=0.2, idempotent=True)
    async def send() -> dict[str, int]:
        """Hangs the first time, then answers."""
        runs.append(1)
        if len(runs) == 1:
            await anyio.sleep(3600)
        return {"ok": len(runs)}

    plugin = env.plugin(unknown_after_interrupt=True)
    plugins = [plugin, RateLimitPlugin(), RetryPlugin(RetryConfig(base_s=0.01, cap_s=0.05))]
    async with env.kernel([send], plugins) as kernel:
        first = await kernel.call("send", {}, call_id="rp")
        replay = await kernel.call("send", {}, call_id="rp")
    assert [(a.error_kind, a.decision) for a in first.meta.attempts] == [
        ("timeout", "retry"),
        (None, None),
    ]
    assert not first.is_error and first.content == {"ok": 2}
    assert replay.meta.replayed and replay.content == {"ok": 2} and len(runs) == 2
    assert plugin.counters.interrupted == 0


async def test_a_timed_out_attempt_retried_to_a_failure_leaves_the_outcome_unknown(
    env: Env,
) -> None:
    """The second attempt failed for sure, but the first may have taken effect."""
    runs: list[int] = []

    @tool(timeout=0.2)
    async def send() -> Any:
        """Hangs the first time, then fails."""
        runs.append(1)
        if len(runs) == 1:
            await anyio.sleep(3600)
        raise ToolError("busy", kind="unavailable")

    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([send], [plugin, RetryTimeouts()], max_attempts=2) as kernel:
        first = await kernel.call("send", {}, call_id="rf")
        replay = await kernel.call("send", {}, call_id="rf")
    assert first.error is not None and first.error.kind == "unavailable"
    assert [a.error_kind for a in first.meta.attempts] == ["timeout", "unavailable"]
    assert len(runs) == 2  # the replay did not run it
    assert_outcome_unknown(replay, "timeout")
    assert "attempt 1" in replay.error.message  # type: ignore[union-attr]


@pytest.mark.parametrize("retryable", [False, True], ids=["terminal", "retryable"])
async def test_cache_errors_keeps_a_terminal_timeout_as_before(env: Env, retryable: bool) -> None:
    """cache_errors wins for a terminal timeout (the error is replayed); a timeout
    classified retryable is never cached, so the option decides."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate)

    class Classify:
        name, order = "classify", 400

        @hookimpl
        def on_error(self, error: Any) -> None:
            error.retryable = retryable

    plugin = env.plugin(unknown_after_interrupt=True, cache_errors=True)
    async with env.kernel([tool_], [plugin, Classify()]) as kernel:
        first = await kernel.call("send", {}, call_id="ce", timeout=0.2)
        replay = await kernel.call("send", {}, call_id="ce")
    assert first.error is not None and first.error.kind == "timeout"
    assert len(runs) == 1
    if retryable:
        assert_outcome_unknown(replay, "timeout")
    else:
        assert replay.meta.replayed and replay.error is not None
        assert replay.error.to_dict() == first.error.to_dict()
        assert plugin.counters.errors_cached == 1 and plugin.counters.interrupted == 0


# -- which tools -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["timeout", "cancelled"])
async def test_a_read_only_tool_is_not_affected(env: Env, how: str) -> None:
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True, read_only=True)
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin]) as kernel:
        if how == "timeout":
            first = await kernel.call("send", {"to": "bob"}, call_id="ro", timeout=0.2)
            assert first.error is not None and first.error.kind == "timeout"
        else:
            await cancel_once_running(kernel, runs, "ro")
        assert await kernel.state.get_entry(plugin.key_for("send", "ro")) is None
        replay = await kernel.call("send", {"to": "bob"}, call_id="ro")
    assert not replay.is_error and not replay.meta.replayed and len(runs) == 2  # ran again
    assert plugin.counters.interrupted == 0 and plugin.counters.released == 1


@pytest.mark.parametrize(
    ("config", "setting", "kept"),
    [
        ({"unknown_after_interrupt_tools": ["send"]}, None, True),
        ({"unknown_after_interrupt_tools": ["other"]}, None, False),
        ({}, {"unknown_after_interrupt": True}, True),
        ({"unknown_after_interrupt": True}, {"unknown_after_interrupt": False}, False),
        ({"unknown_after_interrupt": True}, {}, True),
        ({"unknown_after_interrupt": True}, True, True),
        ({"unknown_after_interrupt_tools": ["send"]}, {"unknown_after_interrupt": False}, True),
    ],
    ids=[
        "listed",
        "another-listed",
        "own-setting-on",
        "own-setting-off-wins-over-global",
        "own-table-without-the-key",
        "own-setting-true",
        "list-wins-over-own-setting",
    ],
)
async def test_per_tool_override(
    env: Env, config: dict[str, Any], setting: Any, kept: bool
) -> None:
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    if setting is not None:
        tool_.settings = {"idempotency": setting}
    plugin = env.plugin(**config)
    async with env.kernel([tool_], [plugin]) as kernel:
        await cancel_once_running(kernel, runs, "p")
        replay = await kernel.call("send", {"to": "bob"}, call_id="p")
    assert plugin.unknown_after_interrupt(tool_) is kept
    if kept:
        assert_outcome_unknown(replay, "cancelled")
        assert len(runs) == 1
    else:
        assert not replay.is_error and len(runs) == 2


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("no", "is str 'no'"),
        ({"unknown_after_interupt": True}, "unknown key(s) 'unknown_after_interupt'"),
        ({"unknown_after_interrupt": "yes"}, "unknown_after_interrupt = 'yes'"),
    ],
    ids=["not-a-table", "misspelt-key", "not-a-bool"],
)
async def test_a_bad_tool_setting_is_a_config_error_and_nothing_runs(
    env: Env, setting: Any, words: str
) -> None:
    tool_, runs = counting_tool()
    tool_.settings = {"idempotency": setting}
    async with env.kernel([tool_], [env.plugin()], counting=True) as kernel:
        res = await kernel.call("send", {}, call_id="bad")
        assert kernel.state.ops == []  # type: ignore[attr-defined]
    assert runs == []
    assert res.error is not None and res.error.kind == "config_error", res.error
    assert res.error.details == {"reason": "bad_tool_setting", "setting": "idempotency"}
    assert "'send'" in res.error.message and words in res.error.message, res.error.message


# -- the store ---------------------------------------------------------------------


async def test_a_store_failure_keeping_the_record_is_counted_and_logged(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    class FailKeep(CountingStore):
        async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
            if isinstance(value, dict) and "i" in value:
                raise StateStoreError("injected failure of the record keeping")
            return await super().compare_and_set(key, value, **kw)

    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin = env.plugin(unknown_after_interrupt=True, lease_secs=0.3)
    caplog.set_level(logging.WARNING, "toolwire.idempotency")
    async with kernel_on(env, FailKeep(env.store()), [tool_], [plugin]) as kernel:
        first = await kernel.call("send", {}, call_id="sf", timeout=0.2)
        if env.clock is not None:
            env.clock.advance(1.0)  # the claim lapses with its lease
        else:
            await anyio.sleep(0.5)
        replay = await kernel.call("send", {}, call_id="sf")
    assert plugin.counters.store_errors == 1 and plugin.counters.interrupted == 0
    told = first.meta.extra["idempotency"]
    assert told["reason"] == "store_error" and "outcome unknown" in told["message"]
    (warning,) = warnings(caplog)
    assert "'send'" in warning and "'sf'" in warning and "timed out" in warning
    assert "injected failure" in warning
    # the claim lapsed as a dead owner's: still never run again
    assert replay.error is not None and replay.error.details["reason"] == "outcome_unknown"
    assert len(runs) == 1


async def test_keeping_a_cancelled_call_stays_within_the_kernels_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The kernel gives a cancelled call's after_call hooks a few seconds; a store that
    does not answer the write must not hold the cancellation for lease_secs (60 s).
    (On memory only: the bound does not depend on the backend.)"""
    env = Env("memory", "memory://", "bound", FakeClock())
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin = env.plugin(unknown_after_interrupt=True, lease_secs=60)
    caplog.set_level(logging.WARNING, "toolwire.idempotency")

    class Hanging(CountingStore):
        hang = False

        async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
            if self.hang:
                await anyio.sleep(3600)
            return await super().compare_and_set(key, value, **kw)

    store = Hanging(env.store())
    async with kernel_on(env, store, [tool_], [plugin]) as kernel:

        async def call() -> None:
            await kernel.call("send", {}, call_id="hb")

        with anyio.fail_after(30):  # 60 s without the bound
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_until(lambda: runs)
                store.hang = True
                tg.cancel_scope.cancel()
        store.hang = False
    assert plugin.counters.store_errors == 1 and plugin.counters.interrupted == 0
    (warning,) = warnings(caplog)
    assert "after_call hooks of a cancelled call" in warning, warning


async def test_the_record_is_a_lapsed_ownerless_claim_saying_why(env: Env) -> None:
    """What a replay (or an older toolwire-idempotency) reads: a pending claim whose
    lease has lapsed, as a dead owner's; a lease renewal cannot revive it."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin = env.plugin(unknown_after_interrupt=True)
    async with env.kernel([tool_], [plugin]) as kernel:
        t0 = kernel.clock.time()
        await cancel_once_running(kernel, runs, "rec")
        entry = await kernel.state.get_entry(plugin.key_for("send", "rec"))
    assert entry is not None and entry.owner is None
    value = entry.value
    assert value["s"] == "pending" and value["lease"] >= t0 and "w" not in value
    assert value["i"]["why"] == "cancelled" and value["i"]["attempt"] == 1
    assert t0 <= value["i"]["at"] <= value["lease"]


async def test_a_read_only_replay_takes_over_a_kept_record(env: Env) -> None:
    """Another process configured with the tool read-only re-runs it, as after a dead
    owner (the record names no owner; the take-over compares the version)."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True)
    plugin_a = env.plugin(unknown_after_interrupt=True)
    plugin_b = env.plugin(read_only_tools=["send"])
    async with env.kernel([tool_], [plugin_a]) as ka, env.kernel([tool_], [plugin_b]) as kb:
        await cancel_once_running(ka, runs, "ro")
        replay = await kb.call("send", {"to": "bob"}, call_id="ro")
        again = await ka.call("send", {"to": "bob"}, call_id="ro")
    assert not replay.is_error and not replay.meta.replayed and len(runs) == 2
    assert plugin_b.counters.reclaims == 1
    assert again.meta.replayed and again.content == replay.content


def test_the_defaults_leave_interrupted_calls_released() -> None:
    cfg = IdempotencyPlugin(env={}).config
    assert cfg.unknown_after_interrupt is False and cfg.unknown_after_interrupt_tools == []
