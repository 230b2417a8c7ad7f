"""open_store(url): URL parsing, clocks, and the optional redis dependency."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from toolwire.state import (
    ACCEPTED_SCHEMES,
    MemoryStore,
    RedisStore,
    SQLiteStore,
    StateStoreError,
    open_store,
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


def test_memory_url() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert store.backend == "memory"
    assert open_store("memory://") is not store  # independent stores
    with pytest.raises(ValueError, match="memory://"):
        open_store("memory://somewhere/else")


@pytest.mark.anyio
async def test_sqlite_relative_url_creates_parent_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///sub/dir/state.db")
    assert isinstance(store, SQLiteStore)
    assert store.path == "sub/dir/state.db"
    assert not (tmp_path / "sub").exists()  # nothing happens before open
    async with store:
        await store.set("k", 1)
    assert (tmp_path / "sub" / "dir" / "state.db").is_file()


@pytest.mark.anyio
async def test_sqlite_absolute_url(tmp_path: Path) -> None:
    target = tmp_path / "a b" / "c" / "state.db"
    url = f"sqlite:///{target}"  # tmp_path is absolute: sqlite:////tmp/...
    assert url.startswith("sqlite:////")
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    assert store.path == str(target)
    async with store:
        await store.set("k", 1)
    async with open_store(f"sqlite:///{str(target).replace(' ', '%20')}") as again:
        assert await again.get("k") == 1


def test_sqlite_url_options_and_errors(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout=0.5")
    assert isinstance(store, SQLiteStore)
    assert store._busy_timeout == 0.5
    for bad in ("sqlite://relative.db", "sqlite://host/x.db", "sqlite:///", "sqlite:x.db"):
        with pytest.raises(ValueError, match="sqlite"):
            open_store(bad)
    with pytest.raises(ValueError, match="unknown option 'timeout'"):
        open_store(f"sqlite:///{tmp_path}/x.db?timeout=1")
    with pytest.raises(ValueError, match="busy_timeout"):
        open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout=soon")
    # before: -1 was accepted, and inf failed at open with a bare OverflowError
    for bad in ("-1", "inf", "nan", "1e12"):
        with pytest.raises(ValueError, match=r"busy_timeout must be a number of seconds from 0"):
            open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout={bad}")
    assert open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout=0")._busy_timeout == 0  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="busy_timeout"):
        SQLiteStore(tmp_path / "x.db", busy_timeout="5")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url", ["redis://:pw@localhost:6379/abc", "redis://localhost/0/1", "rediss+cluster://h:1/x"]
)
def test_redis_path_that_is_not_a_database_number(url: str) -> None:
    """Before: redis-py ignored the path and silently used database 0."""
    with pytest.raises(ValueError, match="the path must be a database number") as info:
        open_store(url)
    assert "pw" not in str(info.value)


def test_sqlite_home_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    store = open_store("sqlite:///~/state.db")
    assert isinstance(store, SQLiteStore)
    assert store.path == os.path.join(str(tmp_path), "state.db")


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:secret@localhost:6380/2",
        "rediss://user:pw@redis.example.com:6380/0",
        "unix:///run/redis.sock?db=3",
        "REDIS://localhost",
    ],
)
def test_redis_urls_build_a_redis_store_without_connecting(url: str) -> None:
    store = open_store(url)
    assert isinstance(store, RedisStore)
    assert store.backend == "redis"
    assert "secret" not in repr(store)
    assert "pw@" not in repr(store)


def test_clock_goes_to_memory_and_sqlite_but_not_redis(tmp_path: Path) -> None:
    def clock() -> float:
        return 1000.0

    assert open_store("memory://", clock=clock)._clock is clock  # type: ignore[attr-defined]
    assert open_store(f"sqlite:///{tmp_path}/c.db", clock=clock)._clock is clock  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="server's clock"):
        open_store("redis://localhost:6379/0", clock=clock)
    # the real clock is what Redis uses anyway: accepted
    assert isinstance(open_store("redis://localhost:6379/0", clock=time.time), RedisStore)


@pytest.mark.anyio
async def test_clock_drives_expiry(tmp_path: Path) -> None:
    now = [1000.0]
    for url in ("memory://", f"sqlite:///{tmp_path}/clock.db"):
        async with open_store(url, clock=lambda: now[0]) as store:
            entry = await store.set("k", 1, ttl=10)
            assert entry.expires_at == 1010.0
            now[0] = 1009.9
            assert await store.get("k") == 1
            now[0] = 1010.0
            assert await store.get("k") is None
            now[0] = 1000.0


@pytest.mark.parametrize(
    "url",
    ["postgres://u:hunter2@db/state", "file:///tmp/x", "state.db", "", "memcached://x", "http://x"],
)
def test_unknown_scheme_names_url_and_accepted_schemes(url: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url)
    message = str(info.value)
    assert "hunter2" not in message
    assert url.replace("hunter2", "***") in message
    for scheme in ("memory://", "sqlite:///", "redis://", "rediss://", "unix://"):
        assert scheme in message
    assert all(s in message for s in ACCEPTED_SCHEMES)


def test_non_string_url() -> None:
    with pytest.raises(TypeError, match=r"state store URL must be a str, not \w*Path$"):
        open_store(Path("x.db"))  # type: ignore[arg-type]


def test_missing_redis_library_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "redis" or name.startswith("redis."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "redis", None)  # makes `import redis` fail
    with pytest.raises(StateStoreError, match=r"pip install 'toolwire\[redis\]'") as info:
        open_store("redis://:topsecret@127.0.0.1:6379/0")
    assert "topsecret" not in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)
    # the other backends do not need it
    assert isinstance(open_store("memory://"), MemoryStore)
