"""End to end: fake Brave, Exa and SearXNG servers on 127.0.0.1, reached through real httpx
sockets by the plugin's own client (no respx, no mock transport)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from toolwire_search_testkit import B1, B2, E1, E2, headers_of, load, make_kernel

from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitPlugin
from toolwire_ratelimit.testing import FakeProvider, Reply
from toolwire_search import SearchPlugin

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


async def test_a_key_an_http_header_cannot_carry_is_set_aside_at_startup(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """A key copied with curly quotes or a no-break space, or keys on lines instead of
    comma-separated. Before, every call failed with a bare ``UnicodeEncodeError``
    (``tool_error``: no other key, no other backend) or spent its attempts on
    ``LocalProtocolError``s that never reached the provider."""
    brave, exa, _ = servers
    brave.script(Reply(200, json=load("brave_web_search_200.json")))
    exa.script(Reply(200, json=load("exa_search_200.json")))
    quoted, nbsp, lines = "\u201cBSA-secret-1\u201d", "BSA-secret\u00a02", "BSA-secret-3\nBSA-4"
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": f"{quoted},{nbsp}", "EXA_API_KEY": f"{lines},{E1}"},
        search={"brave": {"base_url": brave.url}, "exa": {"base_url": exa.url}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        forced = await kernel.call("web_search_brave", {"query": "q"})
        status = SearchPlugin.of(kernel).status()
    # brave has no usable key: web_search starts with exa, whose good key serves
    assert res.error is None and res.content["served_by"] == "exa"
    assert [a.error_kind for a in res.meta.attempts] == [None]
    assert brave.count() == 0 and [r.key for r in exa.requests] == [E1]
    assert forced.error is not None and forced.error.kind == "config_error"
    assert "BRAVE_API_KEY: brave-1 holds U+201C at position 1" in forced.error.message
    assert status["backends"]["brave"]["problems"] == [
        "BRAVE_API_KEY: brave-1 holds U+201C at position 1, which an HTTP header cannot "
        "carry (a copied quote or space? several keys are comma-separated); fix the key "
        "(ignored)",
        "BRAVE_API_KEY: brave-2 holds U+00A0 at position 11, which an HTTP header cannot "
        "carry (a copied quote or space? several keys are comma-separated); fix the key "
        "(ignored)",
    ]
    assert status["backends"]["exa"]["keys"] == ["exa-2"]
    assert "exa-1 holds U+000A at position 13" in caplog.text
    text = json.dumps([res.to_dict(), forced.to_dict(), status]) + caplog.text
    assert "secret" not in text.replace("$secretRef", "")


async def test_an_instance_url_that_cannot_be_requested_is_set_aside_at_startup(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """Before, an instance URL with a bad port (or no host) was registered: each call it
    served failed with a bare ``InvalidURL`` (``tool_error``: no other instance, no
    fallback)."""
    _, exa, searx = servers
    searx.script(Reply(200, json=load("searxng_search_200.json")))
    exa.script(Reply(200, json=load("exa_search_200.json")))
    bad = ["https://bob:pw-secret-9@searx.test:abc", "https://:443", "http://searx.test:70000"]
    kernel = make_kernel(
        environ={"SEARXNG_URL": ",".join([*bad, searx.url])},
        search={"chain_order": ["searxng"]},
    )
    async with kernel:
        results = [await kernel.call("web_search", {"query": "q"}) for _ in range(3)]
        status = SearchPlugin.of(kernel).status()
    assert [(r.error, r.content["served_by"]) for r in results] == [(None, "searxng")] * 3
    assert searx.count() == 3
    assert status["backends"]["searxng"]["keys"] == ["searxng-4"]
    assert status["backends"]["searxng"]["problems"] == [
        "SEARXNG_URL: searxng-1 is not a valid URL: Invalid port: 'abc' (ignored)",
        "SEARXNG_URL: searxng-2 is not a valid URL: it has no host (ignored)",
        "SEARXNG_URL: searxng-3 is not a valid URL: port 70000 is out of range (ignored)",
    ]
    assert "pw-secret-9" not in json.dumps([r.to_dict() for r in results]) + caplog.text
    # the only instance unusable: web_search goes on with the next backend
    kernel = make_kernel(
        environ={"SEARXNG_URL": bad[0], "EXA_API_KEY": E1},
        search={"chain_order": ["searxng", "exa"], "exa": {"base_url": exa.url}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        forced = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is None and res.content["served_by"] == "exa"
    assert forced.error is not None and forced.error.kind == "config_error"
    assert "searxng-1 is not a valid URL: Invalid port: 'abc'" in forced.error.message


@pytest.mark.parametrize("depth", [300, 5000])
async def test_an_answer_nested_too_deep_is_a_broken_answer_and_falls_over(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider], depth: int
) -> None:
    """A stranger's SearXNG instance answering a few KB of brackets. Before: 5000 levels
    raised a bare ``RecursionError``, 300 levels gave a result the kernel could not
    serialize; both a terminal ``tool_error``, with Exa never asked."""
    _, exa, searx = servers
    body = json.dumps(load("searxng_search_200.json"))
    nested = body.replace('"infoboxes": []', '"infoboxes": ' + "[" * depth + "]" * depth)
    assert nested != body
    searx.script(Reply(200, body=nested, headers={"Content-Type": "application/json"}))
    exa.script(Reply(200, json=load("exa_search_200.json")))
    kernel = make_kernel(
        environ={"SEARXNG_URL": searx.url, "EXA_API_KEY": E1},
        search={"chain_order": ["searxng", "exa"], "exa": {"base_url": exa.url}},
        retry={"max_provider_attempts": 1},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        forced = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is None and res.content["served_by"] == "exa"
    assert [a.error_kind for a in res.meta.attempts] == ["unavailable", None]
    assert forced.error is not None and forced.error.kind == "unavailable"
    assert forced.error.message == (
        "searxng (searxng-1): unexpected answer: JSON nested deeper than 64 levels"
    )


async def test_an_answer_nested_as_deep_as_allowed_is_kept() -> None:
    """64 levels of a native field are still an answer (the limit is not off by one)."""
    with FakeProvider("searxng") as searx:
        data = load("searxng_search_200.json")
        data["infoboxes"] = json.loads("[" * 63 + "]" * 63)  # 64 with the answer itself
        searx.script(Reply(200, json=data))
        kernel = make_kernel(environ={"SEARXNG_URL": searx.url})
        async with kernel:
            res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is None and res.content["served_by"] == "searxng"


@pytest.mark.parametrize("score", ["1" + "0" * 400, "NaN", "Infinity", "1e999"])
async def test_a_score_that_is_no_finite_number_is_none(score: str) -> None:
    """Python's json reads these. Before: a 400-digit score raised a bare ``OverflowError``
    (a terminal ``tool_error``: the answer lost), NaN and Infinity came out as the strings
    "NaN" and "Infinity", against the output schema (a number or null)."""
    with FakeProvider("searxng") as searx:
        data = load("searxng_search_200.json")
        first_score = data["results"][0]["score"]
        body = json.dumps(data).replace(f'"score": {first_score}', '"score": SCORE', 1)
        assert "SCORE" in body
        searx.script(
            Reply(
                200, body=body.replace("SCORE", score), headers={"Content-Type": "application/json"}
            )
        )
        kernel = make_kernel(environ={"SEARXNG_URL": searx.url})
        async with kernel:
            res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is None, res.error
    scores = [r["score"] for r in res.content["results"]]
    assert scores[0] is None and scores[1] == data["results"][1]["score"]


@pytest.mark.parametrize(("status", "kind"), [(503, "unavailable"), (429, "rate_limit")])
@pytest.mark.parametrize(
    "body", ["[" * 4000 + "]" * 4000, '{"error": ' + "[" * 2000 + "]" * 2000 + "}"]
)
async def test_an_error_answer_nested_too_deep_is_still_classified(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider], status: int, kind: str, body: str
) -> None:
    """The first 8 KiB of an error answer are parsed when they are JSON. Before: a body of
    nested brackets raised a bare ``RecursionError`` (a terminal ``tool_error``: the
    instance not cooled down, the next backend never asked)."""
    _, exa, searx = servers
    searx.script(Reply(status, body=body, headers={"Content-Type": "application/json"}))
    exa.script(Reply(200, json=load("exa_search_200.json")))
    kernel = make_kernel(
        environ={"SEARXNG_URL": searx.url, "EXA_API_KEY": E1},
        search={"chain_order": ["searxng", "exa"], "exa": {"base_url": exa.url}},
        retry={"max_provider_attempts": 1},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.error is None and res.content["served_by"] == "exa"
    assert [a.error_kind for a in res.meta.attempts] == [kind, None]


@pytest.mark.parametrize("tag", [["API_KEY_BUDGET_EXCEEDED"], {"code": "NO_MORE_CREDITS"}])
async def test_an_exa_error_tag_of_another_type_is_classified(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider], tag: object
) -> None:
    """Before: a 402 whose ``tag`` was a list or an object raised a bare ``TypeError``
    (unhashable) in the adapter: a terminal ``tool_error``, SearXNG never asked."""
    _, exa, searx = servers
    exa.script(Reply(402, json={"requestId": "r1", "error": "budget exceeded", "tag": tag}))
    searx.script(Reply(200, json=load("searxng_search_200.json")))
    kernel = make_kernel(
        environ={"EXA_API_KEY": E1, "SEARXNG_URL": searx.url},
        search={"chain_order": ["exa", "searxng"], "exa": {"base_url": exa.url}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.error is None and res.content["served_by"] == "searxng"
    assert [a.error_kind for a in res.meta.attempts] == ["quota", None]


async def test_searxng_list_params_are_sent_comma_separated(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider],
) -> None:
    """``params = {engines = ["google", "bing"]}``: SearXNG reads ``engines=google,bing``
    (``webadapter.parse_generic`` splits on commas) and keeps only the first value of a
    repeated parameter (``webapp.pre_request`` makes a plain dict of the query). Before,
    the list went out as ``engines=google&engines=bing``: only Google was searched."""
    _, _, searx = servers
    searx.script(Reply(200, json=load("searxng_search_200.json")))
    kernel = make_kernel(
        environ={"SEARXNG_URL": searx.url},
        search={"searxng": {"params": {"engines": ["google", "bing"], "categories": "news"}}},
    )
    async with kernel:
        res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is None
    (sent,) = searx.requests
    assert sent.query["engines"] == ["google,bing"] and sent.query["categories"] == ["news"]


async def test_a_404_is_a_wrong_base_url_and_falls_over(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider],
) -> None:
    """SEARXNG_URL given with its /search: the plugin asked /search/search. Before, the
    404 was a terminal ``tool_error`` ("HTTP 404 Not Found", no word of the URL) and
    web_search never asked Exa."""
    _, exa, searx = servers
    searx.script(Reply(404, body="<h1>Not Found</h1>", headers={"Content-Type": "text/html"}))
    exa.script(Reply(200, json=load("exa_search_200.json")))
    kernel = make_kernel(
        environ={"SEARXNG_URL": f"{searx.url}/search", "EXA_API_KEY": E1},
        search={"chain_order": ["searxng", "exa"], "exa": {"base_url": exa.url}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        forced = await kernel.call("web_search_searxng", {"query": "q"})
        state = await RateLimitPlugin.of(kernel).pool("searxng").status()
    assert res.error is None and res.content["served_by"] == "exa"
    assert [a.error_kind for a in res.meta.attempts] == ["config_error", None]
    assert forced.error is not None and forced.error.kind == "config_error"
    # the instance URL is the pool's "key": shown by its alias, with the path asked
    assert forced.error.message == (
        "searxng (searxng-1): HTTP 404 Not Found at [key:searxng-1]/search: the base URL "
        "is wrong; fix [plugins.search.searxng] urls (or SEARXNG_URL)"
    )
    assert state["keys"]["searxng-1"]["state"] == "ok"  # the instance is not blamed
    # Brave's base URL is no secret: shown whole
    brave = servers[0]
    brave.script(Reply(404, json={"message": "no route"}))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1},
        search={"brave": {"base_url": f"{brave.url}/res/v2"}},
    )
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert res.error is not None and res.error.message == (
        f"brave (brave-1): HTTP 404 Not Found at {brave.url}/res/v2/web/search: the base URL "
        "is wrong; fix [plugins.search.brave] base_url"
    )


async def test_a_spent_exa_key_is_set_aside_for_suspend_seconds_at_most_max_cooldown(
    servers: tuple[FakeProvider, FakeProvider, FakeProvider],
) -> None:
    """As docs/search.md says: the key's cooldown is capped by max_cooldown_seconds, so
    suspend_seconds = 1 day alone brings the spent key back after an hour; raising both
    sets it aside for the day. (Before, the docs promised suspend_seconds.)"""
    _, exa, _ = servers
    exa.script(Reply(402, json=load("exa_402_api_key_budget_exceeded.json")), key=E1)
    exa.script(Reply(200, json=load("exa_search_200.json")), key=E2)
    for pool, back_after_an_hour in [
        ({"suspend_seconds": 86400}, True),
        ({"suspend_seconds": 86400, "max_cooldown_seconds": 86400}, False),
    ]:
        exa.requests.clear()
        clock = FakeClock()
        kernel = make_kernel(
            environ={"EXA_API_KEY": f"{E1},{E2}"},
            search={"exa": {"base_url": exa.url, "pool": pool}},
            clock=clock,
        )
        async with kernel:
            await kernel.call("web_search_exa", {"query": "q"})
            clock.advance(3601)
            for _ in range(3):
                res = await kernel.call("web_search_exa", {"query": "q"})
                assert res.error is None
        keys = [r.key for r in exa.requests]
        assert keys[:2] == [E1, E2]
        assert (E1 in keys[2:]) is back_after_an_hour, keys
