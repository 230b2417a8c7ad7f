"""The web search tools in a kernel with the ratelimit and retry plugins, over respx."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from toolwire_search_testkit import (
    B1,
    B2,
    BRAVE_URL,
    E1,
    E2,
    EXA_URL,
    SEARX,
    SEARX_URL,
    by_key,
    headers_of,
    keys_sent,
    load,
    make_kernel,
)

from toolwire import Kernel, load_config
from toolwire.state import StateStoreError
from toolwire_ratelimit import ApiKey, RateLimitPlugin
from toolwire_retry import RetryPlugin
from toolwire_search import SearchPlugin

pytestmark = pytest.mark.anyio

BRAVE_TOKEN = "X-Subscription-Token"
EXA_KEY = "x-api-key"


def ok(name: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(200, json=load(name), headers=headers)


def brave_empty() -> httpx.Response:
    body = load("brave_web_search_200.json")
    body["web"]["results"] = []
    return httpx.Response(200, json=body)


def kinds(result: Any) -> list[tuple[str, str | None, str | None]]:
    return [(a.tool, a.error_kind, a.decision) for a in result.meta.attempts]


async def pool_state(kernel: Kernel, provider: str) -> dict[str, Any]:
    return await RateLimitPlugin.of(kernel).pool(provider).status()


# ---------------------------------------------------------------- no config
async def test_no_configuration_at_all_lists_the_tools_and_names_the_env_vars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock: respx.MockRouter
) -> None:
    monkeypatch.chdir(tmp_path)  # no toolwire.toml here
    cfg = load_config(env={"TOOLWIRE_LOAD_PLUGINS": "ratelimit,retry,search"})
    async with Kernel.from_config(cfg) as kernel:  # the plugins come from their entry points
        names = {t.name for t in kernel.list_tools()}
        assert {"web_search", "web_search_brave", "web_search_exa", "web_search_searxng"} <= names
        for tool, var in [
            ("web_search_brave", "BRAVE_API_KEY"),
            ("web_search_exa", "EXA_API_KEY"),
            ("web_search_searxng", "SEARXNG_URL"),
        ]:
            res = await kernel.call(tool, {"query": "x"})
            assert res.is_error and res.error is not None
            assert res.error.kind == "config_error" and var in res.error.message
            assert len(res.meta.attempts) == 1  # nobody retries a configuration problem
        res = await kernel.call("web_search", {"query": "x"})
        assert res.error is not None and res.error.kind == "config_error"
        for var in ("BRAVE_API_KEY", "EXA_API_KEY", "SEARXNG_URL"):
            assert var in res.error.message
    assert not mock.calls  # nothing was sent anywhere


async def test_without_the_ratelimit_plugin_tools_answer_config_error(
    mock: respx.MockRouter,
) -> None:
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1}, with_ratelimit=False, with_retry=False)
    async with kernel:
        res = await kernel.call("web_search", {"query": "x"})
    assert res.error is not None and res.error.kind == "config_error"
    assert "ratelimit" in res.error.message and not mock.calls


async def test_secret_ref_in_toolwire_toml(tmp_path: Path, mock: respx.MockRouter) -> None:
    (tmp_path / "toolwire.toml").write_text(
        'enabled_plugins = ["ratelimit", "retry", "search"]\n'
        "[plugins.search.brave]\n"
        'api_keys = [{"$secretRef" = "MY_BRAVE"}, {alias = "spare", secret = {"$secretRef" = "MY_BRAVE_2"}}]\n',
        encoding="utf-8",
    )
    cfg = load_config(tmp_path / "toolwire.toml", env={"MY_BRAVE": B1, "MY_BRAVE_2": B2})
    route = mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json"))
    async with Kernel.from_config(cfg) as kernel:
        res = await kernel.call("web_search", {"query": "solid state battery"})
        status = SearchPlugin.of(kernel).status()
    assert not res.is_error and res.content["served_by"] == "brave"
    assert keys_sent(route, BRAVE_TOKEN) == [B1]
    assert status["backends"]["brave"]["keys"] == ["brave-1", "spare"]
    dumped = json.dumps([res.to_dict(), status])
    assert B1 not in dumped and B2 not in dumped


# ------------------------------------------------------------------ success
async def test_brave_success(mock: respx.MockRouter) -> None:
    route = mock.get(BRAVE_URL).mock(
        return_value=ok("brave_web_search_200.json", headers_of("brave_web_search_200.json"))
    )
    exa = mock.post(EXA_URL)
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call(
            "web_search",
            {"query": "solid state battery", "max_results": 2, "safesearch": "strict"},
        )
    assert not res.is_error, res.error
    out = res.content
    assert out["served_by"] == "brave" and res.meta.served_by == "web_search"
    assert [r["url"] for r in out["results"]] == [
        "https://www.nature.com/articles/s41586-026-01234-5",
        "https://www.example-news.com/ev/solid-state-2026",
    ]
    assert out["results"][0]["title"] == "Sulfide solid-state cells pass 1,000 cycles"
    assert out["warnings"] == []
    assert out["provider_metadata"]["brave"]["query"]["original"] == (
        "solid state battery breakthrough"
    )
    sent = route.calls.last.request
    assert sent.headers[BRAVE_TOKEN] == B1 and B1 not in str(sent.url)
    assert sent.url.params["count"] == "2" and sent.url.params["safesearch"] == "strict"
    assert not exa.called
    assert res.meta.extra["served_by"] == {
        "tool": "web_search",
        "provider": "brave",
        "key": "brave-1",
    }


async def test_exa_success_through_the_backend_argument(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL)
    route = mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call(
            "web_search",
            {"query": "solid state", "backend": "exa", "include_domains": ["nature.com"]},
        )
    assert res.content["served_by"] == "exa" and not brave.called
    body = json.loads(route.calls.last.request.content)
    assert body["query"] == "solid state" and body["includeDomains"] == ["nature.com"]
    assert route.calls.last.request.headers[EXA_KEY] == E1
    assert (
        res.content["provider_metadata"]["exa"]["requestId"] == "b5947044c4b78efa9552a7c89b306d95"
    )


@pytest.mark.parametrize("limit", [2000, 0])
async def test_long_text_fields_are_cut_at_max_field_chars(
    mock: respx.MockRouter, limit: int | None
) -> None:
    """Before: a provider's page text, long titles and highlights went out whole (10 Exa
    hits with contents.text made an 11 MB answer for the model and the idempotency store)."""
    body = load("exa_search_200.json")
    hit = body["results"][0]
    hit["title"] = "T" * 5000
    hit["text"] = "page text " * 10_000  # 100,000 characters
    hit["highlights"] = ["h" * 3000, "short"]
    long_url = "https://example.org/" + "p" * 2500
    hit["url"] = long_url
    mock.post(EXA_URL).mock(return_value=httpx.Response(200, json=body))
    kernel = make_kernel(environ={"EXA_API_KEY": E1}, search={"max_field_chars": limit})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "exa"})
    assert not res.is_error, res.error
    first = res.content["results"][0]
    native = first["provider_metadata"]["exa"]
    assert first["url"] == long_url == native["url"]  # a cut URL would be a wrong one
    if not limit:
        assert len(native["text"]) == 100_000 and len(first["title"]) == 5000
        assert not any("max_field_chars" in w for w in res.content["warnings"])
        return
    assert len(first["title"]) == limit and first["title"].endswith("…")
    assert len(native["text"]) == limit and native["text"].startswith("page text page")
    assert [len(h) for h in first["highlights"]] == [limit, 5]
    assert len(json.dumps(res.content)) < 30_000
    assert any("max_field_chars" in w for w in res.content["warnings"])


async def test_the_cut_warning_survives_the_warnings_cap(mock: respx.MockRouter) -> None:
    """Before: the note that fields were cut came last and fell off the 20 warnings kept when
    many SearXNG engines failed: the answer was altered with nothing saying so."""
    body = load("searxng_search_200.json")
    body["results"][0]["content"] = "c" * 5000
    body["unresponsive_engines"] = [[f"engine{i}", "timeout"] for i in range(30)]
    mock.get(SEARX_URL).mock(return_value=httpx.Response(200, json=body))
    kernel = make_kernel(environ={"SEARXNG_URL": SEARX})
    async with kernel:
        res = await kernel.call("web_search_searxng", {"query": "q"})
    assert not res.is_error, res.error
    warnings = res.content["warnings"]
    assert len(warnings) == 20
    assert any("max_field_chars" in w for w in warnings), warnings


async def test_a_key_echoed_in_a_long_field_is_redacted_before_the_cut(
    mock: respx.MockRouter,
) -> None:
    """Before: the cut came first, so a key straddling the cut no longer matched and its first
    characters went out in the answer."""
    title = "t" * 1990 + B1  # the key's first 9 characters fall inside the 2,000 kept
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(
            200, json={"web": {"results": [{"url": "https://a.test", "title": title}]}}
        )
    )
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert not res.is_error, res.error
    text = json.dumps(res.to_dict())
    assert B1[:9] not in text
    assert res.content["results"][0]["title"].endswith("…")


async def test_a_key_echoed_url_encoded_in_a_result_is_redacted(mock: respx.MockRouter) -> None:
    """Before: only the key as configured was looked for in a success body; a key with a '+',
    '/' or '=' echoed in a result's URL (percent-encoded) went out in the answer."""
    key = "BSA+k3y/with=signs0123"
    url = "https://a.test/?key=BSA%2Bk3y%2Fwith%3Dsigns0123"
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(200, json={"web": {"results": [{"url": url, "title": "x"}]}})
    )
    kernel = make_kernel(environ={"BRAVE_API_KEY": key})
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert not res.is_error, res.error
    text = json.dumps(res.to_dict())
    assert "k3y%2Fwith" not in text
    assert res.content["results"][0]["url"].startswith("https://a.test/?key=[key:")


async def test_searxng_instance_from_the_environment(mock: respx.MockRouter) -> None:
    route = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(environ={"SEARXNG_URL": SEARX + "/"})
    async with kernel:
        res = await kernel.call("web_search", {"query": "solid state", "language": "fr"})
    assert res.content["served_by"] == "searxng"
    params = route.calls.last.request.url.params
    assert (
        params["format"] == "json" and params["language"] == "fr" and params["q"] == "solid state"
    )
    assert [r["engine"] for r in res.content["results"]] == ["searxng"] * 3
    assert any("qwant" in w for w in res.content["warnings"])  # partial engine failure


async def test_domains_are_filtered_when_the_backend_cannot(mock: respx.MockRouter) -> None:
    route = mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        only = await kernel.call(
            "web_search_brave", {"query": "battery", "include_domains": ["wikipedia.org"]}
        )
        without = await kernel.call(
            "web_search_brave", {"query": "battery", "exclude_domains": ["www.nature.com"]}
        )
    assert [r["url"] for r in only.content["results"]] == [
        "https://en.wikipedia.org/wiki/Solid-state_battery"
    ]
    assert route.calls[0].request.url.params["q"] == "battery site:wikipedia.org"
    assert "nature.com" not in json.dumps([r["url"] for r in without.content["results"]])
    assert len(without.content["results"]) == 2


async def test_invalid_arguments_never_reach_a_backend(mock: respx.MockRouter) -> None:
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        both = await kernel.call(
            "web_search", {"query": "x", "freshness": "day", "start_date": "2026-01-01"}
        )
        unknown = await kernel.call("web_search", {"query": "x", "backend": "bing"})
        empty = await kernel.call("web_search", {"query": "   "})
        reversed_range = await kernel.call(
            "web_search", {"query": "x", "start_date": "2026-10-01", "end_date": "2026-09-01"}
        )
        end_and_freshness = await kernel.call(
            "web_search", {"query": "x", "freshness": "week", "end_date": "2026-01-01"}
        )
    for res in (both, unknown, empty, reversed_range, end_and_freshness):
        assert res.error is not None and res.error.kind == "invalid_args"
    # each names its field, without pydantic's "Value error, " or a dump of every argument
    # (was "invalid arguments ...: Value error, give either ... (got {'query': 'x', 'fr)")
    problems = {
        name: res.error.details["problems"]  # type: ignore[union-attr]
        for name, res in {
            "both": both,
            "unknown": unknown,
            "reversed": reversed_range,
            "end": end_and_freshness,
        }.items()
    }
    assert [p["field"] for p in problems["both"]] == ["start_date"]
    assert problems["both"][0]["message"].startswith(
        "give either freshness or start_date/end_date, not both"
    )
    assert [p["field"] for p in problems["end"]] == ["end_date"]
    assert [p["field"] for p in problems["reversed"]] == ["end_date"]
    assert "end_date is before start_date (2026-10-01)" in problems["reversed"][0]["message"]
    assert [p["field"] for p in problems["unknown"]] == ["backend"]
    assert problems["unknown"][0]["message"].startswith(
        "unknown backend 'bing'; use 'auto' or one of ['brave', 'exa', 'searxng']"
    )
    for res in (both, unknown, reversed_range, end_and_freshness):
        assert "Value error" not in res.error.message  # type: ignore[union-attr]
    assert not mock.calls


# -------------------------------------------------------------------- empty
async def test_a_healthy_empty_result_is_a_success(mock: respx.MockRouter) -> None:
    mock.get(BRAVE_URL).mock(return_value=brave_empty())
    exa = mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search", {"query": "zzzz"})
    assert not res.is_error and res.content["results"] == []
    assert res.content["served_by"] == "brave" and not exa.called


async def test_fallback_on_empty_moves_to_the_next_backend(mock: respx.MockRouter) -> None:
    mock.get(BRAVE_URL).mock(return_value=brave_empty())
    exa = mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1}, search={"fallback_on_empty": True}
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "zzzz"})
    assert res.content["served_by"] == "exa" and exa.call_count == 1
    assert kinds(res)[0] == ("web_search", "unavailable", "fallback")


# ----------------------------------------------------------- rate limits
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # respx works under both
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_brave_per_second_limit_rotates_to_the_next_key(
    mock: respx.MockRouter, state: str, tmp_path: Path
) -> None:
    limited = httpx.Response(
        429,
        json=load("brave_429_rate_limited.json"),
        headers=headers_of("brave_429_rate_limited.json"),
    )
    route = mock.get(BRAVE_URL).mock(
        side_effect=by_key(BRAVE_TOKEN, {B1: limited, B2: ok("brave_web_search_200.json")})
    )
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    kernel = make_kernel(environ={"BRAVE_API_KEY": f"{B1},{B2}", "EXA_API_KEY": E1}, state=url)
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        pool = await pool_state(kernel, "brave")
    assert res.content["served_by"] == "brave"
    assert keys_sent(route, BRAVE_TOKEN) == [B1, B2]
    assert kinds(res) == [("web_search", "rate_limit", "retry"), ("web_search", None, None)]
    detail = res.meta.extra["attempt_details"][0]
    assert detail["key"] == "brave-1" and detail["retry_after_s"] == 1.0  # X-RateLimit-Reset
    assert pool["keys"]["brave-1"]["state"] == "cooling" and pool["suspended"] is None
    assert res.content["warnings"] == ["attempt 1: brave failed (rate_limit, key brave-1)"]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(
    mock: respx.MockRouter, free_tcp_port: int
) -> None:
    """redis.asyncio runs on asyncio only: the kernel says so when it starts (no hang, no
    traceback from inside redis-py), and nothing is sent."""
    url = f"redis://127.0.0.1:{free_tcp_port}/0"
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1}, state=url)
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await kernel.call("web_search", {"query": "q"})
    assert not mock.calls


async def test_brave_monthly_quota_suspends_brave_and_falls_over(mock: respx.MockRouter) -> None:
    monthly = {**headers_of("brave_429_rate_limited.json"), "X-RateLimit-Remaining": "1, 0"}
    brave = mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(
            429, json=load("brave_429_quota_exhausted.json"), headers=monthly
        )
    )
    exa = mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": f"{B1},{B2}", "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        state = await pool_state(kernel, "brave")
        again = await kernel.call("web_search", {"query": "q2"})
    # the monthly quota is the account's: no second brave key is tried, exa answers
    assert brave.call_count == 1
    assert kinds(res) == [("web_search", "quota", "fallback"), ("web_search_exa", None, None)]
    assert res.content["served_by"] == "exa"
    assert state["state"] == "suspended" and state["retry_after_s"] == pytest.approx(1419704)
    assert res.content["warnings"] == ["attempt 1: brave failed (quota, key brave-1)"]
    # the next call does not even ask Brave
    assert again.content["served_by"] == "exa" and brave.call_count == 1 and exa.call_count == 2


async def test_brave_quota_fields_alone_tell_the_monthly_quota_apart(
    mock: respx.MockRouter,
) -> None:
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(429, json=load("brave_429_quota_exhausted.json"))
    )
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert res.error is not None and res.error.kind == "quota"
    assert res.error.details["pattern"] == "default.body.quota_exhausted"
    assert res.error.details["code"] == "RATE_LIMITED"


async def test_a_success_that_uses_up_the_month_suspends_the_pool(mock: respx.MockRouter) -> None:
    last = {**headers_of("brave_web_search_200.json"), "X-RateLimit-Remaining": "0, 0"}
    brave = mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json", last))
    mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        first = await kernel.call("web_search", {"query": "q"})
        state = await pool_state(kernel, "brave")
        second = await kernel.call("web_search", {"query": "q"})
    assert first.content["served_by"] == "brave" and len(first.content["results"]) == 3
    assert any("monthly quota used up" in w for w in first.content["warnings"])
    assert state["state"] == "suspended"
    assert second.content["served_by"] == "exa" and brave.call_count == 1


class _StoreThatGoesAway:
    """A memory store whose reads and writes, once ``gone`` is set, fail (``"down"``: Redis
    went away) or never answer (``"hung"``)."""

    def __new__(cls, how: str) -> Any:
        import anyio

        from toolwire.state import MemoryStore, StateStoreError

        async def away() -> None:
            if how == "down":
                raise StateStoreError("memory state store: injected outage")
            await anyio.sleep_forever()

        class Store(MemoryStore):
            gone = False

            async def get_entry(self, key: str) -> Any:
                if self.gone:
                    await away()
                return await super().get_entry(key)

            async def compare_and_set(self, key: str, value: Any, **kw: Any) -> Any:
                if self.gone:
                    await away()
                return await super().compare_and_set(key, value, **kw)

        return Store()


@pytest.mark.parametrize("how", ["down", "hung"])
@pytest.mark.parametrize("month_used_up", [False, True], ids=["success", "month-used-up"])
async def test_a_store_outage_after_the_answer_never_costs_the_results(
    mock: respx.MockRouter, caplog: pytest.LogCaptureFixture, month_used_up: bool, how: str
) -> None:
    """Before: the key's bookkeeping after a good answer (its success, or the used-up month)
    raised StateStoreError out of the tool: the search had run, its results were dropped.
    The bookkeeping is bounded too: a store that stops answering is logged, naming what was
    not recorded (before, the bound cut it without a word)."""
    caplog.set_level(logging.WARNING)
    store = _StoreThatGoesAway(how)
    headers = headers_of("brave_web_search_200.json")
    if month_used_up:
        headers = {**headers, "X-RateLimit-Remaining": "0, 0"}

    def answer(request: httpx.Request) -> httpx.Response:
        store.gone = True  # the store goes away while the backend answers
        return ok("brave_web_search_200.json", headers)

    mock.get(BRAVE_URL).mock(side_effect=answer)
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1}, with_retry=False, state=store)
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        store.gone = False
    assert not res.is_error, res.error
    assert res.content["served_by"] == "brave" and len(res.content["results"]) == 3
    if month_used_up:
        assert any("could not be set aside" in w for w in res.content["warnings"])
    if how == "hung":
        if month_used_up:
            assert "could not set the used-up key aside" in caplog.text
        else:
            assert "could not record the key's success" in caplog.text
        assert "did not answer within 2s" in caplog.text


async def test_exa_429_is_a_rate_limit(mock: respx.MockRouter) -> None:
    mock.post(EXA_URL).mock(
        return_value=httpx.Response(429, json=load("exa_429_rate_limited.json"))
    )
    kernel = make_kernel(environ={"EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search_exa", {"query": "q"})
    assert res.error is not None and res.error.kind == "rate_limit"
    assert {a.error_kind for a in res.meta.attempts} == {"rate_limit"}
    assert res.meta.extra["attempt_details"][0]["pattern"] == "default.rate_limit.text"


# ---------------------------------------------------------------- bad keys
async def test_brave_invalid_token_quarantines_that_key(mock: respx.MockRouter) -> None:
    bad = httpx.Response(422, json=load("brave_422_invalid_token.json"))
    route = mock.get(BRAVE_URL).mock(
        side_effect=by_key(BRAVE_TOKEN, {B1: bad, B2: ok("brave_web_search_200.json")})
    )
    kernel = make_kernel(environ={"BRAVE_API_KEY": f"{B1},{B2}"})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        again = await kernel.call("web_search", {"query": "q"})
        state = await pool_state(kernel, "brave")
    assert kinds(res) == [("web_search", "auth", "retry"), ("web_search", None, None)]
    assert again.content["served_by"] == "brave"
    assert keys_sent(route, BRAVE_TOKEN) == [B1, B2, B2]  # never the bad key again
    assert state["keys"]["brave-1"]["state"] == "quarantined"


async def test_exa_401_fails_the_forced_tool_without_fallback(mock: respx.MockRouter) -> None:
    mock.post(EXA_URL).mock(return_value=httpx.Response(401, json=load("exa_401_invalid_key.json")))
    brave = mock.get(BRAVE_URL)
    kernel = make_kernel(environ={"EXA_API_KEY": E1, "BRAVE_API_KEY": B1})
    async with kernel:
        res = await kernel.call("web_search_exa", {"query": "q"})
        state = await pool_state(kernel, "exa")
    assert res.error is not None and res.error.kind == "auth"
    assert "exa (exa-1): HTTP 401" in res.error.message
    assert not brave.called  # forced: no other backend
    assert state["state"] == "quarantined"


@pytest.mark.parametrize(
    "fixture",
    [
        "exa_402_no_more_credits.json",
        "exa_402_team_budget_exceeded.json",
        "exa_402_api_key_budget_exceeded.json",
    ],
)
async def test_exa_402_tags(fixture: str, mock: respx.MockRouter) -> None:
    exhausted = httpx.Response(402, json=load(fixture))
    route = mock.post(EXA_URL).mock(
        side_effect=by_key(EXA_KEY, {E1: exhausted, E2: ok("exa_search_200.json")})
    )
    kernel = make_kernel(environ={"EXA_API_KEY": f"{E1},{E2}"})
    async with kernel:
        res = await kernel.call("web_search_exa", {"query": "q"})
        state = await pool_state(kernel, "exa")
    tag = load(fixture)["tag"]
    first = res.meta.extra["attempt_details"][0]
    assert first["kind"] == "quota"
    if tag == "API_KEY_BUDGET_EXCEEDED":
        # only that key is spent: the other key serves, the provider is not suspended
        assert not res.is_error and res.content["served_by"] == "exa"
        assert keys_sent(route, EXA_KEY) == [E1, E2]
        assert state["suspended"] is None and state["keys"]["exa-1"]["state"] == "cooling"
        assert first["pattern"] == "search.exa.key_exhausted"
    else:
        # credits / team budget: the account is spent, no other key is tried
        assert res.error is not None and res.error.kind == "quota"
        assert res.error.details["tag"] == tag and tag in res.error.message
        assert keys_sent(route, EXA_KEY) == [E1]
        assert state["state"] == "suspended"


# ---------------------------------------------------------- server errors
async def test_503_is_retried_on_the_same_backend(mock: respx.MockRouter) -> None:
    route = mock.get(BRAVE_URL).mock(
        side_effect=[httpx.Response(503, text="upstream busy"), ok("brave_web_search_200.json")]
    )
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert not res.is_error and route.call_count == 2
    assert kinds(res) == [
        ("web_search_brave", "unavailable", "retry"),
        ("web_search_brave", None, None),
    ]


async def test_an_unexplained_500_is_terminal(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL).mock(return_value=httpx.Response(500, text="division by zero"))
    exa = mock.post(EXA_URL)
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.error is not None and res.error.kind == "tool_error"
    assert "HTTP 500 division by zero" in res.error.message
    assert brave.call_count == 1 and not exa.called


async def test_a_5xx_outage_falls_over_after_the_same_backend_retry(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL).mock(return_value=httpx.Response(502, text="bad gateway"))
    mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert brave.call_count == 2 and res.content["served_by"] == "exa"
    assert [k for _, k, _ in kinds(res)] == ["unavailable", "unavailable", None]


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>maintenance</html>"),
        httpx.Response(200, json=[{"not": "an object"}]),
        # nested: these were a healthy empty answer, so nothing fell over
        httpx.Response(200, json={"type": "search", "web": [{"url": "https://a.test"}]}),
        httpx.Response(200, json={"type": "search", "web": {"results": {"0": {}}}}),
    ],
    ids=["not-json", "json-list", "web-list", "results-object"],
)
async def test_a_broken_success_answer_falls_over(
    mock: respx.MockRouter, answer: httpx.Response
) -> None:
    """A 200 that is not JSON, or JSON of the wrong shape, is the provider's fault, not the
    query's. Before: a final tool_error after one attempt, and exa was never asked."""
    brave = mock.get(BRAVE_URL).mock(return_value=answer)
    mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
        forced = await kernel.call("web_search_brave", {"query": "q"})
    assert not res.is_error and res.content["served_by"] == "exa", res.error
    assert brave.call_count >= 1
    assert forced.error is not None and forced.error.message.startswith("brave")


async def test_timeouts_are_classified_and_fall_over(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL).mock(side_effect=httpx.ReadTimeout("read timed out"))
    mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        forced = await kernel.call("web_search_brave", {"query": "q"})
        walked = await kernel.call("web_search", {"query": "q"})
    assert forced.error is not None and forced.error.kind == "timeout"
    assert "no complete answer within 10s (ReadTimeout)" in forced.error.message
    assert walked.content["served_by"] == "exa"
    assert [k for _, k, _ in kinds(walked)] == ["timeout", "timeout", None]
    assert brave.call_count == 4


async def test_connection_errors_are_unavailable(mock: respx.MockRouter) -> None:
    mock.get(SEARX_URL).mock(side_effect=httpx.ConnectError("connection refused"))
    kernel = make_kernel(environ={"SEARXNG_URL": SEARX})
    async with kernel:
        res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is not None and res.error.kind == "unavailable"
    assert len(res.meta.attempts) == 2


# ----------------------------------------------------------------- searxng
async def test_searxng_json_disabled_is_a_config_error(mock: respx.MockRouter) -> None:
    html = load("searxng_403_json_disabled.txt").split("\n\n", 1)[1]
    mock.get(SEARX_URL).mock(
        return_value=httpx.Response(403, text=html, headers={"content-type": "text/html"})
    )
    brave = mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json"))
    kernel = make_kernel(
        environ={"SEARXNG_URL": SEARX, "BRAVE_API_KEY": B1},
        search={"chain_order": ["searxng", "brave"]},
    )
    async with kernel:
        forced = await kernel.call("web_search_searxng", {"query": "q"})
        walked = await kernel.call("web_search", {"query": "q"})
        state = await pool_state(kernel, "searxng")
    assert forced.error is not None and forced.error.kind == "config_error"
    assert "formats: [html, json]" in forced.error.message and len(forced.meta.attempts) == 1
    assert state["keys"]["searxng-1"]["state"] == "ok"  # the instance is not "quarantined"
    assert walked.content["served_by"] == "brave" and brave.call_count == 1


async def test_searxng_answering_html_with_200_is_a_config_error(mock: respx.MockRouter) -> None:
    mock.get(SEARX_URL).mock(return_value=httpx.Response(200, text="<html>results</html>"))
    kernel = make_kernel(environ={"SEARXNG_URL": SEARX})
    async with kernel:
        res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is not None and res.error.kind == "config_error"


async def test_every_searxng_engine_failing_is_a_backend_failure(mock: respx.MockRouter) -> None:
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_all_engines_failed.json"))
    mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(
        environ={"SEARXNG_URL": SEARX, "EXA_API_KEY": E1},
        search={"chain_order": ["searxng", "exa"]},
    )
    async with kernel:
        walked = await kernel.call("web_search", {"query": "q"})
        last = await kernel.call("web_search_searxng", {"query": "q"})
    # in a chain: the next backend answers
    assert walked.content["served_by"] == "exa" and len(walked.content["results"]) == 3
    assert walked.meta.attempts[0].error_kind == "unavailable"
    # last resort: empty results, with the engines' failures as warnings
    assert not last.is_error and last.content["results"] == []
    assert last.meta.extra.get("recovered") == "fallback_on_empty"
    assert any("CAPTCHA" in w for w in last.content["warnings"])
    assert searx.call_count == 2  # the same failing instance is not hammered


async def test_every_searxng_engine_failing_without_retry_is_an_error(
    mock: respx.MockRouter,
) -> None:
    mock.get(SEARX_URL).mock(return_value=ok("searxng_search_all_engines_failed.json"))
    kernel = make_kernel(environ={"SEARXNG_URL": SEARX}, with_retry=False)
    async with kernel:
        res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is not None and res.error.kind == "unavailable"
    assert "every engine failed" in res.error.message


async def test_bad_searxng_url_in_the_environment_is_reported(mock: respx.MockRouter) -> None:
    kernel = make_kernel(environ={"SEARXNG_URL": "searx.local"})
    async with kernel:
        res = await kernel.call("web_search_searxng", {"query": "q"})
    assert res.error is not None and res.error.kind == "config_error"
    assert "SEARXNG_URL: searxng-1 is not an http:// or https:// URL" in res.error.message


# -------------------------------------------------------------- the chain
async def test_forced_tools_never_fall_over(mock: respx.MockRouter) -> None:
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(429, json=load("brave_429_quota_exhausted.json"))
    )
    exa = mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1},
        rl={"chain_order": ["brave", "exa"]},  # even with a chain configured elsewhere
    )
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert res.error is not None and res.error.kind == "quota" and not exa.called


async def test_chain_order_walks_only_configured_backends(mock: respx.MockRouter) -> None:
    mock.post(EXA_URL).mock(return_value=httpx.Response(503, text="service unavailable"))
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    # brave has no key: web_search starts with exa and falls over to searxng
    kernel = make_kernel(environ={"EXA_API_KEY": E1, "SEARXNG_URL": SEARX})
    async with kernel:
        tool = kernel.get_tool("web_search")
        res = await kernel.call("web_search", {"query": "q"})
    assert tool is not None and tool.settings["provider"] == "exa"
    assert "exa -> searxng" in tool.description
    assert res.content["served_by"] == "searxng" and searx.call_count == 1
    assert res.meta.served_by == "web_search_searxng"


async def test_chain_order_from_the_ratelimit_section(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL)
    mock.post(EXA_URL).mock(return_value=ok("exa_search_200.json"))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1}, rl={"chain_order": ["exa", "brave"]}
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.content["served_by"] == "exa" and not brave.called


async def test_every_backend_failing_gives_one_error_naming_each(mock: respx.MockRouter) -> None:
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(429, json=load("brave_429_quota_exhausted.json"))
    )
    mock.post(EXA_URL).mock(
        return_value=httpx.Response(402, json=load("exa_402_no_more_credits.json"))
    )
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.error is not None and res.error.kind == "unavailable"
    assert set(res.error.details["providers"]) == {"brave", "exa"}
    # the message itself names each backend and what it failed with
    assert "brave: failed with quota" in res.error.message, res.error.message
    assert "exa: failed with quota" in res.error.message, res.error.message
    assert res.error.retry_after_s is not None  # when it may be tried again


async def test_the_operators_own_fallbacks_win(mock: respx.MockRouter) -> None:
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(429, json=load("brave_429_quota_exhausted.json"))
    )
    exa = mock.post(EXA_URL)
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX},
        retry={"fallbacks": {"web_search": ["web_search_searxng"]}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.content["served_by"] == "searxng" and searx.called and not exa.called


async def test_base_urls_are_configurable(mock: respx.MockRouter) -> None:
    route = mock.get("https://proxy.corp.test/brave/web/search").mock(
        return_value=ok("brave_web_search_200.json")
    )
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1},
        search={"brave": {"base_url": "https://proxy.corp.test/brave/"}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    assert res.content["served_by"] == "brave" and route.called


async def test_redirects_are_not_followed(mock: respx.MockRouter) -> None:
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(301, headers={"location": "https://elsewhere.test/"})
    )
    elsewhere = mock.get("https://elsewhere.test/")
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    async with kernel:
        res = await kernel.call("web_search_brave", {"query": "q"})
    assert res.error is not None and res.error.kind == "config_error"
    assert not elsewhere.called  # the key never travels to another host


# ------------------------------------------------------------------ secrets
async def test_keys_never_appear_in_results_errors_or_logs(
    mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"requestId": "r1", "error": f"Invalid API key {E1}"}
    mock.post(EXA_URL).mock(return_value=httpx.Response(401, json=echo))
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(
            200, json={"web": {"results": [{"url": "https://a.test", "title": f"echo {B1}"}]}}
        )
    )
    kernel = make_kernel(environ={"EXA_API_KEY": E1, "BRAVE_API_KEY": B1})
    async with kernel:
        failed = await kernel.call("web_search_exa", {"query": "q"})
        echoed = await kernel.call("web_search_brave", {"query": "q"})
        status = SearchPlugin.of(kernel).status()
    assert failed.error is not None and failed.error.kind == "auth"
    text = json.dumps([failed.to_dict(), echoed.to_dict(), status]) + caplog.text
    assert E1 not in text and B1 not in text
    assert "[key:exa-1]" in json.dumps(failed.to_dict())
    assert echoed.content["results"][0]["title"] == "echo [key:brave-1]"


# -------------------------------------------------------------- lifecycle
async def test_one_shared_client_opened_at_startup_closed_at_shutdown(
    mock: respx.MockRouter,
) -> None:
    mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1})
    plugin = SearchPlugin.of(kernel)
    assert plugin.client is None
    async with kernel:
        client = plugin.client
        assert client is not None and not client.is_closed
        await kernel.call("web_search", {"query": "a"})
        await kernel.call("web_search_brave", {"query": "b"})
        assert plugin.client is client
    assert plugin.client is None and client.is_closed


async def test_searxng_url_credentials_travel_in_a_header(
    mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    route = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(environ={"SEARXNG_URL": "https://bob:pw-secret-999999@searx.test"})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    sent = route.calls.last.request
    assert res.content["served_by"] == "searxng"
    assert (
        sent.url.userinfo == b""
        and sent.headers["Authorization"] == "Basic Ym9iOnB3LXNlY3JldC05OTk5OTk="
    )
    assert "pw-secret-999999" not in caplog.text + json.dumps(res.to_dict())


async def test_an_explicit_backend_starts_the_walk(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL)
    exa = mock.post(EXA_URL).mock(
        return_value=httpx.Response(402, json=load("exa_402_no_more_credits.json"))
    )
    mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "exa"})
    # exa first; its pool is then suspended, so web_search's chain continues with searxng
    assert [(a.tool, a.error_kind) for a in res.meta.attempts] == [
        ("web_search", "quota"),
        ("web_search_searxng", None),
    ]
    assert res.content["served_by"] == "searxng" and exa.call_count == 1 and not brave.called


# ------------------------------------------------- the chain through the retry API
def down() -> httpx.Response:
    return httpx.Response(503, text="service unavailable")


async def test_the_default_chains_are_set_through_the_retry_api(mock: respx.MockRouter) -> None:
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "SEARXNG_URL": SEARX})
    retry = _retry_of(kernel)
    async with kernel:
        await kernel.start()
        web = [s.tool for s in retry.fallbacks_for("web_search")]
        forced = {n: retry.fallbacks_for(f"web_search_{n}") for n in ("brave", "exa", "searxng")}
        # a backend configured later: the next catalog build replaces the search plugin's chain
        RateLimitPlugin.of(kernel).register_keys("exa", [ApiKey("exa-1", E1)])
        await kernel.refresh_tools()
        refreshed = [s.tool for s in retry.fallbacks_for("web_search")]
    assert web == ["web_search_searxng"]  # exa has no key
    assert forced == {"brave": [], "exa": [], "searxng": []}
    assert refreshed == ["web_search_exa", "web_search_searxng"]
    assert retry.config.fallbacks == {} and retry.config.tools == {}  # config untouched


def _retry_of(kernel: Kernel) -> RetryPlugin:
    plugin = kernel.get_plugin("retry")
    assert isinstance(plugin, RetryPlugin)
    return plugin


async def test_without_a_backend_the_chain_is_unchanged(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL).mock(return_value=down())
    exa = mock.post(EXA_URL).mock(return_value=down())
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX},
        retry={"max_provider_attempts": 1},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q"})
    # backend "auto": the first configured backend, then every one after it, in order
    assert kinds(res) == [
        ("web_search", "unavailable", "fallback"),
        ("web_search_exa", "unavailable", "fallback"),
        ("web_search_searxng", None, None),
    ]
    assert (brave.call_count, exa.call_count, searx.call_count) == (1, 1, 1)


async def test_an_explicit_backend_never_comes_back_to_itself(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json"))
    exa = mock.post(EXA_URL).mock(return_value=down())  # down, but its pool stays usable
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX})
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "exa"})
        again = await kernel.call("web_search", {"query": "q"})  # the override was per call
    # exa: its own retry, then the backends after exa in the chain — not exa a third time
    # through web_search_exa, and not brave (before exa in the chain)
    assert kinds(res) == [
        ("web_search", "unavailable", "retry"),
        ("web_search", "unavailable", "fallback"),
        ("web_search_searxng", None, None),
    ]
    assert res.content["served_by"] == "searxng" and exa.call_count == 2
    assert searx.call_count == 1
    assert again.content["served_by"] == "brave" and brave.call_count == 1


async def test_an_explicit_last_backend_has_nowhere_to_go(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL)
    exa = mock.post(EXA_URL)
    searx = mock.get(SEARX_URL).mock(return_value=down())
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX},
        retry={"max_provider_attempts": 1},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "searxng"})
    assert res.error is not None and res.error.kind == "unavailable"
    assert kinds(res) == [("web_search", "unavailable", None)]
    assert not brave.called and not exa.called and searx.call_count == 1

    # a backend left out of chain_order has nothing after it either
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX},
        search={"chain_order": ["exa", "searxng"]},
        retry={"max_provider_attempts": 1},
    )
    brave.mock(return_value=down())
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "brave"})
    assert kinds(res) == [("web_search", "unavailable", None)]
    assert brave.call_count == 1 and not exa.called and searx.call_count == 1


async def test_an_explicit_backend_skips_disabled_and_unconfigured_backends(
    mock: respx.MockRouter,
) -> None:
    mock.get(BRAVE_URL).mock(
        return_value=httpx.Response(429, json=load("brave_429_quota_exhausted.json"))
    )
    exa = mock.post(EXA_URL)
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX},
        search={"chain_order": ["exa", "brave", "searxng"], "exa": {"enabled": False}},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "brave"})
    assert kinds(res)[-1] == ("web_search_searxng", None, None)
    assert res.content["served_by"] == "searxng" and not exa.called

    # a backend with no key is not a candidate either
    kernel = make_kernel(
        environ={"BRAVE_API_KEY": B1, "SEARXNG_URL": SEARX},
        search={"chain_order": ["brave", "exa", "searxng"]},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "brave"})
    assert [a.tool for a in res.meta.attempts] == ["web_search", "web_search_searxng"]
    assert not exa.called and searx.call_count == 2


async def test_a_call_still_on_its_way_when_the_kernel_closes_is_unavailable(
    mock: respx.MockRouter,
) -> None:
    """Before: kind 'internal' and 'the search plugin is not started', with nothing to do."""
    import anyio

    from toolwire import hookimpl

    gate, waiting = anyio.Event(), anyio.Event()

    class Hold:
        name, order = "hold", 10

        @hookimpl
        async def before_call(self) -> None:
            waiting.set()
            await gate.wait()

    brave = mock.get(BRAVE_URL).mock(return_value=ok("brave_web_search_200.json"))
    kernel = make_kernel(environ={"BRAVE_API_KEY": B1}, with_retry=False)
    kernel.register(Hold())
    results: list[Any] = []
    await kernel.start()
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            results.append(await kernel.call("web_search", {"query": "q"}))

        tg.start_soon(call)
        await waiting.wait()
        await kernel.close()  # the search plugin's HTTP client closes
        gate.set()
    (res,) = results
    assert res.error is not None and res.error.kind == "unavailable", res.error
    assert "start the kernel" in res.error.message and not brave.called


def test_of_a_kernel_without_the_plugin_says_how_to_load_it() -> None:
    with pytest.raises(LookupError, match="enable it \\(enabled_plugins\\) or pass SearchPlugin"):
        SearchPlugin.of(Kernel())


async def test_an_explicit_backend_with_the_operators_own_list(mock: respx.MockRouter) -> None:
    brave = mock.get(BRAVE_URL)
    exa = mock.post(EXA_URL).mock(return_value=down())
    searx = mock.get(SEARX_URL).mock(return_value=ok("searxng_search_200.json"))
    everything = {"BRAVE_API_KEY": B1, "EXA_API_KEY": E1, "SEARXNG_URL": SEARX}
    # the operator's list is kept, without the chosen backend
    kernel = make_kernel(
        environ=everything,
        retry={
            "fallbacks": {"web_search": ["web_search_exa", "searxng"]},
            "max_provider_attempts": 1,
        },
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "exa"})
    assert [a.tool for a in res.meta.attempts] == ["web_search", "web_search_searxng"]
    assert exa.call_count == 1 and not brave.called

    # the operator said "no fallback for web_search": an explicit backend does not change that
    kernel = make_kernel(
        environ=everything,
        retry={"tools": {"web_search": {"fallbacks": []}}, "max_provider_attempts": 1},
    )
    async with kernel:
        res = await kernel.call("web_search", {"query": "q", "backend": "exa"})
    assert res.is_error and [a.tool for a in res.meta.attempts] == ["web_search"]
    assert searx.call_count == 1 and not brave.called


@pytest.mark.parametrize(
    ("tool", "body", "field"),
    [
        ("web_search_exa", {"requestId": "r1", "results": "none"}, "results"),
        ("web_search_searxng", {"query": "q", "results": {"0": {}}}, "results"),
    ],
)
async def test_a_results_field_of_the_wrong_type_is_a_broken_answer(
    mock: respx.MockRouter, tool: str, body: dict[str, Any], field: str
) -> None:
    """Before: a healthy empty answer (no fallback, no warning)."""
    mock.post(EXA_URL).mock(return_value=httpx.Response(200, json=body))
    mock.get(SEARX_URL).mock(return_value=httpx.Response(200, json=body))
    kernel = make_kernel(environ={"EXA_API_KEY": E1, "SEARXNG_URL": SEARX})
    async with kernel:
        res = await kernel.call(tool, {"query": "q"})
    assert res.error is not None and res.error.kind == "unavailable", res.content
    assert f"field {field!r}" in res.error.message
