"""Data toolwire did not write: ``get`` and ``scan`` fail alike, with a StateDataError naming
the key, on every backend (before, Redis ``scan`` silently skipped a key of another type while
``get`` raised, and a hash with a version that is not a number was "a client-library fault")."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import pytest

from toolwire.state import StateDataError
from toolwire.state._memory import MemoryStore, _Record

if TYPE_CHECKING:
    from conftest import Backend

pytestmark = pytest.mark.anyio


def _raw_redis(url: str) -> Any:
    import redis
    import redis.cluster

    if url.startswith("redis+cluster://"):
        return redis.cluster.RedisCluster.from_url(url.replace("+cluster", "", 1))
    return redis.Redis.from_url(url)


def plant(backend: Backend, key: str, corruption: str) -> None:
    """Write ``key`` behind the store's back, the way another program could."""
    if backend.name == "memory":
        assert isinstance(backend.store, MemoryStore)
        backend.store._data[key] = _Record("{not json", 1, None, None)
    elif backend.name == "sqlite":
        with sqlite3.connect(backend.url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "INSERT INTO toolwire_state (key, value, version) VALUES (?, ?, 1)",
                (key, "{not json"),
            )
    else:
        client = _raw_redis(backend.url)
        try:
            if corruption == "not_json":
                client.hset(key, mapping={"v": "{not json", "ver": "1"})
            elif corruption == "other_type":
                client.set(key, "a plain Redis string")
            else:  # bad_version
                client.hset(key, mapping={"v": "1", "ver": "one"})
        finally:
            client.close()


async def test_get_and_scan_name_a_key_toolwire_did_not_write(backend: Backend) -> None:
    await get_and_scan_name(backend, "not_json")


@pytest.mark.state_backends("redis", "redis-cluster")  # only Redis keys have these
@pytest.mark.parametrize("corruption", ["other_type", "bad_version"])
async def test_get_and_scan_name_a_redis_key_of_another_type_or_version(
    backend: Backend, corruption: str
) -> None:
    await get_and_scan_name(backend, corruption)


async def get_and_scan_name(backend: Backend, corruption: str) -> None:
    """``get`` and ``scan`` both raise a StateDataError naming the planted key; the good
    entries stay readable."""
    store = backend.store
    await store.set("data:a", {"ok": 1})
    await store.set("other:c", 3)
    plant(backend, "data:b", corruption)

    with pytest.raises(StateDataError, match="'data:b'") as from_get:
        await store.get("data:b")
    with pytest.raises(StateDataError, match="'data:b'") as from_scan:
        await store.scan("data:")
    assert "Delete" in str(from_get.value) or "delete" in str(from_get.value)
    assert "Delete" in str(from_scan.value) or "delete" in str(from_scan.value)
    # the good entries stay readable, and a scan that does not cover the key works
    assert await store.get("data:a") == {"ok": 1}
    assert [e.key for e in await store.scan("data:a")] == ["data:a"]
    assert [e.value for e in await store.scan("other:")] == [3]


@pytest.mark.state_backends("redis", "redis-cluster")
async def test_claiming_a_foreign_redis_hash_is_a_data_error(backend: Backend) -> None:
    """A hash without toolwire's fields where set_if_absent_or_get claims: before, a plain
    StateStoreError (an outage), which the idempotency plugin answered `unavailable`,
    retryable, or with on_store_error = 'fail_open' ran the tool unprotected every time."""
    client = _raw_redis(backend.url)
    try:
        client.hset("claim:x", mapping={"something": "else"})
    finally:
        client.close()
    with pytest.raises(StateDataError, match=r"'claim:x'.*not a toolwire state entry"):
        await backend.store.set_if_absent_or_get("claim:x", {"s": "pending"}, owner="o")
