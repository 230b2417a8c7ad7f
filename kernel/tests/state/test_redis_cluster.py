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

from toolwire.state import RedisStore, StateStoreError, open_store
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
    assert "redis+cluster://" in message


async def test_an_old_redis_py_is_named_for_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.asyncio

    monkeypatch.delattr(redis.asyncio.RedisCluster, "pubsub")
    with pytest.raises(StateStoreError, match=r"Redis Cluster needs redis-py >= 8\.0"):
        await open_store("redis+cluster://127.0.0.1:7000").open()
