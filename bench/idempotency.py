"""Idempotency plugin cost per call, next to raw redis-py round trips measured in the same run.

The plugin's replay (hit) path makes ONE state-store round trip
(``set_if_absent_or_get``) and its first-call path TWO (that claim, then the
completing compare-and-set). This prints µs per call (best and median of
interleaved rounds) for:

Redis (``TOOLWIRE_REDIS_URL``, else ``redis://127.0.0.1:6379/14``; when nothing
answers there and ``redis-server`` is installed, a private one on a free
loopback port):

- kernel + plugin: hit path and first-call path (``kernel.call`` end to end)
- raw redis-py (a default client) making the same round trips: the store's
  Lua scripts by EVALSHA, the same server work without toolwire's Python
  (hit = the claim-or-read script, first = that plus the compare-and-set)
- raw redis-py, plain commands for scale: hit = ``SET key v NX GET PX ttl``
  (claim-or-read in one command, string layout, no version), first = that plus
  ``SET key v XX PX ttl``
- the round trips the plugin's store client really sent per call (1 and 2)

and the ratios kernel+plugin / raw (target <= 1.3x the same raw round trips). Then the SQLite and memory paths, with the kernel without the
plugin as reference. Keys are written under a per-run prefix and deleted
afterwards (the database is not flushed).

Run: ``uv run python bench/idempotency.py [--calls N] [--rounds R] [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from toolwire import Kernel, tool
from toolwire.state import RedisStore
from toolwire.state._redis import _LUA_CAS, _LUA_PRELUDE, _LUA_SET_IF_ABSENT_OR_GET, _channel
from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

DEFAULT_REDIS = "redis://127.0.0.1:6379/14"
TTL_MS = "3600000"


@tool
async def send_email(to: str, subject: str, body: str) -> dict[str, Any]:
    """Send an email (pretend)."""
    return {"sent": True, "to": to, "message_id": "m-123"}


ARGS = {"to": "alice@example.com", "subject": "Invoice 42", "body": "Please find it attached."}
RESULT = '{"sent":true,"to":"alice@example.com","message_id":"m-123"}'

Fn = Callable[[], Awaitable[Any]]


async def interleaved(cases: dict[str, Fn], calls: int, rounds: int) -> dict[str, list[float]]:
    """µs per call of each case, one list entry per round; rounds alternate between cases."""
    for fn in cases.values():
        for _ in range(min(300, calls)):
            await fn()
    out: dict[str, list[float]] = {name: [] for name in cases}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in cases.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    await fn()
                out[name].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        gc.enable()
    return out


def row(name: str, samples: list[float], ref: list[float] | None = None, note: str = "") -> None:
    best, med = min(samples), statistics.median(samples)
    ratio = "" if ref is None else f"{best / min(ref):6.2f}x"
    print(f"  {name:<52s} {best:8.1f} {med:8.1f} {ratio:>8s}  {note}")


def header(title: str) -> None:
    print(f"\n{title}")
    print(f"  {'':<52s} {'best µs':>8s} {'median':>8s} {'ratio':>8s}")


def ids(prefix: str) -> Iterator[str]:
    return (f"{prefix}{i}" for i in itertools.count())


# -------------------------------------------------------------------- redis
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str | None]:
    """The Redis URL to use: the given/default one if it answers, else a private server."""
    wanted = url or os.environ.get("TOOLWIRE_REDIS_URL") or DEFAULT_REDIS
    if _redis_answers(wanted):
        yield wanted
        return
    if url is not None or shutil.which("redis-server") is None:
        print(f"redis: nothing answers at {wanted} and no redis-server to start: skipped")
        yield None
        return
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="toolwire-bench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    private = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            if _redis_answers(private):
                break
            time.sleep(0.05)
        print(f"redis: nothing answers at {wanted}; started a private redis-server on port {port}")
        yield private
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


async def round_trips_per_call(client: Any, fn: Fn, n: int = 200) -> float:
    """Commands ``client`` sent per call of ``fn`` (each one is a network round trip)."""
    sent = 0
    original = client.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        nonlocal sent
        sent += 1
        return await original(*args, **options)

    client.execute_command = counting
    try:
        for _ in range(n):
            await fn()
    finally:
        client.execute_command = original
    return sent / n


async def bench_redis(url: str, calls: int, rounds: int) -> None:
    import redis.asyncio as aredis

    run = f"bench{os.getpid()}"
    prefix = f"{run}:"
    plugin = IdempotencyPlugin(IdempotencyConfig(prefix=run), env={})
    kernel = Kernel(tools=[send_email], plugins=[plugin], state=url)
    bare = Kernel(tools=[send_email], state=url)
    plain = aredis.Redis.from_url(url, decode_responses=True)  # a default redis-py client
    try:
        await kernel.start()
        await bare.start()
        claim = plain.register_script(_LUA_PRELUDE + _LUA_SET_IF_ABSENT_OR_GET)
        cas = plain.register_script(_LUA_PRELUDE + _LUA_CAS)

        hit_key = plugin.key_for("send_email", "hit")
        first = await kernel.call("send_email", ARGS, call_id="hit")
        assert not first.is_error, first.error
        replay = await kernel.call("send_email", ARGS, call_id="hit")
        assert replay.meta.replayed and replay.content == first.content
        pending = '{"s":"pending","req":"' + "0" * 64 + '","lease":1.0,"at":1.0,"ro":false}'
        done = '{"s":"done","req":"' + "0" * 64 + '","c":' + RESULT + "}"
        await plain.set(f"{prefix}plain-hit", done)

        cids, pids, sids, rids = ids("first-"), ids(f"{prefix}p-"), ids(f"{prefix}s-"), ids("r-")

        async def kernel_hit() -> None:
            await kernel.call("send_email", ARGS, call_id="hit")

        async def kernel_first() -> None:
            await kernel.call("send_email", ARGS, call_id=next(cids))

        async def plain_hit() -> None:
            await plain.set(f"{prefix}plain-hit", pending, nx=True, get=True, px=3_600_000)

        async def plain_first() -> None:
            key = next(pids)
            await plain.set(key, pending, nx=True, get=True, px=3_600_000)
            await plain.set(key, done, xx=True, px=3_600_000)

        async def script_hit() -> None:
            await claim(keys=[hit_key], args=[_channel(hit_key), pending, "set", "o", TTL_MS])

        async def script_first() -> None:
            key = next(sids)
            await claim(keys=[key], args=[_channel(key), pending, "set", "o", TTL_MS])
            await cas(
                keys=[key],
                args=[_channel(key), done, "any", "", "eq", "o", "clear", "", TTL_MS],
            )

        async def bare_call() -> None:
            await bare.call("send_email", ARGS, call_id=next(rids))

        results = await interleaved(
            {
                "kernel_hit": kernel_hit,
                "plain_hit": plain_hit,
                "script_hit": script_hit,
                "kernel_first": kernel_first,
                "plain_first": plain_first,
                "script_first": script_first,
                "bare": bare_call,
            },
            calls,
            rounds,
        )
        store = kernel.state
        assert isinstance(store, RedisStore) and store._client is not None
        hit_trips = await round_trips_per_call(store._client, kernel_hit)
        first_trips = await round_trips_per_call(store._client, kernel_first)
        assert plugin.counters.lost_claims == 0 and plugin.counters.store_errors == 0

        r = results
        header(f"Redis ({url}, {calls} calls x {rounds} rounds, one caller)")
        row("raw redis-py: the claim-or-read script (EVALSHA)", r["script_hit"])
        row("raw redis-py: SET NX GET (a plain command)", r["plain_hit"])
        row("kernel + plugin, replay (hit) path", r["kernel_hit"], r["script_hit"],
            f"{hit_trips:.2f} round trips/call; "
            f"{min(r['kernel_hit']) / min(r['plain_hit']):.2f}x the plain command")  # fmt: skip
        row("raw redis-py: claim + complete scripts (2x EVALSHA)", r["script_first"])
        row("raw redis-py: SET NX GET + SET XX (plain commands)", r["plain_first"])
        row("kernel + plugin, first-call path", r["kernel_first"], r["script_first"],
            f"{first_trips:.2f} round trips/call; "
            f"{min(r['kernel_first']) / min(r['plain_first']):.2f}x the plain commands")  # fmt: skip
        row("kernel without the plugin (no store access)", r["bare"])
        hit = min(r["kernel_hit"]) / min(r["script_hit"])
        first = min(r["kernel_first"]) / min(r["script_first"])
        verdict = "met" if max(hit, first) <= 1.3 else "NOT met"
        print(
            f"  target <= 1.3x the same raw round trips: hit {hit:.2f}x, first call "
            f"{first:.2f}x -> {verdict}"
        )
    finally:
        with contextlib.suppress(Exception):
            keys = [k async for k in plain.scan_iter(match=f"{prefix}*", count=1000)]
            for i in range(0, len(keys), 1000):
                await plain.delete(*keys[i : i + 1000])
        await kernel.close()
        await bare.close()
        await plain.aclose()


# ------------------------------------------------------------ sqlite, memory
async def bench_local(name: str, url: str, calls: int, rounds: int) -> None:
    plugin = IdempotencyPlugin(env={})
    kernel = Kernel(tools=[send_email], plugins=[plugin], state=url)
    bare = Kernel(tools=[send_email], state=url)
    async with kernel, bare:
        await kernel.call("send_email", ARGS, call_id="hit")
        cids, rids = ids("first-"), ids("r-")
        store = kernel.state
        await store.set("raw-hit", {"s": "done"})

        async def kernel_hit() -> None:
            await kernel.call("send_email", ARGS, call_id="hit")

        async def kernel_first() -> None:
            await kernel.call("send_email", ARGS, call_id=next(cids))

        async def store_hit() -> None:
            await store.set_if_absent_or_get("raw-hit", {"s": "pending"}, ttl=3600, owner="o")

        async def bare_call() -> None:
            await bare.call("send_email", ARGS, call_id=next(rids))

        r = await interleaved(
            {"hit": kernel_hit, "first": kernel_first, "store": store_hit, "bare": bare_call},
            calls,
            rounds,
        )
    header(f"{name} ({url})")
    row("kernel without the plugin", r["bare"])
    row("store.set_if_absent_or_get on an existing key", r["store"])
    row("kernel + plugin, replay (hit) path", r["hit"], r["bare"], "x kernel without plugin")
    row("kernel + plugin, first-call path", r["first"], r["bare"], "x kernel without plugin")


async def main(args: argparse.Namespace) -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    with redis_server(args.redis_url) as url:
        if url is not None:
            await bench_redis(url, args.calls, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        await bench_local("SQLite", f"sqlite:///{tmp}/state.db", args.calls // 2, args.rounds)
    await bench_local("memory", "memory://", args.calls * 2, args.rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per round and case")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--redis-url", default=None, help=f"default: $TOOLWIRE_REDIS_URL or {DEFAULT_REDIS}"
    )
    asyncio.run(main(parser.parse_args()))
