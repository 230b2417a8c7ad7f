"""SearXNG (self-hosted): ``GET {instance}/search?format=json``; the instance URL is the "key"."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any
from urllib.parse import unquote_to_bytes

import httpx

from toolwire import ErrorKind, ToolError

from ._backend import (
    Backend,
    BackendPage,
    BackendRequest,
    field_of,
    http_error,
    unexpected_answer,
)
from ._models import SearchQuery, make_result

__all__ = ["SearxngBackend"]

_SAFESEARCH = {"off": 0, "moderate": 1, "strict": 2}
_JSON_DISABLED = (
    "JSON output is disabled on this instance (SearXNG's default); add json to search.formats "
    "in its settings.yml (formats: [html, json])"
)


def _time_range(q: SearchQuery, now: float) -> tuple[str | None, str | None]:
    """(SearXNG time_range, a warning) for freshness or a date range."""
    if q.freshness is not None:  # day, week, month, year: SearXNG's own time ranges
        return q.freshness, None
    if not q.has_date_range:
        return None, None
    today = dt.datetime.fromtimestamp(now, dt.UTC).date()
    start = q.start_date
    if start is None:
        return None, "searxng: end_date is applied by filtering dated results only"
    age = (today - start).days
    bounds = (("day", 1), ("week", 7), ("month", 31), ("year", 366))
    rng = next((name for name, days in bounds if age <= days), None)
    return rng, (
        "searxng: no exact date range; "
        + (f"searched time_range={rng} and " if rng else "")
        + "filtered results with a known date"
    )


class SearxngBackend(Backend):
    """A SearXNG instance (https://docs.searxng.org) — its base URL is the pool's "key",
    so several instances rotate and cool down like API keys.

    ``score`` is SearXNG's merged score; ``engine`` is ``searxng`` and the
    engines that found a result stay in its metadata (``engines``). An answer
    with no results and ``unresponsive_engines`` is a backend failure (every
    engine failed), not an empty success. JSON output disabled (HTTP 403, the
    default of a fresh instance) is a ``config_error`` that falls over.
    """

    name = "searxng"
    title = "SearXNG"
    default_env = ("SEARXNG_URL",)
    key_is_base_url = True
    key_hint = (
        "the base URL of an instance with JSON output enabled, e.g. https://searx.example.org"
    )

    def build_request(
        self, q: SearchQuery, *, secret: str, base_url: str, now: float
    ) -> BackendRequest:
        """``GET {instance}/search?q=...&format=json``."""
        query = q.query
        if len(q.include_domains) == 1:
            query += f" site:{q.include_domains[0]}"
        params: dict[str, Any] = {"q": query, "format": "json", "pageno": 1}
        warnings: list[str] = []
        rng, note = _time_range(q, now)
        if rng:
            params["time_range"] = rng
        if note:
            warnings.append(note)
        if q.language:
            params["language"] = q.language.replace("_", "-")
        if q.safesearch:
            params["safesearch"] = _SAFESEARCH[q.safesearch]
        if q.include_domains or q.exclude_domains:
            warnings.append("searxng: domains are applied by filtering the results")
        # SearXNG keeps the first value of a repeated parameter (webapp's pre_request makes
        # a plain dict of the query) and reads lists comma-separated (engines=a,b): a list
        # sent as engines=a&engines=b searched engine a alone
        params.update(
            {k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in self.params.items()}
        )
        headers = {"Accept": "application/json"}
        url = httpx.URL(f"{base_url}/search")
        if url.userinfo:  # credentials go in a header, never in logged URLs
            token = base64.b64encode(unquote_to_bytes(url.userinfo)).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
            url = url.copy_with(username=None, password=None)
        return BackendRequest(
            "GET",
            str(url),
            params=params,
            headers=headers,
            warnings=warnings,
            filter_domains=bool(q.include_domains or q.exclude_domains),
            filter_dates=q.has_date_range,
        )

    def decode(self, response: httpx.Response, alias: str | None) -> Any:
        """JSON, or a ``config_error`` when the instance answers HTML (JSON disabled)."""
        try:
            return response.json()
        except ValueError:
            raise http_error(
                self.name,
                response,
                alias=alias,
                summary=f"answered HTML instead of JSON: {_JSON_DISABLED}",
                kind=ErrorKind.CONFIG_ERROR,
                details={"failover": True},
            ) from None

    def parse(self, data: Any, q: SearchQuery) -> BackendPage:
        """``results`` as SearchResults; answers, suggestions, infoboxes and
        ``unresponsive_engines`` as metadata (and the latter as warnings)."""
        if not isinstance(data, dict):
            raise unexpected_answer("searxng", data)
        raw = field_of("searxng", data, "results", list)
        results = []
        for r in raw:
            if not isinstance(r, dict) or not isinstance(r.get("url"), str):
                continue
            results.append(
                make_result(
                    title=r.get("title"),
                    url=r["url"],
                    snippet=r.get("content"),
                    published_date=r.get("publishedDate") or r.get("pubdate"),
                    author=r.get("author"),
                    score=r.get("score"),
                    engine=self.name,
                    native=r,
                )
            )
        meta = {k: v for k, v in data.items() if k != "results"}
        failed = _engines(data.get("unresponsive_engines"))
        warnings = [f"searxng: engine {e} did not answer ({why})" for e, why in failed]
        failure = None
        if failed and not results:
            failure = "every engine failed: " + ", ".join(f"{e} ({why})" for e, why in failed)
        return BackendPage(results, warnings, meta, failure)

    def error_for(self, response: httpx.Response, alias: str | None) -> ToolError:
        """403 is JSON output disabled (``config_error``, falls over); the rest is classified."""
        if response.status_code == 403:
            return http_error(
                self.name,
                response,
                alias=alias,
                summary=f"Forbidden: {_JSON_DISABLED}",
                kind=ErrorKind.CONFIG_ERROR,
                details={"failover": True},
            )
        err = http_error(self.name, response, alias=alias)
        body = err.details.get("body")
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            err = http_error(self.name, response, alias=alias, summary=body["error"])
        return err


def _engines(value: Any) -> list[tuple[str, str]]:
    out = []
    if isinstance(value, list):
        for item in value[:50]:
            if isinstance(item, (list, tuple)) and item:
                out.append((str(item[0]), str(item[1]) if len(item) > 1 else "no reason given"))
            elif isinstance(item, str):
                out.append((item, "no reason given"))
    return out
