"""Against a real HTTP server on 127.0.0.1 through real httpx: quarantine across a restart,
keys echoed back by a provider, classification of live responses."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolwire import CallContext, CallEvent, Kernel, tool
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin, key_pool, lease_key
from toolwire_ratelimit.testing import FakeProvider, Reply

pytestmark = pytest.mark.anyio

K1, K2 = "sk-live-key-one-111111", "sk-live-key-two-222222"


@pytest.fixture
def api() -> Iterator[FakeProvider]:
    with FakeProvider("acme") as p:
        yield p


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as c:
        yield c


def search_tool(base: str, client: httpx.AsyncClient, *, key_in: str = "header") -> Any:
    @tool(name="acme_search", read_only=True, provider="acme")
    async def acme_search(q: str, ctx: CallContext) -> dict[str, Any]:
        """Search acme."""
        async with lease_key(ctx, "acme") as key:
            assert key.secret is not None
            if key_in == "header":
                r = await client.get(
                    f"{base}/search", params={"q": q}, headers={"X-Api-Key": key.secret}
                )
            else:
                r = await client.get(f"{base}/search", params={"q": q, "api_key": key.secret})
            r.raise_for_status()
            return dict(r.json())

    return acme_search


def cfg(prefix: str = "ratelimit") -> RateLimitConfig:
    return RateLimitConfig.model_validate(
        {
            "state_prefix": prefix,
            "providers": {
                "acme": {"keys": [{"alias": "one", "secret": K1}, {"alias": "two", "secret": K2}]}
            },
        }
    )


async def test_401_on_one_key_quarantines_it_across_a_restart_on_sqlite(
    tmp_path: Path, api: FakeProvider, client: httpx.AsyncClient
) -> None:
    api.script(Reply(401, json={"error": "Invalid API key"}), key=K1)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    kernel = Kernel(
        state=url,
        clock=FakeClock(),
        plugins=[RateLimitPlugin(cfg())],
        tools=[search_tool(api.url, client)],
    )
    async with kernel:
        first = await kernel.call("acme_search", {"q": "a"})  # key one (weights equal: 'one' first)
        assert first.error is not None
        assert (first.error.kind, first.error.details["key"]) == ("auth", "one")
        assert first.error.details["pattern"] == "default.auth.invalid_key"
        assert first.error.details["status"] == 401
        for _ in range(5):
            res = await kernel.call("acme_search", {"q": "b"})
            assert not res.is_error and res.meta.extra["served_by"]["key"] == "two"
    assert api.count(K1, any_key=False) == 1

    kernel2 = Kernel(
        state=url,
        clock=FakeClock(),
        plugins=[RateLimitPlugin(cfg())],
        tools=[search_tool(api.url, client)],
    )
    async with kernel2:
        for _ in range(5):
            res = await kernel2.call("acme_search", {"q": "c"})
            assert res.meta.extra["served_by"]["key"] == "two"
        status = await key_pool(kernel2, "acme").status()
        assert status["keys"]["one"]["state"] == "quarantined"
    assert api.count(K1, any_key=False) == 1  # never used again


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_a_rate_limited_key_cools_down_and_the_next_call_rotates_on_each_loop(
    state: str, tmp_path: Path, api: FakeProvider, client: httpx.AsyncClient
) -> None:
    api.script(Reply(429, body="slow down", headers={"Retry-After": "30"}), key=K1)
    clock = FakeClock()
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path / 'state.db'}"
    kernel = Kernel(
        state=url,
        clock=clock,
        plugins=[RateLimitPlugin(cfg())],
        tools=[search_tool(api.url, client)],
    )
    async with kernel:
        first = await kernel.call("acme_search", {"q": "a"})  # key one (weights equal: 'one' first)
        then = [await kernel.call("acme_search", {"q": "b"}) for _ in range(3)]
        cooling = (await key_pool(kernel, "acme").status())["keys"]["one"]
    assert first.error is not None and first.error.kind == "rate_limit"
    assert first.error.details["key"] == "one" and first.error.retry_after_s == 30
    assert [r.meta.extra["served_by"]["key"] for r in then] == ["two"] * 3
    assert cooling["state"] == "cooling" and cooling["cool_until"] == clock.time() + 30
    assert api.count(K1, any_key=False) == 1 and api.count(K2, any_key=False) == 3


@pytest.mark.parametrize("key_in", ["header", "query"])
async def test_a_key_echoed_in_an_error_body_never_reaches_logs_or_results(
    api: FakeProvider, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, key_in: str
) -> None:
    api.script(Reply(401, json={"error": "Invalid API key"}, echo_key=True), key=K1)
    api.script(
        Reply(429, body="slow down, caller", echo_key=True, headers={"Retry-After": "1"}), key=K2
    )
    events: list[CallEvent] = []
    kernel = Kernel(
        clock=FakeClock(),
        plugins=[RateLimitPlugin(cfg())],
        tools=[search_tool(api.url, client, key_in=key_in)],
    )
    kernel.events.subscribe(events.append)
    with caplog.at_level(logging.DEBUG, logger="toolwire"):
        async with kernel:
            results = [await kernel.call("acme_search", {"q": "x"}) for _ in range(2)]
    dumped = json.dumps([r.to_dict() for r in results]) + json.dumps(
        [e.data for e in events], default=str
    )
    logs = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
    for secret in (K1, K2):
        assert secret not in dumped
        assert secret not in logs
    assert [r.error.kind for r in results if r.error] == ["auth", "rate_limit"]
    assert "[key:one]" in dumped or "[key:two]" in dumped  # the echo was replaced by the alias
    assert all(r.error and r.error.exception is not None for r in results)
    for r in results:
        assert r.error is not None and r.error.exception is not None
        chain = f"{r.error.exception!s} {r.error.exception.__cause__!s}"
        assert K1 not in chain and K2 not in chain


async def test_live_responses_are_classified_with_their_hints(
    api: FakeProvider, client: httpx.AsyncClient
) -> None:
    api.script(
        Reply(429, json={"error": "rate limit exceeded"}, headers={"Retry-After": "12"}),
        Reply(402, json={"error": "You have run out of credits.", "tag": "NO_MORE_CREDITS"}),
        Reply(500, body="<html>" + "x" * 100_000),
    )
    clock = FakeClock()
    kernel = Kernel(
        clock=clock, plugins=[RateLimitPlugin(cfg())], tools=[search_tool(api.url, client)]
    )
    async with kernel:
        r1 = await kernel.call("acme_search", {"q": "x"})
        assert r1.error is not None
        assert (r1.error.kind, r1.error.retryable, r1.error.retry_after_s) == (
            "rate_limit",
            True,
            12.0,
        )
        assert r1.error.details["headers"]["retry-after"] == "12"
        r2 = await kernel.call("acme_search", {"q": "x"})
        assert r2.error is not None and r2.error.kind == "quota"
        assert (await key_pool(kernel, "acme").availability()).state == "suspended"
        await key_pool(kernel, "acme").clear()
        r3 = await kernel.call("acme_search", {"q": "x"})
        assert r3.error is not None
        assert (r3.error.kind, r3.error.retryable, r3.error.details["pattern"]) == (
            "tool_error",
            False,
            None,
        )
        assert len(r3.error.details["body"]) <= 2048 and r3.error.details["body_truncated"]
        assert [a.error_kind for a in r3.meta.attempts] == ["tool_error"]


async def test_hostile_bodies_in_details_stay_serializable() -> None:
    from toolwire import Tool, ToolError

    node: dict[str, Any] = {"error": "x"}
    for _ in range(50_000):
        node = {"n": node}
    bodies: list[Any] = [node, b"\xff\xfe" * 1_000_000, "y" * 5_000_000, list(range(1_000_000))]

    async def boom(args: dict[str, Any], ctx: Any) -> Any:
        raise ToolError("x" * 1_000_000, status=500, details={"body": bodies[args["i"]]})

    tool_ = Tool("boom", "Boom.", {"type": "object"}, boom)
    async with Kernel(clock=FakeClock(), plugins=[RateLimitPlugin()], tools=[tool_]) as kernel:
        for i in range(len(bodies)):
            res = await kernel.call("boom", {"i": i})
            text = json.dumps(res.to_dict())
            assert len(text) < 20_000
            assert res.error is not None and res.error.details["body_truncated"]


@pytest.mark.parametrize("leased", [True, False])
async def test_a_quota_that_suspends_the_pool_says_when_to_come_back(
    api: FakeProvider, client: httpx.AsyncClient, leased: bool
) -> None:
    # a 402 without a reset time suspends the pool for suspend_seconds: the error itself
    # carries that delay (not only the next call's PoolUnavailable), still not retryable
    from toolwire import ToolError

    @tool(name="acme_plain", provider="acme")
    async def acme_plain(q: str) -> Any:
        """Fails like a tool that reports its HTTP failure without leasing a key."""
        raise ToolError("payment required", status=402, details={"body": "out of credits"})

    api.script(Reply(402, json={"error": "You have run out of credits."}))
    clock = FakeClock()
    config = cfg()
    config.providers["acme"].suspend_seconds = 3600
    tools = [search_tool(api.url, client), acme_plain]
    async with Kernel(clock=clock, plugins=[RateLimitPlugin(config)], tools=tools) as kernel:
        r1 = await kernel.call("acme_search" if leased else "acme_plain", {"q": "x"})
        assert r1.error is not None
        assert (r1.error.kind, r1.error.retryable, r1.error.retry_after_s) == (
            "quota",
            False,
            3600.0,
        )
        assert r1.meta.extra["attempt_details"][-1]["retry_after_s"] == 3600.0
        clock.advance(600)
        r2 = await kernel.call("acme_search", {"q": "x"})
        assert r2.error is not None and r2.error.kind == "quota"
        assert r2.error.retry_after_s == pytest.approx(3000.0)


async def test_a_quota_reset_time_from_the_provider_wins_over_suspend_seconds(
    api: FakeProvider, client: httpx.AsyncClient
) -> None:
    api.script(Reply(402, json={"error": "out of credits"}, headers={"Retry-After": "120"}))
    async with Kernel(
        clock=FakeClock(), plugins=[RateLimitPlugin(cfg())], tools=[search_tool(api.url, client)]
    ) as kernel:
        r = await kernel.call("acme_search", {"q": "x"})
        assert r.error is not None
        assert (r.error.kind, r.error.retryable, r.error.retry_after_s) == ("quota", False, 120.0)
        assert (await key_pool(kernel, "acme").availability()).retry_after_s == 120.0
