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


def main(mode: str, **kwargs: Any) -> None:
    if mode == "replay":
        anyio.run(lambda: replay(**kwargs))
    elif mode == "die":
        anyio.run(lambda: die(**kwargs))
    else:
        raise ValueError(mode)


if __name__ == RUN_NAME:
    main(**globals()["ARGS"])
