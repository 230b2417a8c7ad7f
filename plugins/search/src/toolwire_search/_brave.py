"""Brave Search API: ``GET /res/v1/web/search`` with ``X-Subscription-Token``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx

from toolwire import ToolError
from toolwire_ratelimit import reset_hints

from ._backend import (
    Backend,
    BackendPage,
    BackendRequest,
    Exhaustion,
    as_dict,
    as_list,
    field_of,
    http_error,
    unexpected_answer,
)
from ._models import SearchQuery, make_result

__all__ = ["BraveBackend"]

_FRESHNESS = {"day": "pd", "week": "pw", "month": "pm", "year": "py"}


class BraveBackend(Backend):
    """Brave Search (https://api-dashboard.search.brave.com).

    Results have no score (``score`` is None); ``page_age`` becomes
    ``published_date`` (the human ``age`` stays in the metadata);
    ``extra_snippets`` become ``highlights``. Rate-limit headers: a 429 is a
    per-second limit or the monthly quota (``quota_current >= quota_limit``,
    or the monthly window of ``X-RateLimit-Remaining`` at 0) — the ratelimit
    plugin tells them apart from the status, headers and body this backend
    passes on; a *successful* answer whose monthly window reaches 0 suspends
    the key's pool at once (``exhaustion``).
    """

    name = "brave"
    title = "Brave Search"
    default_env = ("BRAVE_API_KEY",)
    default_base_url = "https://api.search.brave.com/res/v1"
    key_hint = "a subscription token from https://api-dashboard.search.brave.com"

    def build_request(
        self, q: SearchQuery, *, secret: str, base_url: str, now: float
    ) -> BackendRequest:
        """``GET {base}/web/search?q=...&count=...``."""
        query = q.query
        warnings: list[str] = []
        if len(q.include_domains) == 1:
            query += f" site:{q.include_domains[0]}"
        for d in q.exclude_domains:
            query += f" -site:{d}"
        params: dict[str, Any] = {"q": query[:400], "count": q.max_results}
        if q.freshness:
            params["freshness"] = _FRESHNESS[q.freshness]
        elif q.has_date_range:
            today = dt.datetime.fromtimestamp(now, dt.UTC).date()
            start = q.start_date or dt.date(1990, 1, 1)
            params["freshness"] = f"{start.isoformat()}to{(q.end_date or today).isoformat()}"
        if q.language:
            params["search_lang"] = q.language.lower().replace("_", "-")
        if q.safesearch:
            params["safesearch"] = q.safesearch
        if len(q.include_domains) > 1:
            warnings.append(
                "brave: several include_domains are applied by filtering the results; "
                "fewer results may come back"
            )
        params.update(self.params)
        return BackendRequest(
            "GET",
            f"{base_url}/web/search",
            params=params,
            headers={"X-Subscription-Token": secret, "Accept": "application/json"},
            warnings=warnings,
            filter_domains=bool(q.include_domains or q.exclude_domains),
        )

    def parse(self, data: Any, q: SearchQuery) -> BackendPage:
        """``web.results`` as SearchResults; the rest of the answer as metadata."""
        if not isinstance(data, dict):
            raise unexpected_answer("brave", data)
        web = field_of("brave", data, "web", dict)
        raw = field_of("brave", web, "results", list)
        results = []
        for r in raw:
            if not isinstance(r, dict) or not isinstance(r.get("url"), str):
                continue
            results.append(
                make_result(
                    title=r.get("title"),
                    url=r["url"],
                    snippet=r.get("description"),
                    published_date=r.get("page_age"),
                    author=_author(r),
                    highlights=as_list(r.get("extra_snippets")),
                    engine=self.name,
                    native=r,
                )
            )
        meta = {k: v for k, v in data.items() if k != "web"}
        meta["web"] = {k: v for k, v in web.items() if k != "results"}
        warnings = []
        query = as_dict(data.get("query"))
        altered = query.get("altered")
        if isinstance(altered, str) and altered and altered != query.get("original"):
            warnings.append(f"brave searched for {altered!r} instead (spellcheck)")
        return BackendPage(results, warnings, meta)

    def error_for(self, response: httpx.Response, alias: str | None) -> ToolError:
        """``ErrorResponse`` bodies: the code (``RATE_LIMITED``,
        ``SUBSCRIPTION_TOKEN_INVALID``...) and detail go to the message."""
        err = http_error(self.name, response, alias=alias)
        body = err.details.get("body")
        e = body.get("error") if isinstance(body, dict) else None
        if isinstance(e, dict):
            code, detail = e.get("code"), e.get("detail")
            summary = " ".join(str(x) for x in (code, detail) if x)
            err = http_error(
                self.name, response, alias=alias, summary=f"{summary}", details={"code": code}
            )
        return err

    def exhaustion(self, response: httpx.Response, now: float) -> Exhaustion | None:
        """A monthly window (``X-RateLimit-Policy ...;w=2592000``) with 0 remaining."""
        headers = {k.lower(): v for k, v in response.headers.items()}
        hints = reset_hints(headers, now)
        if not hints.quota_exhausted:
            return None
        return Exhaustion(
            hints.quota_reset_s,
            "monthly quota used up (X-RateLimit-Remaining of the monthly window is 0)",
        )


def _author(r: dict[str, Any]) -> str | None:
    article = r.get("article")
    if isinstance(article, dict):
        authors = article.get("author")
        if isinstance(authors, list) and authors and isinstance(authors[0], dict):
            name = authors[0].get("name")
            return name if isinstance(name, str) and name else None
    return None
