"""One store object used from successive event loops (e.g. several ``anyio.run`` calls)."""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
import pytest

from toolwire.state import Entry, StateStore, open_store


async def use(store: StateStore) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(store.incr, "n")
    entry = await store.get_entry("n")
    assert entry is not None
    woke: list[Entry | None] = []

    async def wait() -> None:
        woke.append(await store.wait_for_change("n", version=entry.version, timeout=10))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.05)
            await store.incr("n")
    assert woke[0] is not None
    assert woke[0].value == entry.value + 1


def make_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/loops.db"
    url: str = request.getfixturevalue("fresh_redis_url")
    return url


LOOPS = [
    ("memory", ["asyncio", "trio", "asyncio"]),
    ("sqlite", ["asyncio", "trio", "asyncio"]),
    pytest.param("redis", ["asyncio", "asyncio"], marks=pytest.mark.redis),
]


@pytest.mark.parametrize(("kind", "loops"), LOOPS)
def test_open_and_close_in_each_event_loop(
    kind: str, loops: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The kernel's lifecycle: startup opens the store, shutdown closes it."""
    store = open_store(make_url(kind, tmp_path, request))

    async def run() -> object:
        await store.open()
        try:
            await use(store)
            return await store.get("n")
        finally:
            await store.close()

    assert [anyio.run(run, backend=b) for b in loops] == [11 * (i + 1) for i in range(len(loops))]


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize(("kind", "loops"), LOOPS)
def test_never_closed_store_moves_to_a_new_event_loop(
    kind: str, loops: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Not closing is a bug, but the store reconnects in the new loop instead of failing.

    (Redis: the connections of the dead loop are abandoned, hence ResourceWarnings.)
    """
    store = open_store(make_url(kind, tmp_path, request))
    for backend in loops:
        anyio.run(use, store, backend=backend)

    async def final() -> object:
        async with store:
            return await store.get("n")

    assert anyio.run(final) == 11 * len(loops)
    gc.collect()  # let abandoned connections warn here, under this test's filter
