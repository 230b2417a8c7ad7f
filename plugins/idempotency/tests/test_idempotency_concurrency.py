"""In-flight duplicates, lease renewal and dead owners, on memory, SQLite and Redis."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import pytest

from toolwire import ToolError, hookimpl, tool

from .conftest import Env, counting_tool

pytestmark = pytest.mark.anyio


async def pass_time(env: Env, seconds: float) -> None:
    """Let ``seconds`` pass on the kernels' clock (a fake one jumps, plus a real pause)."""
    if env.clock is not None:
        env.clock.advance(seconds)
        await anyio.sleep(0.05)
    else:
        await anyio.sleep(seconds)


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_fifty_concurrent_duplicates_run_once(env: Env) -> None:
    tool_, runs = counting_tool(delay=0.3)
    plugin_a, plugin_b = env.plugin(), env.plugin()  # two kernels sharing the state
    results: list[Any] = []
    async with env.kernel([tool_], [plugin_a]) as ka, env.kernel([tool_], [plugin_b]) as kb:

        async def call(kernel: Any) -> None:
            results.append(await kernel.call("send", {"to": "bob"}, call_id="dup"))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(call, ka if i % 2 else kb)
    assert len(runs) == 1
    assert len(results) == 50
    assert all(not r.is_error for r in results), [r.error for r in results if r.is_error]
    assert all(r.content == results[0].content for r in results)
    assert sum(not r.meta.replayed for r in results) == 1
    total = plugin_a.counters.as_dict()
    for k, v in plugin_b.counters.as_dict().items():
        total[k] += v
    assert total["misses"] == 1 and total["hits"] == 49
    assert total["waits"] >= 1 and total["conflicts"] == 0


async def test_on_in_flight_error_answers_conflict_at_once(env: Env) -> None:
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate)
    plugin = env.plugin(on_in_flight="error")
    async with env.kernel([tool_], [plugin]) as kernel:
        async with anyio.create_task_group() as tg:

            async def original() -> None:
                await kernel.call("send", {}, call_id="busy")

            tg.start_soon(original)
            await wait_until(lambda: runs)
            dup = await kernel.call("send", {}, call_id="busy")
            gate.set()
        replay = await kernel.call("send", {}, call_id="busy")
    assert dup.error is not None and dup.error.kind == "conflict"
    assert dup.error.retryable is True and dup.error.retry_after_s
    assert dup.error.details["reason"] == "in_flight"
    assert "is still running elsewhere" in dup.error.message  # not "after waiting"
    assert replay.meta.replayed and len(runs) == 1
    assert plugin.counters.in_flight == 1
    assert plugin.counters.waits == 0  # at once: it never waited for the original


async def test_waiting_is_bounded_then_conflict_retryable(env: Env) -> None:
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate)
    plugin = env.plugin(wait_secs=0.3)
    async with env.kernel([tool_], [plugin]) as kernel, anyio.create_task_group() as tg:

        async def original() -> None:
            await kernel.call("send", {}, call_id="slow")

        tg.start_soon(original)
        await wait_until(lambda: runs)
        start = anyio.current_time()
        dup = await kernel.call("send", {}, call_id="slow")
        waited = anyio.current_time() - start
        gate.set()
    assert dup.error is not None and dup.error.kind == "conflict" and dup.error.retryable
    assert dup.error.details["reason"] == "in_flight"
    assert 0.25 <= waited < 5
    assert len(runs) == 1
    assert plugin.counters.waits == 1 and plugin.counters.in_flight == 1


async def test_waiter_runs_the_call_itself_when_the_original_is_released(env: Env) -> None:
    gate = anyio.Event()
    outcomes: list[Any] = [ToolError("flaky", kind="unavailable"), {"ok": "second"}]

    def run(args: dict[str, Any]) -> Any:
        item = outcomes.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    class Classify:
        name, order = "classify", 400

        @hookimpl
        def on_error(self, error: Any) -> None:
            error.retryable = True

    tool_, runs = counting_tool(result=run, gate=gate)
    async with env.kernel([tool_], [env.plugin(), Classify()]) as kernel:
        got: list[Any] = []

        async def call() -> None:
            got.append(await kernel.call("send", {}, call_id="rel"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_until(lambda: runs)
            tg.start_soon(call)  # waits for the original...
            await anyio.sleep(0.2)
            gate.set()  # ...which fails retryably and releases: the waiter runs it
    assert len(runs) == 2
    assert sorted(r.is_error for r in got) == [False, True]
    assert next(r for r in got if not r.is_error).content == {"ok": "second"}


async def test_lease_is_renewed_while_a_long_tool_runs(env: Env) -> None:
    tool_, runs = counting_tool(delay=2.5, read_only=False)
    plugin_a, plugin_b = env.plugin(lease_secs=1.0), env.plugin(lease_secs=1.0)
    async with env.kernel([tool_], [plugin_a]) as ka, env.kernel([tool_], [plugin_b]) as kb:
        got: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def original() -> None:
                got.append(await ka.call("send", {}, call_id="long"))

            async def tick() -> None:  # the fake clock follows real time here
                while env.clock is not None:
                    env.clock.advance(0.05)
                    await anyio.sleep(0.05)

            tg.start_soon(original)
            if env.clock is not None:
                tg.start_soon(tick)
            await wait_until(lambda: runs)
            await anyio.sleep(1.5)  # well past the first lease
            dup = await kb.call("send", {}, call_id="long")
            tg.cancel_scope.cancel()
    assert len(runs) == 1
    assert not dup.is_error, dup.error  # not "outcome unknown": the owner kept renewing
    assert dup.meta.replayed and dup.content == got[0].content
    assert plugin_a.counters.renewals >= 2
    assert plugin_a.counters.lost_claims == 0


@pytest.mark.parametrize("read_only", [False, True], ids=["side-effecting", "read-only"])
async def test_dead_owner(env: Env, read_only: bool) -> None:
    """The owner stops renewing (as a killed process would) while its tool runs."""
    gate = anyio.Event()  # holds the original (A's) execution only
    tool_, runs = counting_tool(gate=gate, gate_first_only=True, read_only=read_only)
    plugin_a, plugin_b = env.plugin(lease_secs=0.3), env.plugin(lease_secs=0.3)

    async def no_renewal(claim: Any) -> None:
        return None

    plugin_a._renew = no_renewal  # type: ignore[method-assign]
    async with env.kernel([tool_], [plugin_a]) as ka, env.kernel([tool_], [plugin_b]) as kb:
        got: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def original() -> None:
                got.append(await ka.call("send", {}, call_id="dead"))

            tg.start_soon(original)
            await wait_until(lambda: runs)
            await pass_time(env, 0.5)  # the lease lapses
            with anyio.fail_after(10):
                replay = await kb.call("send", {}, call_id="dead")
            gate.set()  # the stalled original finishes now
        after = await kb.call("send", {}, call_id="dead")

    if read_only:
        assert len(runs) == 2  # re-executed once, by B
        assert not replay.is_error and not replay.meta.replayed
        assert plugin_b.counters.reclaims == 1
        assert plugin_a.counters.lost_claims == 1  # A's late completion was refused
        (late,) = got  # A's caller still gets its result, and is told it is not kept
        assert not late.is_error
        assert late.meta.extra["idempotency"]["recorded"] is False
        assert late.meta.extra["idempotency"]["reason"] == "lost_claim"
        assert after.meta.replayed and after.content == replay.content  # B's result is kept
    else:
        assert len(runs) == 1  # never re-run silently
        assert replay.error is not None and replay.error.kind == "conflict"
        assert replay.error.details["reason"] == "outcome_unknown"
        assert not replay.error.retryable
        assert "outcome unknown" in replay.error.message
        assert plugin_b.counters.outcome_unknown == 1
        # the stalled owner came back and recorded its result: replays get it now
        assert after.meta.replayed and after.content == got[0].content


async def test_a_waiting_duplicate_takes_over_a_dead_read_only_call(env: Env) -> None:
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate, gate_first_only=True, read_only=True)
    plugin_a, plugin_b = env.plugin(lease_secs=0.4), env.plugin(lease_secs=0.4)

    async def no_renewal(claim: Any) -> None:
        return None

    plugin_a._renew = no_renewal  # type: ignore[method-assign]
    async with env.kernel([tool_], [plugin_a]) as ka, env.kernel([tool_], [plugin_b]) as kb:
        got: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def original() -> None:
                await ka.call("send", {}, call_id="w")

            async def duplicate() -> None:
                got.append(await kb.call("send", {}, call_id="w"))

            tg.start_soon(original)
            await wait_until(lambda: runs)
            tg.start_soon(duplicate)  # waits: the lease is still valid
            await anyio.sleep(0.1)
            assert got == [] and len(runs) == 1
            if env.clock is not None:
                env.clock.advance(1.0)  # the lease lapses (real time passes for Redis)
            await wait_until(lambda: got)
            gate.set()
    assert len(runs) == 2
    assert not got[0].is_error and not got[0].meta.replayed
    assert plugin_b.counters.waits == 1 and plugin_b.counters.reclaims == 1


async def test_renewal_task_is_stopped_at_shutdown_and_claims_are_not_leaked(env: Env) -> None:
    tool_, _ = counting_tool()
    plugin = env.plugin()
    kernel = env.kernel([tool_], [plugin])
    async with kernel:
        await kernel.call("send", {}, call_id="x")
        renewer = plugin._renewer
        assert renewer is not None and renewer.task is not None and renewer.alive
        assert plugin._active == {}  # completed calls hold nothing
    assert renewer.task.done and not renewer.alive
    assert plugin._renewer is None
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert "toolwire-idempotency-renewer" not in names


# -- event loops: asyncio and trio -------------------------------------------------

STAMPED: list[int] = []


@tool
async def stamp(n: int) -> dict[str, int]:
    """Return n."""
    STAMPED.append(n)
    await anyio.sleep(0.3)
    return {"n": n}


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_duplicates_wait_replays_return_the_result_and_claims_renew_on_each_loop(
    state: str, tmp_path: Any
) -> None:
    from toolwire import Kernel
    from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

    STAMPED.clear()
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path}/s.db"
    plugin = IdempotencyPlugin(IdempotencyConfig(lease_secs=0.4), env={})  # renews every 0.1 s
    results: list[Any] = []
    async with Kernel(tools=[stamp], plugins=[plugin], state=url) as kernel:

        async def call() -> None:
            results.append(await kernel.call("stamp", {"n": 7}, call_id="t"))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(call)
        replay = await kernel.call("stamp", {"n": 7}, call_id="t")
    assert STAMPED == [7]
    assert [r.content for r in results] == [{"n": 7}] * 5
    assert replay.content == {"n": 7} and replay.meta.replayed is True
    assert plugin.counters.misses == 1 and plugin.counters.hits == 5
    assert plugin.counters.renewals >= 1  # the renewal task ran on this loop
    assert plugin._renewer is None


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(free_tcp_port: int) -> None:
    """redis.asyncio runs on asyncio only: the kernel says so when it starts (no hang, no
    traceback from inside redis-py), and nothing runs."""
    from toolwire import Kernel
    from toolwire.state import StateStoreError
    from toolwire_idempotency import IdempotencyPlugin

    STAMPED.clear()
    url = f"redis://127.0.0.1:{free_tcp_port}/0"
    kernel = Kernel(tools=[stamp], plugins=[IdempotencyPlugin(env={})], state=url)
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await kernel.call("stamp", {"n": 1}, call_id="r")
    assert STAMPED == []


async def test_a_running_claim_outlives_a_short_ttl(env: Env) -> None:
    env.clock = None  # real time: the store's TTL is what is tested
    tool_, runs = counting_tool(delay=1.2)
    plugin = env.plugin(ttl_secs=0.5, lease_secs=2.0)
    async with env.kernel([tool_], [plugin]) as kernel:
        got: list[Any] = []

        async def call() -> None:
            got.append(await kernel.call("send", {}, call_id="short"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_until(lambda: runs)
            await anyio.sleep(0.7)  # past ttl_secs while the tool still runs
            tg.start_soon(call)
    assert len(runs) == 1
    assert sorted(r.meta.replayed for r in got) == [False, True]


async def test_the_calls_deadline_bounds_the_wait_for_an_in_flight_duplicate(env: Env) -> None:
    """Before: a duplicate called with timeout=1.0 waited the full wait_secs (3.7 s here)."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate)
    plugin = env.plugin(wait_secs=30)
    async with env.kernel([tool_], [plugin]) as kernel, anyio.create_task_group() as tg:

        async def original() -> None:
            await kernel.call("send", {}, call_id="long")

        tg.start_soon(original)
        await wait_until(lambda: runs)
        start = anyio.current_time()
        dup = await kernel.call("send", {}, call_id="long", timeout=0.3)
        waited = anyio.current_time() - start
        gate.set()
    assert dup.error is not None and dup.error.kind == "timeout", dup.error
    assert dup.error.details["reason"] == "deadline" and dup.error.retryable
    assert "still running elsewhere when this call's deadline came" in dup.error.message
    assert 0.2 <= waited < 5
    assert len(runs) == 1


async def _tick(env: Env) -> None:
    """Make a fake clock follow real time (renewals are due on the kernel's clock)."""
    while env.clock is not None:
        env.clock.advance(0.05)
        await anyio.sleep(0.05)


def _idem_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The plugin's warnings about claims (not the one about a memory store)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "toolwire.idempotency"
        and r.levelno >= logging.WARNING
        and "claim" in r.getMessage()
    ]


async def test_a_claim_lost_while_the_tool_runs_is_counted_once(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewal finds the claim gone, then the completing write is refused: one loss."""
    gate = anyio.Event()
    tool_, runs = counting_tool(gate=gate)
    plugin = env.plugin(lease_secs=0.4)
    caplog.set_level(logging.INFO)
    async with env.kernel([tool_], [plugin]) as kernel:
        got: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def original() -> None:
                got.append(await kernel.call("send", {}, call_id="gone"))

            tg.start_soon(original)
            tg.start_soon(_tick, env)
            await wait_until(lambda: runs)
            assert await plugin.forget("send", "gone")  # the record vanishes mid-run
            await wait_until(lambda: plugin.counters.lost_claims >= 1)  # a renewal saw it
            gate.set()
            await wait_until(lambda: got)
            tg.cancel_scope.cancel()
    (late,) = got
    assert not late.is_error
    assert late.meta.extra["idempotency"]["reason"] == "lost_claim"
    assert plugin.counters.lost_claims == 1  # not again when the completion is refused
    (warning,) = _idem_warnings(caplog)  # one loss, one warning, naming the call
    assert "'send'" in warning and "'gone'" in warning and "while the tool ran" in warning


async def test_a_claim_lost_while_the_call_waits_to_run_is_counted_once(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Parked in a later plugin's before_call (approval): lost at a renewal, then refused
    when it would start; counted and logged once, and the log does not say the tool ran."""
    hold = anyio.Event()

    class Hold:
        name, order = "hold", 300

        @hookimpl
        async def before_call(self, call: Any, ctx: Any) -> None:
            await hold.wait()

    tool_, runs = counting_tool()
    plugin = env.plugin(lease_secs=0.4)
    caplog.set_level(logging.INFO)
    async with env.kernel([tool_], [plugin, Hold()]) as kernel:
        got: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def original() -> None:
                got.append(await kernel.call("send", {}, call_id="parked"))

            tg.start_soon(original)
            tg.start_soon(_tick, env)
            await wait_until(lambda: plugin._active)
            await wait_until(lambda: any(c.parked for c in plugin._active.values()))
            assert await plugin.forget("send", "parked")
            await wait_until(lambda: plugin.counters.lost_claims >= 1)
            hold.set()
            await wait_until(lambda: got)
            tg.cancel_scope.cancel()
    (res,) = got
    assert runs == []  # never run: it lost its claim before it started
    assert res.error is not None and res.error.details["reason"] == "lost_claim"
    assert plugin.counters.lost_claims == 1
    assert plugin.counters.released == 0  # not ours to give back: not counted as released
    (warning,) = _idem_warnings(caplog)
    assert "'send'" in warning and "'parked'" in warning and "before it started" in warning
