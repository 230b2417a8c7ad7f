"""End to end: fake Brave, Exa and SearXNG servers on 127.0.0.1, reached through real httpx
sockets by the plugin's own client (no respx, no mock transport)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from toolwire_search_testkit import B1, B2, E1, headers_of, load, make_kernel

from toolwire_ratelimit.testing import FakeProvider, Reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def servers() -> Iterator[tuple[FakeProvider, FakeProvider, FakeProvider]]:
    with FakeProvider("brave") as b, FakeProvider("exa") as e, FakeProvider("searxng") as s:
        yield b, e, s


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_web_search_over_loopback(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider],
) -> None:
    brave, exa, searx = servers
    per_second = {**headers_of("brave_429_rate_limited.json")}
    monthly = {**per_second, "X-RateLimit-Remaining": "1, 0"}
    brave.script(Reply(429, json=load("brave_429_rate_limited.json"), headers=per_second), key=B1)
    brave.script(Reply(429, json=load("brave_429_quota_exhausted.json"), headers=monthly), key=B2)
    exa.script(Reply(200, json=load("exa_search_200.json")))
    searx.script(Reply(200, json=load("searxng_search_200.json")))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": f"{B1},{B2}", "EXA_API_KEY": E1, "SEARXNG_URL": searx.url},
        search={
            "brave": {"base_url": f"{brave.url}/res/v1"},
            "exa": {"base_url": exa.url},
        },
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "solid state battery", "max_results": 3})
        forced = await kernel.call("web_search_searxng", {"query": "solid state battery"})

    # brave key 1: per-second limit -> key 2: monthly quota -> exa answers
    assert [(a.tool, a.error_kind) for a in res.meta.attempts] == [
        ("web_search", "rate_limit"),
        ("web_search", "quota"),
        ("web_search_exa", None),
    ]
    assert res.content["served_by"] == "exa" and len(res.content["results"]) == 3
    assert [r.key for r in brave.requests] == [B1, B2]
    assert {r.path for r in brave.requests} == {"/res/v1/web/search"}
    assert brave.requests[0].query["q"] == ["solid state battery"]
    (sent,) = exa.requests
    assert (sent.method, sent.path, sent.key) == ("POST", "/search", E1)
    assert json.loads(sent.body)["numResults"] == 3
    assert res.content["warnings"] == [
        "attempt 1: brave failed (rate_limit, key brave-1)",
        "attempt 2: brave failed (quota, key brave-2)",
    ]
    # the SearXNG instance is the pool's "key": it is reached at its own URL
    assert forced.content["served_by"] == "searxng"
    assert searx.requests[0].query["format"] == ["json"]


async def test_a_backend_that_never_answers_times_out_and_falls_over(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider],
) -> None:
    brave, exa, _ = servers
    brave.script(Reply(hang=True))
    exa.script(Reply(200, json=load("exa_search_200.json")))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1},
        search={
            "timeout_seconds": 0.2,
            "brave": {"base_url": brave.url},
            "exa": {"base_url": exa.url},
        },
        retry={"max_provider_attempts": 1},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert [a.error_kind for a in res.meta.attempts] == ["timeout", None]
    assert res.content["served_by"] == "exa" and brave.count() == 1
