"""Conformance: wait_for_change on every backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from toolwire.state import Entry, StateStore

if TYPE_CHECKING:
    from conftest import Backend

pytestmark = pytest.mark.anyio

LONG = 20.0  # a timeout the tests never reach: returning early proves the wake-up


class Waiter:
    """Runs ``wait_for_change`` in a task and records what it returned."""

    def __init__(self) -> None:
        self.result: Entry | str | None = "pending"
        self.elapsed = -1.0

    async def run(
        self,
        store: StateStore,
        key: str,
        version: int | None,
        timeout: float = LONG,  # noqa: ASYNC109
    ) -> None:
        start = anyio.current_time()
        self.result = await store.wait_for_change(key, version=version, timeout=timeout)
        self.elapsed = anyio.current_time() - start


async def test_wakes_on_a_write_from_another_task(store: StateStore) -> None:
    first = await store.set("w", "old")
    waiter = Waiter()
    with anyio.fail_after(LONG / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.run, store, "w", first.version)
            await anyio.sleep(0.05)  # let it start waiting
            assert waiter.result == "pending"
            new = await store.set("w", "new")
    assert waiter.result == new


async def test_wakes_on_deletion(store: StateStore) -> None:
    first = await store.set("w", "old")
    waiter = Waiter()
    with anyio.fail_after(LONG / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.run, store, "w", first.version)
            await anyio.sleep(0.05)
            assert await store.delete("w")
    assert waiter.result is None


async def test_version_none_waits_for_the_key_to_appear(store: StateStore) -> None:
    waiter = Waiter()
    with anyio.fail_after(LONG / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.run, store, "appear", None)
            await anyio.sleep(0.05)
            assert waiter.result == "pending"
            created = await store.set_if_absent("appear", {"ok": True})
    assert created is not None
    assert waiter.result == created


async def test_wakes_on_incr_and_cas(store: StateStore) -> None:
    for write in ("incr", "cas"):
        current = await store.set("n", 1)
        waiter = Waiter()
        with anyio.fail_after(LONG / 2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter.run, store, "n", current.version)
                await anyio.sleep(0.05)
                if write == "incr":
                    await store.incr("n")
                else:
                    await store.compare_and_set("n", 2, expected_version=current.version)
        assert isinstance(waiter.result, Entry)
        assert waiter.result.value == 2
        assert waiter.result.version != current.version


async def test_wakes_on_expiry(backend: Backend) -> None:
    store = backend.store
    entry = await store.set("exp", 1, ttl=0.2)
    waiter = Waiter()
    with anyio.fail_after(LONG / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.run, store, "exp", entry.version)
            await anyio.sleep(0.05)
            await backend.pass_time(0.3)
    assert waiter.result is None


async def test_returns_at_once_when_already_changed(store: StateStore) -> None:
    old = await store.set("k", 1)
    new = await store.set("k", 2)
    with anyio.fail_after(LONG / 2):
        assert await store.wait_for_change("k", version=old.version, timeout=LONG) == new
        assert await store.wait_for_change("k", version=None, timeout=LONG) == new
        await store.delete("k")
        assert await store.wait_for_change("k", version=new.version, timeout=LONG) is None


async def test_returns_current_entry_on_timeout(store: StateStore) -> None:
    entry = await store.set("still", "same")
    waiter = Waiter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter.run, store, "still", entry.version, 0.25)
        await anyio.sleep(0.05)
        for i in range(5):  # writes to other keys do not end the wait
            await store.set("still-not", i)
            await store.set("other", i)
    assert waiter.result == entry
    assert waiter.elapsed >= 0.24

    absent = Waiter()
    await absent.run(store, "never", None, timeout=0.1)
    assert absent.result is None
    assert absent.elapsed >= 0.09

    zero = Waiter()
    await zero.run(store, "still", entry.version, timeout=0)
    assert zero.result == entry


async def test_is_cancellable(store: StateStore) -> None:
    entry = await store.set("c", 1)
    with anyio.move_on_after(0.1) as scope:
        await store.wait_for_change("c", version=entry.version, timeout=LONG)
    assert scope.cancelled_caught
    # the store still works, and a later waiter still gets woken
    waiter = Waiter()
    with anyio.fail_after(LONG / 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.run, store, "c", entry.version)
            await anyio.sleep(0.05)
            await store.set("c", 2)
    assert isinstance(waiter.result, Entry) and waiter.result.value == 2


async def test_many_waiters_on_one_key_all_wake(store: StateStore) -> None:
    entry = await store.set("many", 0)
    waiters = [Waiter() for _ in range(20)]
    with anyio.fail_after(LONG / 2):
        async with anyio.create_task_group() as tg:
            for w in waiters:
                tg.start_soon(w.run, store, "many", entry.version)
            await anyio.sleep(0.05)
            await store.set("many", 1)
    assert all(isinstance(w.result, Entry) and w.result.value == 1 for w in waiters)
