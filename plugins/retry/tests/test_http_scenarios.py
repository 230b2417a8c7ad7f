"""The issue's scenarios against fake providers on 127.0.0.1, called with real httpx."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from typing import Any

import anyio
import httpx
import pytest

from toolwire import Kernel, SystemClock, tool
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitPlugin, key_pool
from toolwire_ratelimit.testing import FakeProvider, Reply
from toolwire_retry import RetryConfig, RetryPlugin

pytestmark = pytest.mark.anyio

A1, A2, B1 = "alpha-secret-111111", "alpha-secret-222222", "beta-secret-333333"
ONE_KEY = [{"alias": "a1", "secret": A1}]


def details(res: Any) -> list[dict[str, Any]]:
    return list(res.meta.extra.get("attempt_details", []))


async def test_429_with_retry_after_then_success(make_kernel: Any, alpha: FakeProvider) -> None:
    clock = FakeClock()
    alpha.script(
        Reply(429, json={"error": "rate limit exceeded"}, headers={"Retry-After": "2"}), Reply(200)
    )
    async with make_kernel(alpha_keys=ONE_KEY, chain=False, clock=clock) as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
    assert not res.is_error, res.error
    assert clock.sleeps == [2.0]
    assert [(a.tool, a.error_kind, a.decision) for a in res.meta.attempts] == [
        ("alpha_search", "rate_limit", "retry"),
        ("alpha_search", None, None),
    ]
    d = details(res)
    assert d[0]["provider"] == "alpha" and d[0]["key"] == "a1"
    assert d[0]["pattern"] == "default.rate_limit.text" and d[0]["slept_ms"] == 2000.0
    assert d[1].get("probe") is True  # the cooled key came back through a half-open probe
    assert res.meta.extra["served_by"] == {"tool": "alpha_search", "provider": "alpha", "key": "a1"}


async def test_persistent_429_on_every_key_cools_each_once_then_the_fallback_serves(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider
) -> None:
    clock = FakeClock()
    alpha.script(Reply(429, json={"error": "Too Many Requests"}))
    async with make_kernel(clock=clock) as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
        status = await key_pool(kernel, "alpha").status()
    assert not res.is_error, res.error
    assert res.meta.served_by == "beta_search"
    assert [(a.tool, a.decision) for a in res.meta.attempts] == [
        ("alpha_search", "retry"),
        ("alpha_search", "fallback"),
        ("beta_search", None),
    ]
    assert [d.get("key") for d in details(res)] == ["a1", "a2", "b1"]
    assert alpha.count(A1, any_key=False) == 1 and alpha.count(A2, any_key=False) == 1
    assert {a: (k["state"], k["strikes"]) for a, k in status["keys"].items()} == {
        "a1": ("cooling", 1),
        "a2": ("cooling", 1),
    }
    assert clock.sleeps == []  # rotating and failing over never sleeps
    assert beta.count() == 1


async def test_401_on_one_key_quarantines_it_and_the_other_key_serves(
    make_kernel: Any, alpha: FakeProvider
) -> None:
    alpha.script(Reply(401, json={"error": "Invalid API key"}), key=A1)
    async with make_kernel() as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
        again = await kernel.call("alpha_search", {"q": "y"})
        status = await key_pool(kernel, "alpha").status()
    assert not res.is_error and res.meta.extra["served_by"]["key"] == "a2"
    assert [a.error_kind for a in res.meta.attempts] == ["auth", None]
    assert again.meta.extra["served_by"]["key"] == "a2" and len(again.meta.attempts) == 1
    assert status["keys"]["a1"]["state"] == "quarantined"


async def test_402_suspends_the_whole_pool_and_the_next_provider_serves(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider
) -> None:
    alpha.script(
        Reply(402, json={"error": "You have run out of credits.", "tag": "NO_MORE_CREDITS"})
    )
    async with make_kernel() as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
        assert res.meta.served_by == "beta_search"
        assert details(res)[0]["pattern"] == "default.quota.credits"
        av = await key_pool(kernel, "alpha").availability()
        assert (av.state, av.kind) == ("suspended", "quota")
        res2 = await kernel.call("alpha_search", {"q": "y"})  # the pool gates before any request
    assert res2.meta.served_by == "beta_search"
    assert details(res2)[0]["pattern"] == "pool.suspended"
    assert alpha.count() == 1 and beta.count() == 2


async def test_an_unmatched_500_is_one_attempt_and_terminal(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider
) -> None:
    alpha.script(Reply(500, body="internal error: division by zero"))
    async with make_kernel() as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
    assert res.error is not None
    assert (res.error.kind, res.error.retryable, res.error.details["pattern"]) == (
        "tool_error",
        False,
        None,
    )
    assert len(res.meta.attempts) == 1 and alpha.count() == 1 and beta.count() == 0


async def test_a_fallback_that_fails_for_good_says_what_failed_before_it(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider
) -> None:
    """Before: the call of alpha_search ended with beta_search's own error, "division by
    zero", and nothing in the error said that alpha_search had been tried and rate
    limited, or that the answer came from a fallback (an MCP client sees the message)."""
    alpha.script(Reply(429, json={"error": "rate limit exceeded"}))
    beta.script(Reply(500, body="internal error: division by zero"))
    async with make_kernel() as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
    assert [a.tool for a in res.meta.attempts] == ["alpha_search", "alpha_search", "beta_search"]
    assert res.error is not None and res.error.kind == "tool_error"
    assert "500 Internal Server Error" in res.error.message
    assert "(a fallback for 'alpha_search': 'alpha_search' failed with rate_limit)" in (
        res.error.message
    )
    assert res.error.details["fallback_of"] == "alpha_search"
    assert res.error.details["tried"] == [
        {"tool": "alpha_search", "provider": "alpha", "kind": "rate_limit"}
    ]
    assert alpha.count() == 2 and beta.count() == 1


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_dropped_connection_after_the_request_went_out(
    read_only: bool, alpha: FakeProvider, client: httpx.AsyncClient
) -> None:
    """The upstream reads the request, then closes the connection without an answer
    (httpx: RemoteProtocolError). Before, that was an outage like a refused connection,
    and a tool with side effects ran twice: the upstream got the request twice."""
    alpha.script(Reply(drop=True), Reply(200, json={"sent": True}))

    @tool(name="send", read_only=read_only, provider="alpha")
    async def send(to: str) -> dict[str, Any]:
        """Send a message."""
        r = await client.post(f"{alpha.url}/send", json={"to": to})
        r.raise_for_status()
        return dict(r.json())

    plugins = [RateLimitPlugin(), RetryPlugin(RetryConfig(seed=1, base_s=0.01))]
    async with Kernel(tools=[send], plugins=plugins) as kernel:
        res = await kernel.call("send", {"to": "x"})
    if read_only:  # safe to repeat: retried
        assert res.content == {"sent": True} and alpha.count() == 2
        return
    assert alpha.count() == 1
    assert res.error is not None and res.error.kind == "unavailable"
    assert res.error.details["in_flight"] is True
    assert "lost its connection during the call" in res.error.details["gave_up"]
    assert not res.error.retryable


@pytest.mark.parametrize(
    ("status", "maybe_done"), [(502, True), (504, True), (524, True), (503, False), (408, False)]
)
async def test_a_gateway_that_gave_up_on_its_upstream_leaves_the_outcome_unknown(
    status: int, maybe_done: bool, alpha: FakeProvider, client: httpx.AsyncClient
) -> None:
    """A 502 or 504 comes from a gateway that had the request and got no (good) answer
    from the upstream behind it, which may have acted. Before, both were retried like a
    503 and a tool with side effects ran twice."""
    alpha.script(Reply(status, body="upstream trouble"), Reply(200, json={"sent": True}))

    @tool(name="send", provider="alpha")
    async def send(to: str) -> dict[str, Any]:
        """Send a message."""
        r = await client.post(f"{alpha.url}/send", json={"to": to})
        r.raise_for_status()
        return dict(r.json())

    plugins = [RateLimitPlugin(), RetryPlugin(RetryConfig(seed=1, base_s=0.01))]
    async with Kernel(tools=[send], plugins=plugins) as kernel:
        res = await kernel.call("send", {"to": "x"})
    if not maybe_done:  # 503: refused; 408: the server timed out reading it. Retried
        assert res.content == {"sent": True} and alpha.count() == 2
        return
    assert alpha.count() == 1
    assert res.error is not None and res.error.kind == "unavailable"
    assert res.error.details["in_flight"] is True and res.error.details["status"] == status
    assert f"failed with HTTP {status} after the request reached" in res.error.details["gave_up"]
    assert "may have side effects" in res.error.details["gave_up"]
    assert not res.error.retryable


async def test_a_refused_connection_of_a_side_effecting_tool_is_retried(
    client: httpx.AsyncClient,
) -> None:
    """Nothing was sent (httpx: ConnectError): an outage like any other."""
    with FakeProvider("gone") as gone:
        url = gone.url  # a port nothing listens on once it stops
    runs: list[int] = []

    @tool(name="send", provider="gone")
    async def send(to: str) -> dict[str, Any]:
        """Send a message."""
        runs.append(1)
        r = await client.post(f"{url}/send", json={"to": to})
        return dict(r.json())

    plugins = [RateLimitPlugin(), RetryPlugin(RetryConfig(seed=1, base_s=0.01))]
    async with Kernel(tools=[send], plugins=plugins) as kernel:
        res = await kernel.call("send", {"to": "x"})
    assert res.error is not None and res.error.kind == "unavailable"
    assert "in_flight" not in res.error.details and len(runs) == 2


async def test_a_connect_timeout_of_a_side_effecting_tool_is_retried() -> None:
    """No connection could be made in time (httpx: ConnectTimeout against a listener whose
    backlog is full), so nothing was sent: an outage like a refused connection. Before,
    it was an unknown outcome ("timed out and may have side effects"), not retried, and
    the error told the caller not to retry either."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue: further connections are not answered
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    runs: list[int] = []

    @tool(name="send")
    async def send(to: str) -> dict[str, Any]:
        """Send a message."""
        runs.append(1)
        async with httpx.AsyncClient(timeout=httpx.Timeout(5, connect=0.2)) as c:
            r = await c.post(f"http://127.0.0.1:{port}/send", json={"to": to})
        return dict(r.json())

    plugins = [RateLimitPlugin(), RetryPlugin(RetryConfig(seed=1, base_s=0.01))]
    try:
        async with Kernel(tools=[send], plugins=plugins) as kernel:
            res = await kernel.call("send", {"to": "x"})
    finally:
        for s in [*fillers, listener]:
            s.close()
    assert res.error is not None and res.error.kind == "timeout"
    assert res.error.details["in_flight"] is False
    assert len(runs) == 2 and [a.decision for a in res.meta.attempts] == ["retry", None]
    assert "may have side effects" not in str(res.error.details.get("gave_up"))


async def test_a_provider_that_never_answers_times_out_and_falls_over_within_the_deadline(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider
) -> None:
    alpha.script(Reply(hang=True))
    kernel = make_kernel(
        clock=SystemClock(),
        alpha_provider={"request_timeout_seconds": 0.3},
        deadline_s=5.0,
    )
    t0 = time.monotonic()
    async with kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
    elapsed = time.monotonic() - t0
    assert not res.is_error, res.error
    assert res.meta.served_by == "beta_search"
    assert [a.error_kind for a in res.meta.attempts] == ["timeout", "timeout", None]
    assert all(0.25 <= a.duration_ms / 1000 < 1.5 for a in res.meta.attempts[:2])
    assert elapsed < 5.0


async def test_retry_after_3600_does_not_sleep_and_falls_over_at_once(
    make_kernel: Any, alpha: FakeProvider
) -> None:
    clock = FakeClock()
    alpha.script(Reply(429, json={"error": "slow down"}, headers={"Retry-After": "3600"}))
    async with make_kernel(alpha_keys=ONE_KEY, clock=clock) as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
    assert res.meta.served_by == "beta_search"
    assert clock.sleeps == []
    assert details(res)[0]["retry_after_s"] == 3600.0


async def test_retry_after_3600_without_a_fallback_gives_up_at_once(
    make_kernel: Any, alpha: FakeProvider
) -> None:
    clock = FakeClock()
    alpha.script(Reply(429, json={"error": "slow down"}, headers={"Retry-After": "3600"}))
    async with make_kernel(alpha_keys=ONE_KEY, chain=False, clock=clock) as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
    assert res.error is not None
    assert (res.error.kind, res.error.retry_after_s) == ("rate_limit", 3600.0)
    assert "exceeds cap_s" in res.error.details["gave_up"]
    assert clock.sleeps == [] and len(res.meta.attempts) == 1


async def test_every_candidate_unavailable_is_one_error_naming_each_provider(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider
) -> None:
    clock = FakeClock()
    alpha.script(Reply(429, json={"error": "rate limit"}, headers={"Retry-After": "90"}))
    beta.script(Reply(402, json={"error": "budget exceeded", "tag": "TEAM_BUDGET_EXCEEDED"}))
    async with make_kernel(alpha_keys=ONE_KEY, clock=clock) as kernel:
        res = await kernel.call("alpha_search", {"q": "x"})
        again = await kernel.call("alpha_search", {"q": "x"})
    err = res.error
    assert err is not None and err.kind == "unavailable"
    assert (
        "alpha: failed with rate_limit" in err.message and "beta: failed with quota" in err.message
    )
    assert "may be tried again at" in err.message
    provs = err.details["providers"]
    assert set(provs) == {"alpha", "beta"}
    assert provs["alpha"]["retry_at"] == pytest.approx(clock.time() + 90, abs=1)
    assert provs["beta"]["retry_at"] == pytest.approx(clock.time() + 3600, abs=1)
    assert err.retry_after_s == pytest.approx(90, abs=1) and err.retryable
    # the next call does not touch either provider: both are skipped with their reasons
    assert again.error is not None and again.error.kind == "unavailable"
    assert "cooling down" in again.error.message and "suspended until" in again.error.message
    assert alpha.count() == 1 and beta.count() == 1


async def test_cancellation_in_the_middle_of_a_backoff_leaks_no_task(
    make_kernel: Any, alpha: FakeProvider
) -> None:
    alpha.script(Reply(503, body="Service Unavailable", headers={"Retry-After": "10"}))
    kernel = make_kernel(alpha_keys=ONE_KEY, chain=False, clock=SystemClock())
    async with kernel:
        before = set(asyncio.all_tasks())
        t0 = time.monotonic()
        with anyio.move_on_after(0.5) as scope:
            await kernel.call("alpha_search", {"q": "x"})
        assert scope.cancelled_caught and time.monotonic() - t0 < 2.0
        await asyncio.sleep(0.05)
        assert set(asyncio.all_tasks()) == before
        assert alpha.count() == 1
        status = await key_pool(kernel, "alpha").status()
        assert status["available"] and status["keys"]["a1"]["state"] == "ok"


async def test_two_kernels_on_one_store_share_cooldowns(
    make_kernel: Any, alpha: FakeProvider
) -> None:
    from toolwire.state import MemoryStore

    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    alpha.script(Reply(429, json={"error": "rate limit"}, headers={"Retry-After": "30"}))
    k1 = make_kernel(alpha_keys=ONE_KEY, clock=clock, state=store)
    k2 = make_kernel(alpha_keys=ONE_KEY, clock=clock, state=store)
    async with k1, k2:
        assert (await k1.call("alpha_search", {"q": "x"})).meta.served_by == "beta_search"
        res = await k2.call("alpha_search", {"q": "x"})
    assert res.meta.served_by == "beta_search" and alpha.count() == 1
    assert details(res)[0]["pattern"] == "pool.cooling"


@pytest.mark.redis
async def test_two_kernels_on_one_real_redis(
    make_kernel: Any, alpha: FakeProvider, beta: FakeProvider, redis_url: str
) -> None:
    prefix = f"retry-test-{uuid.uuid4().hex[:10]}"
    alpha.script(Reply(401, json={"error": "Invalid API key"}), key=A1)
    alpha.script(Reply(402, json={"error": "insufficient_quota"}), key=A2)
    kernels = [
        make_kernel(clock=SystemClock(), state=redis_url, rl={"state_prefix": prefix})
        for _ in range(2)
    ]
    async with kernels[0], kernels[1]:
        first = await kernels[0].call("alpha_search", {"q": "x"})  # a1: 401 -> a2: 402 -> beta
        assert [d.get("key") for d in details(first)] == ["a1", "a2", "b1"]
        second = await kernels[1].call(
            "alpha_search", {"q": "y"}
        )  # alpha suspended: straight to beta
        assert second.meta.served_by == "beta_search"
        assert details(second)[0]["pattern"] == "pool.suspended"
        status = await key_pool(kernels[1], "alpha").status()
        assert status["keys"]["a1"]["state"] == "quarantined" and status["state"] == "suspended"
        entries = await kernels[0].state.scan(prefix)
        for e in entries:
            await kernels[0].state.delete(e.key)
    assert alpha.count() == 2 and beta.count() == 2


def test_fake_provider_scripts() -> None:
    import httpx

    with FakeProvider("p") as api:
        api.script(Reply(201, json={"n": 1}), Reply(418, body="teapot"))
        with httpx.Client() as c:
            assert c.get(api.url + "/a").status_code == 201
            assert c.get(api.url + "/a").text == "teapot"
            assert c.get(api.url + "/a").status_code == 418  # the last reply repeats
        assert [r.path for r in api.requests] == ["/a", "/a", "/a"]
    with pytest.raises(RuntimeError):
        _ = api.url
