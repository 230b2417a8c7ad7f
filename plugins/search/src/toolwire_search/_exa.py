"""Exa: ``POST /search`` with ``x-api-key``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx

from toolwire import ToolError

from ._backend import (
    Backend,
    BackendPage,
    BackendRequest,
    KeyExhausted,
    as_list,
    field_of,
    http_error,
    unexpected_answer,
)
from ._models import SearchQuery, make_result

__all__ = ["ExaBackend"]

#: 402 tags that concern one key only (the other keys of the account still work).
KEY_SCOPED_TAGS = frozenset({"API_KEY_BUDGET_EXCEEDED"})


def _iso(d: dt.date, end: bool = False) -> str:
    return f"{d.isoformat()}T{'23:59:59.999' if end else '00:00:00.000'}Z"


class ExaBackend(Backend):
    """Exa (https://dashboard.exa.ai).

    ``score`` is Exa's own relevance (absent for some search types: None);
    ``snippet`` is the first highlight, else the summary, else the start of
    the text. Domains and dates are native filters; ``language`` and
    ``safesearch`` do not exist at Exa (a warning says so). Errors are
    ``{"requestId", "error", "tag"}``: 402 tags ``NO_MORE_CREDITS`` and
    ``TEAM_BUDGET_EXCEEDED`` exhaust the account (the pool is suspended),
    ``API_KEY_BUDGET_EXCEEDED`` only the key used (the key is put aside and
    the next key is tried).
    """

    name = "exa"
    title = "Exa"
    default_env = ("EXA_API_KEY",)
    default_base_url = "https://api.exa.ai"
    default_params = {"type": "auto", "contents": {"highlights": {"maxCharacters": 500}}}
    key_hint = "an API key from https://dashboard.exa.ai"
    #: ``contents = {text = true}`` returns each page's full text: answers of megabytes
    #: (11 MB for 10 hits seen), so more room than the default's 4 MiB
    default_max_answer_bytes = 16 * 1024 * 1024

    def build_request(
        self, q: SearchQuery, *, secret: str, base_url: str, now: float
    ) -> BackendRequest:
        """``POST {base}/search`` with a JSON body."""
        body: dict[str, Any] = {"query": q.query, "numResults": q.max_results}
        warnings: list[str] = []
        filter_domains = False
        if q.include_domains:
            body["includeDomains"] = list(q.include_domains)
            if q.exclude_domains:  # Exa takes one of the two: exclusions are filtered here
                filter_domains = True
        elif q.exclude_domains:
            body["excludeDomains"] = list(q.exclude_domains)
        start, end = q.date_bounds(now)
        if start is not None:
            body["startPublishedDate"] = _iso(start)
        if end is not None:
            body["endPublishedDate"] = _iso(end, end=True)
        if q.language:
            warnings.append("exa: language is not supported and was ignored")
        if q.safesearch:
            warnings.append("exa: safesearch is not supported and was ignored")
        body.update(self.params)
        return BackendRequest(
            "POST",
            f"{base_url}/search",
            json=body,
            headers={"x-api-key": secret, "Accept": "application/json"},
            warnings=warnings,
            filter_domains=filter_domains,
        )

    def parse(self, data: Any, q: SearchQuery) -> BackendPage:
        """``results`` as SearchResults; ``requestId``, ``costDollars``... as metadata."""
        if not isinstance(data, dict):
            raise unexpected_answer("exa", data)
        raw = field_of("exa", data, "results", list)
        results = []
        for r in raw:
            if not isinstance(r, dict) or not isinstance(r.get("url"), str):
                continue
            highlights = [h for h in as_list(r.get("highlights")) if isinstance(h, str) and h]
            snippet = highlights[0] if highlights else r.get("summary")
            if not isinstance(snippet, str) or not snippet.strip():
                text = r.get("text")
                snippet = text[:2000] if isinstance(text, str) else ""
            results.append(
                make_result(
                    title=r.get("title"),
                    url=r["url"],
                    snippet=snippet,
                    published_date=r.get("publishedDate"),
                    author=r.get("author"),
                    score=r.get("score"),
                    highlights=highlights,
                    engine=self.name,
                    native=r,
                    max_snippet=500,
                )
            )
        meta = {k: v for k, v in data.items() if k != "results"}
        return BackendPage(results, [], meta)

    def error_for(self, response: httpx.Response, alias: str | None) -> ToolError:
        """The tag (``NO_MORE_CREDITS``, ``API_KEY_BUDGET_EXCEEDED``...) and the
        message go to the error; a key-scoped budget raises ``KeyExhausted``."""
        err = http_error(self.name, response, alias=alias)
        body = err.details.get("body")
        if not isinstance(body, dict):
            return err
        tag, message = body.get("tag"), body.get("error")
        summary = " ".join(str(x) for x in (tag, message) if x)
        extra = {"tag": tag, "request_id": body.get("requestId")}
        # untrusted JSON: a tag of another type (a list...) is no known tag, not a TypeError
        scoped = isinstance(tag, str) and tag in KEY_SCOPED_TAGS
        cls = KeyExhausted if response.status_code == 402 and scoped else ToolError
        return http_error(
            self.name,
            response,
            alias=alias,
            summary=summary,
            kind="quota" if cls is KeyExhausted else "tool_error",
            details=extra,
            cls=cls,
        )
