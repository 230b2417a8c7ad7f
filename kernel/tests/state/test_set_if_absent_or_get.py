"""Conformance: set_if_absent_or_get, the atomic claim-or-read, on every backend."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from toolwire.state import MAX_TTL_S, Entry, StateStore, StateStoreError

if TYPE_CHECKING:
    from conftest import Backend

pytestmark = pytest.mark.anyio

N = 50
FALSY = [0, False, "", [], {}, None, 0.0]


async def test_creates_when_absent_then_returns_the_live_entry(backend: Backend) -> None:
    store = backend.store
    created, was_created = await store.set_if_absent_or_get("rog", {"n": 1}, ttl=60, owner="a")
    assert was_created is True
    assert (created.key, created.value, created.owner) == ("rog", {"n": 1}, "a")
    assert created.expires_at is not None
    assert await store.get_entry("rog") == created

    # a second call returns the entry untouched: value, ttl and owner are ignored
    again, was_created = await store.set_if_absent_or_get("rog", {"n": 2}, owner="b")
    assert was_created is False
    assert again == created
    assert await store.get_entry("rog") == created


async def test_falsy_values_are_created_and_read_back(store: StateStore) -> None:
    for i, value in enumerate(FALSY):
        entry, created = await store.set_if_absent_or_get(f"f{i}", value)
        assert created and entry.value == value and type(entry.value) is type(value)
        entry, created = await store.set_if_absent_or_get(f"f{i}", "other")
        assert not created and entry.value == value and type(entry.value) is type(value)


async def test_no_owner_and_no_ttl(store: StateStore) -> None:
    entry, created = await store.set_if_absent_or_get("plain", [1, 2])
    assert created and entry.owner is None and entry.expires_at is None
    existing = await store.set("other", "x", owner="o", ttl=60)
    got, created = await store.set_if_absent_or_get("other", "y")
    assert not created and got == existing


async def test_expired_entry_counts_as_absent(backend: Backend) -> None:
    store = backend.store
    old, _ = await store.set_if_absent_or_get("lease", "old", ttl=0.2, owner="dead")
    await backend.pass_time(0.3)
    new, created = await store.set_if_absent_or_get("lease", "new", ttl=60, owner="alive")
    assert created is True
    assert (new.value, new.owner) == ("new", "alive")
    assert new.version != old.version  # never an old version back


async def test_value_is_copied_out(store: StateStore) -> None:
    entry, _ = await store.set_if_absent_or_get("copy", {"list": [1]})
    entry.value["list"].append(2)
    again, _ = await store.set_if_absent_or_get("copy", None)
    assert again.value == {"list": [1]}
    again.value["list"].append(3)
    assert await store.get("copy") == {"list": [1]}


@pytest.mark.parametrize("bad", [{1, 2}, b"x", math.nan, [math.inf]], ids=str)
async def test_bad_value_is_rejected_even_when_the_key_exists(store: StateStore, bad: Any) -> None:
    before = await store.set("existing", "keep")
    for key in ("fresh", "existing"):
        with pytest.raises(StateStoreError, match=key):
            await store.set_if_absent_or_get(key, bad)
    assert await store.get_entry("fresh") is None
    assert await store.get_entry("existing") == before


async def test_invalid_arguments(store: StateStore) -> None:
    for ttl in (0, -1, math.nan, math.inf, MAX_TTL_S * 2, 1e16):  # 1e16: a Redis overflow
        with pytest.raises(ValueError, match="ttl"):
            await store.set_if_absent_or_get("k", 1, ttl=ttl)
    with pytest.raises(TypeError):
        await store.set_if_absent_or_get(1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.set_if_absent_or_get("k", 1, owner=5)  # type: ignore[arg-type]
    assert await store.get_entry("k") is None


async def test_closed_store_raises(store: StateStore) -> None:
    await store.close()
    with pytest.raises(StateStoreError, match="closed"):
        await store.set_if_absent_or_get("k", 1)
    await store.open()
    assert (await store.set_if_absent_or_get("k", 1))[1] is True


async def test_fifty_concurrent_callers_one_creator_same_entry(store: StateStore) -> None:
    seen: list[tuple[int, Entry, bool]] = []

    async def contender(i: int) -> None:
        entry, created = await store.set_if_absent_or_get("claim", i, ttl=60, owner=f"task-{i}")
        seen.append((i, entry, created))

    async with anyio.create_task_group() as tg:
        for i in range(N):
            tg.start_soon(contender, i)

    assert len(seen) == N
    creators = [i for i, _, created in seen if created]
    assert len(creators) == 1
    winner = creators[0]
    entries = {(e.value, e.version, e.owner, e.expires_at) for _, e, _ in seen}
    assert len(entries) == 1  # everyone sees the same entry
    entry = seen[0][1]
    assert (entry.value, entry.owner) == (winner, f"task-{winner}")
    assert await store.get_entry("claim") == entry


async def test_create_wakes_waiters_a_read_does_not(store: StateStore) -> None:
    woke: list[Entry | None] = []

    async def wait_for_creation() -> None:
        woke.append(await store.wait_for_change("w", version=None, timeout=20))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_creation)
            await anyio.sleep(0.05)
            created, _ = await store.set_if_absent_or_get("w", "v")
    assert woke == [created]

    # reading an existing key is not a write: a waiter on its version sleeps on
    start = anyio.current_time()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def wait_on_version() -> None:
                woke.append(await store.wait_for_change("w", version=created.version, timeout=0.3))

            tg.start_soon(wait_on_version)
            await anyio.sleep(0.05)
            assert (await store.set_if_absent_or_get("w", "other"))[1] is False
    assert woke[-1] == created
    assert anyio.current_time() - start >= 0.25  # it timed out rather than woke


async def test_interplays_with_the_other_operations(store: StateStore) -> None:
    claim, _ = await store.set_if_absent_or_get("c", {"s": "pending"}, owner="me", ttl=60)
    done = await store.compare_and_set("c", {"s": "done"}, expected_owner="me", owner=None, ttl=60)
    assert done is not None and done.owner is None
    assert (await store.set_if_absent_or_get("c", {"s": "pending"}, owner="you"))[0] == done
    assert await store.compare_and_delete("c", expected_version=done.version)
    again, created = await store.set_if_absent_or_get("c", {"s": "pending"}, owner="you")
    assert created and again.owner == "you"
    assert again.version not in (claim.version, done.version)


@pytest.mark.parametrize("owner", ["a:b:c", "nul\x00inside", "ünï-cødé ✓", "", "-", "=x"])
async def test_owners_and_values_with_separator_characters(store: StateStore, owner: str) -> None:
    value = {"text": "colon: nul \x00 = - ü ✓", "n": [1, 2.5, None]}
    created, _ = await store.set_if_absent_or_get("sep", value, owner=owner, ttl=60)
    again, was_created = await store.set_if_absent_or_get("sep", "other")
    assert not was_created
    assert again == created
    assert (again.value, again.owner) == (value, owner)
