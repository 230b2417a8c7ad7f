"""Cross-process correctness of the shared backends (SQLite file, Redis, Redis Cluster).

Children are real processes started with the ``spawn`` method; they run
``_state_worker.py`` (via ``runpy``) against the same store URL.
"""

from __future__ import annotations

import multiprocessing
import runpy
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from toolwire.state import Entry, open_store

WORKER = str(Path(__file__).with_name("_state_worker.py"))
RUN_NAME = "__toolwire_state_worker__"
PROCESSES = 4
ROUNDS = 25  # set_if_absent races and CAS increments per process


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/shared/state.db"
    fixture = "fresh_redis_url" if request.param == "redis" else "fresh_redis_cluster_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spawn(ctx: Any, **args: Any) -> Any:
    process = ctx.Process(
        target=runpy.run_path,
        args=(WORKER,),
        kwargs={"run_name": RUN_NAME, "init_globals": {"ARGS": args}},
        daemon=True,
    )
    process.start()
    return process


def test_processes_agree(shared_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        spawn(
            ctx,
            mode="contend",
            url=shared_url,
            index=i,
            rounds=ROUNDS,
            barrier=barrier,
            results=results,
        )
        for i in range(PROCESSES)
    ]
    try:
        reports = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()

    # set_if_absent: exactly one winner per key, and the stored value is the winner's
    winners = {r: [rep["index"] for rep in reports if r in rep["won"]] for r in range(ROUNDS)}
    assert all(len(w) == 1 for w in winners.values()), winners

    # set_if_absent_or_get: exactly one creator per key, every process saw its entry
    creators = {r: [rep["index"] for rep in reports if r in rep["claimed"]] for r in range(ROUNDS)}
    assert all(len(c) == 1 for c in creators.values()), creators
    for r in range(ROUNDS):
        seen = {tuple(rep["claim_seen"][r]) for rep in reports}
        assert len(seen) == 1, seen
        value, _, owner = seen.pop()
        assert (value, owner) == (creators[r][0], f"p{creators[r][0]}")

    # CAS increments: every value 1..N written exactly once -> no lost update
    written = sorted(v for rep in reports for v in rep["written"])
    assert written == list(range(1, PROCESSES * ROUNDS + 1))

    async def check() -> dict[str, Any]:
        async with open_store(shared_url) as store:
            return {
                "counter": await store.get("counter"),
                "hits": await store.get("hits"),
                "races": [await store.get_entry(f"race:{r}") for r in range(ROUNDS)],
            }

    final = anyio.run(check)
    assert final["counter"] == PROCESSES * ROUNDS
    assert final["hits"] == PROCESSES * ROUNDS
    for r, entry in enumerate(final["races"]):
        assert isinstance(entry, Entry)
        assert entry.value == winners[r][0]
        assert entry.owner == f"p{winners[r][0]}"


@pytest.mark.anyio
async def test_wait_for_change_sees_another_process(shared_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    result: list[Entry | None] = []
    async with open_store(shared_url) as store:

        async def wait() -> None:
            result.append(await store.wait_for_change("ping", version=None, timeout=30))

        def run_child() -> int:
            p = spawn(ctx, mode="signal", url=shared_url, key="ping", value={"from": "child"})
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
            return int(p.exitcode if p.exitcode is not None else -1)

        with anyio.fail_after(25):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.05)
                assert result == []  # still waiting
                assert await anyio.to_thread.run_sync(run_child) == 0

    assert len(result) == 1
    entry = result[0]
    assert entry is not None
    assert entry.value == {"from": "child"}
