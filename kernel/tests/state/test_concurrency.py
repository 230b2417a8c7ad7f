"""Conformance: atomicity under 50 concurrent tasks, on every backend."""

from __future__ import annotations

import anyio
import pytest

from toolwire.state import StateStore

pytestmark = pytest.mark.anyio

N = 50


async def cas_increment(store: StateStore, key: str) -> int:
    """Add one with a read / compare-and-set retry loop; returns the attempts made."""
    attempts = 0
    while True:
        attempts += 1
        entry = await store.get_entry(key)
        if entry is None:
            won = await store.compare_and_set(key, 1, expected_version=None)
        else:
            won = await store.compare_and_set(key, entry.value + 1, expected_version=entry.version)
        if won is not None:
            return attempts


async def test_set_if_absent_has_exactly_one_winner(store: StateStore) -> None:
    winners: list[int] = []

    async def contender(i: int) -> None:
        if await store.set_if_absent("claim", i, owner=f"task-{i}") is not None:
            winners.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(N):
            tg.start_soon(contender, i)

    assert len(winners) == 1
    entry = await store.get_entry("claim")
    assert entry is not None
    assert (entry.value, entry.owner) == (winners[0], f"task-{winners[0]}")


async def test_cas_counter_has_no_lost_updates(store: StateStore) -> None:
    attempts: list[int] = []

    async def worker() -> None:
        attempts.append(await cas_increment(store, "counter"))

    async with anyio.create_task_group() as tg:
        for _ in range(N):
            tg.start_soon(worker)

    assert await store.get("counter") == N
    assert len(attempts) == N
    # the tasks really did race: some compare-and-sets lost and were retried
    assert sum(attempts) > N


async def test_incr_from_many_tasks(store: StateStore) -> None:
    results: list[int] = []

    async def worker() -> None:
        results.append(await store.incr("hits"))

    async with anyio.create_task_group() as tg:
        for _ in range(N):
            tg.start_soon(worker)

    assert await store.get("hits") == N
    assert sorted(results) == list(range(1, N + 1))  # every caller saw a distinct value


async def test_lease_via_owner_has_one_holder(store: StateStore) -> None:
    holders: list[str] = []

    async def acquire(name: str) -> None:
        if await store.compare_and_set("lease", "held", expected_version=None, owner=name):
            holders.append(name)

    async with anyio.create_task_group() as tg:
        for i in range(N):
            tg.start_soon(acquire, f"w{i}")

    assert len(holders) == 1
    assert not await store.compare_and_delete("lease", expected_owner="somebody-else")
    assert await store.compare_and_delete("lease", expected_owner=holders[0])
    assert await store.get_entry("lease") is None


async def test_compare_and_delete_has_one_winner(store: StateStore) -> None:
    entry = await store.set("once", 1)
    deleted: list[bool] = []

    async def worker() -> None:
        deleted.append(await store.compare_and_delete("once", expected_version=entry.version))

    async with anyio.create_task_group() as tg:
        for _ in range(N):
            tg.start_soon(worker)

    assert deleted.count(True) == 1
