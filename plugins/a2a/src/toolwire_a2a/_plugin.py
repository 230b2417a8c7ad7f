"""The ``a2a`` plugin: A2A agents (from the config and a registry) as toolwire tools."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from toolwire import BackgroundTask, ErrorInfo, ErrorKind, Tool, ToolResult, hookimpl

from ._agent import AgentHandle, AgentSpec
from ._cards import (
    CardEntry,
    CardFetchError,
    fetch_json,
    make_entry,
    nickname_for,
    selector_matches,
)
from ._config import A2AConfig, card_url_for
from ._limits import capped_client

if TYPE_CHECKING:
    from toolwire import Kernel

__all__ = ["A2APlugin"]

log = logging.getLogger("toolwire.a2a")

_CARD_KEY = "a2a:card:"
_REGISTRY_KEY = "a2a:registry:"
#: How long fetched cards and listings are kept in the state store.
CACHE_TTL_S = 30 * 86400.0


def _resolve(base: str, url: Any) -> str | None:
    """``url`` (a listing entry's card URL, maybe relative) against ``base``, the
    listing's URL; None unless that gives an http(s) URL."""
    if not isinstance(url, str) or not url:
        return None
    try:
        resolved = str(httpx.URL(base).join(url))
    except (httpx.InvalidURL, ValueError):
        return None
    return resolved if resolved.startswith(("http://", "https://")) else None


class _BorrowedTransport(httpx.AsyncBaseTransport):
    """A transport the caller owns: our clients use it but never close it."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        return None


class A2APlugin:
    """Offers remote A2A agents as tools: ``agent_<nickname>`` and ``agent_<nickname>_task``.

    Agents come from ``[plugins.a2a] agents`` (card or base URLs) and from a
    registry listing filtered by a selector. Cards are read from
    ``/.well-known/agent-card.json`` (A2A 1.0 and 0.3 cards), revalidated with
    their ETag (``If-None-Match`` -> 304), kept in ``kernel.state`` and
    re-read every ``refresh_interval_s`` by a background task; when the set
    of tools changes the plugin calls ``kernel.refresh_tools()``.

    An agent whose card cannot be read at startup has no tool until a later
    refresh reads it (retried every ``retry_interval_s``), unless its card is
    known from an earlier run (the state store): then its tools are offered
    and answer ``unavailable`` while the agent is down.

    ``transport`` (tests, embedding): an ``httpx`` transport used for every
    request (``httpx.ASGITransport(app)`` reaches an in-process agent). The
    caller keeps ownership of it.
    """

    name = "a2a"
    order = 910
    Config = A2AConfig

    def __init__(
        self,
        config: A2AConfig | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config or A2AConfig()
        self._transport = _BorrowedTransport(transport) if transport is not None else None
        self._handles: dict[str, AgentHandle] = {}
        self._active: list[AgentHandle] = []
        self._excluded: dict[str, str] = {}
        self._registry_cache: tuple[Any, str | None] | None = None
        self._registry_error: str | None = None
        self._kernel: Kernel | None = None
        self._http: httpx.AsyncClient | None = None
        self._lock: anyio.Lock | None = None
        self._published: list[Tool] | None = None
        self._refresher: BackgroundTask | None = None

    # ---------------------------------------------------------------- hooks
    @hookimpl
    async def startup(self, kernel: Kernel) -> None:
        """Read the cards (bounded by ``request_timeout_s``) and start the refresh task."""
        self._kernel = kernel
        self._lock = anyio.Lock()
        if not self._configured():
            return
        self._http = capped_client(  # the registry listing
            limit=self.config.max_answer_bytes,
            setting="[plugins.a2a] max_answer_bytes",
            transport=self._transport,
            timeout=self.config.request_timeout_s,
        )
        try:
            await self._load_cache(kernel)
            async with self._lock:
                await self._sync()
        except Exception:  # an agent or registry problem must not stop the kernel
            log.exception("plugin 'a2a': reading the agents at startup failed; will retry")
        for h in self._handles.values():
            if h.entry is None and h.last_error:
                log.warning(
                    "plugin 'a2a': agent at %s could not be read at startup (%s); its tools "
                    "appear once a refresh reads its card",
                    h.card_url,
                    h.last_error,
                )
            elif h.last_error:  # its card is known from an earlier run (the state store)
                log.warning(
                    "plugin 'a2a': agent at %s could not be read at startup (%s); its tools "
                    "stay offered from the card cached by an earlier run and answer "
                    "unavailable until the agent is back",
                    h.card_url,
                    h.last_error,
                )
        if self.config.refresh_interval_s > 0:
            self._refresher = kernel.spawn(self._refresh_loop, name="a2a card refresh")

    @hookimpl
    async def shutdown(self) -> None:
        """Stop the refresh task and close the HTTP clients."""
        if self._refresher is not None:
            await self._refresher.cancel()
            self._refresher = None
        handles = list(self._handles.values())
        self._handles.clear()
        self._active = []
        for h in handles:
            await h.aclose()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self._kernel = None
        self._published = None

    @hookimpl
    def after_call(self, result: ToolResult) -> ToolResult | None:
        """A call of an agent tool cut by its timeout, after the agent took the task: the
        error says so and carries the task id, so any caller (an MCP client, which does not
        see ``meta.extra``) can follow it with ``agent_<nick>_task`` rather than send the
        message again."""
        err = result.error
        info = result.meta.extra.get("a2a")
        if (
            err is None
            or err.kind != ErrorKind.TIMEOUT
            or not isinstance(info, dict)
            or not info.get("task_id")
            or "task_id" in err.details
        ):
            return None
        nick, task_id = info.get("agent"), info["task_id"]
        hint = (
            f"; the agent had already taken the task {task_id!r}: do not send the message "
            f"again, get its outcome with agent_{nick}_task and task_id={task_id!r}"
        )
        details = {**err.details, "task_id": task_id, "context_id": info.get("context_id")}
        again = ErrorInfo(
            err.kind,
            err.message + hint,
            err.retryable,
            err.retry_after_s,
            err.source,
            details,
            err.exception,
        )
        return ToolResult.from_error(again, result.meta)

    @hookimpl
    def discover(self, query: str | None) -> list[Tool] | None:
        """Every agent's tools for a full listing; nothing extra for a search."""
        if query is not None:
            return None
        tools = self._tools()
        self._published = list(tools)
        return tools

    # ---------------------------------------------------------------- public
    async def refresh(self) -> bool:
        """Re-read the registry and the cards now (ETag-revalidated).

        Calls ``kernel.refresh_tools()`` when the tools changed, and returns
        whether they did. Unreachable agents keep their last known card.
        """
        if self._lock is None or self._http is None:
            return False
        async with self._lock:
            await self._sync()
        return await self._publish()

    def agents(self) -> dict[str, dict[str, Any]]:
        """Every known agent by card URL: nickname, status, tools, origin, last error."""
        out: dict[str, dict[str, Any]] = {}
        active = {id(h) for h in self._active}
        for url, h in self._handles.items():
            out[url] = {
                "nickname": h.nickname,
                "name": h.entry.card.name if h.entry else None,
                "origin": h.spec.origin,
                "status": h.status,
                "offered": id(h) in active,
                "excluded": self._excluded.get(url),
                "tools": [t.name for t in h.tools] if id(h) in active else [],
                "etag": h.entry.etag if h.entry else None,
                "last_error": h.last_error,
            }
        return out

    # -------------------------------------------------------------- private
    def _configured(self) -> bool:
        return any(a.enabled for a in self.config.agents) or self.config.registry is not None

    def _tools(self) -> list[Tool]:
        return [t for h in self._active for t in h.tools]

    async def _publish(self) -> bool:
        kernel, published, tools = self._kernel, self._published, self._tools()
        if kernel is None or published is None:
            return False
        if len(tools) == len(published) and all(
            a is b for a, b in zip(tools, published, strict=True)
        ):
            return False
        try:
            await kernel.refresh_tools(keep_on_collision=True)
        except Exception as exc:
            log.error("plugin 'a2a': updating the kernel's catalog failed: %s", exc)
            return False
        return True

    def _config_specs(self) -> list[tuple[AgentSpec, dict[str, Any] | None]]:
        out: list[tuple[AgentSpec, dict[str, Any] | None]] = []
        for a in self.config.agents:
            if not a.enabled:
                continue
            spec = AgentSpec(
                card_url=a.card_url,
                origin="config",
                nickname=a.nickname,
                headers=a.http_headers(),
                context=dict(a.context),
                streaming=a.streaming,
                timeout_s=a.timeout_s,
                settings=dict(a.settings),
                max_answer_bytes=a.max_answer_bytes,
            )
            out.append((spec, None))
        return out

    async def _registry_specs(self) -> list[tuple[AgentSpec, dict[str, Any] | None]]:
        """Fetch the registry listing (ETag-revalidated) and return its agents."""
        reg = self.config.registry
        if reg is None or self._http is None:
            return []
        etag = self._registry_cache[1] if self._registry_cache else None
        try:
            got = await fetch_json(
                self._http,
                reg.url,
                headers=reg.http_headers(),
                timeout_s=self.config.request_timeout_s,
                etag=etag,
                params=reg.query_params() if reg.send_selector else None,
            )
            self._registry_error = None
        except CardFetchError as exc:
            self._registry_error = str(exc)
            log.warning("plugin 'a2a': registry %s: %s; keeping the last listing", reg.url, exc)
            got = None
        if got is not None:
            self._registry_cache = got
            await self._store(_REGISTRY_KEY + reg.url, {"data": got[0], "etag": got[1]})
        return self._listing_specs()

    def _listing_specs(self) -> list[tuple[AgentSpec, dict[str, Any] | None]]:
        """The agents of the last registry listing, with their inline cards if any."""
        reg = self.config.registry
        if reg is None or self._registry_cache is None:
            return []
        listing = self._registry_cache[0]
        entries = listing.get("agents") if isinstance(listing, dict) else listing
        if not isinstance(entries, list):
            log.warning(
                "plugin 'a2a': registry %s: expected {\"agents\": [...]} or a list, got %s",
                reg.url,
                type(listing).__name__,
            )
            return []
        agent_headers = {k: v.get_secret_value() for k, v in reg.agent_headers.items()}
        out: list[tuple[AgentSpec, dict[str, Any] | None]] = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                continue
            url = e.get("card_url") or e.get("cardUrl") or e.get("url")
            card = e.get("card") if isinstance(e.get("card"), dict) else None
            resolved = _resolve(reg.url, url)  # relative to the listing, as links are
            if resolved is not None:
                card_url = card_url_for(resolved)
            elif card is not None:
                card_url = f"{reg.url}#agents/{i}"  # identity of a card known only inline
            else:
                log.warning(
                    "plugin 'a2a': registry %s: entry %d has %s and no card",
                    reg.url,
                    i,
                    f"a card_url that is not an http(s) URL ({url!r})"
                    if isinstance(url, str) and url
                    else "neither a card_url",
                )
                continue
            nick = e.get("nickname")
            spec = AgentSpec(
                card_url=card_url,
                origin="registry",
                nickname=nickname_for(nick, card_url) if isinstance(nick, str) and nick else None,
                headers=dict(agent_headers),
            )
            out.append((spec, card))
        return out

    async def _sync(self) -> None:
        """Reconcile agents with the config and the registry; fetch cards; choose the tools."""
        specs = self._config_specs()
        known = {s.card_url for s, _ in specs}
        for spec, card in await self._registry_specs():
            if spec.card_url not in known:  # a configured agent wins over its registry entry
                known.add(spec.card_url)
                specs.append((spec, card))
        for url in [u for u in self._handles if u not in known]:
            # delisted from the registry: closed once its calls in flight have ended
            await self._handles.pop(url).retire()
        inline: dict[str, dict[str, Any]] = {}
        for spec, card in specs:
            h = self._handles.get(spec.card_url)
            if h is None:
                h = self._handles[spec.card_url] = AgentHandle(spec, self.config, self._transport)
            else:
                h.spec = spec
            if card is not None:
                inline[spec.card_url] = card
        fetch = [self._handles[s.card_url] for s, _ in specs if s.card_url not in inline]
        async with anyio.create_task_group() as tg:
            for h in fetch:
                tg.start_soon(self._fetch_card, h)
        entries: dict[str, CardEntry] = {}
        for spec, _ in specs:
            h = self._handles[spec.card_url]
            if spec.card_url in inline:
                try:
                    h.entry = make_entry(spec.card_url, inline[spec.card_url])
                    entries[spec.card_url] = h.entry
                    h.last_error = None
                except CardFetchError as exc:
                    h.last_error = str(exc)
            elif h.entry is not None:
                entries[spec.card_url] = h.entry
        self._choose(specs, entries)

    def _choose(
        self, specs: list[tuple[AgentSpec, dict[str, Any] | None]], entries: dict[str, CardEntry]
    ) -> None:
        """Apply the selector and the nicknames; rebuild tools where the card changed."""
        reg = self.config.registry
        used: dict[str, str] = {}
        active: list[AgentHandle] = []
        excluded: dict[str, str] = {}
        for spec, _ in specs:
            h = self._handles[spec.card_url]
            entry = entries.get(spec.card_url)
            if entry is None:
                continue
            nick = spec.nickname or nickname_for(entry.card.name, spec.card_url)
            if (
                spec.origin == "registry"
                and reg is not None
                and not selector_matches(reg.selector, entry.card, nick)
            ):
                excluded[spec.card_url] = "does not match the registry selector"
                continue
            names = (f"agent_{nick}", f"agent_{nick}_task")
            clash = next((used[n] for n in names if n in used), None)
            if clash is not None:
                reason = (
                    f"nickname {nick!r} clashes with the agent at {clash}; give it another "
                    f"`nickname` in [plugins.a2a] agents"
                )
                if self._excluded.get(spec.card_url) != reason:
                    log.warning("plugin 'a2a': agent at %s skipped: %s", spec.card_url, reason)
                excluded[spec.card_url] = reason
                continue
            for n in names:
                used[n] = spec.card_url
            h.set_card(entry, nick)
            active.append(h)
        self._active = active
        self._excluded = excluded

    async def _fetch_card(self, h: AgentHandle) -> None:
        """Read (or revalidate) one card; on failure the last known card stays."""
        etag = h.entry.etag if h.entry is not None else None
        try:
            got = await fetch_json(
                h.http, h.card_url, headers={}, timeout_s=self.config.request_timeout_s, etag=etag
            )
            if got is None:  # 304 Not Modified: the card we hold is current
                h.status, h.last_error = "up", None
                return
            entry = make_entry(h.card_url, got[0], got[1])
        except CardFetchError as exc:
            h.last_error = str(exc)
            if exc.status is None or exc.status >= 500:
                h.status = "down"
            return
        except Exception as exc:  # keep the other fetches going whatever happens here
            h.last_error = f"reading the card failed: {type(exc).__name__}: {exc}"
            log.exception("plugin 'a2a': reading the card at %s failed", h.card_url)
            return
        h.status, h.last_error = "up", None
        if h.entry is None or h.entry.data != entry.data or h.entry.etag != entry.etag:
            await self._store(_CARD_KEY + h.card_url, entry.to_json())
        h.entry = entry  # _choose -> set_card rebuilds the tools if the card changed

    async def _load_cache(self, kernel: Kernel) -> None:
        """Cards and the listing from an earlier run (their ETags make the first refresh cheap)."""
        try:
            reg = self.config.registry
            if reg is not None:
                cached = await kernel.state.get(_REGISTRY_KEY + reg.url)
                if isinstance(cached, dict) and "data" in cached:
                    self._registry_cache = (cached["data"], cached.get("etag"))
            specs = self._config_specs() + self._listing_specs()
            for spec, card in specs:
                if card is not None or spec.card_url in self._handles:
                    continue
                h = self._handles[spec.card_url] = AgentHandle(spec, self.config, self._transport)
                value = await kernel.state.get(_CARD_KEY + spec.card_url)
                if isinstance(value, dict) and isinstance(value.get("data"), dict):
                    try:
                        h.entry = make_entry(spec.card_url, value["data"], value.get("etag"))
                    except CardFetchError:
                        continue
        except Exception as exc:
            log.warning("plugin 'a2a': cannot read cached cards from the state store: %s", exc)

    async def _store(self, key: str, value: dict[str, Any]) -> None:
        kernel = self._kernel
        if kernel is None:
            return
        try:
            await kernel.state.set(key, value, ttl=CACHE_TTL_S)
        except Exception as exc:
            log.warning("plugin 'a2a': cannot cache %s in the state store: %s", key, exc)

    # ------------------------------------------------------- background task
    async def _refresh_loop(self) -> None:
        while True:
            await anyio.sleep(self._next_delay())
            try:
                await self.refresh()
            except Exception:
                log.exception("plugin 'a2a': refreshing the agents failed")

    def _next_delay(self) -> float:
        interval = self.config.refresh_interval_s
        missing = self._registry_error is not None or any(
            h.entry is None for h in self._handles.values()
        )
        return min(interval, self.config.retry_interval_s) if missing else interval
