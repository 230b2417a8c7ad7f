"""Pending approvals survive a restart (SQLite) and travel between processes (Redis)."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest
from approval_testkit import Pending, Recorder, plugin, redis_url, running_call

from toolwire import Kernel

pytestmark = pytest.mark.anyio


async def test_a_pending_approval_survives_a_restart_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    cfg = {"key_prefix": "tw:approval", "tools": {"send_email": "REQUIRED"}}

    # Process 1 asks, then dies (here: the call is cancelled and the kernel closed).
    k1 = Kernel(state=url, plugins=[plugin(**cfg)])
    rec1 = Recorder()
    rec1.add_to(k1)
    pending1 = Pending(k1)
    async with k1:
        with anyio.move_on_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    functools.partial(k1.call, "send_email", {"to": "a@x"}, call_id="c-42")
                )
                first = await pending1.next()
                tg.cancel_scope.cancel()
    assert rec1.runs == []

    # Process 2 starts on the same file: the request is still pending.
    p2 = plugin(**cfg)
    k2 = Kernel(state=url, plugins=[p2])
    rec2 = Recorder()
    rec2.add_to(k2)
    pending2 = Pending(k2)
    async with k2:
        [req] = await p2.pending()
        assert req.id == first["id"] and req.call_id == "c-42" and req.args["to"] == "a@x"
        # The agent resumes the same call: it waits on the same request, not a new one.
        async with running_call(k2, "send_email", {"to": "a@x"}, call_id="c-42") as result:
            resumed = await pending2.next()
            assert resumed["id"] == first["id"] and pending2.events[0].data["resumed"] is True
            await p2.approve(req.id, by="ops")
        assert not result().is_error and rec2.runs == [{"to": "a@x", "body": "hi", "count": 1}]
        assert len(await p2.requests()) == 1


async def test_a_decision_taken_while_nobody_waits_is_found_by_the_resumed_call(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    cfg = {"key_prefix": "tw:approval", "default": "REQUIRED"}
    k1 = Kernel(state=url, plugins=[plugin(**cfg)])
    Recorder().add_to(k1)
    async with k1:
        res = await k1.call("send_email", {"to": "a@x"}, call_id="c-7", timeout=0.1)
    assert res.error is not None and res.error.kind == "timeout"  # the call's own deadline

    decider = plugin(**cfg)
    k2 = Kernel(state=url, plugins=[decider])
    async with k2:
        [req] = await decider.pending()
        await decider.approve(req.id, by="night shift")

    p3 = plugin(**cfg)
    k3 = Kernel(state=url, plugins=[p3])
    rec3 = Recorder()
    rec3.add_to(k3)
    async with k3:
        res = await k3.call("send_email", {"to": "a@x"}, call_id="c-7")
    assert not res.is_error and len(rec3.runs) == 1
    assert res.meta.approval is not None and res.meta.approval["by"] == "night shift"


@pytest.mark.redis
async def test_a_decision_on_one_kernel_releases_a_call_waiting_on_another_via_redis() -> None:
    url = redis_url()
    cfg = {"default": "REQUIRED"}
    waiting_plugin = plugin(**cfg)
    prefix = waiting_plugin.config.key_prefix
    deciding_plugin = plugin(**cfg, key_prefix=prefix)
    k_wait = Kernel(state=url, plugins=[waiting_plugin])
    k_decide = Kernel(state=url, plugins=[deciding_plugin])
    rec = Recorder()
    rec.add_to(k_wait)
    assert k_wait.state is not k_decide.state  # two connections, as two processes have
    async with k_wait, k_decide:
        async with running_call(k_wait, "send_email", {"to": "a@x"}) as approved:
            pending = []
            with anyio.fail_after(10):
                while not pending:
                    pending = await deciding_plugin.pending()
                    await anyio.sleep(0.02)
            await deciding_plugin.approve(pending[0].id, by="remote", args={"to": "b@x"})
        res = approved()
        assert not res.is_error and rec.runs == [{"to": "b@x", "body": "hi", "count": 1}]
        assert res.meta.approval is not None and res.meta.approval["by"] == "remote"

        async with running_call(k_wait, "send_email", {"to": "c@x"}) as rejected:
            pending = []
            with anyio.fail_after(10):
                while not pending:
                    pending = await deciding_plugin.pending()
                    await anyio.sleep(0.02)
            await deciding_plugin.reject(pending[0].id, "not today")
        assert rejected().error is not None and rejected().error.kind == "denied"  # type: ignore[union-attr]
        assert len(rec.runs) == 1
        for r in await deciding_plugin.requests():
            await k_decide.state.delete(f"{prefix}:req:{r.id}")
