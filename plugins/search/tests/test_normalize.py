"""Normalization of the three success payloads, and the adapters' requests (no kernel)."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import httpx
import pytest
from toolwire_search_testkit import FIXTURES, SHARED_FIXTURES, headers_of, load

from toolwire import ToolError
from toolwire_search import (
    BackendConfig,
    BraveBackend,
    ExaBackend,
    KeyExhausted,
    SearchQuery,
    SearxngBackend,
    SearxngConfig,
    strip_html,
)

CORE = ("title", "url", "snippet", "published_date", "author", "score", "highlights", "engine")
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC).timestamp()


def q(**kw: Any) -> SearchQuery:
    return SearchQuery.model_validate({"query": "solid state battery", **kw})


def core(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in CORE} for r in results]


@pytest.mark.parametrize(
    ("backend", "fixture"),
    [
        (BraveBackend(BackendConfig()), "brave_web_search_200.json"),
        (ExaBackend(BackendConfig()), "exa_search_200.json"),
        (SearxngBackend(SearxngConfig()), "searxng_search_200.json"),
    ],
    ids=["brave", "exa", "searxng"],
)
def test_success_payloads_map_to_search_results(backend: Any, fixture: str) -> None:
    raw = load(fixture)
    page = backend.parse(copy.deepcopy(raw), q())
    expected = load("expected_normalized.json")[fixture]
    assert core(page.results) == core(expected)
    natives = raw["web"]["results"] if backend.name == "brave" else raw["results"]
    for result, native in zip(page.results, natives, strict=True):
        # every native field is kept, untouched, under provider_metadata.<provider>
        assert result["provider_metadata"] == {backend.name: native}
    # the response-level fields are kept too, without the results themselves
    if backend.name == "brave":
        assert page.metadata["query"] == raw["query"]
        assert "results" not in page.metadata["web"] and page.metadata["mixed"] == raw["mixed"]
    else:
        assert "results" not in page.metadata
        assert set(page.metadata) == set(raw) - {"results"}


def test_brave_html_decorations_are_stripped_but_native_fields_are_not() -> None:
    page = BraveBackend(BackendConfig()).parse(load("brave_web_search_200.json"), q())
    for r in page.results:
        for text in [r["title"], r["snippet"], *r["highlights"]]:
            assert "<" not in text and "&#" not in text
    assert "<strong>" in page.results[0]["provider_metadata"]["brave"]["title"]


def test_scores_stay_provider_native() -> None:
    exa = ExaBackend(BackendConfig()).parse(load("exa_search_200.json"), q())
    searx = SearxngBackend(SearxngConfig()).parse(load("searxng_search_200.json"), q())
    brave = BraveBackend(BackendConfig()).parse(load("brave_web_search_200.json"), q())
    assert [r["score"] for r in exa.results] == [0.4123, 0.3877, None]
    assert [r["score"] for r in searx.results] == [3.0, 2.67, 0.33]  # not rescaled to 0..1
    assert {r["score"] for r in brave.results} == {None}


def test_searxng_legacy_payload_and_partial_engine_failures() -> None:
    b = SearxngBackend(SearxngConfig())
    legacy = b.parse(load("searxng_search_legacy_with_number_of_results.json"), q())
    assert [r["title"] for r in legacy.results] == ["Solid-state battery - Wikipedia"]
    assert legacy.metadata["number_of_results"] == 0 and legacy.failure is None
    partial = b.parse(load("searxng_search_200.json"), q())
    assert partial.failure is None  # results came back: a success with warnings
    assert partial.warnings == [
        "searxng: engine google did not answer (Suspended: too many requests)",
        "searxng: engine qwant did not answer (timeout)",
    ]


def test_searxng_all_engines_failed_is_a_failure_not_an_empty_success() -> None:
    page = SearxngBackend(SearxngConfig()).parse(
        load("searxng_search_all_engines_failed.json"), q()
    )
    assert page.results == []
    assert page.failure is not None
    for engine in ("brave", "duckduckgo", "google", "startpage"):
        assert engine in page.failure
    assert "CAPTCHA" in page.failure


def test_exa_snippet_falls_back_to_summary_then_text() -> None:
    data = {
        "results": [
            {"url": "https://a.test", "title": "A", "summary": "the summary", "text": "x" * 900},
            {"url": "https://b.test", "title": "B", "text": "y" * 900},
            {"url": "https://c.test", "title": "C"},
            {"title": "no url: dropped"},
        ]
    }
    page = ExaBackend(BackendConfig()).parse(data, q())
    assert [r["snippet"] for r in page.results] == ["the summary", "y" * 499 + "…", ""]


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("a <strong>bold</strong> claim", "a bold claim"),
        ('<span class="highlight">x</span>&amp;y', "x&y"),
        ("it&#39;s  <b>fine</b>\n ok", "it's fine ok"),
        ("1 < 2 and 3 > 2", "1 < 2 and 3 > 2"),
        ("<br/>line", "line"),
        (None, ""),
    ],
)
def test_strip_html(text: Any, plain: str) -> None:
    assert strip_html(text) == plain


# ------------------------------------------------------------------ requests
def test_brave_request_sends_the_key_in_a_header_and_maps_options() -> None:
    req = BraveBackend(BackendConfig()).build_request(
        q(
            max_results=7,
            freshness="week",
            safesearch="strict",
            language="pt_BR",
            exclude_domains=["spam.test"],
        ),
        secret="k-123456",
        base_url="https://api.search.brave.com/res/v1",
        now=NOW,
    )
    assert req.method == "GET" and req.url == "https://api.search.brave.com/res/v1/web/search"
    assert req.headers["X-Subscription-Token"] == "k-123456"
    assert "k-123456" not in str(req.params)
    assert req.params == {
        "q": "solid state battery -site:spam.test",
        "count": 7,
        "freshness": "pw",
        "safesearch": "strict",
        "search_lang": "pt-br",
    }
    assert req.filter_domains


def test_brave_date_range_and_operator_params() -> None:
    b = BraveBackend(BackendConfig(params={"country": "de", "extra_snippets": True}))
    req = b.build_request(
        q(start_date="2026-01-01", end_date="2026-02-01"), secret="s" * 8, base_url="x", now=NOW
    )
    assert req.params["freshness"] == "2026-01-01to2026-02-01"
    assert req.params["country"] == "de" and req.params["extra_snippets"] is True


def test_exa_request_body() -> None:
    req = ExaBackend(BackendConfig()).build_request(
        q(
            max_results=3,
            freshness="month",
            include_domains=["https://Nature.com/x", "arxiv.org"],
            language="en",
        ),
        secret="exa-k-123456",
        base_url="https://api.exa.ai",
        now=NOW,
    )
    assert (req.method, req.url) == ("POST", "https://api.exa.ai/search")
    assert req.headers["x-api-key"] == "exa-k-123456"
    assert req.json == {
        "query": "solid state battery",
        "numResults": 3,
        "includeDomains": ["nature.com", "arxiv.org"],
        "startPublishedDate": "2026-10-29T00:00:00.000Z",
        "type": "auto",
        "contents": {"highlights": {"maxCharacters": 500}},
    }
    assert req.warnings == ["exa: language is not supported and was ignored"]
    assert not req.filter_domains


def test_exa_include_and_exclude_domains_filter_the_exclusions_locally() -> None:
    req = ExaBackend(BackendConfig()).build_request(
        q(include_domains=["a.test"], exclude_domains=["b.a.test"], end_date="2026-03-01"),
        secret="s" * 8,
        base_url="u",
        now=NOW,
    )
    assert req.json["includeDomains"] == ["a.test"] and "excludeDomains" not in req.json
    assert req.json["endPublishedDate"] == "2026-03-01T23:59:59.999Z"
    assert req.filter_domains


def test_searxng_request_uses_the_instance_url_and_json_format() -> None:
    b = SearxngBackend(SearxngConfig(params={"engines": "duckduckgo"}))
    req = b.build_request(
        q(safesearch="moderate", freshness="week", language="en-US"),
        secret="https://searx.example.org/",
        base_url=b.base_url("https://searx.example.org/"),
        now=NOW,
    )
    assert req.url == "https://searx.example.org/search"
    assert req.params == {
        "q": "solid state battery",
        "format": "json",
        "pageno": 1,
        "time_range": "week",
        "language": "en-US",
        "safesearch": 1,
        "engines": "duckduckgo",
    }
    # SearXNG has a week range (webadapter.parse_time_range: day, week, month, year); before,
    # a month was searched with a warning that SearXNG had none, and undated results of
    # the last month came back as "the last week"
    assert not req.filter_dates and req.warnings == []


def test_searxng_date_range_uses_the_narrowest_time_range() -> None:
    b = SearxngBackend(SearxngConfig())
    today = dt.datetime.fromtimestamp(NOW, dt.UTC).date()
    ranges = {}
    for days in (1, 5, 20, 200, 900):
        req = b.build_request(
            q(start_date=today - dt.timedelta(days=days)),
            secret="https://searx.example.org",
            base_url="https://searx.example.org",
            now=NOW,
        )
        ranges[days] = req.params.get("time_range")
        assert req.filter_dates
    assert ranges == {1: "day", 5: "week", 20: "month", 200: "year", 900: None}


# ------------------------------------------------------------------- errors
def _resp(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    if isinstance(body, str):
        return httpx.Response(status, text=body, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


def test_brave_error_keeps_status_headers_body_and_names_the_code() -> None:
    err = BraveBackend(BackendConfig()).error_for(
        _resp(429, load("brave_429_rate_limited.json"), headers_of("brave_429_rate_limited.json")),
        "brave-1",
    )
    assert err.kind == "tool_error"  # classification is the ratelimit plugin's job
    assert str(err) == "brave (brave-1): HTTP 429 RATE_LIMITED Request rate limit exceeded for plan"
    assert err.details["status"] == 429 and err.details["code"] == "RATE_LIMITED"
    assert err.details["headers"]["x-ratelimit-remaining"] == "0, 1985"
    assert err.details["body"]["error"]["meta"]["quota_current"] == 15


def test_exa_key_scoped_budget_is_key_exhausted() -> None:
    b = ExaBackend(BackendConfig())
    key = b.error_for(_resp(402, load("exa_402_api_key_budget_exceeded.json")), "exa-1")
    team = b.error_for(_resp(402, load("exa_402_team_budget_exceeded.json")), "exa-1")
    credits = b.error_for(_resp(402, load("exa_402_no_more_credits.json")), "exa-1")
    assert isinstance(key, KeyExhausted) and key.kind == "quota"
    assert key.details["tag"] == "API_KEY_BUDGET_EXCEEDED"
    for account_wide in (team, credits):
        assert type(account_wide) is ToolError and account_wide.kind == "tool_error"
    assert "NO_MORE_CREDITS" in str(credits)


def test_searxng_403_is_a_config_error_that_may_fall_over() -> None:
    err = SearxngBackend(SearxngConfig()).error_for(
        _resp(403, load("searxng_403_json_disabled.txt"), {"content-type": "text/html"}), "s-1"
    )
    assert err.kind == "config_error" and err.details["failover"] is True
    assert "formats: [html, json]" in str(err)


def test_the_fixture_copies_match_the_shared_fixtures() -> None:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"{SHARED_FIXTURES} is not there")
    for f in SHARED_FIXTURES.iterdir():
        assert (FIXTURES / f.name).read_bytes() == f.read_bytes(), f.name
