"""The Redis backend on a real three-node Redis Cluster (``redis+cluster://``).

The conformance suite runs on the cluster too (backend ``redis-cluster``);
these tests check what is particular to it: records spread over every shard,
``scan`` visits every primary, waiters on any shard are woken by pub/sub, and
misconfigurations get errors that say what to write instead.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest

from toolwire.state import RedisStore, StateNotAppliedError, StateStoreError, open_store
from toolwire.state._redis import CHANNEL_PREFIX

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

redis_cluster = pytest.importorskip("redis.cluster")

KEYS = [f"job:{i:03d}" for i in range(60)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _plain(url: str) -> str:
    return url.replace("+cluster", "", 1)


def shard_of(url: str) -> dict[str, str]:
    """Key -> "host:port" of the primary that owns its slot, asked of the cluster itself."""
    client = redis_cluster.RedisCluster.from_url(_plain(url))
    try:
        return {k: client.get_node_from_key(k).name for k in KEYS}
    finally:
        client.close()


async def test_records_spread_over_every_shard_and_scan_sees_them_all(
    fresh_redis_cluster_url: str,
) -> None:
    owners = shard_of(fresh_redis_cluster_url)
    assert len(set(owners.values())) == 3, "the test keys should cover all three primaries"
    async with RedisStore(fresh_redis_cluster_url) as store:
        assert store.cluster
        for i, key in enumerate(KEYS):
            await store.set(key, {"n": i}, ttl=60)
        entries = await store.scan("job:")
        assert [e.key for e in entries] == KEYS  # every shard, sorted by key
        assert [e.value["n"] for e in entries] == list(range(len(KEYS)))
        assert len(await store.scan("job:", limit=7)) == 7
    # each record is one hash on the shard that owns its key
    client = redis_cluster.RedisCluster.from_url(_plain(fresh_redis_cluster_url))
    try:
        per_node = Counter(
            node.name
            for node in client.get_primaries()
            for _ in client.scan_iter(match="job:*", target_nodes=node)
        )
        assert per_node == Counter(owners.values())
        assert client.type(KEYS[0]) == b"hash"
    finally:
        client.close()


async def test_waiters_on_every_shard_are_woken_by_pubsub(
    fresh_redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pub/sub connection hears writes to every shard (PUBLISH reaches all nodes)."""
    from toolwire.state import _redis

    heard: list[str] = []
    dispatch = _redis._Notifier._dispatch

    def spy(self: Any, msg: dict[str, Any]) -> None:
        if msg.get("type") == "message":
            heard.append(str(msg["channel"]))
        dispatch(self, msg)

    monkeypatch.setattr(_redis._Notifier, "_dispatch", spy)
    owners = shard_of(fresh_redis_cluster_url)
    one_per_shard = list({shard: key for key, shard in owners.items()}.values())
    assert len(one_per_shard) == 3
    async with (
        RedisStore(fresh_redis_cluster_url) as store,
        RedisStore(fresh_redis_cluster_url) as writer,
    ):
        firsts = {key: await store.set(key, "old") for key in one_per_shard}
        woken: dict[str, Any] = {}

        async def wait(key: str) -> None:
            woken[key] = await store.wait_for_change(key, version=firsts[key].version, timeout=20)

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for key in one_per_shard:
                    tg.start_soon(wait, key)
                await anyio.sleep(0.3)  # the waiters subscribe and read
                for key in one_per_shard:
                    await writer.set(key, "new")
    assert {k: e.value for k, e in woken.items()} == dict.fromkeys(one_per_shard, "new")
    assert {CHANNEL_PREFIX + k for k in one_per_shard} <= set(heard)


async def test_a_plain_url_to_a_cluster_node_says_use_redis_cluster(
    fresh_redis_cluster_url: str,
) -> None:
    owners = shard_of(fresh_redis_cluster_url)
    seed = _plain(fresh_redis_cluster_url).split("://", 1)[1]
    elsewhere = next(k for k, shard in owners.items() if shard != seed)
    async with RedisStore(_plain(fresh_redis_cluster_url)) as store:
        with pytest.raises(StateStoreError, match=r"use a redis\+cluster:// URL"):
            await store.set(elsewhere, 1)


async def test_a_cluster_url_with_a_database_is_refused(fresh_redis_cluster_url: str) -> None:
    store = open_store(fresh_redis_cluster_url + "/15")
    with pytest.raises(StateStoreError, match=r"is invalid: .*'db' must be 0"):
        await store.open()


async def test_a_dead_cluster_seed_names_the_url(free_tcp_port: int) -> None:
    url = f"redis+cluster://:hunter2@127.0.0.1:{free_tcp_port}"
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert "hunter2" not in message and f"127.0.0.1:{free_tcp_port}" in message
    assert "the cluster cannot serve" in message
    assert "check the cluster (redis-cli --cluster check) or fix the state URL" in message


async def test_timeout_in_a_cluster_url_is_ignored(fresh_redis_cluster_url: str) -> None:
    """?timeout= sets the single-server pool's queueing; a cluster has none, so it is dropped."""
    async with RedisStore(fresh_redis_cluster_url + "?timeout=5&max_connections=7") as store:
        await store.set("k", 1)
        assert await store.get("k") == 1


async def test_an_exhausted_cluster_pool_names_the_per_node_limit(
    fresh_redis_cluster_url: str,
) -> None:
    async with RedisStore(fresh_redis_cluster_url + "?max_connections=2") as store:
        await store.set("hot", 0)
        errors: list[StateStoreError] = []

        async def bump() -> None:
            try:
                await store.incr("hot")
            except StateStoreError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(40):
                tg.start_soon(bump)
        # the full pool fails before the command is sent to the node: nothing applied,
        # and the store says so (StateNotAppliedError), as docs/state.md does
        assert await store.get("hot") == 40 - len(errors)
    assert errors, "40 concurrent calls on 2 connections should exhaust the pool"
    assert all("per cluster node; a cluster's pool does not queue" in str(e) for e in errors)
    assert all(isinstance(e, StateNotAppliedError) for e in errors)


async def test_a_cluster_client_never_resends_a_command(fresh_redis_cluster_url: str) -> None:
    """A script whose reply was lost may have run: the store must not send it again."""
    async with RedisStore(fresh_redis_cluster_url) as store:
        await store.get("k")  # connect
        client: Any = store._client
        assert client.retry.get_retries() == 0
        assert client.reinitialize_steps == 0


async def test_an_old_redis_py_is_named_for_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.asyncio

    monkeypatch.delattr(redis.asyncio.RedisCluster, "pubsub")
    with pytest.raises(StateStoreError, match=r"Redis Cluster needs redis-py >= 8\.0"):
        await open_store("redis+cluster://127.0.0.1:7000").open()


async def test_writes_apply_once_while_slots_move(fresh_redis_cluster_url: str) -> None:
    """Increments racing a real slot migration (redis-cli --cluster reshard) each apply once.

    redis-py's cluster client, left to its defaults, resends commands whose
    connection it closed on a MOVED reply: every counter came out too high.
    """
    seed = _plain(fresh_redis_cluster_url).split("://", 1)[1]
    nodes = await anyio.run_process(["redis-cli", "-u", f"redis://{seed}", "cluster", "nodes"])
    lines = nodes.stdout.decode().splitlines()
    mine = next(ln.split()[0] for ln in lines if "myself" in ln)
    other = next(ln.split()[0] for ln in lines if "master" in ln and "myself" not in ln)
    done: Counter[str] = Counter()
    failed: list[BaseException] = []
    moving = True
    async with RedisStore(fresh_redis_cluster_url) as store:

        async def bump(worker: int) -> None:
            i = 0
            while moving:
                key = f"n:{(i * 7 + worker) % 100}"
                i += 1
                try:
                    await store.incr(key)
                except StateStoreError as exc:  # allowed (outcome unknown); resending is not
                    failed.append(exc)
                else:
                    done[key] += 1

        async with anyio.create_task_group() as tg:
            for w in range(8):
                tg.start_soon(bump, w)
            await anyio.sleep(0.2)
            reshard = await anyio.run_process(
                [
                    "redis-cli",
                    "--cluster",
                    "reshard",
                    seed,
                    "--cluster-from",
                    mine,
                    "--cluster-to",
                    other,
                    "--cluster-slots",
                    "1000",
                    "--cluster-yes",
                ],
                check=False,
            )
            await anyio.sleep(0.2)
            moving = False
        assert reshard.returncode == 0, reshard.stderr.decode()
        stored = {key: await store.get(key) for key in done}
    assert sum(done.values()) > 1000
    over = {k: (stored[k], n) for k, n in done.items() if (stored[k] or 0) > n + len(failed)}
    assert not over, f"increments applied more often than acknowledged: {over}"
