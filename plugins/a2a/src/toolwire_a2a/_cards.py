"""Agent cards: fetching with ETag revalidation, parsing (1.0 and 0.3), selecting, describing."""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from a2a.client.card_resolver import parse_agent_card
from a2a.types import AgentCard

from ._config import Selector
from ._limits import AnswerTooLarge, AnswerUndecodable, RedirectRefused

__all__ = [
    "CardEntry",
    "CardFetchError",
    "card_name",
    "card_skills",
    "describe_card",
    "fetch_json",
    "make_entry",
    "nickname_for",
    "selector_matches",
]


class CardFetchError(Exception):
    """A card or a registry listing could not be fetched or parsed.

    ``status`` is the HTTP status when the server answered.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class CardEntry:
    """A card as served (``data``), parsed (``card``), and its validator (``etag``)."""

    url: str
    data: dict[str, Any]
    card: AgentCard
    etag: str | None = None

    def to_json(self) -> dict[str, Any]:
        """What the state store keeps (the parsed card is rebuilt from ``data``)."""
        return {"url": self.url, "data": self.data, "etag": self.etag}


def make_entry(url: str, data: Any, etag: str | None = None) -> CardEntry:
    """Parse ``data`` (an A2A 1.0 or 0.3 card) into a ``CardEntry``.

    Raises ``CardFetchError`` when it is not a card.
    """
    if not isinstance(data, dict):
        raise CardFetchError(f"the agent card at {url} is not a JSON object")
    try:
        card = parse_agent_card(copy.deepcopy(data))  # the parser rewrites 0.3 fields in place
    except Exception as exc:
        raise CardFetchError(f"the agent card at {url} is not a valid A2A card: {exc}") from exc
    if not card.name:
        raise CardFetchError(f"the agent card at {url} has no `name`")
    if not card.supported_interfaces:
        raise CardFetchError(
            f"the agent card at {url} names no endpoint (`supportedInterfaces` in A2A 1.0, "
            "`url` in 0.3)"
        )
    return CardEntry(url=url, data=data, card=card, etag=etag)


async def fetch_json(
    http: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    timeout_s: float,
    etag: str | None,
    params: list[tuple[str, str | int | float | bool | None]] | None = None,
) -> tuple[Any, str | None] | None:
    """``GET url`` as JSON, revalidating with ``If-None-Match: etag``.

    The whole answer must come within ``timeout_s`` (httpx times each read alone: a
    server sending a byte now and then would hold the read for as long as it liked).
    ``params`` are added to the query the URL has (httpx's ``params`` would replace it).
    Returns ``(body, etag)``, or None when the server answered 304 Not Modified.
    Raises ``CardFetchError`` saying what went wrong.
    """
    hdrs = {"Accept": "application/json", **headers}
    if etag:
        hdrs["If-None-Match"] = etag
    target = httpx.URL(url).copy_merge_params(params) if params else url
    try:
        with anyio.fail_after(timeout_s):
            r = await http.get(target, headers=hdrs, timeout=timeout_s)
    except (httpx.TimeoutException, TimeoutError):
        raise CardFetchError(
            f"GET {url} timed out: no complete answer within {timeout_s:g}s (request_timeout_s)"
        ) from None
    except RedirectRefused as exc:
        raise CardFetchError(str(exc)) from None
    except AnswerTooLarge as exc:
        raise CardFetchError(
            f"GET {url}: the answer is over max_answer_bytes = {exc.limit} bytes "
            f"({exc.setting}); it was dropped"
        ) from None
    except AnswerUndecodable as exc:
        raise CardFetchError(f"GET {url}: {exc}") from None
    except httpx.HTTPError as exc:
        raise CardFetchError(f"GET {url} failed: {type(exc).__name__}: {exc}") from None
    if r.status_code == 304 and etag:
        return None
    if r.status_code >= 400:
        hint = " (check the agent's credentials)" if r.status_code in (401, 403) else ""
        raise CardFetchError(f"GET {url} answered HTTP {r.status_code}{hint}", status=r.status_code)
    try:
        body = r.json()
    except ValueError:
        raise CardFetchError(f"GET {url} did not answer JSON") from None
    except RecursionError:  # within the size cap, but too deep for Python's JSON parser
        raise CardFetchError(f"GET {url} answered JSON nested too deeply to read") from None
    return body, r.headers.get("etag")


# ------------------------------------------------------------------ selection
def card_skills(card: AgentCard) -> tuple[set[str], set[str]]:
    """The union of the card's skill tags and its skill ids, lower-cased."""
    tags = {t.lower() for s in card.skills for t in s.tags}
    ids = {s.id.lower() for s in card.skills if s.id}
    return tags, ids


def selector_matches(selector: Selector, card: AgentCard, nickname: str | None = None) -> bool:
    """Whether ``card`` (offered as ``nickname``) satisfies ``selector`` (see ``Selector``)."""
    tags, ids = card_skills(card)
    combine = all if selector.match == "all" else any
    if selector.tags and not combine(t.lower() in tags for t in selector.tags):
        return False
    if selector.skills and not combine(k.lower() in ids for k in selector.skills):
        return False
    if selector.names:
        candidates = [card.name.lower()] + ([nickname.lower()] if nickname else [])
        if not any(fnmatch.fnmatchcase(c, p.lower()) for p in selector.names for c in candidates):
            return False
    return True


# ------------------------------------------------------------- presentation
_NON_NAME = re.compile(r"[^a-z0-9]+")


def nickname_for(name: str, url: str) -> str:
    """A tool-name-safe nickname from a card name (``"Research Specialist"`` -> ``research_specialist``)."""
    nick = _NON_NAME.sub("_", name.lower()).strip("_")[:40].rstrip("_")
    if not nick:
        nick = "agent_" + hashlib.sha256(url.encode()).hexdigest()[:8]
    return nick


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


#: The longest card name (and provider) put in tool descriptions and titles.
_MAX_NAME = 100


def card_name(card: AgentCard) -> str:
    """The card's name as tools show it: on one line, at most 100 characters (a card's
    fields are the agent's to write, of any length)."""
    return _clip(card.name, _MAX_NAME)


def describe_card(card: AgentCard, nickname: str, *, limit: int) -> str:
    """The ``agent_<nickname>`` tool description: what the agent does, its skills and examples.

    Everything a search for the agent's abilities should find is in here
    (``find_tools`` ranks on names, tags and descriptions).
    """
    name = card_name(card)
    head = card.description.strip() or f"The A2A agent {name!r}."
    about = f"Remote A2A agent {name!r}"
    if card.provider.organization:
        about += f" by {_clip(card.provider.organization, _MAX_NAME)}"
    if card.version:
        about += f", version {_clip(card.version, 40)}"
    tail = (
        f"Ask in natural language with `query`. Set `hands_off` to true to delegate and get "
        f"the outcome later with agent_{nickname}_task; pass the returned `context_id` to "
        f"continue the conversation (e.g. to answer the agent's question)."
    )
    skills = []
    for s in card.skills:
        line = f"- {s.name or s.id}"
        if s.description:
            line += f": {_clip(s.description, 300)}"
        if s.tags:
            line += f" (tags: {', '.join(s.tags)})"
        if s.examples:
            line += " Examples: " + "; ".join(f'"{_clip(e, 120)}"' for e in s.examples[:3])
        skills.append(line)
    head = _clip(head, max(100, limit // 2))
    budget = limit - len(head) - len(about) - len(tail) - 16
    lines = [head, "", about + "."]
    if skills:
        lines.append("Skills:")
        for line in skills:
            if len(line) + 1 > budget:
                lines.append(f"- … and {len(skills) - (len(lines) - 4)} more skills")
                break
            lines.append(line)
            budget -= len(line) + 1
    lines.append(tail)
    return "\n".join(lines)
