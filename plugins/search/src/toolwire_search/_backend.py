"""What a search backend is: build a request, decode the answer, explain a failure.

A backend is a small class (see the README's "Adding a backend"). The plugin
does everything around it: leasing a key from the ratelimit plugin's KeyPool,
the shared HTTP client, timeouts, domain filtering, warnings and the output.
A backend never retries, sleeps or picks keys.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from toolwire import ErrorKind, ToolError

from ._text import strip_html

if TYPE_CHECKING:
    from ._config import _BackendBase
    from ._models import SearchQuery

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "MAX_ERROR_BODY",
    "Backend",
    "BackendPage",
    "BackendRequest",
    "Exhaustion",
    "KeyExhausted",
    "as_dict",
    "as_list",
    "http_error",
    "relevant_headers",
]

#: At most this much of an error body is read and kept (the ratelimit plugin reads 8 KiB).
MAX_ERROR_BODY = 8192
#: The largest answer taken from a backend by default, decompressed (``max_answer_bytes``):
#: a page of results is some 10-200 KiB, and 4 MiB leaves room for native fields.
DEFAULT_MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: A decoded answer nested deeper is a broken one (real answers nest some 6 levels).
MAX_ANSWER_DEPTH = 64


@dataclass(slots=True)
class BackendRequest:
    """One HTTP request to a backend.

    ``filter_domains``: the backend cannot restrict domains natively; the
    plugin drops results outside ``include_domains`` / inside
    ``exclude_domains`` itself; ``filter_dates``: likewise for results whose
    publication date is known and outside the requested range. ``warnings``
    end up in the output.
    """

    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    filter_domains: bool = False
    filter_dates: bool = False


@dataclass(slots=True)
class BackendPage:
    """A decoded answer: normalized results (``make_result`` dicts), warnings, and
    the response-level native fields (``metadata``).

    ``failure``: the answer is formally a success but the backend could not
    really search (every SearXNG engine failed); with no results it counts as
    a backend failure for the fallback chain.
    """

    results: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None


@dataclass(slots=True, frozen=True)
class Exhaustion:
    """A successful answer says the key's long-term quota is now used up."""

    retry_after_s: float | None
    reason: str


class KeyExhausted(ToolError):
    """Only the key used is exhausted (e.g. Exa's ``API_KEY_BUDGET_EXCEEDED``), not the account.

    The plugin cools that key (for the pool's ``suspend_seconds``, at most its
    ``max_cooldown_seconds``: a cooldown is capped by it) instead of
    suspending the whole provider, then reports the failure as ``quota``.
    """


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a dict, else ``{}`` (for untrusted JSON)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` if it is a list, else ``[]`` (for untrusted JSON)."""
    return value if isinstance(value, list) else []


def relevant_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Rate-limit, retry and request-id headers (never cookies or auth)."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        lk = k.lower()
        if lk.startswith(("x-ratelimit", "ratelimit", "retry-after", "x-rate-limit")) or lk in (
            "content-type",
            "x-request-id",
        ):
            out[lk] = v
    return out


def deeper_than(data: Any, limit: int) -> bool:
    """Whether the JSON value ``data`` nests lists and objects more than ``limit`` deep
    (iterative: the value may be nested deeper than the stack)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _body(response: httpx.Response) -> Any:
    raw = response.content[:MAX_ERROR_BODY]
    text = raw.decode(response.encoding or "utf-8", "replace")
    if len(response.content) <= MAX_ERROR_BODY and text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the stack
            return text
        # a body nested too deep is kept as the text it is: it is evidence, not structure
        return text if deeper_than(data, MAX_ANSWER_DEPTH) else data
    return text


def field_of(backend: str, data: dict[str, Any], name: str, kind: type) -> Any:
    """``data[name]`` when it is a ``kind``; absent or null: an empty one; anything else
    is a broken answer (``unexpected_answer``), not a healthy "no results"."""
    value = data.get(name)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise unexpected_answer(backend, value, where=name)
    return value


def unexpected_answer(backend: str, data: Any, *, where: str | None = None) -> ToolError:
    """The error for a 2xx JSON answer of the wrong shape: the provider's fault (a broken
    deployment, an API change), so ``unavailable``: retried, then the next backend."""
    what = f"field {where!r} of" if where else "of"
    expected = "the expected JSON type" if where else "a JSON object"
    return ToolError(
        f"{backend}: unexpected answer: {what} type {type(data).__name__} (expected {expected})",
        kind=ErrorKind.UNAVAILABLE,
        details={"backend": backend},
    )


def http_error(
    backend: str,
    response: httpx.Response,
    *,
    alias: str | None,
    summary: str | None = None,
    kind: str = ErrorKind.TOOL_ERROR,
    details: Mapping[str, Any] | None = None,
    cls: type[ToolError] = ToolError,
) -> ToolError:
    """A ``ToolError`` for a failed HTTP answer, with everything a classifier reads.

    ``status``, the rate-limit ``headers`` and the ``body`` (parsed JSON when it
    is JSON) go to ``details``: the ratelimit plugin classifies from them
    (429 per-second vs monthly quota, 402 tags, invalid keys...). The message
    names the backend and the key *alias*, never the key.
    """
    body = _body(response)
    if summary is None:
        summary = strip_html(body if isinstance(body, str) else "")[:200]
    who = f"{backend} ({alias})" if alias else backend
    msg = f"{who}: HTTP {response.status_code}" + (f" {summary}" if summary else "")
    return cls(
        msg,
        kind=kind,
        status=response.status_code,
        details={
            "backend": backend,
            "headers": relevant_headers(response.headers),
            "body": body,
            **(details or {}),
        },
    )


class Backend(ABC):
    """A web-search provider. Subclass it to add one (see the README).

    Class attributes: ``name`` (the KeyPool provider, the tool suffix and
    ``served_by``), ``title``, ``default_env`` (environment variables holding
    keys), ``default_base_url`` (None when the "key" is the base URL, as for
    SearXNG), ``key_is_base_url``, ``default_params`` (native parameters sent
    unless the operator overrides them in ``params``), ``key_hint`` (how
    to get a key, for the ``config_error`` message) and
    ``default_max_answer_bytes`` (the largest answer taken unless the
    operator sets ``max_answer_bytes``).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    default_env: ClassVar[tuple[str, ...]] = ()
    default_base_url: ClassVar[str | None] = None
    key_is_base_url: ClassVar[bool] = False
    default_params: ClassVar[Mapping[str, Any]] = {}
    key_hint: ClassVar[str] = "an API key"
    default_max_answer_bytes: ClassVar[int] = DEFAULT_MAX_ANSWER_BYTES

    def __init__(self, config: _BackendBase) -> None:
        self.config = config
        self.params: dict[str, Any] = {**self.default_params, **config.params}

    # -------------------------------------------------------------- setup
    @property
    def max_answer_bytes(self) -> int:
        """The largest answer taken, decompressed: ``max_answer_bytes``, else the default."""
        return self.config.max_answer_bytes or self.default_max_answer_bytes

    @property
    def env(self) -> list[str]:
        """Environment variables read when no key is configured."""
        return list(self.config.env) if self.config.env is not None else list(self.default_env)

    #: The config table of this backend, as messages name it (the plugin sets it:
    #: ``plugins.search.<name>`` for a built-in one, else ``plugins.search.backends.<name>``).
    config_table: str = ""

    @property
    def table(self) -> str:
        """``[...]`` of this backend's config table, for messages."""
        return f"[{self.config_table or f'plugins.search.{self.name}'}]"

    def base_url(self, secret: str) -> str:
        """The base URL for a request made with ``secret``."""
        if self.key_is_base_url:
            return secret.rstrip("/")
        url = getattr(self.config, "base_url", None) or self.default_base_url
        if not url:
            raise ToolError(
                f"{self.name}: no base_url configured; set {self.table} base_url",
                kind=ErrorKind.CONFIG_ERROR,
            )
        return str(url).rstrip("/")

    def missing_key_message(self) -> str:
        """What to do when the backend has no key (the ``config_error`` message)."""
        env = self.env
        what = "instance URL" if self.key_is_base_url else "API key"
        how = f"set the environment variable {' or '.join(env)}" if env else "configure one"
        field = "urls" if self.key_is_base_url else "api_keys"
        return (
            f"{self.title} has no {what}; {how} ({self.key_hint}; several: comma-separated), "
            f'or {self.table} {field} = [{{"$secretRef" = "{env[0] if env else "NAME"}"}}]'
        )

    # ----------------------------------------------------------- requests
    @abstractmethod
    def build_request(
        self, q: SearchQuery, *, secret: str, base_url: str, now: float
    ) -> BackendRequest:
        """The request for ``q``, sending ``secret`` (in a header, never in the URL,
        unless the secret *is* the base URL). ``now`` is the kernel's wall clock."""

    @abstractmethod
    def parse(self, data: Any, q: SearchQuery) -> BackendPage:
        """Normalize a decoded success answer (``make_result`` for each result)."""

    def decode(self, response: httpx.Response, alias: str | None) -> Any:
        """The decoded body of a 2xx answer (JSON by default). ``response`` holds the
        body, read and decompressed by the plugin (at most ``max_answer_bytes``).

        A success that is not JSON is the provider's fault (a maintenance page, a
        broken deployment), not the query's: ``unavailable``, which is retried and
        falls over to the next backend like a 5xx.
        """
        try:
            return response.json()
        except ValueError:
            raise http_error(
                self.name,
                response,
                alias=alias,
                summary="(the answer is not JSON)",
                kind=ErrorKind.UNAVAILABLE,
            ) from None

    def error_for(self, response: httpx.Response, alias: str | None) -> ToolError:
        """The error for a 4xx/5xx answer. The default hands status, headers and body
        to the classifier; override it to add the provider's error code to the message.
        ``response`` holds the start of the body only: ``MAX_ERROR_BODY`` bytes and one
        more (a longer one is cut, the rest never read)."""
        return http_error(self.name, response, alias=alias)

    def exhaustion(self, response: httpx.Response, now: float) -> Exhaustion | None:
        """Whether a *successful* answer says the key's long-term quota is used up."""
        return None
