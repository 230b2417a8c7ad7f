"""Body of the processes that test_multiprocess.py spawns (not a test module).

Run with ``runpy.run_path(__file__, run_name=RUN_NAME, init_globals={"ARGS": {...}})``
so that spawned children need not import the test package.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread

from toolwire.state import open_store

RUN_NAME = "__toolwire_state_worker__"


async def contend(url: str, index: int, rounds: int, barrier: Any, results: Any) -> None:
    """Race on ``rounds`` set_if_absent and set_if_absent_or_get keys while
    CAS-incrementing a shared counter."""
    won: list[int] = []
    claimed: list[int] = []
    claim_seen: dict[int, tuple[Any, int, str | None]] = {}
    written: list[int] = []
    cas_losses = 0
    async with open_store(url) as store:
        await anyio.to_thread.run_sync(barrier.wait, 60)
        for r in range(rounds):
            if await store.set_if_absent(f"race:{r}", index, owner=f"p{index}") is not None:
                won.append(r)
            entry, created = await store.set_if_absent_or_get(
                f"claim:{r}", index, ttl=600, owner=f"p{index}"
            )
            if created:
                claimed.append(r)
            claim_seen[r] = (entry.value, entry.version, entry.owner)
            while True:
                entry = await store.get_entry("counter")
                new = 1 if entry is None else entry.value + 1
                done = await store.compare_and_set(
                    "counter", new, expected_version=None if entry is None else entry.version
                )
                if done is not None:
                    written.append(new)
                    break
                cas_losses += 1
            await store.incr("hits")
    results.put(
        {
            "index": index,
            "won": won,
            "claimed": claimed,
            "claim_seen": claim_seen,
            "written": written,
            "cas_losses": cas_losses,
        }
    )


async def signal(url: str, key: str, value: Any) -> None:
    """Write one key (to wake a waiter in another process)."""
    async with open_store(url) as store:
        await store.set(key, value)


def main(mode: str, **kwargs: Any) -> None:
    if mode == "contend":
        anyio.run(lambda: contend(**kwargs))
    elif mode == "signal":
        anyio.run(lambda: signal(**kwargs))
    else:
        raise ValueError(mode)


if __name__ == RUN_NAME:
    main(**globals()["ARGS"])
