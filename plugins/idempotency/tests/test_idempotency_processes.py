"""Across processes (SQLite file, Redis): concurrent replays and a SIGKILLed owner.

Children are real processes started with ``spawn``; each builds its own Kernel
on the same state URL and runs ``_idem_worker.py`` (via ``runpy``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from .conftest import delete_prefix, redis_url

WORKER = str(Path(__file__).with_name("_idem_worker.py"))
RUN_NAME = "__toolwire_idempotency_worker__"
PROCESSES = 4
TASKS_PER_PROCESS = 10
PARENT_TASKS = 50

worker = runpy.run_path(WORKER, run_name="idem_worker_in_parent")


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(state URL shared by the processes, key prefix of this test)."""
    prefix = f"p{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared/state.db", prefix
        return
    url = redis_url()
    try:
        yield url, prefix
    finally:
        delete_prefix(url, prefix)


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


def executions(runs_file: Path) -> list[str]:
    return runs_file.read_text().split() if runs_file.exists() else []


@pytest.mark.anyio
async def test_tasks_and_processes_replaying_one_call_run_it_once(
    shared: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = shared
    runs_file = tmp_path / "runs.txt"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES + 1)
    results = ctx.Queue()
    procs = [
        spawn(
            ctx,
            mode="replay",
            url=url,
            prefix=prefix,
            runs_file=str(runs_file),
            tasks=TASKS_PER_PROCESS,
            barrier=barrier,
            results=results,
        )
        for _ in range(PROCESSES)
    ]
    seen: list[tuple[Any, bool, bool]] = []
    try:
        kernel = worker["kernel_for"](url, prefix, str(runs_file), read_only=False, delay=0.5)
        async with kernel:
            await anyio.to_thread.run_sync(barrier.wait, 60)

            async def one() -> None:
                r = await kernel.call("charge", {"amount": 42}, call_id="replayed-call")
                seen.append((r.content, r.meta.replayed, r.is_error))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for _ in range(PARENT_TASKS):
                        tg.start_soon(one)
        for _ in procs:
            seen.extend(await anyio.to_thread.run_sync(results.get, True, 60))
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()

    assert len(executions(runs_file)) == 1  # exactly one execution, in one process
    assert len(seen) == PARENT_TASKS + PROCESSES * TASKS_PER_PROCESS
    assert not any(is_error for _, _, is_error in seen), seen
    assert len({repr(content) for content, _, _ in seen}) == 1  # everyone got the same result
    assert sum(not replayed for _, replayed, _ in seen) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "side-effecting"])
async def test_owner_killed_between_running_and_storing(
    shared: tuple[str, str], tmp_path: Path, read_only: bool
) -> None:
    url, prefix = shared
    runs_file = tmp_path / "runs.txt"
    ctx = multiprocessing.get_context("spawn")
    child = spawn(
        ctx, mode="die", url=url, prefix=prefix, runs_file=str(runs_file), read_only=read_only
    )
    try:
        deadline = time.monotonic() + 60
        while not executions(runs_file):
            assert time.monotonic() < deadline, "the child never ran the tool"
            assert child.is_alive(), f"the child died early ({child.exitcode})"
            await anyio.sleep(0.02)
        await anyio.sleep(0.3)  # it renewed its lease meanwhile
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
    assert len(executions(runs_file)) == 1

    kernel = worker["kernel_for"](url, prefix, str(runs_file), lease_secs=0.5, read_only=read_only)
    async with kernel:
        # the lease (0.5 s) has not lapsed yet: the replay waits for the dead
        # owner, sees the lease lapse, and only then decides
        start = anyio.current_time()
        first = await kernel.call("charge", {"amount": 42}, call_id="killed-call")
        assert anyio.current_time() - start < 5
        second = await kernel.call("charge", {"amount": 42}, call_id="killed-call")

    if read_only:
        assert len(executions(runs_file)) == 2  # re-executed exactly once
        assert not first.is_error and not first.meta.replayed
        assert second.meta.replayed and second.content == first.content
    else:
        assert len(executions(runs_file)) == 1  # never re-run silently
        for result in (first, second):
            assert result.error is not None and result.error.kind == "conflict"
            assert result.error.details["reason"] == "outcome_unknown"
            assert not result.error.retryable


@pytest.mark.anyio
@pytest.mark.parametrize("first_error", ["rate_limit", "timeout"])
async def test_owner_killed_in_the_backoff_between_two_attempts(
    shared: tuple[str, str], tmp_path: Path, first_error: str
) -> None:
    """The first attempt of a side-effecting call fails, the retry plugin backs off (10
    minutes), and the process is SIGKILLed during that wait. Refused with a rate limit
    (429), the attempt did nothing: the replay takes the claim over and runs the tool,
    once. Timed out, it may have done its work: the replay answers outcome_unknown."""
    url, prefix = shared
    runs_file = tmp_path / "runs.txt"
    ctx = multiprocessing.get_context("spawn")
    child = spawn(
        ctx,
        mode="back_off",
        url=url,
        prefix=prefix,
        runs_file=str(runs_file),
        first_error=first_error,
    )
    kernel = worker["retrying_kernel_for"](url, prefix, str(runs_file), first_error, lease_secs=0.4)
    try:
        async with kernel:
            plugin = kernel.get_plugin("idempotency")
            key = plugin.key_for("charge", "backoff-call")
            deadline = time.monotonic() + 60
            while not executions(runs_file):
                assert time.monotonic() < deadline, "the child never ran the tool"
                assert child.is_alive(), f"the child died early ({child.exitcode})"
                await anyio.sleep(0.02)
            # in the backoff now (or about to be): let the child renew its lease three
            # times (lease_secs / 4 = 0.1 s apart), whatever its record says then
            seen: set[int] = set()
            while len(seen) < 4:
                assert time.monotonic() < deadline, f"the child renewed its claim {seen}"
                assert child.is_alive(), f"the child died early ({child.exitcode})"
                entry = await kernel.state.get_entry(key)
                assert entry is not None and entry.value["s"] == "pending", entry
                seen.add(entry.version)
                await anyio.sleep(0.02)
            os.kill(child.pid, signal.SIGKILL)
            child.join(timeout=30)
            assert child.exitcode == -signal.SIGKILL
            assert executions(runs_file) == [str(child.pid), "fail"]

            # the lease (0.4 s) has not lapsed yet: the replay waits for it, then decides
            first = await kernel.call("charge", {"amount": 42}, call_id="backoff-call")
            second = await kernel.call("charge", {"amount": 42}, call_id="backoff-call")
    finally:
        if child.is_alive():
            child.kill()

    if first_error == "rate_limit":
        assert first.error is None, first.error
        assert not first.meta.replayed
        assert executions(runs_file)[1::2] == ["fail", "ok"]  # run once more, here
        assert second.meta.replayed and second.content == first.content
        assert plugin.counters.reclaims == 1
    else:
        assert executions(runs_file)[1::2] == ["fail"]  # never run again
        for result in (first, second):
            assert result.error is not None and result.error.kind == "conflict"
            assert result.error.details["reason"] == "outcome_unknown"


def _stop_toolwire_call(
    tmp_path: Path, sig: signal.Signals, extra_config: str = ""
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], Path]:
    """Run `toolwire call slow --call-id run-1`, send ``sig`` once the tool has started,
    then replay the call: (the stopped run, the replay, the file counting executions)."""
    marker = tmp_path / "started"
    (tmp_path / "slowmod.py").write_text(
        "import anyio, pathlib\n"
        "from toolwire import tool\n"
        f"MARK = pathlib.Path({str(marker)!r})\n"
        "@tool\n"
        "async def slow() -> dict:\n"
        "    first = not MARK.exists()\n"
        "    MARK.write_text(MARK.read_text() + 'x' if MARK.exists() else 'x')\n"
        "    if first:\n"
        "        await anyio.sleep(120)\n"
        "    return {'runs': len(MARK.read_text())}\n"
    )
    config = tmp_path / "toolwire.toml"
    config.write_text(
        f'state = "sqlite:///{tmp_path / "state.db"}"\nenabled_plugins = ["idempotency"]\n'
        '[tools]\nmodules = ["slowmod"]\n'
        '[plugins.idempotency]\non_in_flight = "error"\nlease_secs = 60\n' + extra_config
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "toolwire.cli", "--config", str(config), "call", "slow"]
    argv += ["--call-id", "run-1"]
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    stopped = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    replay = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    return stopped, replay, marker


def test_toolwire_call_stopped_by_sigterm_releases_its_claim(tmp_path: Path) -> None:
    """SIGTERM on `toolwire call` cancels the call as Ctrl-C does: the plugins release
    what they hold and the kernel closes. Before, the process died mid-call; its claim
    stayed pending for the lease, and a replay got 'still running elsewhere'."""
    stopped, replay, _ = _stop_toolwire_call(tmp_path, signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert stopped.stdout == "" and "terminated (SIGTERM) while calling 'slow'" in stopped.stderr
    # The claim was released (cancelled: never recorded), so the replay runs the tool
    # rather than being told the call is still running elsewhere.
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["content"] == {"runs": 2}


def test_toolwire_call_stopped_by_ctrl_c_releases_its_claim(tmp_path: Path) -> None:
    stopped, replay, _ = _stop_toolwire_call(tmp_path, signal.SIGINT)
    assert stopped.returncode == 130, stopped.stderr
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["content"] == {"runs": 2}


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)],
    ids=["sigterm", "ctrl-c"],
)
def test_toolwire_call_stopped_with_unknown_after_interrupt_keeps_its_claim(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """With the option on, the stopped call's tool had started: the replay is told the
    outcome is unknown instead of running it a second time."""
    stopped, replay, marker = _stop_toolwire_call(tmp_path, sig, "unknown_after_interrupt = true\n")
    assert stopped.returncode == code, stopped.stderr
    assert replay.returncode == 1, replay.stdout + replay.stderr
    error = json.loads(replay.stdout)["error"]
    assert error["kind"] == "conflict" and not error["retryable"], error
    assert error["details"]["reason"] == "outcome_unknown"
    assert error["details"]["interrupted"] == "cancelled"
    assert "was cancelled while it ran" in error["message"]
    assert marker.read_text() == "x"  # ran once
