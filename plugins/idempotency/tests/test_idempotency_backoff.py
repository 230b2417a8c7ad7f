"""A call backing off between two attempts: its record says "nothing applied" only
when every attempt so far was refused, and the mark is off before the next attempt.

The backoff is held open by the kernel clock's ``sleep`` (``HeldClock``) while the
renewals run; the crash itself is tested with real processes in
test_idempotency_processes.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolwire import (
    CallContext,
    Clock,
    ErrorInfo,
    Kernel,
    Retry,
    SystemClock,
    Tool,
    ToolAnnotations,
    ToolError,
    hookimpl,
)
from toolwire.state import StateStore
from toolwire_idempotency import IdempotencyPlugin

from .conftest import SCHEMA, CountingStore, Env

pytestmark = pytest.mark.anyio


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.01)


class HeldClock(Clock):
    """The kernel's clock, whose sleeps (the backoff) last until ``go`` is set. A fake
    clock underneath moves with real time, so that renewals fall due."""

    def __init__(self, env: Env) -> None:
        self.inner: Any = env.clock
        if self.inner is None:
            self.inner = SystemClock()
        self.fake = env.clock
        self.go = anyio.Event()
        self.waiting = False

    def monotonic(self) -> float:
        return float(self.inner.monotonic())

    def time(self) -> float:
        return float(self.inner.time())

    async def sleep(self, seconds: float) -> None:
        self.waiting = True
        try:
            await self.go.wait()
        finally:
            self.waiting = False
            self.go = anyio.Event()

    async def tick(self) -> None:
        while self.fake is not None:
            self.fake.advance(0.05)
            await anyio.sleep(0.05)


class RetryAll:
    """Retries every failure (after 60 s, held by the clock) up to ``times`` times."""

    name, order = "retry_all", 500

    def __init__(self, times: int = 1) -> None:
        self.times = times

    @hookimpl
    def on_error(self, error: ErrorInfo, ctx: CallContext) -> Retry | None:
        return Retry(60) if ctx.attempt <= self.times else None


def held_kernel(
    env: Env,
    clock: HeldClock,
    tools: list[Tool],
    plugins: list[object],
    store: StateStore | None = None,
) -> Kernel:
    """A kernel on the env's state (or ``store``) whose clock is ``clock``."""
    state = env.store() if store is None else store
    kernel = Kernel(tools=tools, plugins=plugins, state=state, clock=clock)
    env.kernels.append(kernel)
    return kernel


def flaky(failures: list[BaseException], seen: list[Any], key: list[str]) -> Tool:
    """A side-effecting tool raising ``failures`` in turn, then succeeding; each run
    notes the record as it stood when the attempt started."""

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        entry = await ctx.kernel.state.get_entry(key[0])
        seen.append(None if entry is None else entry.value)
        if len(seen) <= len(failures):
            raise failures[len(seen) - 1]
        return {"runs": len(seen)}

    return Tool("send", "sends", SCHEMA, executor, annotations=ToolAnnotations(readOnlyHint=False))


async def back_off_and_look(
    env: Env, failures: list[BaseException], plugin: IdempotencyPlugin, renewals: int = 2
) -> tuple[list[dict[str, Any] | None], list[Any], Any]:
    """Call the tool; in each backoff wait for ``renewals`` renewals and read the record.
    (the records read in each backoff, the records the attempts started with, the result)"""
    clock = HeldClock(env)
    seen: list[Any] = []
    key = [plugin.key_for("send", "b1")]
    tool = flaky(failures, seen, key)
    kernel = held_kernel(env, clock, [tool], [plugin, RetryAll(len(failures))])
    in_backoff: list[dict[str, Any] | None] = []
    got: list[Any] = []
    async with kernel, anyio.create_task_group() as tg:
        tg.start_soon(clock.tick)

        async def call() -> None:
            got.append(await kernel.call("send", {}, call_id="b1"))

        tg.start_soon(call)
        for _ in failures:
            await wait_until(lambda: clock.waiting)
            before = plugin.counters.renewals
            await wait_until(lambda b=before: plugin.counters.renewals >= b + renewals)
            entry = await kernel.state.get_entry(key[0])
            in_backoff.append(None if entry is None else entry.value)
            clock.go.set()
        await wait_until(lambda: got)
        tg.cancel_scope.cancel()
    return in_backoff, seen, got[0]


REFUSED = [
    pytest.param(ToolError("429 Too Many Requests", kind="rate_limit", status=429), id="429"),
    pytest.param(ToolError("slow down", kind="rate_limit"), id="rate_limit"),
    pytest.param(ToolError("monthly quota exhausted", kind="quota", status=402), id="quota"),
    pytest.param(
        ToolError(
            "no connection to the upstream", kind="unavailable", details={"in_flight": False}
        ),
        id="never-sent",
    ),
]
MAYBE_APPLIED = [
    pytest.param(ToolError("no answer", kind="timeout"), id="timeout"),
    pytest.param(ToolError("upstream busy", kind="unavailable", status=503), id="503"),
    pytest.param(ToolError("rate limited", kind="rate_limit", status=500), id="rate_limit-500"),
    pytest.param(
        ToolError("429, connection dropped", kind="rate_limit", details={"in_flight": True}),
        id="rate_limit-in_flight",
    ),
    pytest.param(
        ToolError("broke off", kind="unavailable", details={"in_flight": True}), id="lost"
    ),
    pytest.param(RuntimeError("a bug"), id="unclassified"),
]


@pytest.mark.parametrize("failure", REFUSED)
async def test_a_refused_attempt_marks_the_backoff_until_the_next_attempt(
    env: Env, failure: BaseException
) -> None:
    plugin = env.plugin(lease_secs=0.2)
    in_backoff, seen, result = await back_off_and_look(env, [failure], plugin)
    assert result.error is None and result.content == {"runs": 2}
    ((marked,), (first, second)) = in_backoff, seen
    assert marked is not None and marked.get("w") is True  # a replay may take it over
    assert first is not None and "w" not in first
    assert second is not None and "w" not in second  # taken off before the attempt


@pytest.mark.parametrize("failure", MAYBE_APPLIED)
async def test_an_attempt_that_may_have_applied_leaves_the_backoff_unmarked(
    env: Env, failure: BaseException
) -> None:
    plugin = env.plugin(lease_secs=0.2)
    in_backoff, seen, result = await back_off_and_look(env, [failure], plugin)
    assert result.error is None and len(seen) == 2
    ((record,),) = (in_backoff,)
    assert record is not None and record["s"] == "pending" and "w" not in record


async def test_a_refusal_after_a_timeout_leaves_the_backoff_unmarked(env: Env) -> None:
    """The first attempt may have done its work: the second one's refusal does not
    make the call one that applied nothing."""
    plugin = env.plugin(lease_secs=0.2)
    failures: list[BaseException] = [
        ToolError("no answer", kind="timeout"),
        ToolError("429 Too Many Requests", kind="rate_limit", status=429),
    ]
    in_backoff, seen, result = await back_off_and_look(env, failures, plugin)
    assert result.error is None and len(seen) == 3
    assert [r is not None and "w" in r for r in in_backoff] == [False, False]


async def test_two_refusals_mark_each_backoff(env: Env) -> None:
    plugin = env.plugin(lease_secs=0.2)
    failures: list[BaseException] = [
        ToolError("429 Too Many Requests", kind="rate_limit", status=429),
        ToolError("429 Too Many Requests", kind="rate_limit", status=429),
    ]
    in_backoff, seen, result = await back_off_and_look(env, failures, plugin)
    assert result.error is None and len(seen) == 3
    assert [r is not None and r.get("w") is True for r in in_backoff] == [True, True]
    assert all(r is not None and "w" not in r for r in seen)


async def test_a_marked_claim_lapsed_in_the_backoff_is_taken_over_once(env: Env) -> None:
    """What a replay after a crash does: the owner stops renewing (here: its renewals
    are stopped) while its record says nothing was applied; another kernel takes the
    claim over and runs the call; the owner, coming back, finds its claim gone and does
    not run the tool again."""
    plugin = env.plugin(lease_secs=0.2)
    clock = HeldClock(env)
    seen: list[Any] = []
    key = [plugin.key_for("send", "b1")]
    tool = flaky([ToolError("429", kind="rate_limit", status=429)], seen, key)
    owner = held_kernel(env, clock, [tool], [plugin, RetryAll()])
    other_plugin = env.plugin(lease_secs=0.2)
    other = env.kernel([tool], [other_plugin])
    got: list[Any] = []
    async with owner, other:
        async with anyio.create_task_group() as tg:
            tg.start_soon(clock.tick)

            async def call() -> None:
                got.append(await owner.call("send", {}, call_id="b1"))

            tg.start_soon(call)
            await wait_until(lambda: clock.waiting)

            async def marked() -> bool:
                entry = await owner.state.get_entry(key[0])
                return entry is not None and entry.value.get("w") is True

            with anyio.fail_after(10):
                while not await marked():  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            await plugin._stop_renewer()  # as if the process had died
            replay = await other.call("send", {}, call_id="b1")  # waits for the lease
            assert replay.error is None and replay.content == {"runs": 2}
            assert other_plugin.counters.reclaims == 1
            clock.go.set()
            await wait_until(lambda: got)
            tg.cancel_scope.cancel()
        again = await other.call("send", {}, call_id="b1")
    (late,) = got
    assert len(seen) == 2  # the refused attempt, and the replay's: never a third
    assert late.error is not None and late.error.details["reason"] == "lost_claim"
    assert late.error.retryable
    assert again.meta.replayed and again.content == {"runs": 2}


@pytest.mark.parametrize("where", ["approval", "backoff"])
async def test_a_mark_whose_answer_was_lost_is_still_taken_off(env: Env, where: str) -> None:
    """The renewal writing the mark is applied but its answer lost (Redis: "may or may
    not have been applied"): the mark is taken off before the tool runs all the same.
    Before, the plugin took it for not written, and the tool ran under a record saying
    nothing was applied (a crash then: a replay ran it a second time)."""
    plugin = env.plugin(lease_secs=0.2)
    clock = HeldClock(env)
    seen: list[Any] = []
    key = [plugin.key_for("send", "b1")]
    failures: list[BaseException] = [ToolError("429", kind="rate_limit", status=429)]
    tool = flaky(failures if where == "backoff" else [], seen, key)
    hold = anyio.Event()
    holding = anyio.Event()

    class Hold:
        name, order = "hold", 300

        @hookimpl
        async def before_call(self) -> None:
            if where == "approval":
                holding.set()
                await hold.wait()

    store = CountingStore(env.store())
    kernel = held_kernel(env, clock, [tool], [plugin, Hold(), RetryAll()], store)
    got: list[Any] = []
    async with kernel, anyio.create_task_group() as tg:
        tg.start_soon(clock.tick)

        async def call() -> None:
            got.append(await kernel.call("send", {}, call_id="b1"))

        tg.start_soon(call)
        if where == "approval":
            await holding.wait()
        else:
            await wait_until(lambda: clock.waiting)
        store.fail_after.add("compare_and_set")  # the marking renewal: applied, answer lost
        await wait_until(lambda: plugin.counters.store_errors >= 1)
        store.fail_after.clear()
        entry = await kernel.state.get_entry(key[0])
        assert entry is not None and entry.value.get("w") is True  # it was applied
        hold.set()
        clock.go.set()
        await wait_until(lambda: got)
        tg.cancel_scope.cancel()
    (result,) = got
    assert result.error is None, result.error
    assert seen and all(r is not None and "w" not in r for r in seen), seen


async def test_a_mark_that_could_not_be_taken_off_goes_at_the_next_renewal(env: Env) -> None:
    """fail_open: the store fails as the mark is to come off, and the call runs anyway.
    Before, its lease was then never renewed (the renewals left the mark to a write that
    had already failed): it lapsed while the tool ran, under a record saying "not
    started", and a replay took the claim over and ran the tool beside it."""
    plugin = env.plugin(lease_secs=0.2, on_store_error="fail_open")
    clock = HeldClock(env)
    runs: list[int] = []
    done = anyio.Event()

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        runs.append(1)
        await done.wait()
        return {"runs": len(runs)}

    tool = Tool("send", "sends", SCHEMA, executor, annotations=ToolAnnotations(readOnlyHint=False))
    hold = anyio.Event()

    class Hold:
        name, order = "hold", 300

        @hookimpl
        async def before_call(self) -> None:
            await hold.wait()

    store = CountingStore(env.store())
    kernel = held_kernel(env, clock, [tool], [plugin, Hold()], store)
    other = held_kernel(env, clock, [tool], [env.plugin(lease_secs=0.2, on_in_flight="error")])
    key = plugin.key_for("send", "b1")
    got: list[Any] = []
    async with kernel, other, anyio.create_task_group() as tg:
        tg.start_soon(clock.tick)

        async def call() -> None:
            got.append(await kernel.call("send", {}, call_id="b1"))

        tg.start_soon(call)
        await wait_until(lambda: any(c.parked for c in plugin._active.values()))
        await wait_until(lambda: plugin.counters.renewals >= 1)  # marked "not started"
        store.fail.add("compare_and_set")
        hold.set()
        await wait_until(lambda: runs)  # it runs, fail_open
        store.fail.clear()
        before = plugin.counters.renewals
        await wait_until(lambda: plugin.counters.renewals >= before + 2)
        entry = await kernel.state.get_entry(key)
        assert entry is not None and "w" not in entry.value
        await anyio.sleep(0.4)  # twice the lease, on the fake clock too
        replay = await other.call("send", {}, call_id="b1")
        assert replay.error is not None and replay.error.details["reason"] == "in_flight"
        done.set()
        await wait_until(lambda: got)
        tg.cancel_scope.cancel()
    assert runs == [1] and got[0].error is None
    assert plugin.counters.fail_open == 1
