"""The one input schema and the one output shape every search tool shares."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from ._text import domain_matches, strip_html

__all__ = [
    "Freshness",
    "SafeSearch",
    "SearchOutput",
    "SearchQuery",
    "SearchResult",
    "make_result",
    "output_schema",
]

Freshness = Literal["day", "week", "month", "year"]
SafeSearch = Literal["off", "moderate", "strict"]

_HOST = re.compile(r"^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9-]{1,63}$")


def _domain(value: str) -> str:
    d = value.strip().lower()
    if "://" in d:
        d = d.split("://", 1)[1]
    d = d.split("/", 1)[0].rstrip(".")
    if not _HOST.match(d):
        raise ValueError(f"{value!r} is not a domain name (e.g. 'example.com')")
    return d


Domain = Annotated[str, AfterValidator(_domain)]


class SearchQuery(BaseModel):
    """The input of ``web_search`` and of every ``web_search_<backend>``.

    Options a backend cannot honour natively are emulated (domains filtered
    after the fact) or ignored with an entry in the result's ``warnings``.
    """

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    query: str = Field(
        min_length=1, max_length=400, description="What to search for (at most 400 characters)."
    )
    max_results: int = Field(10, ge=1, le=20, description="How many results to return (1-20).")
    freshness: Freshness | None = Field(
        None, description="Only results published in the last day, week, month or year."
    )
    start_date: dt.date | None = Field(
        None, description="Only results published on or after this date (YYYY-MM-DD)."
    )
    end_date: dt.date | None = Field(
        None, description="Only results published on or before this date (YYYY-MM-DD)."
    )
    language: str | None = Field(
        None,
        pattern=r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?$",
        description="Preferred result language, e.g. 'en' or 'pt-BR'.",
    )
    safesearch: SafeSearch | None = Field(
        None,
        description="Adult-content filter: off, moderate or strict (provider default if unset).",
    )
    include_domains: list[Domain] = Field(
        default_factory=list,
        max_length=20,
        description="Only results from these domains (and their subdomains).",
    )
    exclude_domains: list[Domain] = Field(
        default_factory=list, max_length=20, description="No results from these domains."
    )
    backend: str = Field(
        "auto",
        description="'auto' walks the configured backends in order; a backend name starts "
        "with that backend (web_search only; the web_search_<backend> tools ignore it).",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("backends")
        if known is not None and v != "auto" and v not in known:
            raise PydanticCustomError(
                "unknown_backend",
                "unknown backend '{backend}'; use 'auto' or one of {known}",
                {"backend": v, "known": str(sorted(known))},
            )
        return v

    # Field validators, not a model validator, so the error names the field
    # (a model validator's error has none); PydanticCustomError, so the message
    # is not prefixed with pydantic's "Value error, ".
    @field_validator("start_date")
    @classmethod
    def _start_not_with_freshness(cls, v: dt.date | None, info: ValidationInfo) -> dt.date | None:
        if v is not None and info.data.get("freshness") is not None:
            raise PydanticCustomError(
                "date_conflict", "give either freshness or start_date/end_date, not both"
            )
        return v

    @field_validator("end_date")
    @classmethod
    def _end_after_start(cls, v: dt.date | None, info: ValidationInfo) -> dt.date | None:
        if v is None or "start_date" not in info.data:  # start_date invalid: reported there
            return v
        start = info.data["start_date"]
        if start is None and info.data.get("freshness") is not None:
            raise PydanticCustomError(
                "date_conflict", "give either freshness or start_date/end_date, not both"
            )
        if start is not None and start > v:
            raise PydanticCustomError(
                "date_order", "end_date is before start_date ({start})", {"start": str(start)}
            )
        return v

    @property
    def has_date_range(self) -> bool:
        """Whether ``start_date`` or ``end_date`` is set."""
        return self.start_date is not None or self.end_date is not None

    def date_bounds(self, now: float) -> tuple[dt.date | None, dt.date | None]:
        """(first day, last day) the results may be from, for freshness or the date range."""
        if self.freshness is not None:
            days = {"day": 1, "week": 7, "month": 31, "year": 366}[self.freshness]
            today = dt.datetime.fromtimestamp(now, dt.UTC).date()
            return today - dt.timedelta(days=days), None
        return self.start_date, self.end_date

    def wants(self, url: str) -> bool:
        """Whether ``url`` passes ``include_domains`` / ``exclude_domains``."""
        if self.include_domains and not any(domain_matches(url, d) for d in self.include_domains):
            return False
        return not any(domain_matches(url, d) for d in self.exclude_domains)


def validate_query(args: Mapping[str, Any], backends: Iterable[str]) -> dict[str, Any]:
    """Validate tool args into a plain JSON dict (dates as ``YYYY-MM-DD``)."""
    q = SearchQuery.model_validate(args, context={"backends": frozenset(backends)})
    return q.model_dump(mode="json")


class SearchResult(BaseModel):
    """One normalized result.

    ``score`` is the provider's own (Exa's relevance, SearXNG's merged score;
    Brave has none): scores of different providers are not comparable and are
    never rescaled. ``provider_metadata.<provider>`` holds every native field
    of the result as the provider sent it.
    """

    title: str
    url: str
    snippet: str
    published_date: str | None = None
    author: str | None = None
    score: float | None = None
    highlights: list[str] = Field(default_factory=list)
    engine: str
    provider_metadata: dict[str, Any] = Field(default_factory=dict)


class SearchOutput(BaseModel):
    """What every search tool returns.

    ``served_by``: the backend (or ``collection:<name>``) that produced the
    results. ``warnings``: options that were ignored or emulated, earlier
    backends that failed in this call, partial failures. ``provider_metadata``:
    the response-level native fields (request ids, suggestions, engine
    failures...), under the provider's name.
    """

    results: list[SearchResult]
    served_by: str
    warnings: list[str] = Field(default_factory=list)
    provider_metadata: dict[str, Any] = Field(default_factory=dict)


def make_result(
    *,
    title: object,
    url: str,
    snippet: object,
    engine: str,
    native: Mapping[str, Any],
    published_date: object = None,
    author: object = None,
    score: object = None,
    highlights: Iterable[object] | None = None,
    max_snippet: int = 1000,
) -> dict[str, Any]:
    """A ``SearchResult`` as a plain dict, from a provider's raw values.

    ``title``, ``snippet``, ``author`` and ``highlights`` are stripped of HTML
    decorations and entities (non-strings become ``""``/None); ``snippet`` is
    cut at ``max_snippet`` characters; ``published_date`` is kept as the
    provider wrote it (None unless a non-empty string); ``score`` stays
    provider-native (None unless a finite number). ``native`` — the provider's whole
    result — goes to ``provider_metadata[engine]``, untouched.
    """
    text = strip_html(snippet)
    if len(text) > max_snippet:
        text = text[: max_snippet - 1] + "…"
    num = _finite(score)
    return {
        "title": strip_html(title),
        "url": url,
        "snippet": text,
        "published_date": published_date
        if isinstance(published_date, str) and published_date
        else None,
        "author": strip_html(author) or None,
        "score": num,
        "highlights": [h for h in (strip_html(x) for x in highlights or ()) if h],
        "engine": engine,
        "provider_metadata": {engine: dict(native)},
    }


def _finite(value: object) -> float | None:
    """``value`` as a finite float; None for anything else (a bool, NaN, Infinity, or an
    integer too large for a float: JSON has no such numbers, the output schema neither)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        num = float(value)
    except OverflowError:
        return None
    return num if math.isfinite(num) else None


def cut_long_text(obj: Any, limit: int, *, _depth: int = 0) -> tuple[Any, int]:
    """``obj`` with every string longer than ``limit`` cut (ending in "…"); and how many.

    URLs (the values of keys named ``url``) are never cut: a cut URL is a
    wrong one. Nesting beyond 50 levels is left as it is.
    """
    if isinstance(obj, str):
        return (obj[: limit - 1] + "…", 1) if len(obj) > limit else (obj, 0)
    if _depth > 50:
        return obj, 0
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        cut = 0
        for k, v in obj.items():
            if k == "url" and isinstance(v, str):
                out[k] = v
                continue
            out[k], n = cut_long_text(v, limit, _depth=_depth + 1)
            cut += n
        return out, cut
    if isinstance(obj, list):
        items: list[Any] = []
        cut = 0
        for v in obj:
            item, n = cut_long_text(v, limit, _depth=_depth + 1)
            items.append(item)
            cut += n
        return items, cut
    return obj, 0


def output_schema() -> dict[str, Any]:
    """The JSON schema of ``SearchOutput`` (the tools' ``output_schema``)."""
    schema = SearchOutput.model_json_schema(mode="serialization")
    schema.pop("title", None)
    return schema


def input_schema(backends: Iterable[str]) -> dict[str, Any]:
    """The JSON schema of ``SearchQuery`` with ``backend`` limited to the known backends."""
    schema = SearchQuery.model_json_schema()
    schema.pop("title", None)
    props = schema.get("properties", {})
    for prop in props.values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    if "backend" in props:
        props["backend"]["enum"] = ["auto", *backends]
    return schema
