"""``[plugins.a2a]``: which agents become tools, how they are reached and refreshed."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from toolwire.state import MAX_TTL_S

__all__ = ["A2AConfig", "AgentConfig", "RegistryConfig", "Selector", "card_url_for"]

#: Where A2A 0.3+ agents publish their card, relative to the agent's base URL.
WELL_KNOWN_CARD_PATH = "/.well-known/agent-card.json"

#: ``max_answer_bytes`` unless configured: 32 MiB, as the mcp plugin's.
DEFAULT_MAX_ANSWER_BYTES = 32 * 1024 * 1024

_NICKNAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


def card_url_for(url: str) -> str:
    """The agent-card URL for ``url``.

    A URL whose path ends in ``.json`` is taken as the card itself; any other
    URL is the agent's base URL and gets ``/.well-known/agent-card.json``.
    """
    base, sep, query = url.partition("?")
    if base.rstrip("/").endswith(".json"):
        return url
    return base.rstrip("/") + WELL_KNOWN_CARD_PATH + (sep + query if sep else "")


def _check_url(url: str, what: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{what} must start with http:// or https://, got {url!r}")
    return url


#: Every integer up to this magnitude is exactly a double (message metadata numbers are
#: doubles: a protobuf Struct).
_EXACT_INT = 2**53


def _inexact_int(value: Any, where: str) -> tuple[str, int] | None:
    """The first integer in ``value`` (dicts, lists) that a double cannot hold: (key, value)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (where, value) if abs(value) > _EXACT_INT else None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = _inexact_int(v, f"{where}.{k}")
        if found is not None:
            return found
    return None


def _check_json(value: dict[str, Any], what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`{what}` is sent as JSON message metadata; use strings, numbers, booleans, "
            f"arrays and tables only ({exc})"
        ) from None
    found = _inexact_int(value, what)
    if found is not None:
        key, n = found
        raise ValueError(
            f"`{key}` = {n} is past 2**53 in magnitude: message metadata numbers are "
            f"doubles, which hold every integer only up to 2**53 (it would arrive as "
            f'{float(n)!r}); write it as a string ("{n}")'
        )


class Selector(BaseModel):
    """Which agents of a registry listing become tools.

    Every criterion that is given must hold (AND between criteria; an empty
    selector selects every agent). ``tags`` and ``skills`` are compared with
    the union of all the card's skills (case-insensitive); ``match`` says
    whether every listed value must be present (``"all"``, the default) or
    one is enough (``"any"``). ``names`` always matches any-of, with shell
    globs, against the card name or the nickname (case-insensitive).
    """

    model_config = ConfigDict(extra="forbid")

    tags: list[str] = Field(default_factory=list, description="skill tags the agent must have")
    skills: list[str] = Field(default_factory=list, description="skill ids the agent must have")
    names: list[str] = Field(
        default_factory=list, description="card names or nicknames (globs), any-of"
    )
    match: Literal["all", "any"] = Field(
        "all", description="tags/skills: every listed value ('all') or at least one ('any')"
    )

    def is_empty(self) -> bool:
        """True when the selector selects every agent."""
        return not (self.tags or self.skills or self.names)


class AgentConfig(BaseModel):
    """One agent, by the URL of its card (or its base URL)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        description="the agent's base URL (the card is read from /.well-known/agent-card.json) "
        "or the full URL of its card (a path ending in .json)"
    )
    nickname: str | None = Field(
        None,
        description="tool name part: the tool is agent_<nickname> (default: from the card name)",
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='HTTP headers sent to this agent (card and calls); secrets as {"$secretRef" = "NAME"}',
    )
    bearer_token: SecretStr | None = Field(
        None, description="sent as `Authorization: Bearer <token>`"
    )
    context: dict[str, Any] = Field(
        default_factory=dict, description="merged over the global `context` for this agent"
    )
    streaming: bool | None = Field(None, description="overrides the global `streaming`")
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="overrides the global `timeout_s`",
    )
    max_answer_bytes: int | None = Field(
        None, ge=1024, description="overrides the global `max_answer_bytes`"
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="tool settings other plugins read (e.g. approval = 'REQUIRED')",
    )
    enabled: bool = Field(True, description="false: ignore this entry")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _check_url(v, "`url`")

    @field_validator("context")
    @classmethod
    def _json_context(cls, v: dict[str, Any]) -> dict[str, Any]:
        _check_json(v, "context")
        return v

    @field_validator("nickname")
    @classmethod
    def _nick(cls, v: str | None) -> str | None:
        if v is not None and not _NICKNAME.match(v):
            raise ValueError(
                f"nickname {v!r} must be 1-40 characters of a-z, 0-9, '_' or '-', "
                "starting with a letter or digit (it becomes the tool name agent_<nickname>)"
            )
        return v

    @property
    def card_url(self) -> str:
        """Where the card is fetched from."""
        return card_url_for(self.url)

    def http_headers(self) -> dict[str, str]:
        """The headers to send, secrets revealed (never log this)."""
        out = {k: v.get_secret_value() for k, v in self.headers.items()}
        if self.bearer_token is not None:
            out["Authorization"] = f"Bearer {self.bearer_token.get_secret_value()}"
        return out


class RegistryConfig(BaseModel):
    """A registry listing agents, filtered with a selector.

    A2A defines no registry API; the listing is ``GET <url>`` answering
    ``{"agents": [{"nickname": ..., "card_url": ..., "card": {...}?}, ...]}``
    (or a bare list of such entries). The selector's tags, skills and names
    are also sent as query parameters (``?tag=a&tag=b&skill=x&name=y&match=all``)
    so a large registry can filter on its side; the plugin filters again.
    """

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="the listing's URL")
    selector: Selector = Field(default_factory=Selector, description="which agents to keep")
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="HTTP headers for the listing request"
    )
    bearer_token: SecretStr | None = Field(None, description="`Authorization: Bearer` for it")
    agent_headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="HTTP headers sent to every agent from this registry"
    )
    send_selector: bool = Field(True, description="send the selector as query parameters")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _check_url(v, "`registry.url`")

    def http_headers(self) -> dict[str, str]:
        """Headers of the listing request, secrets revealed (never log this)."""
        out = {k: v.get_secret_value() for k, v in self.headers.items()}
        if self.bearer_token is not None:
            out["Authorization"] = f"Bearer {self.bearer_token.get_secret_value()}"
        return out

    def query_params(self) -> list[tuple[str, str | int | float | bool | None]]:
        """The selector as query parameters."""
        s = self.selector
        params: list[tuple[str, str | int | float | bool | None]] = [("tag", t) for t in s.tags]
        params += [("skill", k) for k in s.skills]
        params += [("name", n) for n in s.names]
        if params:
            params.append(("match", s.match))
        return params


class A2AConfig(BaseModel):
    """``[plugins.a2a]``. With no keys at all the plugin contributes no tools."""

    model_config = ConfigDict(extra="forbid")

    agents: list[AgentConfig] = Field(
        default_factory=list,
        description="agents by URL: a list of URLs or tables, or a table keyed by nickname",
    )
    registry: RegistryConfig | None = Field(None, description="a registry listing agents")
    context: dict[str, Any] = Field(
        default_factory=dict, description="sent to every agent as message metadata"
    )
    refresh_interval_s: float = Field(
        300.0,
        ge=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="re-read cards and the registry this often; 0: never",
    )
    retry_interval_s: float = Field(
        30.0,
        gt=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="while an agent's card or the registry could not be read, retry this often "
        "(at most refresh_interval_s)",
    )
    request_timeout_s: float = Field(
        10.0,
        gt=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="timeout of requests that answer at once (the whole answer must come "
        "within it): cards, the registry, GetTask, CancelTask, hands-off SendMessage; also the "
        "connect timeout of blocking calls",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="per-attempt timeout of the agent tools (None: the kernel's default_timeout_s)",
    )
    streaming: bool = Field(
        True,
        description="use SendStreamingMessage when the card allows it (progress is reported)",
    )
    cancel_abandoned: bool = Field(
        True,
        description="a blocking call cancelled by its caller (not cut by its deadline or "
        "timeout) sends CancelTask for the task it started, as nobody can follow it up",
    )
    poll_interval_s: float = Field(
        1.0,
        gt=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="how often agent_<nickname>_task polls while waiting",
    )
    max_wait_s: float = Field(
        300.0,
        ge=0,
        le=MAX_TTL_S,
        allow_inf_nan=False,
        description="upper bound of the `wait_s` argument of agent_<nickname>_task",
    )
    interrupted_ttl_s: float = Field(
        86400.0,
        gt=0,
        le=MAX_TTL_S,  # a state-store TTL: finite (inf or 1e16 s were refused by every store)
        allow_inf_nan=False,
        description="how long an interrupted task is remembered for its context_id",
    )
    max_description_chars: int = Field(
        2000, ge=200, description="tool descriptions built from cards are cut to this length"
    )
    max_answer_bytes: int = Field(
        DEFAULT_MAX_ANSWER_BYTES,
        ge=1024,
        description="the largest answer taken from an agent or the registry, in bytes, "
        "decompressed: a JSON-RPC answer, a card, the listing, or one event of a stream, and "
        "what one call keeps of a stream's events together; a larger one fails (`tool_error`, "
        "`details.answer_too_large`) and is not kept in memory",
    )

    @field_validator("agents", mode="before")
    @classmethod
    def _agents(cls, v: Any) -> Any:
        """Accept ``["http://...", {url=...}]`` and ``{nickname = {url=...} | "http://..."}``."""
        if isinstance(v, dict):
            out = []
            for nick, entry in v.items():
                if isinstance(entry, str):
                    entry = {"url": entry}
                if isinstance(entry, dict):
                    entry = {"nickname": nick, **entry}
                out.append(entry)  # anything else: pydantic names agents.<n> and the type
            return out
        if isinstance(v, list):
            return [{"url": e} if isinstance(e, str) else e for e in v]
        return v

    @field_validator("context")
    @classmethod
    def _json_context(cls, v: dict[str, Any]) -> dict[str, Any]:
        _check_json(v, "context")
        return v

    @field_validator("agents", mode="after")
    @classmethod
    def _unique(cls, agents: list[AgentConfig]) -> list[AgentConfig]:
        # A field validator, not a model validator: the error is then located at
        # ``plugins.a2a.agents`` (a model validator's error has no key to name).
        cards: dict[str, str] = {}
        for a in agents:
            if not a.enabled:
                continue
            if a.card_url in cards:  # one handle per card: the second would take its tools
                raise ValueError(
                    f"two agents have the same card {a.card_url} ({cards[a.card_url]} and "
                    f"{a.url}); list each agent once (per-call context goes in the message)"
                )
            cards[a.card_url] = a.url
        seen: dict[str, str] = {}
        for a in agents:
            if a.nickname is None or not a.enabled:  # a disabled entry is ignored
                continue
            if a.nickname in seen:
                raise ValueError(
                    f"two agents use the nickname {a.nickname!r} ({seen[a.nickname]} and "
                    f"{a.url}); give each a distinct `nickname`"
                )
            seen[a.nickname] = a.url
        return agents
