"""Conformance: reads, writes, values, versions, TTL, CAS, incr and scan on every backend."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest

from toolwire.state import (
    ANY,
    MAX_TTL_S,
    Entry,
    MemoryStore,
    StateNotAppliedError,
    StateStore,
    StateStoreError,
)

if TYPE_CHECKING:
    from conftest import Backend

pytestmark = pytest.mark.anyio

FALSY = [0, False, "", [], {}, None, 0.0]


async def test_absent_key(store: StateStore) -> None:
    assert await store.get_entry("nope") is None
    assert await store.get("nope") is None
    assert await store.get("nope", "dflt") == "dflt"
    assert await store.delete("nope") is False
    assert await store.compare_and_delete("nope") is False
    assert await store.scan("nope") == []


async def test_set_get_delete_round_trip(store: StateStore) -> None:
    entry = await store.set("k", {"a": [1, 2.5, "x"], "b": None})
    assert entry == Entry("k", {"a": [1, 2.5, "x"], "b": None}, entry.version, None, None)
    assert await store.get_entry("k") == entry
    assert await store.get("k") == {"a": [1, 2.5, "x"], "b": None}

    again = await store.set("k", "v2", owner="me")
    assert (again.value, again.owner) == ("v2", "me")
    assert await store.get_entry("k") == again

    assert await store.delete("k") is True
    assert await store.get_entry("k") is None
    assert await store.get("k", 7) == 7
    assert await store.delete("k") is False


async def test_falsy_values_are_kept_and_distinct_from_absent(store: StateStore) -> None:
    for i, value in enumerate(FALSY):
        key = f"falsy:{i}"
        await store.set(key, value)
        entry = await store.get_entry(key)
        assert entry is not None, value
        assert entry.value == value
        assert type(entry.value) is type(value)
        assert await store.get(key, "default") == value
        # a stored falsy value is present: set_if_absent must not overwrite it
        assert await store.set_if_absent(key, "other") is None
    assert [e.value for e in await store.scan("falsy:")] == FALSY


async def test_json_round_trip(store: StateStore) -> None:
    value = {
        "unicode": "héllo wörld ✓ 漢字 \U0001f600",
        "escapes": 'quote " backslash \\ newline \n tab \t nul \x00',
        "big": 2**62 + 1,
        "neg": -(2**40),
        "float": 0.1,
        "exp": 1e300,
        "nested": [[[]], {"": {"x": [True, False, None]}}],
    }
    await store.set("json", value)
    assert await store.get("json") == value
    # JSON semantics on every backend: tuples come back as lists, int keys as str
    await store.set("json2", {"t": (1, 2), 3: "three"})
    assert await store.get("json2") == {"t": [1, 2], "3": "three"}


async def test_values_are_copied_in_and_out(store: StateStore) -> None:
    value: dict[str, Any] = {"list": [1, 2], "d": {"x": 1}}
    written = await store.set("copy", value)
    value["list"].append(3)
    value["d"]["x"] = 99
    assert written.value == {"list": [1, 2], "d": {"x": 1}}
    written.value["list"].append("w")

    got = await store.get("copy")
    assert got == {"list": [1, 2], "d": {"x": 1}}
    got["list"].append(4)
    assert await store.get("copy") == {"list": [1, 2], "d": {"x": 1}}

    entries = await store.scan("copy")
    entries[0].value["d"]["x"] = -1
    assert await store.get("copy") == {"list": [1, 2], "d": {"x": 1}}


@pytest.mark.parametrize(
    ("bad", "type_name"),
    [
        ({1, 2}, "set"),
        (b"bytes", "bytes"),
        (object(), "object"),
        ({"deep": [1, {"x": 1j}]}, "complex"),
        (math.nan, "NaN"),
        ([math.inf], "Infinity"),
    ],
    ids=["set", "bytes", "object", "nested-complex", "nan", "inf"],
)
async def test_non_json_value_is_rejected_before_writing(
    store: StateStore, bad: Any, type_name: str
) -> None:
    before = await store.set("existing", "keep")

    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.set("fresh", bad),
        lambda: store.set_if_absent("fresh", bad),
        lambda: store.compare_and_set("fresh", bad, expected_version=None),
        lambda: store.set("existing", bad),
        lambda: store.compare_and_set("existing", bad, expected_version=before.version),
    ]
    for call in calls:
        with pytest.raises(StateStoreError) as info:
            await call()
        message = str(info.value)
        assert "fresh" in message or "existing" in message
        assert type_name in message

    assert await store.get_entry("fresh") is None
    assert await store.get_entry("existing") == before


async def test_invalid_arguments(store: StateStore) -> None:
    for ttl in (0, -1, math.nan, math.inf, MAX_TTL_S * 2, 1e16):  # 1e16: a Redis overflow
        with pytest.raises(ValueError, match="ttl"):
            await store.set("k", 1, ttl=ttl)
    with pytest.raises(TypeError):
        await store.set(1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.incr("k", 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.compare_and_set("k", 1, expected_version="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        await store.scan("", limit=-1)
    assert await store.get_entry("k") is None


# -- versions -----------------------------------------------------------------


async def test_versions_change_on_every_write(store: StateStore) -> None:
    seen = [(await store.set("v", 1)).version]
    seen.append((await store.set("v", 1)).version)  # same value: still a write
    cas = await store.compare_and_set("v", 2, expected_version=seen[-1])
    assert cas is not None
    seen.append(cas.version)
    await store.incr("n")
    seen.append((await store.get_entry("n")).version)  # type: ignore[union-attr]
    await store.incr("n")
    seen.append((await store.get_entry("n")).version)  # type: ignore[union-attr]
    assert len(set(seen)) == len(seen)
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in seen)


async def test_versions_are_not_reused_after_delete_or_expiry(backend: Backend) -> None:
    store = backend.store
    seen: list[int] = []
    for _ in range(20):
        seen.append((await store.set("aba", "x")).version)
        seen.append((await store.set("aba", "y")).version)
        assert await store.delete("aba")
        created = await store.set_if_absent("aba", "z")
        assert created is not None
        seen.append(created.version)
        assert await store.compare_and_delete("aba", expected_version=created.version)
    # expiry, then re-creation
    seen.append((await store.set("aba", "t", ttl=0.2)).version)
    await backend.pass_time(0.3)
    recreated = await store.compare_and_set("aba", "u", expected_version=None)
    assert recreated is not None
    seen.append(recreated.version)
    assert len(set(seen)) == len(seen)


# -- TTL ----------------------------------------------------------------------


async def test_ttl_expiry_hides_the_entry_everywhere(backend: Backend) -> None:
    store = backend.store
    entry = await store.set("ttl:a", "short", ttl=0.2, owner="o")
    await store.set("ttl:b", "long", ttl=60)
    await store.set("ttl:c", "forever")
    assert entry.expires_at is not None
    assert await store.get("ttl:a") == "short"

    await backend.pass_time(0.3)

    assert await store.get_entry("ttl:a") is None
    assert await store.get("ttl:a", "gone") == "gone"
    assert [e.key for e in await store.scan("ttl:")] == ["ttl:b", "ttl:c"]
    assert await store.delete("ttl:a") is False
    assert await store.compare_and_delete("ttl:a", expected_version=entry.version) is False
    assert await store.compare_and_delete("ttl:a", expected_owner="o") is False
    assert await store.compare_and_set("ttl:a", 1, expected_version=entry.version) is None
    assert await store.compare_and_set("ttl:a", 1, expected_owner="o") is None
    assert await store.incr("ttl:a", 5) == 5  # expired counts as absent
    assert await store.delete("ttl:a") is True
    assert await store.set_if_absent("ttl:a", "again") is not None
    assert await store.get("ttl:b") == "long"


async def test_expires_at_is_reported(backend: Backend) -> None:
    store = backend.store
    before = backend.now()
    entry = await store.set("exp", 1, ttl=30)
    after = backend.now()
    assert entry.expires_at is not None
    slack = 0.0 if backend.clock is not None else 1.0  # redis: server clock, ms precision
    assert before + 30 - slack <= entry.expires_at <= after + 30 + slack
    got = await store.get_entry("exp")
    assert got is not None
    assert got.expires_at == pytest.approx(entry.expires_at, abs=0.002)

    unbounded = await store.set("exp", 2)
    assert unbounded.expires_at is None
    assert (await store.get_entry("exp")).expires_at is None  # type: ignore[union-attr]


async def test_set_and_cas_replace_the_ttl(backend: Backend) -> None:
    store = backend.store
    await store.set("t1", 1, ttl=0.2)
    await store.set("t1", 2)  # set without ttl: no expiry any more
    e = await store.set("t2", 1, ttl=0.2)
    assert await store.compare_and_set("t2", 2, expected_version=e.version) is not None
    e3 = await store.set("t3", 1)
    assert await store.compare_and_set("t3", 2, expected_version=e3.version, ttl=0.2)
    await backend.pass_time(0.3)
    assert await store.get("t1") == 2
    assert await store.get("t2") == 2
    assert await store.get_entry("t3") is None


# -- set_if_absent / compare_and_set / compare_and_delete ---------------------


async def test_set_if_absent(store: StateStore) -> None:
    first = await store.set_if_absent("sia", "first", owner="a")
    assert first is not None
    assert (first.value, first.owner) == ("first", "a")
    assert await store.set_if_absent("sia", "second", owner="b") is None
    assert await store.get_entry("sia") == first


async def test_compare_and_set_on_version(store: StateStore) -> None:
    created = await store.compare_and_set("cas", "v1", expected_version=None)
    assert created is not None and created.value == "v1"
    assert await store.compare_and_set("cas", "no", expected_version=None) is None

    updated = await store.compare_and_set("cas", "v2", expected_version=created.version)
    assert updated is not None and updated.value == "v2"
    assert updated.version != created.version
    # stale version loses and changes nothing
    assert await store.compare_and_set("cas", "stale", expected_version=created.version) is None
    assert await store.get_entry("cas") == updated
    # version on an absent key never matches
    assert await store.compare_and_set("nokey", 1, expected_version=created.version) is None
    assert await store.get_entry("nokey") is None
    # no condition at all: behaves like set (keeping the owner)
    assert await store.compare_and_set("cas", "any") is not None
    assert await store.get("cas") == "any"


async def test_compare_and_set_on_owner(store: StateStore) -> None:
    await store.set("lease", "held", owner="alice")
    assert await store.compare_and_set("lease", "x", expected_owner="bob") is None
    assert await store.compare_and_set("lease", "x", expected_owner=None) is None

    renewed = await store.compare_and_set("lease", "renewed", expected_owner="alice")
    assert renewed is not None
    assert renewed.owner == "alice"  # owner=ANY keeps it

    moved = await store.compare_and_set("lease", "moved", expected_owner="alice", owner="bob")
    assert moved is not None and moved.owner == "bob"

    both = await store.compare_and_set(
        "lease", "both", expected_version=moved.version, expected_owner="bob", owner=None
    )
    assert both is not None and both.owner is None
    assert await store.get_entry("lease") == both

    # expected_owner=None matches an entry without owner...
    unowned = await store.compare_and_set("lease", "mine", expected_owner=None, owner="carol")
    assert unowned is not None and unowned.owner == "carol"
    # ...but any expected_owner fails on an absent key
    assert await store.compare_and_set("absent", 1, expected_owner=None) is None
    assert await store.compare_and_set("absent", 1, expected_owner="carol") is None
    # creating with expected_version=None and owner=ANY: no owner
    fresh = await store.compare_and_set("absent", 1, expected_version=None)
    assert fresh is not None and fresh.owner is None
    # the empty string is an owner, distinct from None
    await store.set("empty", 1, owner="")
    assert (await store.get_entry("empty")).owner == ""  # type: ignore[union-attr]
    assert await store.compare_and_set("empty", 2, expected_owner=None) is None
    assert await store.compare_and_set("empty", 2, expected_owner="") is not None


async def test_compare_and_delete(store: StateStore) -> None:
    e = await store.set("cad", 1, owner="me")
    assert await store.compare_and_delete("cad", expected_version=e.version + 12345) is False
    assert await store.compare_and_delete("cad", expected_owner="you") is False
    assert await store.compare_and_delete("cad", expected_owner=None) is False
    assert await store.compare_and_delete("cad", expected_version=None) is False
    assert await store.get_entry("cad") == e
    assert await store.compare_and_delete("cad", expected_version=e.version, expected_owner="me")
    assert await store.get_entry("cad") is None
    assert await store.compare_and_delete("cad", expected_version=e.version) is False

    e2 = await store.set("cad", 2)
    assert await store.compare_and_delete("cad", expected_owner=None) is True
    assert await store.compare_and_delete("cad") is False
    e3 = await store.set("cad", 3, owner="x")
    assert e3.version != e2.version
    assert await store.compare_and_delete("cad") is True  # ANY/ANY: delete if present


# -- incr -----------------------------------------------------------------------


async def test_incr(backend: Backend) -> None:
    store = backend.store
    assert await store.incr("n") == 1
    assert await store.incr("n", 41) == 42
    assert await store.incr("n", -50) == -8
    assert await store.get("n") == -8
    assert await store.incr("zero", 0) == 0
    assert await store.get_entry("zero") is not None

    await store.set("owned", 10, ttl=0.3, owner="me")
    assert await store.incr("owned", 5, ttl=100) == 15  # ttl only applies on creation
    entry = await store.get_entry("owned")
    assert entry is not None and entry.owner == "me" and entry.value == 15

    assert await store.incr("fresh", 2, ttl=0.2) == 2
    await backend.pass_time(0.35)
    assert await store.get_entry("owned") is None
    assert await store.get_entry("fresh") is None
    assert await store.incr("fresh") == 1


@pytest.mark.parametrize("value", ["12", 1.5, True, None, [1], {"n": 1}])
async def test_incr_rejects_non_integers(store: StateStore, value: Any) -> None:
    before = await store.set("notint", value)
    with pytest.raises(StateStoreError, match="notint"):
        await store.incr("notint")
    assert await store.get_entry("notint") == before


# -- scan -----------------------------------------------------------------------


async def test_scan_by_prefix(backend: Backend) -> None:
    store = backend.store
    for key in ["app:b", "app:a", "app:c:1", "app:c", "apple", "ap", "other:app:x", "app;"]:
        await store.set(key, key.upper())
    await store.set("app:expiring", 1, ttl=0.2)
    await backend.pass_time(0.3)

    got = await store.scan("app:")
    assert [e.key for e in got] == ["app:a", "app:b", "app:c", "app:c:1"]
    assert [e.value for e in got] == ["APP:A", "APP:B", "APP:C", "APP:C:1"]
    assert all(isinstance(e, Entry) and e.version for e in got)

    assert [e.key for e in await store.scan("app:", limit=2)] == ["app:a", "app:b"]
    assert await store.scan("app:", limit=0) == []
    assert [e.key for e in await store.scan("app")] == [
        "app:a",
        "app:b",
        "app:c",
        "app:c:1",
        "app;",
        "apple",
    ]
    assert len(await store.scan("")) == 8
    assert await store.scan("zzz") == []


async def test_scan_prefix_with_special_characters(store: StateStore) -> None:
    keys = ["x*[1]?", "x*[1]?/a", "x*[1]?\\b", "x*[2]?", "x*", "x?", "x\\*", "é:1", "é:2", "é;"]
    for key in keys:
        await store.set(key, 0)
    assert [e.key for e in await store.scan("x*[1]?")] == ["x*[1]?", "x*[1]?/a", "x*[1]?\\b"]
    assert [e.key for e in await store.scan("x\\")] == ["x\\*"]
    assert [e.key for e in await store.scan("é:")] == ["é:1", "é:2"]
    top = "\U0010ffff"
    await store.set(top + "a", 1)
    await store.set(top, 1)
    assert [e.key for e in await store.scan(top)] == [top, top + "a"]


async def test_scan_limit_skips_expired_entries(backend: Backend) -> None:
    store = backend.store
    for i in range(6):
        await store.set(f"lim:{i}", i, ttl=0.2 if i % 2 == 0 else None)
    await backend.pass_time(0.3)
    assert [e.value for e in await store.scan("lim:", limit=2)] == [1, 3]


# -- lifecycle --------------------------------------------------------------------


async def test_close_then_reopen(store: StateStore) -> None:
    await store.set("life", 1)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StateNotAppliedError, match=r"is closed; .* open\(\) it again"):
        await store.get("life")
    with pytest.raises(StateNotAppliedError, match="is closed"):
        await store.set_if_absent("life", 2)
    await store.open()
    await store.open()  # idempotent
    assert await store.get("life") == 1


async def test_context_manager_and_lazy_open(backend: Backend) -> None:
    other = MemoryStore() if backend.make_store is None else backend.make_store()
    assert await other.get("whatever") is None  # opens on first use
    await other.close()
    async with other as opened:
        assert opened is other
        await opened.set("cm", 1)
    with pytest.raises(StateStoreError):
        await other.get("cm")


def test_entry_is_frozen() -> None:
    entry = Entry("k", 1, 1)
    with pytest.raises(AttributeError):
        entry.value = 2  # type: ignore[misc]
    assert repr(ANY) == "ANY"
