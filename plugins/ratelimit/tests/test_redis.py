"""Two kernels on one real Redis share the pools: rotation, cooldowns, quarantine, rates."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from toolwire import Kernel
from toolwire.testing import FakeClock
from toolwire_ratelimit import KeyPool, PoolUnavailable, RateLimitConfig, RateLimitPlugin, key_pool

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


def cfg(prefix: str, **provider: object) -> RateLimitConfig:
    return RateLimitConfig.model_validate(
        {
            "state_prefix": prefix,
            "providers": {
                "acme": {
                    "keys": [
                        {"alias": "a", "secret": "redis-secret-aaaaaa", "weight": 3},
                        {"alias": "b", "secret": "redis-secret-bbbbbb", "weight": 1},
                    ],
                    **provider,
                }
            },
        }
    )


async def test_two_kernels_share_rotation_without_lost_updates(redis_url: str, prefix: str) -> None:
    k1 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix))])
    k2 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix))])
    async with k1, k2:
        pools = [key_pool(k1, "acme"), key_pool(k2, "acme")]
        got: list[str | None] = []

        async def pick(i: int) -> None:
            got.append((await pools[i % 2].acquire()).alias)

        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(pick, i)
        assert Counter(got) == {"a": 75, "b": 25}
        status = await pools[1].status()
        assert {a: k["picks"] for a, k in status["keys"].items()} == {"a": 75, "b": 25}
        await k1.state.delete(RateLimitPlugin.of(k1).state_key("pool", "acme"))


async def test_health_is_shared_between_replicas(redis_url: str, prefix: str) -> None:
    k1 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix, cooldown_seconds=60))])
    k2 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix, cooldown_seconds=60))])
    async with k1, k2:
        p1, p2 = key_pool(k1, "acme"), key_pool(k2, "acme")
        await p1.report("a", "auth", pattern="default.status.401")
        assert {(await p2.acquire()).alias for _ in range(4)} == {"b"}
        await p2.report("b", "rate_limit")
        with pytest.raises(PoolUnavailable) as exc:
            await p1.acquire()
        assert exc.value.availability.keys == {"a": "quarantined", "b": "cooling"}
        await p2.clear()
        assert (await p1.availability()).available
        await p1.report(None, "quota")
        assert (await p2.availability()).state == "suspended"
        await k1.state.delete(RateLimitPlugin.of(k1).state_key("pool", "acme"))


async def test_a_rolling_key_rename_keeps_the_old_key_until_no_replica_lists_it(
    redis_url: str, prefix: str
) -> None:
    """Replicas with keys {a, b} and {a, c} write the record concurrently, past the grace:
    b (quarantined) stays while the old replica leases, and goes once it stopped."""
    renamed = RateLimitConfig.model_validate(
        {
            "state_prefix": prefix,
            "providers": {
                "acme": {
                    "keys": [
                        {"alias": "a", "secret": "redis-secret-aaaaaa"},
                        {"alias": "c", "secret": "redis-secret-cccccc"},
                    ],
                    "removed_key_grace_seconds": 600,
                }
            },
        }
    )
    clock = FakeClock()
    old = Kernel(state=redis_url, clock=clock, plugins=[RateLimitPlugin(cfg(prefix))])
    new = Kernel(state=redis_url, clock=clock, plugins=[RateLimitPlugin(renamed)])
    key = RateLimitPlugin.of(old).state_key("pool", "acme")
    async with old, new:
        p_old, p_new = key_pool(old, "acme"), key_pool(new, "acme")
        await p_old.report("b", "auth")

        async def lease(pool: KeyPool) -> None:
            await (await pool.acquire()).success()

        for _ in range(3):  # 30 minutes of both serving, writes racing
            clock.advance(599)
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(lease, (p_old, p_new)[i % 2])
        assert (await p_old.availability()).keys["b"] == "quarantined"
        async with anyio.create_task_group() as tg:  # only the new replica from here
            for _ in range(20):
                tg.start_soon(lease, p_new)
        clock.advance(600)
        await lease(p_new)
        assert set((await new.state.get(key))["picks"]) == {"a", "c"}
        assert "b" not in (await new.state.get(key))["keys"]
        await old.state.delete(key)


async def test_a_rolling_secret_change_keeps_both_secrets_quarantines(
    redis_url: str, prefix: str
) -> None:
    """Replicas sending key a's old and new secret, both rejected: before, each one's
    quarantine replaced the other's (one slot per alias), and the other secret was sent
    again."""
    new_a = RateLimitConfig.model_validate(
        {
            "state_prefix": prefix,
            "providers": {
                "acme": {
                    "keys": [
                        {"alias": "a", "secret": "redis-secret-NEW-aaa"},
                        {"alias": "b", "secret": "redis-secret-bbbbbb"},
                    ]
                }
            },
        }
    )
    k1 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix))])
    k2 = Kernel(state=redis_url, plugins=[RateLimitPlugin(new_a)])
    async with k1, k2:
        p1, p2 = key_pool(k1, "acme"), key_pool(k2, "acme")

        async def reject(pool: KeyPool) -> None:
            await pool.report("a", "auth", pattern="default.status.401")

        async with anyio.create_task_group() as tg:  # concurrently, on both replicas
            for i in range(20):
                tg.start_soon(reject, (p1, p2)[i % 2])
        for pool in (p1, p2, p1, p2):
            assert (await pool.availability()).keys["a"] == "quarantined"
            await (await pool.acquire()).success()
        assert {(await (p1, p2)[i % 2].acquire()).alias for i in range(8)} == {"b"}
        await k1.state.delete(RateLimitPlugin.of(k1).state_key("pool", "acme"))


async def test_a_removed_provider_is_forgotten_after_the_grace(redis_url: str, prefix: str) -> None:
    """Before: a provider's pool record stayed for ever once no process configured it."""
    both = cfg(prefix).model_dump()
    both["providers"]["old"] = {
        "keys": [{"alias": "k", "secret": "redis-secret-oooooo"}],
        "removed_key_grace_seconds": 600,
    }
    clock = FakeClock()
    k_old = Kernel(state=redis_url, clock=clock, plugins=[RateLimitPlugin(RateLimitConfig(**both))])
    k_new = Kernel(state=redis_url, clock=clock, plugins=[RateLimitPlugin(cfg(prefix))])
    async with k_old, k_new:
        await key_pool(k_old, "old").report("k", "auth")
        sweep = RateLimitPlugin.of(k_new).forget_removed_providers
        assert await sweep() == []
        clock.advance(599)
        assert await sweep() == []
        assert (await key_pool(k_old, "old").availability()).keys == {"k": "quarantined"}
        clock.advance(1)
        assert await sweep() == ["old"]
        assert await k_new.state.get(RateLimitPlugin.of(k_new).state_key("pool", "old")) is None
        for key in ("pool:acme", "sweep:pools"):
            await k_new.state.delete(f"{prefix}:{key}")


async def test_outbound_rate_is_shared(redis_url: str, prefix: str) -> None:
    rate = {"requests": 1, "per_seconds": 30, "mode": "fail_fast"}
    k1 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix, rate=rate))])
    k2 = Kernel(state=redis_url, plugins=[RateLimitPlugin(cfg(prefix, rate=rate))])
    async with k1, k2:
        await key_pool(k1, "acme").acquire()
        with pytest.raises(PoolUnavailable) as exc:
            await key_pool(k2, "acme").acquire()
        assert exc.value.details["pattern"] == "outbound.providers.acme"
        assert 25 < (exc.value.retry_after_s or 0) <= 30
        plugin = RateLimitPlugin.of(k1)
        for key in (plugin.state_key("pool", "acme"), plugin.state_key("rate", "providers.acme")):
            await k1.state.delete(key)
