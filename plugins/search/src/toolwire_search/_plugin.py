"""The ``search`` plugin: web-search tools over pluggable backends, and local collections.

A tool source (``discover``) contributing ``web_search``, ``web_search_<backend>``
and ``search_<collection>``. Keys come from the ratelimit plugin's KeyPool
(registered at startup), failures are classified by the ratelimit plugin and
fallbacks decided by the retry plugin: this plugin never retries, sleeps or
rotates keys itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from toolwire import (
    CallContext,
    ConfigError,
    ErrorKind,
    Kernel,
    Tool,
    ToolAnnotations,
    ToolError,
    hookimpl,
    plugin_not_loaded,
)
from toolwire.state import StateStoreError
from toolwire_ratelimit import ApiKey, RateLimitPlugin
from toolwire_retry import EmptyResult, FallbackSpec, RetryPlugin

from ._answer import ACCEPT_ENCODING, AnswerTooLarge, UndecodableAnswer, read_answer, with_body
from ._backend import MAX_ANSWER_DEPTH, MAX_ERROR_BODY, Backend, KeyExhausted, deeper_than
from ._brave import BraveBackend
from ._config import KeyEntry, SearchConfig, url_problem
from ._exa import ExaBackend
from ._kb import (
    Collection,
    load_collection,
    resolve_root,
    result_of,
    root_problem,
    signature,
)
from ._models import SearchQuery, cut_long_text, input_schema, output_schema, validate_query
from ._searxng import SearxngBackend
from ._text import tokenize

__all__ = ["BUILTIN_BACKENDS", "DEFAULT_CHAIN", "SearchPlugin"]

log = logging.getLogger("toolwire.search")
#: How long setting a used-up key aside may hold a caller whose answer is in hand.
_BOOKKEEPING_S = 2.0

BUILTIN_BACKENDS: tuple[type[Backend], ...] = (BraveBackend, ExaBackend, SearxngBackend)
#: The chain web_search walks when nothing configures one.
DEFAULT_CHAIN: tuple[str, ...] = ("brave", "exa", "searxng")
_BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_MAX_WARNINGS = 20


class _BorrowedTransport(httpx.AsyncBaseTransport):
    """The caller's transport, not closed with the plugin's client."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class _Plan:
    """What web_search does: the chain, and which of its backends have keys."""

    chain: list[str] = field(default_factory=list)
    configured: list[str] = field(default_factory=list)
    #: the retry plugin walks our default chain for web_search (no operator's list)
    own_fallbacks: bool = False


class _CollectionQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    query: str = Field(min_length=1, max_length=1000)
    max_results: int | None = Field(None, ge=1, le=50)


def _config_error(message: str, **details: Any) -> ToolError:
    return ToolError(message, kind=ErrorKind.CONFIG_ERROR, details=details)


class SearchPlugin:
    """Web search over Brave, Exa and SearXNG, and BM25 search over local folders.

    Tools (contributed through ``discover``):

    - ``web_search``: the first configured backend of ``chain_order`` (or the
      one named by the ``backend`` argument); on a classified failure the
      retry plugin falls over to the next configured backends (after the
      named one, for this call only).
    - ``web_search_brave``, ``web_search_exa``, ``web_search_searxng``: one
      backend only (key rotation and same-backend retries, no fallback).
    - ``search_<collection>`` for each ``[plugins.search.collections.<name>]``.

    Args:
        config: the validated ``[plugins.search]`` table (defaults when None).
        transport: an ``httpx`` transport for every request (tests, embedding);
            the caller keeps ownership of it.
        environ: where environment keys are read (default ``os.environ``).
        extra_backends: more ``Backend`` subclasses (see the README's
            "Adding a backend"); their settings live in ``backends.<name>``.
    """

    name = "search"
    order = 900
    Config = SearchConfig

    def __init__(
        self,
        config: SearchConfig | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        environ: Mapping[str, str] | None = None,
        extra_backends: Sequence[type[Backend]] = (),
    ) -> None:
        self.config = config or SearchConfig()
        self.backends: dict[str, Backend] = {}
        for cls in (*BUILTIN_BACKENDS, *extra_backends):
            if not _BACKEND_NAME.match(getattr(cls, "name", "")):
                raise ConfigError(
                    f"search backend {cls.__name__}: name must match {_BACKEND_NAME.pattern}"
                )
            if cls.name in self.backends:
                raise ConfigError(f"search backend {cls.name!r} is registered twice")
            backend = cls(self.config.backend_config(cls.name))
            backend.config_table = self._table(cls.name)
            self.backends[cls.name] = backend
        unknown = sorted(set(self.config.backends) - set(self.backends))
        if unknown:
            raise ConfigError(
                f"[plugins.search.backends] names unknown backends {unknown}; "
                f"known: {sorted(self.backends)}",
                key="plugins.search.backends",
            )
        for n in self.config.chain_order or []:
            if self._backend_name(n) is None:
                raise ConfigError(
                    f"chain_order names an unknown backend {n!r}; known: {sorted(self.backends)}",
                    key="plugins.search.chain_order",
                )
        self._transport = _BorrowedTransport(transport) if transport is not None else None
        self._environ = environ
        self._client: httpx.AsyncClient | None = None
        self._kernel: Kernel | None = None
        self._rl: RateLimitPlugin | None = None
        self._problems: dict[str, list[str]] = {}
        self._plan = _Plan()
        self._collections: dict[str, Collection | str] = {}
        self._locks: dict[str, anyio.Lock] = {}

    # ------------------------------------------------------------ access
    @classmethod
    def of(cls, kernel: Kernel) -> SearchPlugin:
        """The search plugin registered on ``kernel`` (LookupError if there is none)."""
        for info in kernel.plugins.plugins.values():
            if isinstance(info.plugin, cls):
                return info.plugin
        raise LookupError(
            "the search plugin is not loaded on this kernel; install toolwire-search and "
            "enable it (enabled_plugins) or pass SearchPlugin() to Kernel(plugins=[...])"
        )

    @property
    def client(self) -> httpx.AsyncClient | None:
        """The shared HTTP client (open between startup and shutdown)."""
        return self._client

    def status(self) -> dict[str, Any]:
        """Backends (configured, key aliases, problems), the chain, and collections.

        Never shows a key or an instance URL: aliases only.
        """
        backends: dict[str, Any] = {}
        for name, b in self.backends.items():
            pool = self._rl.pool(name) if self._rl is not None else None
            backends[name] = {
                "enabled": b.config.enabled,
                "configured": bool(pool is not None and pool.has_keys),
                "keys": pool.aliases if pool is not None else [],
                "env": b.env,
                "problems": list(self._problems.get(name, [])),
            }
        cols: dict[str, Any] = {}
        for name, c in self._collections.items():
            if isinstance(c, str):
                cols[name] = {"error": c}
            else:
                cols[name] = {
                    "root": str(c.root),
                    "files": c.files,
                    "passages": len(c.index),
                    "skipped": list(c.skipped),
                }
        return {
            "chain": list(self._plan.chain),
            "configured": list(self._plan.configured),
            "backends": backends,
            "collections": cols,
        }

    # ------------------------------------------------------------- hooks
    @hookimpl
    async def startup(self, kernel: Kernel) -> None:
        """Open the shared HTTP client, register the backends' keys with the KeyPool."""
        self._kernel = kernel
        self._locks = {n: anyio.Lock() for n in self.config.collections}
        try:
            self._rl = RateLimitPlugin.of(kernel)
        except LookupError:
            self._rl = None
            why = (
                str(plugin_not_loaded(kernel.config, "ratelimit"))
                if kernel.config is not None
                else "the ratelimit plugin is not loaded (pass RateLimitPlugin() to Kernel)"
            )
            log.warning(
                "plugin 'search': %s; web search tools answer config_error until it is "
                "(it holds the API keys)",
                why,
            )
        self._problems = {}
        if self._rl is not None:
            for b in self.backends.values():
                if b.config.enabled:
                    self._register(self._rl, b)  # may raise: nothing is open yet
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=self.config.timeout_seconds,
            proxy=self.config.proxy if self._transport is None else None,
            # only what _read decodes itself, within max_answer_bytes
            headers={"User-Agent": self.config.user_agent, "Accept-Encoding": ACCEPT_ENCODING},
            follow_redirects=False,  # keys travel in headers: never to another host
        )
        for name, cfg in self.config.collections.items():
            if cfg.reload_interval_s:
                kernel.spawn(
                    self._reload_loop, name, cfg.reload_interval_s, name=f"search: reload {name}"
                )

    @hookimpl
    async def shutdown(self) -> None:
        """Close the shared HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        self._kernel = None

    @hookimpl
    async def discover(self, kernel: Kernel, query: str | None) -> list[Tool] | None:
        """The search tools (for a full listing; nothing extra for a query)."""
        if query is not None:
            return None
        self._plan = self._make_plan(kernel)
        tools = self._web_tools()
        self._register_fallbacks(kernel)
        for name in self.config.collections:
            await self._refresh_collection(name)
            tools.append(self._collection_tool(name))
        return tools

    # ------------------------------------------------------------- keys
    def _register(self, rl: RateLimitPlugin, b: Backend) -> None:
        keys: list[ApiKey] = []
        problems = self._problems.setdefault(b.name, [])
        where = b.table
        entries: list[tuple[str | None, str, int, str]] = []
        given: dict[str, int] = {}  # alias -> the entry (1-based) that has it
        field = "urls" if b.key_is_base_url else "api_keys"
        plain: set[int] = set()  # entries without an alias: named after their place
        for i, e in enumerate(b.config.entries(), 1):
            own = e.alias if isinstance(e, KeyEntry) else f"{b.name}-{i}"
            if not isinstance(e, KeyEntry):
                plain.add(i)
            if own in given:
                # said here: the pool's "duplicate key aliases; give its keys in one place"
                # sent the reader to the wrong fix
                named = [
                    f"entry {n} " + ("(no alias: named after its place)" if n in plain else "")
                    for n in (given[own], i)
                ]
                example = f'{{alias = "...", {"url" if b.key_is_base_url else "secret"} = ...}}'
                raise ConfigError(
                    f"{where} {field}: {' and '.join(n.strip() for n in named)} both have "
                    f"alias {own!r}; give each its own alias ({example})"
                )
            given[own] = i
            if isinstance(e, KeyEntry):
                entries.append((e.alias, e.secret.get_secret_value(), e.weight, where))
            elif isinstance(e, SecretStr):
                entries.append((own, e.get_secret_value(), 1, where))
        if not entries:
            pc = rl.provider_config(b.name)
            if pc is not None and (pc.keys or pc.api_key is not None):
                return  # keys configured in [plugins.ratelimit.providers.<name>]
            env = self._environ if self._environ is not None else os.environ
            n = 0
            for var in b.env:
                for part in (env.get(var) or "").split(","):
                    if part.strip():
                        n += 1
                        entries.append((f"{b.name}-{n}", part.strip(), 1, var))
        for alias, secret, weight, origin in entries:
            if b.key_is_base_url and not secret.startswith(("http://", "https://")):
                problems.append(f"{origin}: {alias} is not an http:// or https:// URL (ignored)")
                continue
            if b.key_is_base_url and (bad := url_problem(secret)) is not None:
                # sent, it fails every request with a bare InvalidURL, before any fallback
                problems.append(f"{origin}: {alias} is not a valid URL: {bad} (ignored)")
                continue
            if not b.key_is_base_url and (bad := _unsendable(secret)) is not None:
                # sent, it fails every request with a bare UnicodeEncodeError, before any
                # fallback; the character is named, never the key
                problems.append(
                    f"{origin}: {alias} holds {bad}, which an HTTP header cannot carry (a "
                    "copied quote or space? several keys are comma-separated); fix the key "
                    "(ignored)"
                )
                continue
            keys.append(ApiKey(str(alias), secret, weight))
        for problem in problems:
            log.warning("plugin 'search': backend %s: %s", b.name, problem)
        if not keys:
            return
        try:
            rl.register_keys(b.name, keys, **b.config.pool)
        except ConfigError as exc:
            raise ConfigError(
                f"search backend {b.name!r}: {exc}; give its keys in one place "
                f"({where} or [plugins.ratelimit.providers.{b.name}])"
            ) from None
        log.info(
            "plugin 'search': backend %s has %d key(s): %s",
            b.name,
            len(keys),
            [k.alias for k in keys],
        )

    def _configured(self, name: str) -> bool:
        b = self.backends.get(name)
        if b is None or not b.config.enabled or self._rl is None:
            return False
        return self._rl.pool(name).has_keys

    # ------------------------------------------------------------- chain
    def _backend_name(self, entry: str) -> str | None:
        name = entry.removeprefix("web_search_")
        return name if name in self.backends else None

    @staticmethod
    def _retry(kernel: Kernel) -> RetryPlugin | None:
        for info in kernel.plugins.plugins.values():
            if isinstance(info.plugin, RetryPlugin):
                return info.plugin
        return None

    def _make_plan(self, kernel: Kernel) -> _Plan:
        order: list[str] | None = self.config.chain_order
        if order is None:
            retry = self._retry(kernel)
            if retry is not None and retry.config.chain_order:
                order = retry.config.chain_order
        if order is None and self._rl is not None and self._rl.settings.chain_order:
            order = self._rl.settings.chain_order
        names: list[str] = []
        for entry in order or []:
            n = self._backend_name(entry)
            if n is not None and n not in names:
                names.append(n)
        if not names:
            names = [n for n in DEFAULT_CHAIN if n in self.backends]
            names += [n for n in self.backends if n not in names]
        chain = [n for n in names if self.backends[n].config.enabled]
        return _Plan(chain, [n for n in chain if self._configured(n)])

    def _register_fallbacks(self, kernel: Kernel) -> None:
        """Tell the retry plugin where web_search falls over to (the operator's own
        lists win: ``set_fallbacks`` keeps them).

        web_search -> the forced tools of the configured backends after the
        first; web_search_<backend> -> nothing (forced means forced).
        """
        retry = self._retry(kernel)
        if retry is None:
            return
        first = [f"web_search_{n}" for n in self._plan.configured[1:]]
        self._plan.own_fallbacks = retry.set_fallbacks("web_search", first, source=self.name)
        for n, b in self.backends.items():
            if b.config.enabled:
                retry.set_fallbacks(f"web_search_{n}", [], source=self.name)

    def _call_fallbacks(self, ctx: CallContext, chosen: str) -> None:
        """web_search with an explicit ``backend``: this call falls over to the
        configured backends after ``chosen`` in the chain — never to ``chosen`` again,
        never to a disabled backend. With the operator's own list for web_search,
        that list without ``chosen``."""
        if ctx.call.name != "web_search":
            return  # web_search as some other tool's fallback: that call's chain stands
        retry = self._retry(ctx.kernel)
        if retry is None:
            return
        targets: list[str | FallbackSpec]
        if self._plan.own_fallbacks:
            chain = self._plan.chain
            after = chain[chain.index(chosen) + 1 :] if chosen in chain else []
            targets = [f"web_search_{n}" for n in after if n in self._plan.configured]
        else:
            mine = {chosen, f"web_search_{chosen}"}
            targets = [s for s in retry.fallbacks_for("web_search") if s.tool not in mine]
        retry.set_call_fallbacks(ctx, targets)

    # ------------------------------------------------------------- tools
    def _web_tools(self) -> list[Tool]:
        names = [n for n, b in self.backends.items() if b.config.enabled]
        schema = input_schema(names)
        out_schema = output_schema()
        chain = self._plan.configured or self._plan.chain

        def validator(args: Mapping[str, Any]) -> dict[str, Any]:
            return validate_query(args, names)

        walk = " -> ".join(chain) if chain else "none configured"
        tools = [
            Tool(
                name="web_search",
                description=(
                    "Search the web. Returns results (title, url, snippet, date, score) and "
                    f"which backend served them. Backends, in order: {walk}; when one fails "
                    "(rate limit, quota, outage) the next one answers."
                ),
                input_schema=schema,
                executor=self._web_executor("web_search", None),
                output_schema=out_schema,
                validator=validator,
                tags=frozenset({"search", "web"}),
                source="search",
                annotations=_web_annotations("Web search"),
                settings={"provider": chain[0]} if chain else {},
            )
        ]
        for n in names:
            b = self.backends[n]
            tools.append(
                Tool(
                    name=f"web_search_{n}",
                    description=(
                        f"Search the web with {b.title} only (no other backend). Returns "
                        "results (title, url, snippet, date, score)."
                    ),
                    input_schema=schema,
                    executor=self._web_executor(f"web_search_{n}", n),
                    output_schema=out_schema,
                    validator=validator,
                    tags=frozenset({"search", "web", n}),
                    source="search",
                    annotations=_web_annotations(f"Web search ({b.title})"),
                    settings={"provider": n},
                )
            )
        return tools

    def _web_executor(self, tool: str, fixed: str | None) -> Any:
        async def run(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
            return await self._run_web(tool, fixed, args, ctx)

        return run

    async def _run_web(
        self, tool: str, fixed: str | None, args: dict[str, Any], ctx: CallContext
    ) -> dict[str, Any]:
        q = SearchQuery.model_validate(args)
        warnings = _trail(ctx)
        if fixed is not None:
            name = fixed
            if q.backend not in ("auto", fixed) and ctx.call.name == tool:
                warnings.append(f"{tool} always uses {fixed}; backend {q.backend!r} was ignored")
        elif q.backend != "auto":
            name = q.backend
            b = self.backends.get(name)
            if b is None or not b.config.enabled:
                raise _config_error(f"{tool}: backend {name!r} is disabled", backend=name)
            self._call_fallbacks(ctx, name)
        else:
            if not self._plan.configured:
                raise self._nothing_configured(tool)
            name = self._plan.configured[0]
        return await self._search(tool, self.backends[name], q, ctx, warnings)

    def _nothing_configured(self, tool: str) -> ToolError:
        if self._rl is None:
            return self._no_ratelimit(tool)
        parts = []
        for n in self._plan.chain:
            b = self.backends[n]
            parts.append(f"{' or '.join(b.env) or f'[plugins.search.{n}]'} ({b.title})")
        problems = [p for n in self._plan.chain for p in self._problems.get(n, [])]
        return _config_error(
            f"{tool}: no web search backend is configured; set "
            + ", or ".join(parts)
            + " — or give keys in [plugins.search.<backend>]"
            + (f" (problems: {'; '.join(problems)})" if problems else ""),
            env={n: self.backends[n].env for n in self._plan.chain},
        )

    @staticmethod
    def _no_ratelimit(tool: str) -> ToolError:
        return _config_error(
            f"{tool}: the search plugin takes its API keys from the ratelimit plugin, which is "
            "not loaded; install toolwire-ratelimit and enable it (enabled_plugins)"
        )

    async def _search(
        self, tool: str, b: Backend, q: SearchQuery, ctx: CallContext, warnings: list[str]
    ) -> dict[str, Any]:
        rl = self._rl
        if rl is None:
            raise self._no_ratelimit(tool)
        pool = rl.pool(b.name)
        if not pool.has_keys:
            problems = self._problems.get(b.name, [])
            raise _config_error(
                f"{tool}: {b.missing_key_message()}"
                + (f" (problems: {'; '.join(problems)})" if problems else ""),
                backend=b.name,
                env=b.env,
            )
        client = self._client
        if client is None:
            raise ToolError(
                f"{tool}: the search plugin is not started, or its kernel closed it (its HTTP "
                "client is closed); start the kernel (`async with kernel` or kernel.start()) "
                "and call again",
                kind=ErrorKind.UNAVAILABLE,
            )
        now = ctx.kernel.clock.time()
        timeout = b.config.timeout_seconds or self.config.timeout_seconds
        async with pool.lease(ctx) as lease:
            secret, alias = lease.secret or "", lease.alias
            who = f"{b.name} ({alias})" if alias else b.name
            req = b.build_request(q, secret=secret, base_url=b.base_url(secret), now=now)
            try:
                # httpx times each step (connect, each read); the whole answer has the
                # same time, so a provider dripping a byte a second cannot hold the call
                with anyio.fail_after(timeout):
                    async with client.stream(
                        req.method,
                        req.url,
                        params=req.params or None,
                        json=req.json,
                        headers=req.headers,
                        timeout=timeout,
                    ) as streamed:
                        resp = await self._read(b, streamed, who)
            except (httpx.TimeoutException, TimeoutError) as exc:
                raise ToolError(
                    f"{who}: no complete answer within {timeout:g}s ({type(exc).__name__})",
                    kind=ErrorKind.TIMEOUT,
                    details={"backend": b.name},
                ) from exc
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise _config_error(
                    f"{who}: invalid URL ({type(exc).__name__}); check the backend's base URL",
                    backend=b.name,
                ) from None
            except httpx.HTTPError as exc:
                raise ToolError(
                    f"{who}: {type(exc).__name__}: {exc}",
                    kind=ErrorKind.UNAVAILABLE,
                    details={"backend": b.name},
                ) from exc
            status = resp.status_code
            if 300 <= status < 400:
                raise _config_error(
                    f"{who}: HTTP {status} redirect; redirects are not followed (keys travel in "
                    "headers): set the backend's base URL to the final address",
                    backend=b.name,
                    status=status,
                    failover=True,
                )
            if status == 404:
                # the endpoint is fixed: no such page is a wrong base URL (an instance URL
                # given with /search...), not the query's fault nor the key's
                raise self._not_found(b, who, req.url)
            if status >= 400:
                err = b.error_for(resp, alias)
                if isinstance(err, KeyExhausted) and alias is not None:
                    # only this key: put it aside, don't suspend the provider
                    await pool.report(
                        alias,
                        "rate_limit",
                        retry_after_s=pool.settings.suspend_s,
                        pattern=f"search.{b.name}.key_exhausted",
                    )
                    err.details.update(
                        classified_by="search",
                        failover=True,
                        provider=b.name,
                        key=alias,
                        pattern=f"search.{b.name}.key_exhausted",
                    )
                raise err
            try:
                data = b.decode(resp, alias)
            except RecursionError:  # json: nested deeper than the interpreter's stack
                data = None
                too_deep = True
            else:
                too_deep = deeper_than(data, MAX_ANSWER_DEPTH)
            if too_deep:
                # a broken (or hostile) answer: not a crash, nor a result the kernel cannot
                # serialize (its limit is some 250 levels), but the provider's fault
                raise ToolError(
                    f"{who}: unexpected answer: JSON nested deeper than {MAX_ANSWER_DEPTH} levels",
                    kind=ErrorKind.UNAVAILABLE,
                    details={"backend": b.name},
                )
            page = b.parse(data, q)
            exhausted = b.exhaustion(resp, now)
        if exhausted is not None and alias is not None:
            # bookkeeping after the answer came: neither a store outage nor a cancellation
            # during it may cost the results (shielded, bounded)
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_BOOKKEEPING_S) as slow:
                    await pool.report(
                        alias,
                        "quota",
                        retry_after_s=exhausted.retry_after_s,
                        pattern=f"search.{b.name}.exhausted",
                        reason=exhausted.reason,
                    )
                set_aside = "the key is set aside until its reset"
                if slow.cancelled_caught:
                    log.warning(
                        "%s: could not set the used-up key aside: the state store did not "
                        "answer within %gs",
                        who,
                        _BOOKKEEPING_S,
                    )
                    set_aside = "the key could not be set aside (the state store did not answer)"
            except StateStoreError as exc:
                log.warning("%s: could not set the used-up key aside: %s", who, exc)
                set_aside = "the key could not be set aside (the state store failed)"
            warnings.append(f"{who}: {exhausted.reason}; {set_aside}")
        results = page.results
        if req.filter_domains:
            results = [r for r in results if q.wants(r["url"])]
        if req.filter_dates:
            results = _within_dates(results, q, now)
        results = results[: q.max_results]
        warnings.extend(req.warnings)
        warnings.extend(page.warnings)
        metadata: Any = {b.name: page.metadata}
        if secret and not b.key_is_base_url:
            # a provider echoing the key in a success body; before any cut, which could
            # leave a part of the key that no longer matches
            echoed = {"results": results, "warnings": warnings, "metadata": metadata}
            # the redactor's test: the key URL-encoded (echoed in a result's URL) too
            if rl.redactor.contains(json.dumps(echoed, default=str)):
                echoed = rl.redactor.value(echoed)
                results, warnings, metadata = (
                    echoed["results"],
                    echoed["warnings"],
                    echoed["metadata"],
                )
        shown = warnings[:_MAX_WARNINGS]
        limit = self.config.max_field_chars
        if limit is not None:
            results, cut = cut_long_text(results, limit)
            metadata, cut_meta = cut_long_text(metadata, limit)
            if cut + cut_meta:
                # kept whatever the cap: the answer was altered, and it must say so
                shown = [
                    *warnings[: _MAX_WARNINGS - 1],
                    f"{who}: {cut + cut_meta} text fields longer than {limit} characters were "
                    "cut ([plugins.search] max_field_chars)",
                ]
        out: dict[str, Any] = {
            "results": results,
            "served_by": b.name,
            "warnings": shown,
            "provider_metadata": metadata,
        }
        if not results:
            self._soft_failure(tool, b, page.failure, out, ctx)
        return out

    def _not_found(self, b: Backend, who: str, url: str) -> ToolError:
        """HTTP 404: a ``config_error`` naming the URL asked and the key that sets it."""
        shown = httpx.URL(url).copy_with(query=None, username=None, password=None)
        field = "urls" if b.key_is_base_url else "base_url"
        env = f" (or {' / '.join(b.env)})" if b.key_is_base_url and b.env else ""
        return _config_error(
            f"{who}: HTTP 404 Not Found at {shown}: the base URL is wrong; fix "
            f"[{self._table(b.name)}] {field}{env}",
            backend=b.name,
            status=404,
            failover=True,
        )

    async def _read(self, b: Backend, resp: httpx.Response, who: str) -> httpx.Response:
        """``resp`` with its body read: a success up to the backend's ``max_answer_bytes``
        (decompressed), an error's first ``MAX_ERROR_BODY`` bytes, a redirect's nothing.

        An answer over the cap fails as it arrives, before it is all read, and
        nothing of it is kept; leaving ``client.stream`` then drops the connection.
        """
        status = resp.status_code
        if 300 <= status < 400:
            return with_body(resp, b"")
        if status >= 400:
            return with_body(resp, await read_answer(resp, MAX_ERROR_BODY + 1, cut=True))
        limit = b.max_answer_bytes
        try:
            return with_body(resp, await read_answer(resp, limit))
        except AnswerTooLarge as exc:
            table = self._table(b.name)
            declared = f" (Content-Length {exc.declared})" if exc.declared is not None else ""
            details: dict[str, Any] = {
                "backend": b.name,
                "answer_too_large": True,
                "max_answer_bytes": limit,
            }
            if exc.declared is not None:
                details["content_length"] = exc.declared
            # a broken answer, the provider's fault: unavailable, like one that is not JSON
            raise ToolError(
                f"{who}: the answer is over max_answer_bytes = {limit} bytes{declared}; it "
                f"was dropped and the rest not read. Raise [{table}] max_answer_bytes if "
                "this backend's answers are expected to be that large",
                kind=ErrorKind.UNAVAILABLE,
                details=details,
            ) from None
        except UndecodableAnswer as exc:
            raise ToolError(
                f"{who}: the answer cannot be read: {exc}",
                kind=ErrorKind.UNAVAILABLE,
                details={"backend": b.name},
            ) from None

    @staticmethod
    def _table(name: str) -> str:
        """The config table of backend ``name``."""
        builtin = name in {c.name for c in BUILTIN_BACKENDS}
        return f"plugins.search.{name}" if builtin else f"plugins.search.backends.{name}"

    def _soft_failure(
        self, tool: str, b: Backend, failure: str | None, out: dict[str, Any], ctx: CallContext
    ) -> None:
        """An empty answer: a success, unless the backend could not search (every
        SearXNG engine failed) or ``fallback_on_empty`` is on."""
        if failure is None and not self.config.fallback_on_empty:
            return
        current = ctx.current_tool.name if ctx.current_tool is not None else tool
        if failure is not None:
            out["warnings"] = [*out["warnings"], f"{b.name}: {failure}"][:_MAX_WARNINGS]
        if self._kernel is not None and self._retry(self._kernel) is not None:
            # the retry plugin's soft failure: fall over; if every candidate is empty or
            # failed, the first empty answer (with its warnings) is the result
            exc = EmptyResult(current, out)
            if failure is not None:
                exc.args = (f"{b.name}: {failure}",)
                exc.details["pattern"] = f"search.{b.name}.backend_failed"
            exc.details.update(backend=b.name, provider=b.name)
            raise exc
        if failure is not None:
            # classified here: the engines' own messages ("too many requests") describe
            # the engines behind the instance, not a rate limit of the instance itself
            raise ToolError(
                f"{b.name}: {failure}",
                kind=ErrorKind.UNAVAILABLE,
                details={
                    "backend": b.name,
                    "provider": b.name,
                    "classified_by": "search",
                    "pattern": f"search.{b.name}.backend_failed",
                    "failover": True,
                },
            )

    # ------------------------------------------------------- collections
    def _collection_base(self) -> str | None:
        """The folder a relative collection path is read from: toolwire.toml's (None: the
        working directory, for a kernel configured in code)."""
        kcfg = self._kernel.config if self._kernel is not None else None
        return os.path.dirname(kcfg.path) if kcfg is not None and kcfg.path else None

    async def _refresh_collection(self, name: str) -> None:
        """(Re)index a collection when its files changed (or it failed before)."""
        cfg = self.config.collections[name]
        base = self._collection_base()
        root = resolve_root(cfg.path, base)
        lock = self._locks.setdefault(name, anyio.Lock())
        async with lock:
            problem = root_problem(cfg.path, root, base)
            if problem is not None:
                key = f"plugins.search.collections.{name}.path"
                kcfg = self._kernel.config if self._kernel is not None else None
                fix = (  # blame the environment variable the path came from, not the file
                    f"fix {kcfg.source_of(key)}"
                    if kcfg is not None and kcfg.env_var_of(key)
                    else f"fix [plugins.search.collections.{name}] path"
                )
                self._collections[name] = f"collection {name!r}: {problem}; {fix}"
                log.warning("plugin 'search': %s", self._collections[name])
                return
            current = self._collections.get(name)
            if isinstance(current, Collection) and current.root == root:
                sig = await anyio.to_thread.run_sync(
                    signature, root, cfg.include, cfg.exclude, cfg.max_files
                )
                if sig == current.signature:
                    return
            col = await anyio.to_thread.run_sync(
                lambda: load_collection(
                    name,
                    root,
                    include=cfg.include,
                    exclude=cfg.exclude,
                    chunk_words=cfg.chunk_words,
                    overlap_words=cfg.overlap_words,
                    max_file_bytes=cfg.max_file_bytes,
                    max_files=cfg.max_files,
                )
            )
            self._collections[name] = col
            log.info(
                "plugin 'search': collection %r: %d files, %d passages%s",
                name,
                col.files,
                len(col.index),
                f", {len(col.skipped)} skipped" if col.skipped else "",
            )

    async def _reload_loop(self, name: str, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                await self._refresh_collection(name)
            except Exception:  # a transient file-system error must not end the loop
                log.exception("plugin 'search': re-indexing collection %r failed", name)

    def _collection_tool(self, name: str) -> Tool:
        cfg = self.config.collections[name]
        col = self._collections.get(name)
        size = f"{col.files} documents, " if isinstance(col, Collection) else ""
        description = cfg.description or (
            f"Search the {name!r} knowledge base ({size}local files in {cfg.path}). Returns the "
            "best-matching passages with their file, section and line numbers."
        )
        schema = {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1000,
                    "description": "What to look for (keywords work best).",
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "default": cfg.max_results,
                    "description": "How many passages to return.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        }

        def validator(args: Mapping[str, Any]) -> dict[str, Any]:
            v = _CollectionQuery.model_validate(args)
            return {"query": v.query, "max_results": v.max_results or cfg.max_results}

        async def run(args: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
            return await self._run_collection(name, args)

        return Tool(
            name=f"search_{name}",
            description=description,
            input_schema=schema,
            executor=run,
            output_schema=output_schema(),
            validator=validator,
            tags=frozenset({"search", "knowledge-base"}),
            source="search",
            annotations=ToolAnnotations(
                title=f"Search {name}",
                readOnlyHint=True,
                destructiveHint=False,
                idempotentHint=True,
                openWorldHint=False,
            ),
        )

    async def _run_collection(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config.collections[name]
        col = self._collections.get(name)
        if col is None:
            await self._refresh_collection(name)
            col = self._collections.get(name)
        if isinstance(col, str) or col is None:
            raise _config_error(str(col), collection=name)
        query = str(args["query"])
        limit = int(args.get("max_results") or cfg.max_results)
        warnings: list[str] = []
        if not tokenize(query):
            warnings.append("the query has no searchable words (only stopwords or symbols)")
        if col.skipped:
            shown = "; ".join(col.skipped[:5])
            more = f" and {len(col.skipped) - 5} more" if len(col.skipped) > 5 else ""
            warnings.append(f"files not indexed: {shown}{more}")
        hits = col.index.search(query, limit)
        return {
            "results": [result_of(name, c, s, terms, cfg.url_prefix) for c, s, terms in hits],
            "served_by": f"collection:{name}",
            "warnings": warnings,
            "provider_metadata": {
                "collection": {"name": name, "files": col.files, "passages": len(col.index)}
            },
        }


# ------------------------------------------------------------------ helpers
def _web_annotations(title: str) -> ToolAnnotations:
    """Web search reads the open world and changes nothing: safe to repeat."""
    return ToolAnnotations(
        title=title,
        readOnlyHint=True,
        destructiveHint=False,
        idempotentHint=True,
        openWorldHint=True,
    )


def _trail(ctx: CallContext) -> list[str]:
    """Warnings for the attempts that failed earlier in this call (fallback trail)."""
    out: list[str] = []
    details = ctx.meta.extra.get("attempt_details")
    lst = details if isinstance(details, list) else []
    for i, a in enumerate(ctx.attempts):
        if a.error_kind is None:
            continue
        d = lst[i] if i < len(lst) and isinstance(lst[i], dict) else {}
        who = d.get("provider") or a.tool
        key = f", key {d['key']}" if d.get("key") else ""
        out.append(f"attempt {i + 1}: {who} failed ({a.error_kind}{key})")
    return out


def _unsendable(secret: str) -> str | None:
    """The first character of ``secret`` an HTTP header value cannot carry (non-ASCII
    or a control character), described by code point and position; None if there is none."""
    for i, ch in enumerate(secret):
        if not (" " <= ch <= "~" or ch == "\t"):
            return f"U+{ord(ch):04X} at position {i + 1}"
    return None


def _within_dates(
    results: list[dict[str, Any]], q: SearchQuery, now: float
) -> list[dict[str, Any]]:
    """Drop results whose known publication date is outside the requested range."""
    start, end = q.date_bounds(now)
    if start is None and end is None:
        return results
    out = []
    for r in results:
        d = r.get("published_date")
        day = d[:10] if isinstance(d, str) and re.match(r"^\d{4}-\d{2}-\d{2}", d) else None
        if day is not None and (
            (start is not None and day < start.isoformat())
            or (end is not None and day > end.isoformat())
        ):
            continue
        out.append(r)
    return out
