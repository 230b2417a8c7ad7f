"""Redis stopped before the claim and restarted after (a private redis-server on a free port)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolwire import CallContext, Kernel, Tool
from toolwire.state import RedisStore
from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

from .conftest import SCHEMA, CountingStore, counting_tool

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RedisServer:
    """A throw-away redis-server that the test can stop and start again on one port."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        if os.environ.get("TOOLWIRE_REQUIRE_REDIS", "").lower() in ("1", "true", "yes"):
            pytest.fail("TOOLWIRE_REQUIRE_REDIS=1 but redis-server is not installed")
        pytest.skip("redis-server is not installed")
    srv = RedisServer(tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("on_store_error", ["fail_closed", "fail_open"])
async def test_redis_down_at_claim_time_then_back(server: RedisServer, on_store_error: str) -> None:
    tool, runs = counting_tool("charge", result={"charged": 42})
    plugin = IdempotencyPlugin(IdempotencyConfig(on_store_error=on_store_error), env={})  # type: ignore[arg-type]
    async with Kernel(tools=[tool], plugins=[plugin], state=server.url) as kernel:
        assert not (await kernel.call("charge", {}, call_id="warm-up")).is_error
        server.stop()

        with anyio.fail_after(30):
            down = await kernel.call("charge", {"amount": 42}, call_id="pay-1")
        if on_store_error == "fail_closed":
            assert runs == [{}]  # only the warm-up ran
            assert down.error is not None and down.error.kind == "unavailable"
            assert down.error.retryable is True
            assert down.error.details["reason"] == "store_error"
            assert f"127.0.0.1:{server.port}" in down.error.message
            assert plugin.counters.fail_open == 0
        else:
            assert len(runs) == 2 and not down.is_error  # ran, without protection
            assert plugin.counters.fail_open == 1
        assert plugin.counters.store_errors >= 1

        server.start()  # empty again: nothing was recorded while it was down
        with anyio.fail_after(30):
            first = await kernel.call("charge", {"amount": 42}, call_id="pay-1")
            replay = await kernel.call("charge", {"amount": 42}, call_id="pay-1")
    assert not first.is_error and not first.meta.replayed
    assert replay.meta.replayed and replay.content == first.content == {"charged": 42}
    assert len(runs) == (2 if on_store_error == "fail_closed" else 3)


@pytest.mark.parametrize("on_store_error", ["fail_closed", "fail_open"])
async def test_a_claim_redis_refused_is_not_taken_back(
    server: RedisServer, on_store_error: str
) -> None:
    """A stopped server refuses the connection: the claim never went out, and the store
    says so (StateNotAppliedError), so the plugin does not try to take it back. Before,
    every call during the outage paid a second failing round for it (a fail_open call:
    median 212 ms against 115 ms)."""
    tool, runs = counting_tool("charge", result={"charged": 42})
    plugin = IdempotencyPlugin(IdempotencyConfig(on_store_error=on_store_error), env={})  # type: ignore[arg-type]
    store = CountingStore(RedisStore(server.url))
    async with Kernel(tools=[tool], plugins=[plugin], state=store) as kernel:
        assert not (await kernel.call("charge", {}, call_id="warm-up")).is_error
        server.stop()
        await anyio.sleep(0.2)  # the kernel's loop sees its connections close
        store.ops.clear()
        with anyio.fail_after(30):
            down = await kernel.call("charge", {"amount": 42}, call_id="pay-1")
        assert store.ops == ["set_if_absent_or_get"]  # no compare_and_delete after it
        assert down.is_error is (on_store_error == "fail_closed")
        assert len(runs) == (1 if on_store_error == "fail_closed" else 2)
        assert "unreachable" in (
            down.error.message if down.error else down.meta.extra["idempotency"]["message"]
        )


async def test_a_restart_without_persistence_forgets_the_running_claim(
    server: RedisServer,
) -> None:
    """What docs/idempotency.md says of a Redis restarted without persistence: the claim
    is gone, a replay runs the tool again, and the original's caller is told its result
    was not kept (lost_claim)."""
    started, gate = anyio.Event(), anyio.Event()
    runs: list[dict[str, Any]] = []

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        runs.append(args)
        if len(runs) == 1:
            started.set()
            await gate.wait()
        return {"charged": 42}

    tool = Tool(name="charge", description="t", input_schema=SCHEMA, executor=executor)
    plugin = IdempotencyPlugin(IdempotencyConfig(), env={})
    async with Kernel(tools=[tool], plugins=[plugin], state=server.url) as kernel:
        results = []

        async def original() -> None:
            results.append(await kernel.call("charge", {"amount": 42}, call_id="pay-1"))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(original)
                await started.wait()
                server.stop()
                await anyio.sleep(0.2)  # the kernel's loop sees its connections close
                server.start()  # empty: the claim is gone
                replay = await kernel.call("charge", {"amount": 42}, call_id="pay-1")
                gate.set()
    assert len(runs) == 2 and not replay.is_error and not replay.meta.replayed, (
        replay.error and replay.error.message
    )
    note = results[0].meta.extra["idempotency"]
    assert results[0].content == {"charged": 42}
    assert note["recorded"] is False and note["reason"] == "lost_claim"
    assert plugin.counters.lost_claims == 1
