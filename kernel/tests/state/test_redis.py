"""Redis-specific behaviour: errors naming the server, key layout, pub/sub, asyncio only."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import pytest

from toolwire.state import (
    Entry,
    RedisStore,
    StateDataError,
    StateNotAppliedError,
    StateStoreError,
    open_store,
)
from toolwire.state._redis import CHANNEL_PREFIX, redact_url
from toolwire.testing import _skip_or_fail

pytestmark = pytest.mark.anyio

redis_asyncio = pytest.importorskip("redis.asyncio")
redis_sync = pytest.importorskip("redis")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def raw_client(url: str) -> AsyncIterator[Any]:
    client = redis_asyncio.Redis.from_url(url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


# -- errors ---------------------------------------------------------------------


async def test_dead_redis_names_the_url(free_tcp_port: int) -> None:
    url = f"redis://127.0.0.1:{free_tcp_port}/0"  # nothing listens there
    store = RedisStore(url)
    with pytest.raises(StateNotAppliedError) as info:  # a refused connection sent nothing
        await store.open()
    message = str(info.value)
    assert f"redis state store at {url} is unreachable" in message
    assert "start redis-server or fix the state URL" in message
    assert info.value.__cause__ is not None

    # lazily opened stores fail the same way, on any operation
    with pytest.raises(StateNotAppliedError, match="is unreachable"):
        await open_store(url).set("k", 1)


async def test_wrong_credentials_are_named_as_such_not_as_unreachable(redis_url: str) -> None:
    """Before: a wrong password read "is unreachable ...; start redis-server"."""
    scheme, rest = redis_url.split("://", 1)
    url = f"{scheme}://nobody:wrong-pass-123@{rest.rsplit('@', 1)[-1]}"
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert "refused the credentials" in message and "unreachable" not in message
    assert "wrong-pass-123" not in message


@pytest.mark.redis
async def test_rediss_to_a_server_without_tls_says_it_may_not_speak_tls(redis_url: str) -> None:
    """Before: after 5 s, "is unreachable: Timeout connecting ...; start redis-server".

    Here the connect timeout (0.5 s) ends the handshake before the plain-text probe
    (after TLS_PROBE_AFTER_S, 1 s) runs: the hint of the timeout is what is left."""
    scheme, rest = redis_url.split("://", 1)
    assert scheme == "redis", "TOOLWIRE_REDIS_URL should be a plain (non-TLS) server"
    url = f"rediss://{rest.split('?', 1)[0]}?socket_connect_timeout=0.5"
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert "may not speak TLS" in message and "redis://" in message, message
    assert "start redis-server" not in message


@pytest.mark.redis
@pytest.mark.parametrize("cluster", [False, True])
async def test_rediss_to_a_server_without_tls_says_so_before_the_connect_timeout(
    redis_url: str, cluster: bool
) -> None:
    """Before: the TLS handshake waited the whole socket_connect_timeout (5 s by default;
    30 s here, which then ended in "Timeout connecting"): a server without TLS reads the
    ClientHello as an inline command and waits for its end. Now a plain-text PING on a
    second connection finds Redis there, and the error says the server has no TLS."""
    scheme, rest = redis_url.split("://", 1)
    assert scheme == "redis", "TOOLWIRE_REDIS_URL should be a plain (non-TLS) server"
    hostport = rest.split("?", 1)[0].split("/", 1)[0].rsplit("@", 1)[-1]
    tls = "rediss+cluster" if cluster else "rediss"
    url = f"{tls}://{hostport}?socket_connect_timeout=30"
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert message == (
        f"redis state store at {url}: the server does not speak TLS (the URL says {tls}://): "
        "its port answers Redis in plain text and left the TLS handshake unanswered; use "
        f"{tls.replace('rediss', 'redis')}:// for a server without TLS, or point the URL at "
        "the server's tls-port"
    )


def _missing(problem: str) -> NoReturn:
    """Skip, or fail where Redis is required (``TOOLWIRE_REQUIRE_REDIS``, as in CI)."""
    _skip_or_fail(problem, "install redis-server and openssl (Debian: apt-get install ...)")


@pytest.fixture
def tls_redis(free_tcp_port: int, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A private redis-server that speaks TLS only: (its port, the CA file to trust)."""
    import shutil
    import subprocess

    exe, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if exe is None or openssl is None:
        _missing(f"{'redis-server' if exe is None else 'openssl'} is not on PATH")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    args = ["--bind", "127.0.0.1", "--port", "0", "--tls-port", str(free_tcp_port)]
    args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    args += ["--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    log = tmp_path / "redis.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        client = redis_sync.Redis(
            host="127.0.0.1", port=free_tcp_port, ssl=True, ssl_ca_certs=str(cert)
        )
        for _ in range(100):
            if proc.poll() is not None:  # e.g. a redis-server built without TLS
                text = log.read_text(errors="replace")
                _missing(f"redis-server cannot serve TLS here: {text[-300:]}")
            try:
                client.ping()
                break
            except redis_sync.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail(f"the TLS redis-server did not answer within 5 s: {log.read_text()[-300:]}")
        client.close()
        yield free_tcp_port, cert
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.asynccontextmanager
async def slow_relay(port: int, delay: float) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A TCP relay to 127.0.0.1:``port`` that holds each chunk the server sends for
    ``delay`` s (a far-away server): yields its port and the first bytes of each client."""
    firsts: list[bytes] = []

    async def handle(client: anyio.abc.SocketStream) -> None:
        async with (
            client,
            await anyio.connect_tcp("127.0.0.1", port) as server,
            anyio.create_task_group() as tg,
        ):

            async def pump(src: Any, dst: Any, hold: bool) -> None:
                first = True
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    async for chunk in src:
                        if first and not hold:
                            firsts.append(chunk)
                        first = False
                        if hold:
                            await anyio.sleep(delay)
                        await dst.send(chunk)
                tg.cancel_scope.cancel()  # one side closed: close both

            tg.start_soon(pump, client, server, False)
            tg.start_soon(pump, server, client, True)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield listener.extra(anyio.abc.SocketAttribute.local_port), firsts
        tg.cancel_scope.cancel()


@pytest.mark.redis
async def test_a_slow_tls_server_is_waited_for_not_taken_for_one_without_tls(
    tls_redis: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain-text probe only fails a rediss:// store on a Redis reply: a TLS server
    whose handshake takes longer than TLS_PROBE_AFTER_S is probed, and still used."""
    from toolwire.state import _redis

    port, ca = tls_redis
    monkeypatch.setattr(_redis, "TLS_PROBE_AFTER_S", 0.05)
    async with slow_relay(port, delay=0.5) as (relay, firsts):
        url = f"rediss://127.0.0.1:{relay}/0?ssl_ca_certs={ca}"
        async with RedisStore(url) as store:
            await store.set("k", 1)
            assert await store.get("k") == 1
    # the probe ran (its PING went to the TLS server) while the handshake was held
    assert b"PING\r\n" in firsts, firsts
    assert any(f.startswith(b"\x16\x03") for f in firsts)  # the TLS ClientHello


@pytest.fixture
def password_redis(free_tcp_port: int) -> Iterator[str]:
    """A private redis-server that requires a password: its URL without the password."""
    import shutil
    import subprocess

    exe = shutil.which("redis-server")
    if exe is None:
        _missing("redis-server is not on PATH")
    args = ["--bind", "127.0.0.1", "--port", str(free_tcp_port), "--save", ""]
    args += ["--appendonly", "no", "--requirepass", "s3cret-pw"]
    proc = subprocess.Popen([exe, *args], stdout=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{free_tcp_port}/0"
        client = redis_sync.Redis.from_url(url, password="s3cret-pw")
        for _ in range(100):
            try:
                client.ping()
                break
            except redis_sync.ConnectionError:
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.redis
@pytest.mark.parametrize("user", ["", "default@"])
async def test_a_missing_password_is_named_as_such(password_redis: str, user: str) -> None:
    """Before: "refused the credentials: HELLO must be called with the client already
    authenticated..." (or NOAUTH), which does not say that a password is missing."""
    url = password_redis.replace("redis://", f"redis://{user}", 1)
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert "requires a password" in message and "gives none" in message, message
    assert "redis://:PASSWORD@" in message
    # with the password it works
    scheme, rest = password_redis.split("://", 1)
    async with RedisStore(f"{scheme}://:s3cret-pw@{rest}") as store:
        await store.set("k", 1)
        assert await store.get("k") == 1


async def test_dead_redis_error_redacts_the_password(free_tcp_port: int) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_tcp_port}/0"
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert "hunter2" not in message
    assert f"redis://:***@127.0.0.1:{free_tcp_port}/0" in message


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_is_refused_clearly() -> None:
    store = RedisStore("redis://127.0.0.1:6379/15")
    with pytest.raises(StateStoreError, match="needs asyncio"):
        await store.open()
    with pytest.raises(StateStoreError, match="sqlite:// or memory://"):
        await store.get("k")


def test_redact_url() -> None:
    assert redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact_url("rediss://pw@h/0") == "rediss://***@h/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    assert redact_url("unix:///s.sock?db=1&password=pw") == "unix:///s.sock?db=1&password=***"
    assert "pw" not in redact_url("redis://u:pw@[::1]:6379/0?password=pw")


class Proxy:
    """A TCP proxy to the test Redis that can be killed (a Redis 'dying')."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.scope = anyio.CancelScope()

    async def run(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        with self.scope:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
            async with listener:
                task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
                await listener.serve(self.handle)

    async def handle(self, client: anyio.abc.SocketStream) -> None:
        async with (
            client,
            await anyio.connect_tcp(self.host, self.port) as upstream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(self.pump, client, upstream, tg.cancel_scope)
            tg.start_soon(self.pump, upstream, client, tg.cancel_scope)

    @staticmethod
    async def pump(
        src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream, scope: anyio.CancelScope
    ) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            async for chunk in src:
                await dst.send(chunk)
        scope.cancel()


@pytest.mark.redis
async def test_redis_dying_mid_use(fresh_redis_url: str) -> None:
    parts = urlsplit(fresh_redis_url)
    if parts.scheme != "redis" or parts.hostname is None:
        pytest.skip("needs a redis://host:port URL")
    proxy = Proxy(parts.hostname, parts.port or 6379)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        netloc = f"{parts.netloc.rpartition('@')[0]}@" if "@" in parts.netloc else ""
        url = urlunsplit(("redis", f"{netloc}127.0.0.1:{port}", parts.path, parts.query, ""))
        store = RedisStore(url)
        async with store:
            entry = await store.set("k", 1)
            outcome: list[BaseException | Entry | None] = []

            async def wait() -> None:
                try:
                    outcome.append(
                        await store.wait_for_change("k", version=entry.version, timeout=20)
                    )
                except StateStoreError as exc:
                    outcome.append(exc)

            with anyio.fail_after(15):
                async with anyio.create_task_group() as waiters:
                    waiters.start_soon(wait)
                    await anyio.sleep(0.2)
                    proxy.scope.cancel()  # Redis is gone: connections drop, new ones are refused
            assert len(outcome) == 1
            assert isinstance(outcome[0], StateStoreError)
            assert "is unreachable" in str(outcome[0])

            with pytest.raises(StateStoreError) as info:
                await store.get("k")
            assert f"redis state store at {redact_url(url)} is unreachable" in str(info.value)
            # refused: nothing was sent, and a write says so
            with pytest.raises(StateNotAppliedError, match="is unreachable"):
                await store.set_if_absent("claim", 1, owner="me")


class ReplyCutter(Proxy):
    """A proxy that, once armed, lets the next script (EVALSHA) reach Redis and run, then
    swallows its reply and cuts the client's connection: a reply lost in the network."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.armed = False
        self.cut = 0

    async def handle(self, client: anyio.abc.SocketStream) -> None:
        swallow = anyio.Event()
        async with (
            client,
            await anyio.connect_tcp(self.host, self.port) as upstream,
            anyio.create_task_group() as tg,
        ):

            async def to_redis() -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    async for chunk in client:
                        if self.armed and b"EVALSHA" in chunk.upper():
                            self.armed = False
                            swallow.set()
                        await upstream.send(chunk)
                tg.cancel_scope.cancel()

            async def to_client() -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    async for chunk in upstream:
                        if swallow.is_set():  # the script ran: its reply is lost
                            self.cut += 1
                            break
                        await client.send(chunk)
                tg.cancel_scope.cancel()

            tg.start_soon(to_redis)
            tg.start_soon(to_client)


@pytest.mark.redis
async def test_a_script_whose_reply_is_lost_is_not_sent_again(fresh_redis_url: str) -> None:
    """Before: redis-py sent the script again on the new connection, so one incr(1) added 2
    and the one caller that created a key was told it had not (set_if_absent: None)."""
    parts = urlsplit(fresh_redis_url)
    if parts.scheme != "redis" or parts.hostname is None:
        pytest.skip("needs a redis://host:port URL")
    proxy = ReplyCutter(parts.hostname, parts.port or 6379)
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        netloc = f"{parts.netloc.rpartition('@')[0]}@" if "@" in parts.netloc else ""
        url = urlunsplit(("redis", f"{netloc}127.0.0.1:{port}", parts.path, parts.query, ""))
        async with RedisStore(url) as store:
            await store.incr("warm", 1)  # the scripts are loaded: the next ones are EVALSHA
            await store.set_if_absent("warm-claim", 1)
            with anyio.fail_after(10):
                proxy.armed = True
                with pytest.raises(StateStoreError) as info:
                    await store.incr("n", 1)
                assert proxy.cut == 1
                message = str(info.value)
                assert "after the command on key 'n' was sent" in message
                assert "may or may not have been applied" in message
                assert not isinstance(info.value, StateNotAppliedError)
                assert await store.get("n") == 1  # applied once

                proxy.armed = True
                with pytest.raises(StateStoreError, match="may or may not have been applied"):
                    await store.set_if_absent("claim", {"x": 1}, owner="me")
                assert proxy.cut == 2
                entry = await store.get_entry("claim")
                assert entry is not None and entry.owner == "me"
                assert await store.incr("n", 1) == 2  # a new connection serves on
        tg.cancel_scope.cancel()


#: Keeps the server busy for about a second (a long script: every other client waits).
_BUSY_LUA = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1000000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1
"""


@pytest.mark.redis
async def test_a_write_a_busy_server_did_not_answer_in_time_may_have_been_applied(
    fresh_redis_url: str,
) -> None:
    """A server busy with a long script takes the write and runs it after the store gave
    up waiting. Before, the error said the server "is unreachable" and to "start
    redis-server" (it was running), and nothing of the write's fate."""
    sep = "&" if "?" in fresh_redis_url else "?"
    url = f"{fresh_redis_url}{sep}socket_timeout=0.3"
    async with RedisStore(url) as store, raw_client(fresh_redis_url) as raw:
        await store.set("warm", 1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(raw.eval, _BUSY_LUA, 0)
            await anyio.sleep(0.1)  # the script runs: the server answers nobody meanwhile
            with pytest.raises(StateStoreError) as info:
                await store.set_if_absent("claim", 1, owner="me")
        assert not isinstance(info.value, StateNotAppliedError)
        message = str(info.value)
        assert "no answer within the socket timeout after the command on key 'claim'" in message
        assert "may or may not have been applied" in message
        assert "reachable but slow" in message and "start redis-server" not in message
        with anyio.fail_after(5):
            while (entry := await store.get_entry("claim")) is None:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert entry.owner == "me"  # it was applied, after the timeout


@pytest.mark.redis
async def test_pooled_connections_the_server_closed_are_replaced(fresh_redis_url: str) -> None:
    """A restarted server (here: CLIENT KILL) leaves the pool's connections closed: writes
    reconnect before sending, since a script is never sent twice."""
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        await store.set("k", 0)
        for _ in range(3):
            await raw.execute_command("CLIENT", "KILL", "TYPE", "normal")  # not this one
            await anyio.sleep(0.2)  # the store's event loop reads each connection's EOF
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for _ in range(5):
                        tg.start_soon(store.incr, "k", 1)
        assert await store.get("k") == 15


# -- layout and pub/sub ------------------------------------------------------------


@pytest.mark.redis
async def test_one_hash_per_record_at_the_exact_key(fresh_redis_url: str) -> None:
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        await store.set("toolwire:idempotency:abc", {"r": 1}, ttl=30, owner="w1")
        await store.set("plain", [1])
        await store.incr("n")
        assert sorted(await raw.keys("*")) == ["n", "plain", "toolwire:idempotency:abc"]
        assert await raw.type("toolwire:idempotency:abc") == "hash"
        fields = await raw.hgetall("toolwire:idempotency:abc")
        assert set(fields) == {"v", "ver", "o", "x"}
        assert fields["v"] == '{"r":1}'
        assert fields["o"] == "w1"
        pttl = await raw.pttl("toolwire:idempotency:abc")
        assert 29_000 < pttl <= 30_000
        seconds, micros = await raw.time()
        server_ms = seconds * 1000 + micros // 1000
        assert abs(int(fields["x"]) - (server_ms + pttl)) < 100  # x is the PEXPIREAT
        assert await raw.pttl("plain") == -1
        assert set(await raw.hgetall("plain")) == {"v", "ver"}


@pytest.mark.redis
async def test_foreign_keys_are_reported_or_skipped(fresh_redis_url: str) -> None:
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        await raw.set("foreign:str", "x")
        await raw.hset("foreign:hash", "a", "b")
        await store.set("foreign:ours", 1)
        with pytest.raises(StateStoreError, match="foreign:str"):
            await store.get_entry("foreign:str")
        with pytest.raises(StateStoreError, match="foreign:str"):
            await store.set("foreign:str", 1)
        assert await raw.get("foreign:str") == "x"
        assert await store.get_entry("foreign:hash") is None
        # scan reports the string as get does (before, it skipped it silently)
        with pytest.raises(StateDataError, match="foreign:str"):
            await store.scan("foreign:")
        for key in ("foreign:str", "foreign:hash"):
            with pytest.raises(StateStoreError, match=key):
                await store.set_if_absent_or_get(key, 1)
        assert await raw.hgetall("foreign:hash") == {"a": "b"}
        await raw.delete("foreign:str")
        # a hash without toolwire's fields is absent to get, and to scan
        assert [e.key for e in await store.scan("foreign:")] == ["foreign:ours"]


@pytest.mark.redis
async def test_set_if_absent_or_get_is_one_round_trip(fresh_redis_url: str) -> None:
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        await store.set_if_absent_or_get("warm", 0)  # loads the script
        before = await raw.info("commandstats")
        created, _ = await store.set_if_absent_or_get("rt", {"a": 1}, ttl=30, owner="o")
        got, was_created = await store.set_if_absent_or_get("rt", {"a": 2})
        after = await raw.info("commandstats")
        assert not was_created and got == created

        def calls(stats: dict[str, Any], name: str) -> int:
            return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))

        # two operations: two EVALSHA, and nothing else from the store's connection
        assert calls(after, "evalsha") - calls(before, "evalsha") == 2
        assert calls(after, "eval") == calls(before, "eval")
        fields = await raw.hgetall("rt")
        assert fields["v"] == '{"a":1}' and fields["o"] == "o"


@pytest.mark.redis
async def test_incr_overflow(fresh_redis_url: str) -> None:
    async with RedisStore(fresh_redis_url) as store:
        await store.set("big", 2**63 - 1)
        with pytest.raises(StateStoreError, match="64-bit"):
            await store.incr("big")
        assert await store.get("big") == 2**63 - 1
        # an amount past 64 bits is refused before a new key stores it (before, it was
        # stored, and every later incr of the key failed)
        for amount in (2**63, -(2**63) - 1):
            with pytest.raises(StateStoreError, match="amount does not fit"):
                await store.incr("new", amount)
        assert await store.get_entry("new") is None
        assert await store.incr("new", -(2**63)) == -(2**63)


@pytest.mark.redis
async def test_incr_on_a_foreign_hash_is_a_data_error(fresh_redis_url: str) -> None:
    """Before: "its value is null (null), not an integer", a plain StateStoreError."""
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        await raw.hset("foreign:hash", "a", "b")
        with pytest.raises(StateDataError, match="'foreign:hash' is a hash without"):
            await store.incr("foreign:hash")
        assert await raw.hgetall("foreign:hash") == {"a": "b"}


def _with_path_and_query(url: str, path: str, query: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


@pytest.mark.redis
async def test_unknown_url_option_is_an_invalid_url(redis_url: str) -> None:
    """Before: "command failed in the Redis client (TypeError ...); a write may or may
    not have been applied", on every call."""
    url = _with_path_and_query(redis_url, urlsplit(redis_url).path, "no_such_option=1")
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert f"redis state store URL {redact_url(url)} is invalid" in message
    assert "no_such_option" in message and "fix the state URL" in message
    assert "may or may not" not in message


@pytest.mark.redis
async def test_database_the_server_lacks_says_which_numbers_exist(redis_url: str) -> None:
    url = _with_path_and_query(redis_url, "/100000", urlsplit(redis_url).query)
    with pytest.raises(StateStoreError) as info:
        await open_store(url).get("k")
    message = str(info.value)
    assert "the server has no such database" in message
    assert "/0 to /15" in message


@pytest.mark.redis
async def test_writes_publish_and_waiters_unsubscribe(fresh_redis_url: str) -> None:
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        pubsub = raw.pubsub()
        await pubsub.subscribe(CHANNEL_PREFIX + "pub")
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
        e = await store.set("pub", 1)
        await store.compare_and_set("pub", 2, expected_version=e.version)
        await store.incr("pub")
        await store.delete("pub")
        await store.set_if_absent("pub", 1)
        await store.compare_and_delete("pub")
        await store.set_if_absent("pub", 1)
        assert await store.set_if_absent("pub", 1) is None  # no write: no message
        got = []
        while (msg := await pubsub.get_message(timeout=0.5)) is not None:
            got.append(msg["channel"])
        assert got == [CHANNEL_PREFIX + "pub"] * 7
        await pubsub.aclose()

        # while waiting, the store holds a subscription to the key's channel...
        current = await store.get_entry("pub")
        assert current is not None
        async with anyio.create_task_group() as tg:
            for key, version in (("pub", -1), ("pub", -1), ("other", -1), ("pub", current.version)):
                tg.start_soon(partial(store.wait_for_change, key, version=version, timeout=0.5))
            await anyio.sleep(0.2)
            numsub = dict(await raw.pubsub_numsub(CHANNEL_PREFIX + "pub"))
            assert numsub[CHANNEL_PREFIX + "pub"] == 1  # one shared connection
        # ...and drops it once nobody waits any more
        with anyio.fail_after(5):
            while await raw.pubsub_channels(CHANNEL_PREFIX + "*"):  # noqa: ASYNC110
                await anyio.sleep(0.05)


@pytest.mark.redis
async def test_exhausted_pool_says_so(fresh_redis_url: str) -> None:
    sep = "&" if "?" in fresh_redis_url else "?"
    # one connection, which the waiter's pub/sub subscription then holds
    async with RedisStore(f"{fresh_redis_url}{sep}max_connections=1&timeout=0.2") as store:
        with pytest.raises(StateStoreError, match="max_connections") as info:
            await store.wait_for_change("k", version=None, timeout=5)
        assert "busy" in str(info.value)


@pytest.mark.redis
async def test_scripts_survive_a_flushed_script_cache(fresh_redis_url: str) -> None:
    async with RedisStore(fresh_redis_url) as store, raw_client(fresh_redis_url) as raw:
        first = await store.set("k", 1)
        await raw.script_flush()  # as after a server restart
        second = await store.set("k", 2)
        got, created = await store.set_if_absent_or_get("k", 3)
        assert not created and got == second and second.version != first.version
        await raw.script_flush()
        assert await store.compare_and_set("k", 4, expected_version=second.version)


@pytest.mark.redis
async def test_fast_pool_is_used_and_still_bounds_and_queues(fresh_redis_url: str) -> None:
    sep = "&" if "?" in fresh_redis_url else "?"
    url = f"{fresh_redis_url}{sep}max_connections=3&timeout=20"
    async with RedisStore(url) as store:
        pool = store._client.connection_pool  # type: ignore[union-attr]
        # With the locked redis-py the fast path must be active: if an upgrade
        # removes an internal it relies on, this says so instead of silently
        # falling back to the slower pool.
        assert type(pool).__name__ == "Pool", "fast pool not in use (redis-py internals changed?)"

        async def bump() -> None:
            await store.incr("n")

        async with anyio.create_task_group() as tg:
            for _ in range(500):
                tg.start_soon(bump)
        assert await store.get("n") == 500
        assert len(pool._in_use_connections) == 0
        assert len(pool._available_connections) <= 3


def test_fast_pool_falls_back_when_redis_py_lacks_an_internal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import redis.asyncio

    from toolwire.state import _redis

    monkeypatch.setattr(_redis, "_POOL_ATTRS", (*_redis._POOL_ATTRS, "_not_in_any_redis_py"))
    pool = _redis._fast_pool("redis://127.0.0.1:6379/14", {})
    assert type(pool) is redis.asyncio.BlockingConnectionPool
