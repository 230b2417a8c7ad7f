"""``[plugins.search]``: backends, their keys, the fallback chain and local collections."""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Any

import httpx
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from toolwire_ratelimit import ProviderConfig

__all__ = [
    "BackendConfig",
    "CollectionConfig",
    "KeyEntry",
    "SearchConfig",
    "SearxngConfig",
]

#: Aliases appear in logs, errors and results instead of the keys themselves.
ALIAS_RE = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$"
#: Collection names become tool names: ``search_<name>``.
COLLECTION_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,47}$")
_ENV_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


def url_problem(url: str) -> str | None:
    """Why the base URL ``url`` cannot be requested (``{url}/...``); None if it can.
    Never quotes the URL's credentials."""
    try:
        parsed = httpx.URL(url)
        if not parsed.host:
            return "it has no host"
        if parsed.port is not None and not 0 < parsed.port < 65536:
            return f"port {parsed.port} is out of range"
        httpx.URL(f"{url.rstrip('/')}/search")
    except httpx.InvalidURL as exc:
        why = str(exc)
        userinfo = url.partition("://")[2].partition("/")[0].rpartition("@")[0]
        return "it cannot be parsed" if userinfo and userinfo in why else why
    return None


class KeyEntry(BaseModel):
    """An API key (or a SearXNG instance URL) with an alias and a rotation weight."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    alias: Annotated[str, Field(pattern=ALIAS_RE)]
    secret: SecretStr = Field(validation_alias=AliasChoices("secret", "key", "api_key", "url"))
    weight: int = Field(1, ge=1, le=1000)


def _check_pool(value: dict[str, Any]) -> dict[str, Any]:
    """``pool`` holds provider settings of the ratelimit plugin (no keys, no tools)."""
    bad = sorted(set(value) & {"keys", "api_keys", "api_key", "tools"})
    if bad:
        raise ValueError(f"{bad} cannot be set in pool; give keys with api_keys/urls")
    ProviderConfig.model_validate(value)  # typos fail at load, naming the key
    return value


class _BackendBase(BaseModel):
    """Keys every backend table accepts."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    enabled: bool = Field(True, description="false: no tool, and web_search skips it")
    env: list[Annotated[str, Field(pattern=_ENV_RE)]] | None = Field(
        None,
        description="environment variables read when no key is configured (comma-separated "
        "values give several keys); default per backend",
    )
    timeout_seconds: float | None = Field(
        None, gt=0, le=600, description="HTTP timeout per request (default: the global one)"
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="extra native request parameters, merged over the plugin's defaults",
    )
    max_answer_bytes: int | None = Field(
        None,
        ge=1024,
        description="the largest answer taken from this backend, in bytes, decompressed "
        "(default 4 MiB; Exa 16 MiB); a larger one fails the request (`unavailable`, "
        "`details.answer_too_large`: retried, then the next backend) and is not kept",
    )
    pool: dict[str, Any] = Field(
        default_factory=dict,
        description="ratelimit provider settings for this backend's key pool (cooldown_seconds, "
        "rate, suspend_seconds...), used when [plugins.ratelimit.providers.<name>] is absent",
    )

    @field_validator("pool")
    @classmethod
    def _pool_ok(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_pool(v)

    def entries(self) -> list[SecretStr | KeyEntry]:
        """The configured keys (empty: read the environment)."""
        raise NotImplementedError


class BackendConfig(_BackendBase):
    """``[plugins.search.brave]``, ``[plugins.search.exa]``: an API-key backend."""

    api_keys: list[SecretStr | KeyEntry] = Field(
        default_factory=list,
        validation_alias=AliasChoices("api_keys", "keys", "api_key"),
        description='keys: {"$secretRef" = "NAME"} or {alias, secret, weight}',
    )
    base_url: str | None = Field(
        None, description="API base URL (a proxy or a local fake); default per backend"
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _one_key(cls, v: Any) -> Any:
        return [v] if isinstance(v, (str, dict, SecretStr)) else v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {v!r}")
        if v is not None and (bad := url_problem(v)) is not None:
            # checked here: at call time it failed every request with "invalid URL"
            raise ValueError(f"is not a valid URL: {bad}")
        return v.rstrip("/") if v else v

    def entries(self) -> list[SecretStr | KeyEntry]:
        """The configured keys."""
        return list(self.api_keys)


class SearxngConfig(_BackendBase):
    """``[plugins.search.searxng]``: SearXNG instances; each base URL is a pool "key"."""

    urls: list[SecretStr | KeyEntry] = Field(
        default_factory=list,
        validation_alias=AliasChoices("urls", "url", "instances", "base_url"),
        description="instance base URLs (https://searx.example.org), or {alias, url, weight}",
    )

    @field_validator("urls", mode="before")
    @classmethod
    def _one_url(cls, v: Any) -> Any:
        return [v] if isinstance(v, (str, dict, SecretStr)) else v

    def entries(self) -> list[SecretStr | KeyEntry]:
        """The configured instance URLs."""
        return list(self.urls)


class CollectionConfig(BaseModel):
    """``[plugins.search.collections.<name>]``: a folder of documents searched locally."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description="folder to index, relative to toolwire.toml (to the working directory "
        "for a kernel configured in code), or absolute"
    )
    description: str | None = Field(None, description="tool description (default: generated)")
    include: list[str] = Field(
        default_factory=lambda: ["**/*.md", "**/*.markdown", "**/*.txt", "**/*.rst"],
        min_length=1,
        description="glob patterns of the files to index, relative to path",
    )
    exclude: list[str] = Field(
        default_factory=list, description="glob patterns (relative paths) to leave out"
    )
    chunk_words: int = Field(200, ge=20, le=5000, description="target passage length in words")
    overlap_words: int = Field(
        40, ge=0, le=1000, description="words of the previous passage repeated at the start"
    )
    max_results: int = Field(5, ge=1, le=50, description="default number of passages returned")
    max_file_bytes: int = Field(2_000_000, ge=1, description="larger files are skipped")
    max_files: int = Field(20_000, ge=1, description="at most this many files are indexed")
    url_prefix: str | None = Field(
        None,
        description="results link to url_prefix + relative path (e.g. a repository's blob URL); "
        "default: the relative path",
    )
    reload_interval_s: float | None = Field(
        None, gt=0, description="re-scan the folder this often and re-index changed files"
    )

    @field_validator("include")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        """Checked here: pathlib refused them while the catalog was built, and the whole
        kernel failed to start with a bare ValueError naming no key."""
        for p in v:
            parts = p.replace("\\", "/").split("/")
            if not p.strip():
                raise ValueError("an empty pattern matches nothing; e.g. '**/*.md'")
            if p.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", p):
                raise ValueError(f"{p!r} is absolute; patterns are relative to path")
            if ".." in parts:
                raise ValueError(f"{p!r} leaves the folder ('..'); patterns are relative to path")
            bad = next((x for x in parts if "**" in x and x != "**"), None)
            if bad is not None:
                raise ValueError(
                    f"{p!r}: '**' must be a whole path component (matching any folders), "
                    f"not part of {bad!r}; write e.g. '**/*.md'"
                )
        return v

    @model_validator(mode="after")
    def _overlap(self) -> CollectionConfig:
        if self.overlap_words >= self.chunk_words:
            raise ValueError("overlap_words must be smaller than chunk_words")
        return self


class SearchConfig(BaseModel):
    """``[plugins.search]``. Every key is optional: with none, keys come from the
    environment (``BRAVE_API_KEY``, ``EXA_API_KEY``, ``SEARXNG_URL``) and tools
    of unconfigured backends answer ``config_error`` naming the variable."""

    model_config = ConfigDict(extra="forbid")

    chain_order: list[str] | None = Field(
        None,
        description="backends web_search walks, in order (default: [plugins.retry] chain_order, "
        "else [plugins.ratelimit] chain_order, else brave, exa, searxng)",
    )
    fallback_on_empty: bool = Field(
        False, description="an empty result falls over to the next backend (needs toolwire-retry)"
    )
    timeout_seconds: float = Field(10.0, gt=0, le=600, description="HTTP timeout per request")
    proxy: str | None = Field(None, description="HTTP(S) proxy URL for every backend request")
    user_agent: str = Field("toolwire-search/0.1", min_length=1)
    max_field_chars: int | None = Field(
        2000,
        ge=0,
        description="longer text fields of a web search's results and provider_metadata are "
        "cut to this many characters (a page's full text per hit made 11 MB answers); "
        "0 (or None): keep them whole",
    )
    brave: BackendConfig = Field(default_factory=BackendConfig)
    exa: BackendConfig = Field(default_factory=BackendConfig)
    searxng: SearxngConfig = Field(default_factory=SearxngConfig)
    backends: dict[str, BackendConfig] = Field(
        default_factory=dict,
        description="settings of backends added in code (SearchPlugin(extra_backends=...))",
    )
    collections: dict[str, CollectionConfig] = Field(default_factory=dict)

    @field_validator("chain_order")
    @classmethod
    def _no_duplicates(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            dup = sorted({x for x in v if v.count(x) > 1})
            if dup:
                raise ValueError(f"listed more than once: {dup}")
        return v

    @field_validator("max_field_chars")
    @classmethod
    def _field_chars(cls, v: int | None) -> int | None:
        if v is None or v == 0:
            return None  # keep fields whole
        if v < 100:
            raise ValueError(f"must be 0 (keep text whole) or at least 100 characters, not {v}")
        return v

    @field_validator("user_agent")
    @classmethod
    def _user_agent(cls, v: str) -> str:
        """Checked here: the HTTP client opening at startup failed on it with a bare
        UnicodeEncodeError (a header value is printable ASCII)."""
        for i, ch in enumerate(v):
            if not (" " <= ch <= "~" or ch == "\t"):
                raise ValueError(
                    f"must be printable ASCII (an HTTP header value): U+{ord(ch):04X} at "
                    f"position {i + 1} is not, in {v!r}"
                )
        return v

    @field_validator("proxy")
    @classmethod
    def _proxy(cls, v: str | None) -> str | None:
        """Checked here, not when the HTTP client opens (a bare ValueError at startup)."""
        if v is None:
            return v
        scheme = v.partition("://")[0].lower() if "://" in v else ""
        if scheme not in ("http", "https", "socks5", "socks5h"):
            raise ValueError(
                f"must be an http://, https:// or socks5:// proxy URL "
                f"(e.g. http://proxy.internal:3128), got {v!r}"
            )
        if scheme.startswith("socks") and importlib.util.find_spec("socksio") is None:
            raise ValueError(
                "a socks5:// proxy needs the socksio package: pip install 'httpx[socks]'"
            )
        return v

    @field_validator("collections")
    @classmethod
    def _names(cls, v: dict[str, CollectionConfig]) -> dict[str, CollectionConfig]:
        for name in v:
            if not COLLECTION_RE.match(name):
                raise ValueError(
                    f"collection name {name!r} must be lower-case letters, digits and '_' "
                    "(it becomes the tool name search_<name>)"
                )
        return v

    def backend_config(self, name: str) -> _BackendBase:
        """The table of backend ``name`` (defaults when it is absent)."""
        if name in ("brave", "exa", "searxng"):
            cfg: _BackendBase = getattr(self, name)
            return cfg
        return self.backends.get(name) or BackendConfig()
