"""Two store objects on the same data (SQLite file / Redis / Redis Cluster) agree and wake each
other."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from toolwire.state import Entry, StateStore

if TYPE_CHECKING:
    from conftest import Backend

STATE_BACKENDS = ("sqlite", "redis", "redis-cluster")

pytestmark = pytest.mark.anyio


async def test_two_store_objects_agree(backend: Backend) -> None:
    assert backend.make_store is not None
    other = backend.make_store()
    stores: list[StateStore] = [backend.store, other]
    winners: list[int] = []

    async def claim(i: int) -> None:
        if await stores[i % 2].set_if_absent("claim", i) is not None:
            winners.append(i)

    async def bump(i: int) -> None:
        store = stores[i % 2]
        while True:
            entry = await store.get_entry("counter")
            expected = None if entry is None else entry.version
            new = 1 if entry is None else entry.value + 1
            if await store.compare_and_set("counter", new, expected_version=expected):
                return

    async with other:
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(claim, i)
                tg.start_soon(bump, i)
        assert len(winners) == 1
        assert await other.get("counter") == 40
        assert await backend.store.get("claim") == winners[0]


async def test_wait_wakes_on_a_write_through_another_store_object(backend: Backend) -> None:
    assert backend.make_store is not None
    first = await backend.store.set("shared", "old")
    result: list[Entry | None] = []

    async def wait() -> None:
        result.append(
            await backend.store.wait_for_change("shared", version=first.version, timeout=20)
        )

    async with backend.make_store() as other:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.05)
                assert result == []
                written = await other.set("shared", "new")
    assert result == [written]
