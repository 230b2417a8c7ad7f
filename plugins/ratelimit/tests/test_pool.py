"""KeyPool: fair rotation, cooldowns, half-open probes, quarantine, suspension, shared state."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolwire import CallContext, ErrorInfo, Kernel, Retry, ToolCall, ToolError, hookimpl, tool
from toolwire.state import MemoryStore, StateStoreError
from toolwire.testing import FakeClock
from toolwire_ratelimit import (
    ApiKey,
    PoolUnavailable,
    RateLimitConfig,
    RateLimitPlugin,
    key_pool,
)

pytestmark = pytest.mark.anyio

SECRET_A = "sk-alpha-0123456789"
SECRET_B = "sk-bravo-9876543210"


def config(prefix: str = "ratelimit", **provider: Any) -> RateLimitConfig:
    keys = provider.pop(
        "keys",
        [
            {"alias": "a", "secret": SECRET_A, "weight": 3},
            {"alias": "b", "secret": SECRET_B, "weight": 1},
        ],
    )
    return RateLimitConfig.model_validate(
        {"state_prefix": prefix, "providers": {"acme": {"keys": keys, **provider}}}
    )


def kernel_with(
    cfg: RateLimitConfig, state: Any = "memory://", clock: FakeClock | None = None
) -> Kernel:
    return Kernel(state=state, clock=clock or FakeClock(), plugins=[RateLimitPlugin(cfg)])


async def test_weighted_rotation_is_fair_over_10000_picks() -> None:
    async with kernel_with(config()) as kernel:
        pool = key_pool(kernel, "acme")
        counts: Counter[str | None] = Counter()
        for _ in range(10_000):
            lease = await pool.acquire()
            counts[lease.alias] += 1
            await lease.success()
        assert abs(counts["a"] / 10_000 - 0.75) <= 0.01
        assert abs(counts["b"] / 10_000 - 0.25) <= 0.01
        # smooth WRR: never more than 3 'a' in a row
        seq = [(await pool.acquire()).alias for _ in range(8)]
        assert "".join(s or "" for s in seq) in ("aabaaaba", "abaaabaa", "baaabaaa", "aaabaaab")


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_100_concurrent_picks_lose_no_update(state: str, tmp_path: Path) -> None:
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    async with kernel_with(config(), state=url) as kernel:
        pool = key_pool(kernel, "acme")
        got: list[str | None] = []

        async def pick() -> None:
            got.append((await pool.acquire()).alias)

        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(pick)
        assert Counter(got) == {"a": 75, "b": 25}
        status = await pool.status()
        assert {k: v["picks"] for k, v in status["keys"].items()} == {"a": 75, "b": 25}


async def test_cooldown_is_the_larger_of_retry_after_and_an_exponential_step_capped() -> None:
    clock = FakeClock()
    cfg = config(
        cooldown_seconds=2, max_cooldown_seconds=30, keys=[{"alias": "only", "secret": SECRET_A}]
    )
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        now = clock.time()
        await pool.report("only", "rate_limit")  # strike 1: 2 s
        av = await pool.availability()
        assert (av.available, av.kind, av.retry_at) == (False, "rate_limit", now + 2)
        with pytest.raises(PoolUnavailable) as exc:
            await pool.acquire()
        assert exc.value.kind == "rate_limit" and exc.value.retry_after_s == 2
        assert exc.value.details["pattern"] == "pool.cooling"
        clock.advance(2.1)  # half-open: the next rate limit is the next strike
        now = clock.time()
        await pool.report("only", "rate_limit")  # strike 2: 4 s
        assert (await pool.availability()).retry_at == now + 4
        clock.advance(4.1)
        now = clock.time()
        await pool.report("only", "rate_limit", retry_after_s=10)  # strike 3: max(10, 8)
        assert (await pool.availability()).retry_at == now + 10
        for _ in range(5):
            clock.advance(31)
            await pool.report("only", "rate_limit")
        now = clock.time()
        assert (await pool.availability()).retry_at == now + 30  # capped
        clock.advance(31)
        now = clock.time()
        await pool.report("only", "rate_limit", retry_after_s=10_000)
        assert (await pool.availability()).retry_at == now + 30  # a huge retry-after is capped too


async def test_rate_limits_of_requests_in_flight_together_are_one_strike() -> None:
    # 17 requests on one key were in flight when it started answering 429 with
    # Retry-After: 2. Each 429 used to add a strike: 2**16 s, capped at an hour.
    clock = FakeClock()
    cfg = config(cooldown_seconds=1, keys=[{"alias": "only", "secret": SECRET_A}])
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        now = clock.time()
        leases = [await pool.acquire() for _ in range(17)]
        for lease in leases:
            await lease.failure(kind="rate_limit", retry_after_s=2)
        status = await pool.status()
        assert status["keys"]["only"]["strikes"] == 1
        assert status["keys"]["only"]["cool_until"] == now + 2
        # a longer retry-after of one of them still extends the cooldown
        await pool.report("only", "rate_limit", retry_after_s=5)
        assert (await pool.availability()).retry_at == now + 5
        clock.advance(5.1)
        assert (await pool.acquire()).probe


async def test_a_success_from_before_a_rate_limit_keeps_the_cooldown() -> None:
    # A request leased before the key's 429 that succeeds afterwards says nothing about
    # the key now: the cooldown the provider asked for stands.
    clock = FakeClock()
    cfg = config(cooldown_seconds=1, keys=[{"alias": "only", "secret": SECRET_A}])
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        now = clock.time()
        early, late = await pool.acquire(), await pool.acquire()
        await early.failure(kind="rate_limit", retry_after_s=30)
        await late.success()
        av = await pool.availability()
        assert (av.available, av.retry_at) == (False, now + 30)
        clock.advance(30.1)
        probe = await pool.acquire()
        assert probe.probe
        await probe.success()  # the probe closes the key again
        status = await pool.status()
        assert status["keys"]["only"]["strikes"] == 0 and status["state"] == "ok"


async def test_one_half_open_probe_per_key_after_a_cooldown() -> None:
    clock = FakeClock()
    cfg = config(cooldown_seconds=5, keys=[{"alias": "only", "secret": SECRET_A}])
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("only", "rate_limit")
        clock.advance(5.1)
        probe = await pool.acquire()
        assert probe.probe
        with pytest.raises(PoolUnavailable) as exc:  # the probe is in flight
            await pool.acquire()
        assert exc.value.availability.keys == {"only": "probing"}
        await probe.success()
        first, second = await pool.acquire(), await pool.acquire()  # closed again
        assert not first.probe and not second.probe
        # a failed probe cools the key again, for a longer step
        await pool.report("only", "rate_limit")
        clock.advance(5.1)
        p2 = await pool.acquire()
        await p2.failure(kind="rate_limit")
        av = await pool.availability()
        assert av.state == "cooling" and av.retry_after_s == pytest.approx(10.0)
        # a probe whose holder vanished expires
        clock.advance(10.1)
        await pool.acquire()
        clock.advance(61)
        assert (await pool.acquire()).probe


@pytest.mark.parametrize("ending", ["release", "timeout", "unavailable"])
async def test_a_lease_from_before_the_cooldown_does_not_end_anothers_probe(ending: str) -> None:
    """Before: its release (or timeout) cleared the probe marker of the request probing the key
    now, and a second probe of a key that had just been rate-limited started at once."""
    clock = FakeClock()
    cfg = config(cooldown_seconds=5, keys=[{"alias": "only", "secret": SECRET_A}])
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        stale = await pool.acquire()  # taken while the key was healthy
        await pool.report("only", "rate_limit")  # another request's 429
        clock.advance(5.1)
        probe = await pool.acquire()
        assert probe.probe and not stale.probe
        if ending == "release":
            await stale.release()
        else:
            await stale.failure(kind=ending)
        with pytest.raises(PoolUnavailable) as exc:  # still one probe in flight
            await pool.acquire()
        assert exc.value.availability.keys == {"only": "probing"}
        await probe.release()  # the probe's own end does end it
        assert (await pool.acquire()).probe


@pytest.mark.parametrize("ending", ["success", "tool_error"])
async def test_a_success_from_before_the_cooldown_does_not_end_anothers_probe(ending: str) -> None:
    """Before: a lease taken while the key was healthy, succeeding once the cooldown was over,
    wiped the strikes and the probe in flight: every request went to the key the provider had
    just rate-limited, and the probe's next 429 was strike 1 again (no longer backoff)."""
    clock = FakeClock()
    cfg = config(cooldown_seconds=5, keys=[{"alias": "only", "secret": SECRET_A}])
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        stale = await pool.acquire()  # taken while the key was healthy
        await pool.report("only", "rate_limit")  # another request's 429
        clock.advance(5.1)
        probe = await pool.acquire()
        assert probe.probe and not stale.probe
        if ending == "success":
            await stale.success()
        else:
            await stale.failure(kind=ending)  # the key worked, the request did not
        with pytest.raises(PoolUnavailable) as exc:  # still one probe in flight
            await pool.acquire()
        assert exc.value.availability.keys == {"only": "probing"}
        assert (await pool.status())["keys"]["only"]["strikes"] == 1
        await probe.failure(kind="rate_limit")  # the probe's 429 is the next, longer step
        av = await pool.availability()
        assert av.state == "cooling" and av.retry_after_s == pytest.approx(10.0)


@pytest.mark.parametrize("ending", ["release", "timeout", "success"])
async def test_a_probe_that_outlived_its_timeout_does_not_end_the_next_probe(ending: str) -> None:
    """Before: a probe whose holder outlived probe_timeout_seconds (another lease took over the
    probe) was still 'the probe' when it ended: its release or timeout let a second probe start
    at once, and its success - after the next probe had been rate-limited - wiped the strikes
    and the probe in flight."""
    clock = FakeClock()
    cfg = config(
        cooldown_seconds=5, probe_timeout_seconds=10, keys=[{"alias": "only", "secret": SECRET_A}]
    )
    async with kernel_with(cfg, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("only", "rate_limit")
        clock.advance(5.1)
        slow = await pool.acquire()
        clock.advance(10.1)  # its probe expired: the next lease probes
        current = await pool.acquire()
        assert slow.probe and current.probe
        strikes = 1
        if ending == "success":
            await current.failure(kind="rate_limit")  # strike 2: cooled 10 s
            clock.advance(10.1)
            current = await pool.acquire()
            assert current.probe
            strikes = 2
            await slow.success()
        elif ending == "timeout":
            await slow.failure(kind="timeout")
        else:
            await slow.release()
        with pytest.raises(PoolUnavailable) as exc:  # still one probe in flight
            await pool.acquire()
        assert exc.value.availability.keys == {"only": "probing"}
        assert (await pool.status())["keys"]["only"]["strikes"] == strikes
        await current.success()  # the current probe's own end does settle the key
        assert (await pool.availability()).keys == {"only": "ok"}


async def test_auth_failure_quarantines_until_the_key_changes_or_is_cleared(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with kernel_with(config(), state=url) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("a", "auth", pattern="default.status.401")
        for _ in range(20):
            assert (await pool.acquire()).alias == "b"
    # a restart on the same file: still quarantined, also long after
    clock = FakeClock()
    clock.advance(365 * 86400)
    async with kernel_with(config(), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        assert {(await pool.acquire()).alias for _ in range(10)} == {"b"}
        status = await pool.status()
        assert status["keys"]["a"]["state"] == "quarantined"
        assert status["keys"]["a"]["quarantine"]["pattern"] == "default.status.401"
        await pool.report("b", "auth")
        with pytest.raises(PoolUnavailable) as exc:
            await pool.acquire()
        assert exc.value.kind == "auth" and exc.value.availability.retry_at is None
        assert "`toolwire keys clear acme`" in str(exc.value)  # the operator's way out
        await pool.clear("b")
        assert (await pool.acquire()).alias == "b"
    # the operator replaced key a's secret: the quarantine is lifted
    fixed = config(
        keys=[
            {"alias": "a", "secret": "sk-alpha-NEW-000000", "weight": 3},
            {"alias": "b", "secret": SECRET_B},
        ]
    )
    async with kernel_with(fixed, state=url) as kernel:
        pool = key_pool(kernel, "acme")
        status = await pool.status()
        # before: 'ok', with the old secret's quarantine reason still listed
        assert status["keys"]["a"] == {**status["keys"]["a"], "state": "ok", "quarantine": None}
        assert "a" in {(await pool.acquire()).alias for _ in range(4)}


async def test_a_replaced_secret_does_not_inherit_the_old_keys_cooldown(tmp_path: Path) -> None:
    """Before: the cooldown (and strikes) were the alias's, whatever its secret: a key
    replaced because its monthly quota ran out stayed put aside for the month, and
    removing the first of unnamed keys moved its cooldown onto the next one."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    kw: dict[str, Any] = {"suspend_on_monthly_exhausted": False}
    async with kernel_with(config(**kw), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("a", "quota", retry_after_s=20 * 86400)  # exhausted for 20 days
        await pool.report("b", "rate_limit", retry_after_s=600)
        with pytest.raises(PoolUnavailable):
            await pool.acquire()
    # the operator replaced key a's secret: the new key is used at once, b still cools
    new_a = [{"alias": "a", "secret": "sk-alpha-NEW-000000"}, {"alias": "b", "secret": SECRET_B}]
    async with kernel_with(config(keys=new_a, **kw), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        assert (await pool.availability()).keys == {"a": "ok", "b": "cooling"}
        assert (await pool.status())["keys"]["a"]["strikes"] == 0
        lease = await pool.acquire()
        assert lease.alias == "a" and not lease.probe
        await lease.failure(kind="rate_limit")  # the new key's own first strike
        assert (await pool.status())["keys"]["a"]["strikes"] == 1
    # unnamed keys: removing the first renames the second; its own state follows the secret
    async with kernel_with(
        config(keys=[SECRET_A, SECRET_B], **kw), state=url, clock=clock
    ) as kernel:
        await key_pool(kernel, "acme").report("acme-1", "quota", retry_after_s=20 * 86400)
    async with kernel_with(config(keys=[SECRET_B], **kw), state=url, clock=clock) as kernel:
        assert (await key_pool(kernel, "acme").availability()).keys == {"acme-1": "ok"}


async def test_a_replica_without_a_key_keeps_its_quarantine(tmp_path: Path) -> None:
    """A rolling configuration change: replica 1 has keys a and b, replica 2 already only b.
    Replica 2's reports on b kept dropping a's record, quarantine included, and replica 1
    sent the rejected key again."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    only_b = config(keys=[{"alias": "b", "secret": SECRET_B}])
    async with kernel_with(config(), state=url) as one, kernel_with(only_b, state=url) as two:
        pool1, pool2 = key_pool(one, "acme"), key_pool(two, "acme")
        await pool1.report("a", "auth", pattern="default.status.401")
        await pool2.report("b", "rate_limit", retry_after_s=5)  # writes the shared record
        assert not (await pool2.availability()).available  # b cools
        assert (await pool1.status())["keys"]["a"]["state"] == "quarantined"
        await pool2.clear("b")
        await (await pool2.acquire()).success()
        assert {(await pool1.acquire()).alias for _ in range(4)} == {"b"}


async def test_a_rolling_secret_change_keeps_the_old_secrets_quarantine(tmp_path: Path) -> None:
    """A rolling change of key a's secret: replica 1 still sends the old secret, replica 2
    the new one. Replica 1's quarantine of the old secret was dropped by replica 2's next
    success on a (the quarantine was not its own secret's), and replica 1 sent the
    rejected key again."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    new_a = config(
        keys=[{"alias": "a", "secret": "sk-alpha-NEW-000000"}, {"alias": "b", "secret": SECRET_B}]
    )
    async with kernel_with(config(), state=url) as one, kernel_with(new_a, state=url) as two:
        pool1, pool2 = key_pool(one, "acme"), key_pool(two, "acme")
        await pool1.report("a", "auth", pattern="default.status.401")
        assert (await pool2.availability()).keys["a"] == "ok"  # the new secret is not rejected
        for _ in range(4):  # replica 2 uses its a (and b), and reports the successes
            await (await pool2.acquire()).success()
        await pool2.report("a", "success")
        assert (await pool1.availability()).keys["a"] == "quarantined"
        assert {(await pool1.acquire()).alias for _ in range(4)} == {"b"}
        # the old secret's quarantine does not hold the new one back meanwhile
        assert "a" in {(await pool2.acquire()).alias for _ in range(4)}


async def test_a_rolling_secret_change_keeps_both_secrets_quarantines(tmp_path: Path) -> None:
    """A rolling change of key a's secret where both secrets are rejected. Before: one
    quarantine slot per alias; each replica's auth failure replaced the other's quarantine,
    and the other replica sent its rejected secret again."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    new_a = config(
        keys=[{"alias": "a", "secret": "sk-alpha-NEW-000000"}, {"alias": "b", "secret": SECRET_B}]
    )
    async with kernel_with(config(), state=url) as one, kernel_with(new_a, state=url) as two:
        pool1, pool2 = key_pool(one, "acme"), key_pool(two, "acme")
        await pool1.report("a", "auth", pattern="default.status.401")
        await pool2.report("a", "auth", pattern="default.status.403")
        assert (await pool1.availability()).keys["a"] == "quarantined"
        assert (await pool2.availability()).keys["a"] == "quarantined"
        for _ in range(4):  # both replicas keep leasing (and writing): only b
            for pool in (pool1, pool2):
                lease = await pool.acquire()
                assert lease.alias == "b"
                await lease.success()
        await pool1.report("a", "auth", pattern="default.status.401")  # a lease from before
        assert (await pool2.status())["keys"]["a"]["quarantine"]["pattern"] == (
            "default.status.403"
        )
        assert (await pool1.status())["keys"]["a"]["quarantine"]["pattern"] == (
            "default.status.401"
        )
        other = (await pool2.status())["unconfigured"]  # the old secret's, as replica 2 sees it
        assert [(k["alias"], k["configured"], k["state"]) for k in other] == [
            ("a", True, "quarantined")
        ]
        # a clear of a lifts its secret's quarantine and every one recorded under a (the
        # operator says the key works again)
        await pool2.clear("a")
        assert (await pool2.availability()).keys["a"] == "ok"
        assert (await pool1.availability()).keys["a"] == "ok"


async def test_quarantines_stored_by_an_earlier_version_survive_the_upgrade(
    tmp_path: Path,
) -> None:
    """Earlier versions kept one quarantine per alias, in ``keys[alias]["q"]``: with the
    key's fingerprint and the secret's (a), or, older, the key's only (b). Upgraded
    replicas honour and move them, the one of a secret they do not send included."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    key_a, key_b = ApiKey("a", SECRET_A), ApiKey("b", SECRET_B)
    q = {"since": 1.0, "reason": "authentication failed", "pattern": "default.status.401"}
    legacy = {
        "rr": {},
        "picks": {"a": 3, "b": 1},
        "keys": {
            "a": {
                "fp": key_a.fingerprint,
                "strikes": 1,
                "q": {**q, "fp": key_a.fingerprint, "sfp": key_a.secret_fingerprint},
            },
            "b": {"fp": key_b.fingerprint, "q": {**q, "fp": key_b.fingerprint}},
        },
        "suspended": None,
    }
    new_a = config(
        keys=[{"alias": "a", "secret": "sk-alpha-NEW-000000"}, {"alias": "b", "secret": SECRET_B}]
    )
    async with kernel_with(new_a, state=url) as kernel:  # a replica already sending a new a
        await kernel.state.set("ratelimit:pool:acme", legacy)
        pool = key_pool(kernel, "acme")
        assert (await pool.availability()).keys == {"a": "ok", "b": "quarantined"}
        await (await pool.acquire()).success()
        await pool.report("a", "rate_limit")  # writes a's slot: the old secret's quarantine stays
        stored = await kernel.state.get("ratelimit:pool:acme")
        assert set(stored["quarantines"]) == {key_a.secret_fingerprint, key_b.secret_fingerprint}
        assert stored["keys"]["b"]["q"]["pattern"] == "default.status.401"  # for earlier versions
    renamed = config(keys=[{"alias": "a", "secret": SECRET_A}, {"alias": "c", "secret": SECRET_B}])
    async with kernel_with(config(), state=url) as old, kernel_with(renamed, state=url) as new:
        assert (await key_pool(old, "acme").availability()).keys == {
            "a": "quarantined",
            "b": "quarantined",
        }
        status = await key_pool(new, "acme").status()
        assert status["keys"]["c"]["state"] == "quarantined"
        assert status["keys"]["c"]["quarantine"] == {**q, "alias": "b"}

    # the oldest form, of a secret the upgraded replica does not send: kept until one that
    # sends it moves it
    legacy["keys"] = {"a": {"fp": key_a.fingerprint, "q": {**q, "fp": key_a.fingerprint}}}
    async with kernel_with(new_a, state=url) as kernel:
        await kernel.state.set("ratelimit:pool:acme", legacy)
        pool = key_pool(kernel, "acme")
        assert (await pool.availability()).keys == {"a": "ok", "b": "ok"}
        await pool.report("a", "rate_limit", retry_after_s=5)
        await pool.report("a", "auth")
    without_a = config(keys=[{"alias": "b", "secret": SECRET_B}])
    async with kernel_with(without_a, state=url) as kernel:  # both secrets' quarantines of a
        stored = (await key_pool(kernel, "acme").status())["unconfigured"]
        assert [(k["alias"], k["state"]) for k in stored] == [("a", "quarantined")] * 2
    async with kernel_with(config(), state=url) as kernel:
        pool = key_pool(kernel, "acme")
        assert (await pool.availability()).keys == {"a": "quarantined", "b": "ok"}
        await (await pool.acquire()).success()
        stored = await kernel.state.get("ratelimit:pool:acme")
        assert key_a.secret_fingerprint in stored["quarantines"]
        assert len(stored["quarantines"]) == 2  # and the new secret's


async def test_a_rolling_secret_change_keeps_both_secrets_cooldowns(tmp_path: Path) -> None:
    """Before: one cooldown per alias; replica 2's rate limit on its new secret of a
    replaced replica 1's 10-minute cooldown of the old one, and replica 1 sent it again."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    new_a = config(
        keys=[{"alias": "a", "secret": "sk-alpha-NEW-000000"}, {"alias": "b", "secret": SECRET_B}],
        cooldown_seconds=60,
    )
    async with (
        kernel_with(config(cooldown_seconds=60), state=url, clock=clock) as one,
        kernel_with(new_a, state=url, clock=clock) as two,
    ):
        pool1, pool2 = key_pool(one, "acme"), key_pool(two, "acme")
        await pool1.report("a", "rate_limit", retry_after_s=600)
        await pool2.report("a", "rate_limit")  # its first strike: 60 s
        assert (await pool1.availability()).keys["a"] == "cooling"
        assert (await pool2.availability()).keys["a"] == "cooling"
        for _ in range(4):  # both replicas lease b meanwhile
            for pool in (pool1, pool2):
                await (await pool.acquire()).success()
        clock.advance(61)
        assert (await pool1.availability()).keys["a"] == "cooling"
        probe = await pool2.acquire()  # a's half-open probe on replica 2 (weight 3)
        assert probe.alias == "a" and probe.probe
        await probe.failure(kind="rate_limit")  # strike 2: 120 s
        assert (await pool2.status())["keys"]["a"]["strikes"] == 2
        assert (await pool1.status())["keys"]["a"]["strikes"] == 1
        clock.advance(540)  # replica 1's cooldown is over, replica 2's too
        probe = await pool1.acquire()
        assert probe.alias == "a" and probe.probe
        await probe.success()
        assert (await pool1.availability()).keys["a"] == "ok"
        assert (await pool2.availability()).keys["a"] == "half_open"


def written_by_an_earlier_version(record: dict[str, Any]) -> dict[str, Any]:
    """What a replica still on the version before quarantines were kept per secret writes
    back: the tables it knew (its ``_norm``); ``quarantines`` is dropped."""
    return {k: record[k] for k in ("rr", "picks", "keys", "suspended", "gone") if k in record}


async def test_a_rolling_upgrade_loses_no_quarantine(tmp_path: Path) -> None:
    """Replicas on the earlier version rewrite the record without ``quarantines``: before,
    a quarantine moved out of its earlier form (or recorded by an upgraded replica) was
    lost with it, and the rejected key was sent again."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    key_a = ApiKey("a", SECRET_A)
    q = {"since": 1.0, "reason": "authentication failed", "pattern": "default.status.401"}
    legacy = {
        "rr": {},
        "picks": {},
        "keys": {"a": {"fp": key_a.fingerprint, "q": {**q, "fp": key_a.fingerprint}}},
        "suspended": None,
    }
    async with kernel_with(config(), state=url) as kernel:
        await kernel.state.set("ratelimit:pool:acme", legacy)
        pool = key_pool(kernel, "acme")
        await (await pool.acquire()).success()  # an upgraded replica writes the record
        await pool.report("b", "auth")  # and quarantines b

        async def earlier_version_writes() -> None:
            stored = await kernel.state.get("ratelimit:pool:acme")
            await kernel.state.set("ratelimit:pool:acme", written_by_an_earlier_version(stored))

        for _ in range(2):
            await earlier_version_writes()
            assert (await pool.availability()).keys == {"a": "quarantined", "b": "quarantined"}
            await pool.clear("b")  # a clear is not undone by the earlier form either
            await earlier_version_writes()
            assert (await pool.availability()).keys == {"a": "quarantined", "b": "ok"}
            await pool.report("b", "auth")
        await pool.clear("a")
        await earlier_version_writes()
        assert (await pool.availability()).keys == {"a": "ok", "b": "quarantined"}


async def test_a_quarantine_follows_its_secret_to_a_new_alias(tmp_path: Path) -> None:
    """Before: the quarantine was the alias's: a rolling rename of a rejected key (b
    becoming c, same secret), or removing the first of unnamed keys (acme-2 becoming
    acme-1), lifted it, and the renamed key was sent again; the docs say only a changed
    secret or a clear lifts it."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    renamed = config(keys=[{"alias": "a", "secret": SECRET_A}, {"alias": "c", "secret": SECRET_B}])
    async with kernel_with(config(), state=url) as old, kernel_with(renamed, state=url) as new:
        p_old, p_new = key_pool(old, "acme"), key_pool(new, "acme")
        await p_old.report("b", "auth", pattern="default.status.401")
        assert (await p_new.availability()).keys == {"a": "ok", "c": "quarantined"}
        assert {(await p_new.acquire()).alias for _ in range(4)} == {"a"}
        status = await p_new.status()
        assert status["keys"]["c"]["quarantine"]["pattern"] == "default.status.401"
        assert (await p_old.availability()).keys["b"] == "quarantined"
        await p_new.clear("c")  # the operator says the key works again: under either alias
        assert (await p_new.availability()).keys["c"] == "ok"
        assert (await p_old.availability()).keys["b"] == "ok"
    async with kernel_with(config(keys=[SECRET_A, SECRET_B]), state=url) as kernel:
        await key_pool(kernel, "acme").report("acme-2", "auth")
    async with kernel_with(config(keys=[SECRET_B]), state=url) as kernel:
        with pytest.raises(PoolUnavailable):
            await key_pool(kernel, "acme").acquire()


SECRET_C = "sk-charlie-555555555"
A_AND_C = [{"alias": "a", "secret": SECRET_A}, {"alias": "c", "secret": SECRET_C}]


def aliases_in(record: Any) -> set[str]:
    """Every alias the stored pool record mentions, in any of its tables (a quarantine: the
    alias it was recorded under)."""
    found = {a for table in ("rr", "picks", "keys", "gone") for a in (record.get(table) or {})}
    return found | {q["alias"] for q in (record.get("quarantines") or {}).values()}


async def test_a_renamed_key_is_forgotten_after_the_grace(tmp_path: Path) -> None:
    """Before: the record kept every alias ever configured (rotation weight, picks, strikes,
    quarantine) for the life of the deployment; each rename grew it for good."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    async with kernel_with(config(), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        for _ in range(8):
            await (await pool.acquire()).success()
        await pool.report("b", "rate_limit")
        assert aliases_in(await kernel.state.get("ratelimit:pool:acme")) == {"a", "b"}
    # b renamed to c; a restart, an hour later: b is kept (a replica still listing it may run)
    clock.advance(3600)
    async with kernel_with(config(keys=A_AND_C), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        for _ in range(4):
            await (await pool.acquire()).success()
        assert "b" in aliases_in(await kernel.state.get("ratelimit:pool:acme"))
        status = await pool.status()
        assert set(status["keys"]) == {"a", "c"} and set(status["keys"]) == set(
            (await pool.availability()).keys
        )
    # a week later (removed_key_grace_seconds), the next write forgets b
    clock.advance(7 * 86400)
    async with kernel_with(config(keys=A_AND_C), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await (await pool.acquire()).success()
        assert aliases_in(await kernel.state.get("ratelimit:pool:acme")) == {"a", "c"}


async def test_a_removed_key_is_kept_while_a_replica_still_lists_it(tmp_path: Path) -> None:
    """A rolling configuration change that takes longer than the grace: the replica without
    key b must not forget b's quarantine while a replica listing b still leases from the
    pool; once none does, the grace runs and b is forgotten."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    without_b = config(keys=A_AND_C, removed_key_grace_seconds=3600)
    async with (
        kernel_with(config(), state=url, clock=clock) as old,
        kernel_with(without_b, state=url, clock=clock) as new,
    ):
        pool_old, pool_new = key_pool(old, "acme"), key_pool(new, "acme")
        await pool_old.report("b", "auth", pattern="default.status.401")
        for _ in range(5):  # both replicas serve for 5 hours
            clock.advance(3599)
            await (await pool_new.acquire()).success()
            await (await pool_old.acquire()).success()
        assert (await pool_old.status())["keys"]["b"]["state"] == "quarantined"
        # the old replica has gone: the grace runs from the new one's next write
        clock.advance(60)
        await (await pool_new.acquire()).success()
        clock.advance(3599)
        await (await pool_new.acquire()).success()
        assert "b" in aliases_in(await new.state.get("ratelimit:pool:acme"))
        clock.advance(1)
        await (await pool_new.acquire()).success()
        assert aliases_in(await new.state.get("ratelimit:pool:acme")) == {"a", "c"}


async def test_a_removed_key_still_cooling_is_kept_until_its_cooldown_ends(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    kw: dict[str, Any] = {"suspend_on_monthly_exhausted": False, "removed_key_grace_seconds": 0}
    async with kernel_with(config(**kw), state=url, clock=clock) as kernel:
        await key_pool(kernel, "acme").report("b", "quota", retry_after_s=86400)  # cools a day
    async with kernel_with(config(keys=A_AND_C, **kw), state=url, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await (await pool.acquire()).success()
        assert "b" in aliases_in(await kernel.state.get("ratelimit:pool:acme"))
        clock.advance(86401)
        await (await pool.acquire()).success()
        assert aliases_in(await kernel.state.get("ratelimit:pool:acme")) == {"a", "c"}


async def test_a_key_back_within_the_grace_keeps_its_quarantine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    async with kernel_with(config(), state=url, clock=clock) as kernel:
        await key_pool(kernel, "acme").report("b", "auth")
    for days in (1, 8):  # b removed for a day, then for 8 days (past the 7-day grace)
        async with kernel_with(config(keys=A_AND_C), state=url, clock=clock) as kernel:
            await (await key_pool(kernel, "acme").acquire()).success()
        clock.advance(days * 86400)
        async with kernel_with(config(keys=A_AND_C), state=url, clock=clock) as kernel:
            await (await key_pool(kernel, "acme").acquire()).success()
        async with kernel_with(config(), state=url, clock=clock) as kernel:
            state = (await key_pool(kernel, "acme").status())["keys"]["b"]["state"]
            assert state == ("quarantined" if days == 1 else "ok")


def with_provider_old(**old: Any) -> RateLimitConfig:
    """``config()`` plus a provider ``old`` with keys k1 and k2."""
    cfg = config().model_dump()
    cfg["providers"]["old"] = {
        "keys": [{"alias": "k1", "secret": SECRET_C}, {"alias": "k2", "secret": SECRET_A}],
        **old,
    }
    return RateLimitConfig.model_validate(cfg)


async def test_a_removed_provider_is_forgotten_after_the_grace(tmp_path: Path) -> None:
    """Before: the pool record of a provider removed from the configuration (quarantines
    and all) stayed in the state store for ever, one more for every provider ever
    configured. Now the rule of removed aliases: kept while a replica still uses it."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    both = with_provider_old(removed_key_grace_seconds=3600)
    async with (
        kernel_with(both, state=url, clock=clock) as old,
        kernel_with(config(), state=url, clock=clock) as new,
    ):
        sweep = RateLimitPlugin.of(new).forget_removed_providers
        await key_pool(old, "old").report("k1", "auth")
        await (await key_pool(new, "acme").acquire()).success()
        assert await sweep() == []  # notes since when no process (it knows) lists it
        for _ in range(3):  # the old replica serves for 3 hours: each use renews it
            clock.advance(3599)
            await (await key_pool(old, "old").acquire()).success()
            assert await sweep() == []
        assert (await key_pool(old, "old").availability()).keys["k1"] == "quarantined"
        clock.advance(3599)  # the old replica has gone: an hour (its grace) after the note
        assert await sweep() == []
        clock.advance(1)
        assert await sweep() == ["old"]
        assert await new.state.get("ratelimit:pool:old") is None
        assert await new.state.get("ratelimit:pool:acme") is not None


async def test_a_removed_providers_suspension_is_kept_until_it_ends() -> None:
    """And the plugin looks for removed providers itself, after a pool write."""
    clock = FakeClock()
    async with kernel_with(with_provider_old(), clock=clock) as kernel:
        await key_pool(kernel, "old").report(None, "quota", retry_after_s=30 * 86400)
        value = await kernel.state.get("ratelimit:pool:old")
    async with kernel_with(config(), clock=clock) as kernel:
        plugin = RateLimitPlugin.of(kernel)
        week = 7 * 86400 + 1
        stale = {"rr": {"k": 0}, "picks": {"k": 1}, "removed": clock.time() - week}
        gone = await kernel.state.set("ratelimit:pool:gone", stale)
        await kernel.state.set("ratelimit:pool:old", {**value, "removed": clock.time() - week})
        await (await key_pool(kernel, "acme").acquire()).success()  # starts a sweep
        changed = await kernel.state.wait_for_change(gone.key, version=gone.version, timeout=10)
        assert changed is None  # deleted
        assert await kernel.state.get("ratelimit:pool:old") is not None  # still suspended
        clock.advance(30 * 86400)
        assert await plugin.forget_removed_providers() == ["old"]


async def test_a_keyless_provider_given_keys_forgets_its_implicit_key() -> None:
    clock = FakeClock()
    async with Kernel(state="memory://", clock=clock, plugins=[RateLimitPlugin()]) as kernel:
        await (await key_pool(kernel, "acme").acquire()).success()
        assert aliases_in(await kernel.state.get("ratelimit:pool:acme")) == {"-"}
        pool = RateLimitPlugin.of(kernel).register_keys("acme", [("k1", SECRET_A)])
        await (await pool.acquire()).success()
        clock.advance(7 * 86400)
        await (await pool.acquire()).success()
        assert aliases_in(await kernel.state.get("ratelimit:pool:acme")) == {"k1"}


async def test_quota_suspends_the_whole_pool() -> None:
    clock = FakeClock()
    async with kernel_with(config(suspend_seconds=600), clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("a", "quota", pattern="default.status.402")
        with pytest.raises(PoolUnavailable) as exc:
            await pool.acquire()
        assert exc.value.kind == "quota" and exc.value.retry_after_s == 600
        assert "suspended until" in str(exc.value)
        await pool.report(None, "quota", retry_after_s=50)  # a reset time from the provider wins
        assert (await pool.availability()).retry_after_s == 50
        clock.advance(51)
        assert (await pool.acquire()).alias in ("a", "b")
    # without suspend_on_monthly_exhausted only the key is put aside
    async with kernel_with(config(suspend_on_monthly_exhausted=False)) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("a", "quota")
        assert {(await pool.acquire()).alias for _ in range(5)} == {"b"}


async def test_keyless_provider_tracks_health() -> None:
    clock = FakeClock()
    async with Kernel(state="memory://", clock=clock, plugins=[RateLimitPlugin()]) as kernel:
        pool = key_pool(kernel, "searxng")
        assert pool.aliases == [] and not pool.has_keys
        lease = await pool.acquire()
        assert lease.alias is None and lease.secret is None
        await pool.report(None, "rate_limit", retry_after_s=3)
        with pytest.raises(PoolUnavailable, match="cooling down"):
            await pool.acquire()
        clock.advance(3.1)
        assert (await pool.acquire()).probe


async def test_stored_state_holds_aliases_only() -> None:
    async with kernel_with(config()) as kernel:
        pool = key_pool(kernel, "acme")
        lease = await pool.acquire()
        await pool.report("a", "auth")
        await pool.report("b", "rate_limit")
        entries = await kernel.state.scan("")
        text = json.dumps([e.value for e in entries]) + " ".join(e.key for e in entries)
        assert SECRET_A not in text and SECRET_B not in text
        assert "a" in (await pool.status())["keys"]
        assert lease.secret == SECRET_A and SECRET_A not in repr(lease)
        assert SECRET_A not in repr(ApiKey("a", SECRET_A))


async def test_register_keys_from_code() -> None:
    async with Kernel(state="memory://", clock=FakeClock(), plugins=[RateLimitPlugin()]) as kernel:
        plugin = RateLimitPlugin.of(kernel)
        pool = plugin.register_keys(
            "exa",
            [("k1", "exa-secret-111111", 2), {"alias": "k2", "secret": "exa-secret-222222"}],
            cooldown_seconds=9,
        )
        assert pool.aliases == ["k1", "k2"] and pool.settings.cooldown_s == 9
        assert [(await pool.acquire()).alias for _ in range(3)] == ["k1", "k2", "k1"]
        with pytest.raises(ValueError, match="cooldown_secondz"):
            plugin.register_keys("exa", [("k1", "exa-secret-111111")], cooldown_secondz=1)


async def test_pools_need_a_started_kernel() -> None:
    plugin = RateLimitPlugin()
    Kernel(plugins=[plugin])
    with pytest.raises(LookupError):
        key_pool(Kernel(), "x")
    with pytest.raises(RuntimeError, match="not started"):
        await plugin.pool("x").acquire()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(free_tcp_port: int) -> None:
    """redis.asyncio runs on asyncio only: the kernel says so when it starts (no hang, no
    traceback from inside redis-py)."""
    kernel = kernel_with(config(), state=f"redis://127.0.0.1:{free_tcp_port}/0")
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await kernel.start()
    with pytest.raises(RuntimeError, match="not started"):
        await key_pool(kernel, "acme").acquire()


async def test_outbound_rate_waits_or_fails_fast_and_is_shared() -> None:
    clock = FakeClock()
    from toolwire.state import MemoryStore

    store = MemoryStore(clock=clock.time)
    cfg = config(rate={"requests": 2, "per_seconds": 1, "burst": 2})
    k1 = kernel_with(cfg, state=store, clock=clock)
    k2 = kernel_with(cfg, state=store, clock=clock)
    async with k1, k2:
        p1, p2 = key_pool(k1, "acme"), key_pool(k2, "acme")
        t0 = clock.monotonic()
        for p in (p1, p2, p1, p2):  # 2 at once, then one every 0.5 s, across both kernels
            await p.acquire()
        assert clock.sleeps == [pytest.approx(0.5), pytest.approx(0.5)]
        assert clock.monotonic() - t0 == pytest.approx(1.0)
    fast = config(rate={"requests": 1, "per_seconds": 10, "mode": "fail_fast"})
    async with kernel_with(fast, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.acquire()
        with pytest.raises(PoolUnavailable) as exc:
            await pool.acquire()
        assert exc.value.kind == "rate_limit" and exc.value.retry_after_s == pytest.approx(10.0)
        assert exc.value.details["pattern"] == "outbound.providers.acme"


@pytest.mark.parametrize("mode", ["wait", "fail_fast"])
async def test_a_pool_that_cannot_serve_takes_no_outbound_slot(mode: str) -> None:
    """Before: acquire took (and in "wait" mode slept for) an outbound slot, then found every
    key cooling or the pool suspended. Calls during a suspension queued for slots only to
    fail, and used up the slots of the first requests once the pool served again."""
    clock = FakeClock()
    rate = {"requests": 1, "per_seconds": 10, "burst": 1, "mode": mode, "max_wait_seconds": 60}
    async with kernel_with(config(rate=rate), clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("a", "quota", retry_after_s=3600)  # the whole pool, for an hour
        for _ in range(3):
            with pytest.raises(PoolUnavailable) as exc:
                await pool.acquire()
            assert exc.value.kind == "quota"  # at once, not after a wait for a slot
        assert clock.sleeps == []
        await pool.clear()
        lease = await pool.acquire()  # the slot is still there
        assert lease.alias in ("a", "b") and clock.sleeps == []


async def test_tool_rate_limit_in_before_call() -> None:
    clock = FakeClock()
    cfg = RateLimitConfig.model_validate(
        {"tools": {"ping": {"rate": {"requests": 1, "per_seconds": 5, "mode": "fail_fast"}}}}
    )

    async def ping(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"pong": True}

    from toolwire import Tool

    kernel = Kernel(
        clock=clock,
        plugins=[RateLimitPlugin(cfg)],
        tools=[Tool("ping", "Ping.", {"type": "object"}, ping)],
    )
    async with kernel:
        assert not (await kernel.call("ping", {})).is_error
        res = await kernel.call("ping", {})
        assert res.is_error and res.error is not None
        assert (res.error.kind, res.error.retryable) == ("rate_limit", True)
        assert res.error.retry_after_s == pytest.approx(5.0)
        clock.advance(5)
        assert not (await kernel.call("ping", {})).is_error


async def test_on_error_without_a_lease_reports_provider_health() -> None:
    clock = FakeClock()
    calls = 0

    async def flaky(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        raise ToolError("slow down", status=429, details={"headers": {"Retry-After": "4"}})

    from toolwire import Tool

    tool = Tool("flaky", "Flaky.", {"type": "object"}, flaky, settings={"provider": "up"})
    async with Kernel(clock=clock, plugins=[RateLimitPlugin()], tools=[tool]) as kernel:
        res = await kernel.call("flaky", {})
        assert res.error is not None
        assert (res.error.kind, res.error.retry_after_s) == ("rate_limit", 4.0)
        assert res.error.details["provider"] == "up"
        assert res.meta.extra["attempt_details"][0]["provider"] == "up"
        av = await key_pool(kernel, "up").availability()
        assert (av.available, av.retry_after_s) == (False, 4.0)


class _RetryRetryable:
    """An on_error plugin after ratelimit (order 500): retries what was classified retryable."""

    name = "retry_retryable"
    order = 500

    @hookimpl
    def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Retry | None:
        return Retry() if error.retryable else None


class _RetryFirst:
    """An on_error plugin before ratelimit (order 100): retries every attempt but the first,
    so ratelimit's on_error never runs for those."""

    name = "retry_first"
    order = 100

    @hookimpl
    def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> Retry | None:
        return Retry() if ctx.attempt > 1 else None


async def test_attempt_details_cover_a_retried_success_without_a_provider() -> None:
    calls = 0

    async def flaky(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ToolError("too many requests", status=429)
        return {"ok": True}

    from toolwire import Tool

    tool = Tool("flaky", "Flaky.", {"type": "object"}, flaky)
    async with Kernel(plugins=[RateLimitPlugin(), _RetryRetryable()], tools=[tool]) as kernel:
        res = await kernel.call("flaky", {})
        assert not res.is_error and len(res.meta.attempts) == 2
        details = res.meta.extra["attempt_details"]
        assert [d["attempt"] for d in details] == [1, 2]
        assert details[0]["kind"] == "rate_limit"
        assert "served_by" not in res.meta.extra  # no provider: nothing to name
        res = await kernel.call("flaky", {})  # a success at once records nothing
        assert "attempt_details" not in res.meta.extra


async def test_attempt_details_cover_a_failed_attempt_ratelimit_did_not_see() -> None:
    async def busy(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        raise ToolError("too many requests", status=429)

    from toolwire import Tool

    tool = Tool("busy", "Busy.", {"type": "object"}, busy)
    plugins = [RateLimitPlugin(), _RetryRetryable(), _RetryFirst()]
    async with Kernel(plugins=plugins, tools=[tool], max_attempts=2) as kernel:
        res = await kernel.call("busy", {})
        assert res.is_error and len(res.meta.attempts) == 2
        details = res.meta.extra["attempt_details"]
        assert details == [
            {
                "attempt": 1,
                "kind": "rate_limit",
                "pattern": "default.rate_limit.text",
            },
            {"attempt": 2},
        ]


class _StallingStore(MemoryStore):
    """A memory store that stops answering (every read and write waits) while ``stall``."""

    stall = False

    async def get_entry(self, key: str) -> Any:
        if self.stall:
            await anyio.sleep_forever()
        return await super().get_entry(key)

    async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
        if self.stall:
            await anyio.sleep_forever()
        return await super().compare_and_set(key, value, **kw)


@pytest.mark.parametrize("ending", ["success", "cancelled", "interrupted"])
async def test_bookkeeping_cut_by_its_bound_is_logged_naming_the_key(
    ending: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the release of a probe after a cancellation (or Ctrl-C) was cut at 2 s
    without a word, unlike a success's bookkeeping; both now log the key and the bound."""
    from toolwire_ratelimit import _pool

    monkeypatch.setattr(_pool, "BOOKKEEPING_S", 0.05)
    clock, store = FakeClock(), _StallingStore()
    cfg = config(cooldown_seconds=5, keys=[{"alias": "only", "secret": SECRET_A}])
    async with kernel_with(cfg, state=store, clock=clock) as kernel:
        pool = key_pool(kernel, "acme")
        await pool.report("only", "rate_limit")
        clock.advance(5.1)  # the next lease is the key's probe: its end is always recorded
        with (
            anyio.CancelScope() as scope,
            pytest.raises(KeyboardInterrupt)
            if (ending == "interrupted")
            else contextlib.nullcontext(),
        ):
            async with pool.lease() as lease:
                assert lease.probe
                store.stall = True
                if ending == "cancelled":
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()  # the cancellation arrives here
                elif ending == "interrupted":
                    raise KeyboardInterrupt
        assert scope.cancelled_caught == (ending == "cancelled")
        store.stall = False
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "toolwire.ratelimit"]
    assert "'acme'" in warning and "'only'" in warning
    assert "did not answer within 0.05s" in warning


class _StoreThatCannotWrite(MemoryStore):
    async def compare_and_set(self, *args: Any, **kwargs: Any) -> Any:
        raise StateStoreError("the store is down")


async def test_a_store_failure_recording_a_providers_limit_keeps_the_classification(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A keyless provider's 429: before, the failing write of its suspension left on_error
    with StateStoreError, so the error lost its classification (not `rate_limit`, not
    retryable) and the hook was recorded as a plugin failure."""

    @tool(provider="upstream")
    async def fetch(q: str) -> str:
        """Fetch."""
        raise ToolError("HTTP 429: too many requests", status=429)

    kernel = Kernel(tools=[fetch], plugins=[RateLimitPlugin()], state=_StoreThatCannotWrite())
    async with kernel:
        res = await kernel.call("fetch", {"q": "x"})
    assert res.error is not None and res.error.kind == "rate_limit", res.error
    assert res.error.retryable and res.meta.plugin_errors == []
    assert any("could not record its rate_limit" in r.getMessage() for r in caplog.records)


async def test_a_clear_from_a_process_without_the_provider_keeps_its_grace(
    tmp_path: Path,
) -> None:
    """Before: a write of a removed provider's pool by a process that does not configure it
    (`toolwire keys clear old k2` from a host whose configuration no longer lists it) used
    the default grace (7 days) and dropped the one the provider's configuration had (30
    days here): the sweep then forgot k1's quarantine after 7 days, and status showed a
    wrong "forgotten at"."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    month = 30 * 86400.0
    with_old = with_provider_old(removed_key_grace_seconds=month)
    async with kernel_with(with_old, state=url, clock=clock) as kernel:
        await key_pool(kernel, "old").report("k1", "auth")
        await key_pool(kernel, "old").report("k2", "auth")
    async with (
        kernel_with(config(), state=url, clock=clock) as server,
        kernel_with(config(), state=url, clock=clock) as cli,
    ):
        sweep = RateLimitPlugin.of(server).forget_removed_providers
        assert await sweep() == []  # notes the provider as removed
        clock.advance(86400)
        pool = key_pool(cli, "old")
        await pool.clear("k2")  # the operator lifts k2 only
        stored = {k["alias"]: k for k in (await pool.status())["unconfigured"]}
        assert stored["k1"]["state"] == "quarantined"
        assert stored["k1"]["forget_at"] == stored["k1"]["gone_since"] + month
        for _ in range(10):  # the sweep runs for 10 days: k1 is kept (its grace is 30)
            assert await sweep() == []
            clock.advance(86400)
    async with kernel_with(with_old, state=url, clock=clock) as kernel:  # back in the grace
        assert (await key_pool(kernel, "old").availability()).keys == {
            "k1": "quarantined",
            "k2": "ok",
        }


@pytest.mark.parametrize("rate", [None, 100])
async def test_a_replica_whose_every_key_is_quarantined_keeps_its_quarantines(
    tmp_path: Path, rate: int | None
) -> None:
    """Before: a replica whose every key was quarantined never wrote the pool again (each
    lease failed before writing), so it renewed nothing: a process sharing the store that
    does not configure the provider (or those keys) forgot the pool (or the quarantines)
    after removed_key_grace_seconds, and the replica that configures them all along sent
    the rejected keys again."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = FakeClock()
    extra = {} if rate is None else {"rate": rate}
    with_old = with_provider_old(**extra)
    new_keys = RateLimitConfig.model_validate(
        {"providers": {"old": {"keys": [{"alias": "k3", "secret": SECRET_B}]}}}
    )
    async with (
        kernel_with(with_old, state=url, clock=clock) as replica,
        kernel_with(config(), state=url, clock=clock) as without_old,
        kernel_with(new_keys, state=url, clock=clock) as other_keys,
    ):
        pool = key_pool(replica, "old")
        await pool.report("k1", "auth")
        await pool.report("k2", "auth")
        sweep = RateLimitPlugin.of(without_old).forget_removed_providers
        for _ in range(10):  # 10 days: the replica is asked for the provider all along
            assert await sweep() == []
            await (await key_pool(other_keys, "old").acquire()).success()
            with pytest.raises(PoolUnavailable):
                await pool.acquire()
            clock.advance(86400)
        assert (await pool.availability()).keys == {"k1": "quarantined", "k2": "quarantined"}
