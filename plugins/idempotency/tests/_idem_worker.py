"""Body of the processes that test_idempotency_processes.py spawns (not a test module).

Run with ``runpy.run_path(__file__, run_name=RUN_NAME, init_globals={"ARGS": {...}})``
so that spawned children need not import the test package. The parent loads
``make_tool`` the same way (``run_name`` other than RUN_NAME) to build the very
same tool.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio
import anyio.to_thread

RUN_NAME = "__toolwire_idempotency_worker__"


def make_tool(runs_file: str, *, read_only: bool, delay: float = 0.0, hang: bool = False) -> Any:
    """A tool appending one line per execution to ``runs_file`` (shared by processes)."""
    from toolwire import CallContext, Tool, ToolAnnotations

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        fd = os.open(runs_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
        finally:
            os.close(fd)
        if hang:
            await anyio.sleep(3600)  # killed here: ran, result never stored
        if delay:
            await anyio.sleep(delay)
        return {"token": uuid.uuid4().hex, "pid": os.getpid(), "args": args}

    return Tool(
        name="charge",
        description="charges a card (or reads a balance, when read-only)",
        input_schema={"type": "object", "properties": {}, "additionalProperties": True},
        executor=executor,
        annotations=ToolAnnotations(readOnlyHint=read_only),
    )


def kernel_for(
    url: str, prefix: str, runs_file: str, *, lease_secs: float = 10.0, **tool_options: Any
) -> Any:
    from toolwire import Kernel
    from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

    plugin = IdempotencyPlugin(IdempotencyConfig(prefix=prefix, lease_secs=lease_secs), env={})
    return Kernel(tools=[make_tool(runs_file, **tool_options)], plugins=[plugin], state=url)


async def replay(
    url: str, prefix: str, runs_file: str, tasks: int, barrier: Any, results: Any
) -> None:
    """Wait for everyone, then ``tasks`` concurrent calls of the same call."""
    out: list[tuple[Any, bool, bool]] = []
    async with kernel_for(url, prefix, runs_file, read_only=False, delay=0.5) as kernel:
        await anyio.to_thread.run_sync(barrier.wait, 60)

        async def one() -> None:
            r = await kernel.call("charge", {"amount": 42}, call_id="replayed-call")
            out.append((r.content, r.meta.replayed, r.is_error))

        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(one)
    results.put(out)


async def die(url: str, prefix: str, runs_file: str, read_only: bool) -> None:
    """Run the call; the tool hangs after starting, and the parent SIGKILLs us."""
    kernel = kernel_for(url, prefix, runs_file, lease_secs=0.5, read_only=read_only, hang=True)
    async with kernel:
        await kernel.call("charge", {"amount": 42}, call_id="killed-call")


def make_flaky_tool(runs_file: str, first_error: str) -> Any:
    """A side-effecting tool whose first execution (in any process) fails with
    ``first_error`` ("rate_limit": refused with a 429, nothing done; "timeout": the
    upstream did not answer, so it may have been done), each asking to retry after 10
    minutes. Every execution appends ``<pid> fail|ok`` to ``runs_file``."""
    from toolwire import CallContext, Tool, ToolAnnotations, ToolError

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        fd = os.open(runs_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            first = os.fstat(fd).st_size == 0
            os.write(fd, f"{os.getpid()} {'fail' if first else 'ok'}\n".encode())
        finally:
            os.close(fd)
        if first and first_error == "rate_limit":
            raise ToolError(
                "429 Too Many Requests", kind="rate_limit", status=429, retry_after_s=600
            )
        if first:
            raise ToolError(
                "the upstream did not answer in time", kind="timeout", retry_after_s=600
            )
        return {"token": uuid.uuid4().hex, "pid": os.getpid(), "args": args}

    return Tool(
        name="charge",
        description="charges a card",
        input_schema={"type": "object", "properties": {}, "additionalProperties": True},
        executor=executor,
        annotations=ToolAnnotations(readOnlyHint=False),
    )


def retrying_kernel_for(
    url: str, prefix: str, runs_file: str, first_error: str, *, lease_secs: float
) -> Any:
    """Idempotency with the real ratelimit (classifies) and retry (backs off) plugins; the
    retry policy repeats timeouts too (idempotent = true), so a timeout is backed off."""
    from toolwire import Kernel
    from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin
    from toolwire_ratelimit import RateLimitPlugin
    from toolwire_retry import RetryConfig, RetryPlugin

    plugins = [
        IdempotencyPlugin(IdempotencyConfig(prefix=prefix, lease_secs=lease_secs), env={}),
        RateLimitPlugin(),
        RetryPlugin(RetryConfig(cap_s=3600, max_elapsed_s=7200, idempotent=True)),
    ]
    tool = make_flaky_tool(runs_file, first_error)
    return Kernel(tools=[tool], plugins=plugins, state=url)


async def back_off(url: str, prefix: str, runs_file: str, first_error: str) -> None:
    """Run the call: its first attempt fails, and the parent SIGKILLs us in the backoff."""
    kernel = retrying_kernel_for(url, prefix, runs_file, first_error, lease_secs=0.4)
    async with kernel:
        await kernel.call("charge", {"amount": 42}, call_id="backoff-call")


def main(mode: str, **kwargs: Any) -> None:
    if mode == "replay":
        anyio.run(lambda: replay(**kwargs))
    elif mode == "die":
        anyio.run(lambda: die(**kwargs))
    elif mode == "back_off":
        anyio.run(lambda: back_off(**kwargs))
    else:
        raise ValueError(mode)


if __name__ == RUN_NAME:
    main(**globals()["ARGS"])
