"""The ``ratelimit`` plugin: classify failures (on_error), own the key pools and outbound rates."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio

from toolwire import (
    CallContext,
    CallRejected,
    ConfigError,
    ErrorInfo,
    Kernel,
    PluginError,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    hookimpl,
)
from toolwire.state import StateStoreError

from ._classify import (
    CLASSIFIABLE,
    KIND_RULES,
    Classification,
    Classifier,
    Pattern,
    PatternSet,
    TextRegex,
    default_patterns,
    request_not_sent,
    request_went_out,
)
from ._config import (
    KeySpec,
    PatternKeys,
    PatternSpec,
    ProviderConfig,
    RateLimitConfig,
    RateSpec,
    with_config_file,
)
from ._evidence import BODY_KEYS, Evidence, gather, json_excerpt
from ._hints import bound
from ._pool import BOOKKEEPING_S, ApiKey, KeyLease, KeyPool, PoolSettings, removed_provider
from ._redact import MIN_SECRET_LEN, Redactor
from ._store import LoopLock, Throttle, Throttled

__all__ = ["RateLimitPlugin", "attempt_detail"]

log = logging.getLogger("toolwire.ratelimit")

#: How often the deployment looks for the stored pools of providers no process configures
#: any more (``RateLimitPlugin.forget_removed_providers``): at most once per interval, by
#: the first process to write a pool after it (a marker in the state store says when).
SWEEP_INTERVAL_S = 3600.0

MAX_MESSAGE = 4096
MAX_DETAIL_BODY = 2048
_RELEVANT_HEADER = re.compile(
    r"^(?:retry-after(?:-ms)?|x-ratelimit-.*|ratelimit.*|x-rate-limit-.*|content-type)$"
)
#: Statuses of a gateway that had the request and gave up on its upstream: 502 Bad
#: Gateway, 504 Gateway Timeout, and Cloudflare's 524 (the origin took the request and did
#: not answer in time). The upstream may have acted.
_UPSTREAM_MAY_HAVE_ACTED = frozenset({502, 504, 524})
#: Server errors that say the request was turned away before anything was done: 501 Not
#: Implemented, 503 Service Unavailable, 505 HTTP Version Not Supported, 511 Network
#: Authentication Required, Cloudflare's 521-523 (the origin refused the connection, or
#: none could be made) and 529 (overloaded). Any other 5xx a tool reports as
#: ``unavailable`` (a 500 error page, 520 "unknown error from the origin") came from a
#: server that had the request: it may have acted.
_REFUSED_BEFORE_ACTING = frozenset({501, 503, 505, 511, 521, 522, 523, 529})


def attempt_detail(ctx: CallContext, attempt: int | None = None) -> dict[str, Any]:
    """The facts plugins record about one attempt: ``result.meta.extra["attempt_details"][i]``.

    The list is aligned with ``result.meta.attempts`` (index = attempt number - 1);
    ``attempt`` defaults to the attempt running now. The ratelimit plugin
    writes ``provider``, ``key`` (alias), ``kind``, ``pattern``,
    ``retry_after_s``; the retry plugin ``decision``, ``slept_ms``, ``to``, ``reason``.
    """
    n = attempt if attempt is not None else ctx.attempt
    lst = ctx.meta.extra.setdefault("attempt_details", [])
    while len(lst) < n:
        lst.append({"attempt": len(lst) + 1})
    detail: dict[str, Any] = lst[n - 1]
    return detail


def _align_details(ctx: CallContext) -> None:
    """Once any attempt has a detail, give every attempt one, so that
    ``attempt_details`` stays as long as ``meta.attempts`` (a retried tool with no
    provider that then succeeds has no fact about its last attempt)."""
    lst = ctx.meta.extra.get("attempt_details")
    if lst is not None and len(lst) < len(ctx.attempts):
        attempt_detail(ctx, len(ctx.attempts))


def _small_json(v: Any, max_depth: int = 16, max_nodes: int = 1000) -> bool:
    """Whether ``v`` is plain JSON data, at most ``max_depth`` deep and ``max_nodes`` large."""
    stack: list[tuple[Any, int]] = [(v, 0)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes or depth > max_depth:
            return False
        if isinstance(node, (dict, list)) and len(node) > max_nodes:
            return False
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node):
                return False
            stack.extend((x, depth + 1) for x in node.values())
        elif isinstance(node, list):
            stack.extend((x, depth + 1) for x in node)
        elif isinstance(node, str):
            if len(node) > MAX_DETAIL_BODY:
                return False
        elif not (node is None or isinstance(node, (bool, int, float))):
            return False
    return True


def _scope(
    prefix: str, keys: PatternKeys, timeout_s: float, clock: Callable[[], float]
) -> PatternSet:
    """The configured patterns of one scope; each text search is bounded by ``timeout_s``."""

    def text(pattern: str, pid: str, kind: str) -> TextRegex:
        return TextRegex(
            pattern,
            pattern_id=pid,
            timeout_s=timeout_s,
            timed_out_matches=kind == "deny",
            clock=clock,
        )

    ps = PatternSet()
    for kind, i, entry in keys.pattern_items():
        auto = f"{prefix}.{kind}_patterns[{i}]"
        if isinstance(entry, str):
            ps.add(Pattern(auto, kind, regex=text(entry, auto, kind)))
        else:
            assert isinstance(entry, PatternSpec)
            pid = entry.id or auto
            ps.add(
                Pattern(
                    pid,
                    kind,
                    regex=text(entry.regex, pid, kind) if entry.regex else None,
                    statuses=frozenset(entry.status) if entry.status else None,
                    exception=re.compile(entry.exception, re.IGNORECASE)
                    if entry.exception
                    else None,
                )
            )
    for status, kind in keys.retryable_statuses.items():
        ps.add(Pattern(f"{prefix}.retryable_statuses.{status}", kind, statuses=frozenset({status})))
    return ps


def _keys_of(provider: str, pc: ProviderConfig) -> list[ApiKey]:
    out: list[ApiKey] = []
    entries: list[Any] = list(pc.keys)
    if pc.api_key is not None:
        entries.append(pc.api_key)
    for i, k in enumerate(entries, 1):
        if isinstance(k, KeySpec):
            out.append(ApiKey(k.alias, k.secret.get_secret_value(), k.weight))
        else:
            out.append(ApiKey(f"{provider}-{i}", k.get_secret_value(), 1))
    return out


class RateLimitPlugin:
    """Classifies failures and owns the key pools (see docs/ratelimit.md).

    ``on_error`` refines the error in place — ``kind`` (``rate_limit``,
    ``quota``, ``auth``, ``unavailable``, ``timeout`` or terminal
    ``tool_error``), ``retryable``, ``retry_after_s``, and ``details``
    (``pattern``, ``provider``, ``key`` alias, ``failover``) — and returns None:
    the retry plugin decides.
    """

    name = "ratelimit"
    order = 400
    Config = RateLimitConfig

    def __init__(self, config: RateLimitConfig | None = None) -> None:
        self.config = config or RateLimitConfig()
        self._kernel: Kernel | None = None
        self._registered: dict[str, tuple[list[ApiKey], ProviderConfig | None]] = {}
        self._next_sweep: float | None = None
        self._stopping = False
        self._apply(self.config)
        if not self._tool_rates and not self.config.config_file:
            # No per-tool outbound rate can be configured later: drop the before_call hook
            # (an async hook costs every call ~0.4 µs for nothing).
            self.before_call = None  # type: ignore[method-assign,assignment]

    # ----------------------------------------------------------- config
    def _apply(self, cfg: RateLimitConfig) -> None:
        self.settings = cfg
        self.classifier = Classifier(
            defaults=default_patterns() if cfg.use_default_patterns else None,
            trust_declared_kinds=cfg.trust_tool_kinds,
            max_retry_after_s=cfg.max_retry_after_seconds,
            budget_s=cfg.pattern_budget(),
            clock=self._monotonic,
        )
        limit, clock = cfg.pattern_timeout_seconds, self._monotonic
        self._global = _scope("config", cfg, limit, clock)
        self._provider_scopes = {
            p: _scope(f"providers.{p}", pc, limit, clock) for p, pc in cfg.providers.items()
        }
        self._tool_scopes = {
            t: _scope(f"tools.{t}", tc, limit, clock) for t, tc in cfg.tools.items()
        }
        self._tool_provider: dict[str, str] = {}
        for p, pc in cfg.providers.items():
            for t in pc.tools:
                self._tool_provider[t] = p
        for t, tc in cfg.tools.items():
            if tc.provider:
                self._tool_provider[t] = tc.provider
        self._tool_rates = {t: tc.rate for t, tc in cfg.tools.items() if tc.rate is not None}
        self._throttles: dict[str, Throttle] = {}
        self._pools: dict[str, KeyPool] = {}
        self.redactor = Redactor()
        for p, pc in cfg.providers.items():
            self._check_keys(p, _keys_of(p, pc))
        for keys, _ in self._registered.values():
            self.redactor.update((k.alias, k.secret) for k in keys)

    def _check_keys(self, provider: str, keys: list[ApiKey]) -> None:
        aliases = [k.alias for k in keys]
        dup = sorted({a for a in aliases if aliases.count(a) > 1})
        if dup:
            raise ConfigError(f"provider {provider!r}: duplicate key aliases {dup}")
        for k in keys:
            if len(k.secret) < MIN_SECRET_LEN:
                log.warning(
                    "provider %r key %r is shorter than %d characters; it cannot be redacted "
                    "from error bodies reliably",
                    provider,
                    k.alias,
                    MIN_SECRET_LEN,
                )
        self.redactor.update((k.alias, k.secret) for k in keys)

    # ----------------------------------------------------------- access
    @classmethod
    def of(cls, kernel: Kernel) -> RateLimitPlugin:
        """The ratelimit plugin registered on ``kernel`` (LookupError if there is none)."""
        for info in kernel.plugins.plugins.values():
            if isinstance(info.plugin, cls):
                return info.plugin
        raise LookupError(
            "the ratelimit plugin is not loaded on this kernel; install toolwire-ratelimit and "
            "enable it (enabled_plugins) or pass RateLimitPlugin() to Kernel(plugins=[...])"
        )

    def bound_kernel(self) -> Kernel:
        """The kernel this plugin serves (bound at startup)."""
        if self._kernel is None:
            raise RuntimeError(
                "the ratelimit plugin is not started; use `async with kernel` or await kernel.start()"
            )
        return self._kernel

    def state_key(self, kind: str, name: str) -> str:
        """The StateStore key of a pool / rate bucket."""
        return f"{self.settings.state_prefix}:{kind}:{name}"

    def provider_of(self, tool: str | Tool | None) -> str | None:
        """The provider a tool belongs to: config (``providers.<p>.tools``,
        ``tools.<t>.provider``), else the tool's ``settings["provider"]``."""
        if tool is None:
            return None
        name = tool if isinstance(tool, str) else tool.name
        p = self._tool_provider.get(name)
        if p is not None:
            return p
        t = (
            tool
            if isinstance(tool, Tool)
            else (self._kernel.get_tool(name) if self._kernel else None)
        )
        if t is not None:
            sp = t.settings.get("provider")
            if isinstance(sp, str) and sp:
                return sp
        return None

    def tools_of(self, provider: str) -> list[str]:
        """Tools serving ``provider``: the configured list, else catalog tools naming it."""
        pc = self.settings.providers.get(provider)
        if pc is not None and pc.tools:
            return list(pc.tools)
        if self._kernel is None:
            return []
        return sorted(
            t.name
            for t in self._kernel.list_tools()
            if t.settings.get("provider") == provider or self._tool_provider.get(t.name) == provider
        )

    def provider_config(self, provider: str) -> ProviderConfig | None:
        """The configuration of ``provider`` (None when it is not configured)."""
        return self.settings.providers.get(provider)

    def providers(self) -> list[str]:
        """Every provider this plugin knows: configured in ``[plugins.ratelimit]`` or given keys
        from code (``register_keys``)."""
        return sorted(set(self.settings.providers) | set(self._registered))

    def pool(self, provider: str) -> KeyPool:
        """The key pool of ``provider`` (a keyless, health-only pool if it has no keys)."""
        pool = self._pools.get(provider)
        if pool is None:
            pool = self._build_pool(provider)
            self._pools[provider] = pool
        return pool

    def register_keys(
        self,
        provider: str,
        keys: Iterable[ApiKey | tuple[str, str] | tuple[str, str, int] | Mapping[str, Any]],
        **settings: Any,
    ) -> KeyPool:
        """Give ``provider`` keys from code (a tool source with its own key config).

        ``keys``: ``ApiKey`` objects, ``(alias, secret[, weight])`` tuples or
        mappings with ``alias``, ``secret``, ``weight``. ``settings``: the
        provider keys of the config (``cooldown_seconds``, ``rate``, ...), used
        when the provider is not configured in ``[plugins.ratelimit]``. Replaces
        any keys registered before; a quarantined key stays quarantined unless
        its secret changed.
        """
        out: list[ApiKey] = []
        for k in keys:
            if isinstance(k, ApiKey):
                out.append(k)
            elif isinstance(k, tuple):
                out.append(ApiKey(k[0], k[1], k[2] if len(k) > 2 else 1))
            else:
                spec = KeySpec.model_validate(k)
                out.append(ApiKey(spec.alias, spec.secret.get_secret_value(), spec.weight))
        pc = ProviderConfig.model_validate(settings) if settings else None  # typos fail here
        configured = self.settings.providers.get(provider)
        self._check_keys(provider, (_keys_of(provider, configured) if configured else []) + out)
        self._registered[provider] = (out, pc)
        self._pools.pop(provider, None)
        return self.pool(provider)

    async def stored_providers(self) -> list[str]:
        """Every provider whose pool the state store holds (``<state_prefix>:pool:*``), known
        here or not: a provider no process configures any more is kept until
        ``forget_removed_providers`` forgets it. Scans the state store."""
        prefix = self.state_key("pool", "")
        return [e.key[len(prefix) :] for e in await self.bound_kernel().state.scan(prefix)]

    async def forget_removed_providers(self) -> list[str]:
        """Delete the stored pools of providers no process configures any more; returns them.

        A pool record (``<state_prefix>:pool:<provider>``) of a provider this process does
        not know (not configured, given no keys from code, never used) is noted as unknown
        since now; any write of that pool by a process that uses the provider drops the
        note. Once the note is older than the provider's ``removed_key_grace_seconds`` (as
        the last process configuring it had it; else 7 days) and no cooldown, probe or
        suspension in it still runs, the record is deleted: the rule of removed key
        aliases, so replicas still listing the provider during a rolling change keep its
        quarantines. The plugin runs this in the background after a pool write, at most
        once every ``SWEEP_INTERVAL_S`` in a deployment; it scans the state store.
        """
        kernel = self.bound_kernel()
        store = kernel.state
        prefix = self.state_key("pool", "")
        known = set(self.providers()) | set(self._pools)
        forgotten: list[str] = []
        for entry in await store.scan(prefix):
            provider = entry.key[len(prefix) :]
            if provider in known:
                continue
            verdict, new = removed_provider(entry.value, kernel.clock.time())
            if verdict == "note":
                await store.compare_and_set(entry.key, new, expected_version=entry.version)
            elif verdict == "forget" and await store.compare_and_delete(
                entry.key, expected_version=entry.version
            ):
                forgotten.append(provider)
        if forgotten:
            log.info(
                "forgot the stored key pools of providers no process configured for their "
                "removed_key_grace_seconds: %s",
                forgotten,
            )
        return forgotten

    def _sweep_soon(self) -> None:
        """Start ``forget_removed_providers`` in the background when it is due (after a pool
        write: the kernel has started, and keys registered from code are known)."""
        kernel = self._kernel
        if kernel is None or self._stopping:
            return  # a write during the kernel's close starts nothing the close would not end
        now = self._monotonic()
        if self._next_sweep is not None and now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_INTERVAL_S
        kernel.spawn(self._sweep, name="ratelimit: forget removed providers")

    async def _sweep(self) -> None:
        kernel = self.bound_kernel()
        try:
            marker = self.state_key("sweep", "pools")
            if await kernel.state.set_if_absent(marker, True, ttl=SWEEP_INTERVAL_S) is None:
                return  # another process (or this one, restarted) swept within the interval
            await self.forget_removed_providers()
        except StateStoreError as exc:
            log.warning(
                "could not look for the stored key pools of removed providers (%s); "
                "trying again in %gs",
                exc,
                SWEEP_INTERVAL_S,
            )

    def _build_pool(self, provider: str) -> KeyPool:
        pc = self.settings.providers.get(provider)
        configured = pc is not None or provider in self._registered
        keys = _keys_of(provider, pc) if pc is not None else []
        if provider in self._registered:
            reg_keys, reg_pc = self._registered[provider]
            keys = keys + reg_keys
            if pc is None:
                pc = reg_pc
        if pc is None:
            pc = ProviderConfig()
        settings = PoolSettings(
            cooldown_s=pc.cooldown_seconds,
            max_cooldown_s=pc.max_cooldown_seconds,
            suspend_on_monthly_exhausted=pc.suspend_on_monthly_exhausted,
            suspend_s=pc.suspend_seconds,
            probe_timeout_s=pc.probe_timeout_seconds,
            removed_key_grace_s=pc.removed_key_grace_seconds,
            max_retry_after_s=self.settings.max_retry_after_seconds,
        )
        throttle = self._throttle(f"providers.{provider}", pc.rate) if pc.rate else None
        return KeyPool(provider, keys, settings, self, throttle, configured=configured)

    def _throttle(self, name: str, spec: RateSpec) -> Throttle:
        th = self._throttles.get(name)
        if th is None:
            kernel = self.bound_kernel()
            th = Throttle(
                name, spec, kernel.state, kernel.clock, self.state_key("rate", name), LoopLock()
            )
            self._throttles[name] = th
        return th

    # ----------------------------------------------------- classification
    def _scopes(self, tool: str | None, provider: str | None) -> list[PatternSet]:
        out = []
        if tool is not None and tool in self._tool_scopes:
            out.append(self._tool_scopes[tool])
        if provider is not None and provider in self._provider_scopes:
            out.append(self._provider_scopes[provider])
        out.append(self._global)
        return out

    def _now(self) -> float:
        return self._kernel.clock.time() if self._kernel is not None else time.time()

    def _monotonic(self) -> float:
        return self._kernel.clock.monotonic() if self._kernel is not None else time.monotonic()

    def classify(
        self,
        error: ErrorInfo | BaseException,
        *,
        tool: str | None = None,
        provider: str | None = None,
    ) -> Classification:
        """Classify an error or exception without changing anything (for tools and tests)."""
        if isinstance(error, ErrorInfo):
            ev = gather(error, max_body=self.settings.max_body_bytes)
        else:
            ev = gather(None, error, max_body=self.settings.max_body_bytes)
        provider = provider or ev.provider or self.provider_of(tool)
        return self.classifier.classify(ev, self._scopes(tool, provider), now=self._now())

    def classify_exception(
        self, exc: BaseException, *, provider: str | None, lease: KeyLease | None = None
    ) -> tuple[Classification, Evidence]:
        """(classification, evidence) of an exception a tool raised inside a lease."""
        ev = gather(None, exc, max_body=self.settings.max_body_bytes)
        tool = self._lease_tool(lease, provider)
        c = self.classifier.classify(ev, self._scopes(tool, provider), now=self._now())
        return c, ev

    def _lease_tool(self, lease: KeyLease | None, provider: str | None) -> str | None:
        """The tool whose patterns classify a failure inside ``lease``: the tool running
        now (also after a Fallback) when it belongs to ``provider`` or to none."""
        if lease is None or lease.ctx is None:
            return None
        current = lease.ctx.current_tool
        name = current.name if current is not None else lease.ctx.call.name
        return name if self.provider_of(name) in (None, provider) else None

    def _details(
        self, c: Classification, ev: Evidence | None, provider: str | None, alias: str | None
    ) -> dict[str, Any]:
        d: dict[str, Any] = {"classified_by": "ratelimit", **c.to_details()}
        if provider:
            d["provider"] = provider
        if alias:
            d["key"] = alias
        if ev is not None:
            if c.kind == "unavailable" and (
                request_went_out(ev)
                or ev.status in _UPSTREAM_MAY_HAVE_ACTED
                or (
                    ev.status is not None
                    and ev.status >= 500
                    and ev.status not in _REFUSED_BEFORE_ACTING
                )
            ):
                # the connection broke after the request went out, a gateway gave up on
                # an upstream that had the request, or a server failed while handling it
                # (a 500 a tool declared `unavailable`, or one configured retryable): the
                # outcome is unknown (the retry plugin does not repeat a tool with side
                # effects then)
                d["in_flight"] = True
            elif c.kind == "timeout" and (ev.status == 408 or request_not_sent(ev)):
                # the server timed out reading the request, or no connection was made
                d["in_flight"] = False
            if ev.status is not None:
                d["status"] = ev.status
            hdrs = {k: v for k, v in ev.headers.items() if _RELEVANT_HEADER.match(k)}
            if hdrs:
                d["headers"] = hdrs
            if ev.body_text:
                d["body"] = ev.body_text[:MAX_DETAIL_BODY]
                if len(ev.body_text) > MAX_DETAIL_BODY:
                    d["body_truncated"] = True
        return d

    # ------------------------------------------------------------- leases
    def _call_state(self, ctx: CallContext) -> dict[int, dict[str, Any]]:
        st = ctx.state.get("ratelimit")
        if st is None:
            st = ctx.state["ratelimit"] = {}
        leases: dict[int, dict[str, Any]] = st
        return leases

    def _note_lease(self, ctx: CallContext, lease: KeyLease, waited: float) -> None:
        self._call_state(ctx)[ctx.attempt] = {"provider": lease.provider, "alias": lease.alias}
        d = attempt_detail(ctx)
        d["provider"] = lease.provider
        if lease.alias is not None:
            d["key"] = lease.alias
        if lease.probe:
            d["probe"] = True
        if waited:
            d["throttled_ms"] = round(waited * 1000.0, 3)

    async def _lease_failed(self, lease: KeyLease, exc: Exception) -> ToolError | None:
        """Classify and report a failure inside a lease; a redacted replacement if the
        exception's text holds a key."""
        if isinstance(exc, ToolError) and (
            exc.details.get("classified_by") or str(exc.kind) not in CLASSIFIABLE
        ):
            # already classified (a nested pool), or a kind the tool chose on purpose
            # (config_error, invalid_args...): not the key's fault
            await lease.release()
            return None
        c, ev = self.classify_exception(exc, provider=lease.provider, lease=lease)
        suspended_s = await lease._report(c)
        self._remember(lease, c, ev, suspended_s)
        if not (self.redactor and (self.redactor.contains(ev.text) or self._exc_has_secret(exc))):
            return None
        msg = self.redactor.text(f"{type(exc).__name__}: {exc}")[:MAX_MESSAGE]
        details = self.redactor.value(self._details(c, ev, lease.provider, lease.alias))
        details["redacted"] = True
        return ToolError(
            msg + " (a key was redacted; the original exception chain was dropped)",
            kind=c.kind,
            retry_after_s=c.retry_after_s,
            details=details,
        )

    def _remember(
        self,
        lease: KeyLease,
        c: Classification,
        ev: Evidence,
        suspended_s: float | None,
        *,
        exc: BaseException | None = None,
    ) -> None:
        """Keep a lease's classification of its attempt's failure for ``on_error``, which
        then does not search the same patterns again (a second pattern budget).

        ``exc``: the exception ``KeyLease.failure`` was given; ``on_error`` uses the
        classification only for an error carrying that very exception."""
        if lease.ctx is None:
            return
        rec = self._call_state(lease.ctx).get(lease.attempt or 0)
        if rec is None:
            return
        rec["c"], rec["ev"] = c, ev
        rec["tool"] = self._lease_tool(lease, lease.provider)  # whose patterns it had
        if exc is None:
            rec.pop("exc", None)
        else:
            rec["exc"] = exc
        if suspended_s is not None:
            rec["suspended_until"] = self._now() + suspended_s

    def _exc_has_secret(self, exc: BaseException) -> bool:
        try:
            return self.redactor.contains(f"{exc!s}\n{exc!r}")
        except Exception:
            return True

    # -------------------------------------------------------------- hooks
    @hookimpl
    def startup(self, kernel: Kernel) -> None:
        if self._kernel is not None and self._kernel is not kernel:
            raise PluginError(
                self.name, "one plugin instance serves one kernel; create another RateLimitPlugin"
            )
        self._kernel = kernel
        self._stopping = False
        if self.config.config_file:
            self._apply(with_config_file(self.config, kernel, "plugins.ratelimit"))

    @hookimpl
    def shutdown(self, kernel: Kernel) -> None:
        self._stopping = True

    @hookimpl
    async def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        if not self._tool_rates:
            return
        spec = self._tool_rates.get(call.name)
        if spec is None:
            return
        try:
            waited = await self._throttle(f"tools.{call.name}", spec).take(ctx.time_left())
        except Throttled as exc:
            raise CallRejected(
                "rate_limit",
                f"outbound rate limit of tool {call.name!r} reached ({spec.requests:g} per "
                f"{spec.per_seconds:g}s); retry in {exc.wait_s:.3f}s",
                retryable=True,
                retry_after_s=exc.wait_s,
                details={"pattern": f"outbound.tools.{call.name}", "classified_by": "ratelimit"},
            ) from None
        if waited:
            ctx.meta.extra["throttled_ms"] = round(waited * 1000.0, 3)

    async def _report_provider(self, provider: str, c: Classification) -> float | None:
        """Record a keyless rate limit or quota of ``provider`` (the seconds its pool is now
        suspended for, or None). Shielded and bounded: the call's deadline cutting the
        ``on_error`` hook, or a failing store, must cost neither the record nor the
        classification, which is done already."""
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(BOOKKEEPING_S) as slow:
                return await self.pool(provider).report(
                    None, c.kind, retry_after_s=c.retry_after_s, pattern=c.pattern
                )
            if slow.cancelled_caught:
                raise StateStoreError(f"the state store did not answer within {BOOKKEEPING_S:g}s")
        except StateStoreError as exc:
            log.warning(
                "provider %r: could not record its %s (%s); the error is classified all the "
                "same, but the provider's pool is not suspended",
                provider,
                c.kind,
                exc,
            )
        return None

    @hookimpl
    async def on_error(self, call: ToolCall, error: ErrorInfo, ctx: CallContext) -> None:
        leases = ctx.state.get("ratelimit")
        rec = leases.get(ctx.attempt) if leases else None
        provider: str | None = (rec or {}).get("provider") or error.details.get("provider")
        if not isinstance(provider, str):
            provider = self.provider_of(call.name)
        alias = (rec or {}).get("alias")
        c: Classification | None = None
        ev: Evidence | None = None
        suspended_until: float | None = (rec or {}).get("suspended_until")
        if error.details.get("classified_by"):
            kind = str(error.kind)
            error.retryable = (
                not error.details.get("denied") and KIND_RULES.get(kind, (False, False))[0]
            )
        elif str(error.kind) in CLASSIFIABLE:
            if (
                rec is not None
                and rec.get("c") is not None
                and rec.get("exc", error.exception) is error.exception
            ):
                c, ev = rec["c"], rec["ev"]
                # Classified anew only when the lease's classification lacked this tool's
                # patterns: the same search again would spend a second pattern budget on
                # the one failure (pattern_budget_seconds bounds a failure's, not a pass's).
                if call.name in self._tool_scopes and rec.get("tool") != call.name:
                    c = self.classifier.classify(
                        ev, self._scopes(call.name, provider), now=self._now()
                    )
            else:
                ev = gather(error, max_body=self.settings.max_body_bytes)
                c = self.classifier.classify(ev, self._scopes(call.name, provider), now=self._now())
                if provider is not None and rec is None and c.kind in ("rate_limit", "quota"):
                    suspended_s = await self._report_provider(provider, c)
                    if suspended_s is not None:
                        suspended_until = self._now() + suspended_s
        if c is not None:
            error.kind = c.kind
            error.retryable = c.retryable
            if c.retry_after_s is not None:
                error.retry_after_s = c.retry_after_s
            elif c.kind == "quota" and suspended_until is not None and error.retry_after_s is None:
                # the failure suspended the whole pool: say when it may be used again
                error.retry_after_s = max(0.0, suspended_until - self._now())
            extra = self._details(c, ev, provider, alias)
            if any(k in error.details for k in BODY_KEYS):
                extra.pop("body", None)  # keep the tool's own body (bounded by _scrub)
                extra.pop("body_truncated", None)
            if "in_flight" in error.details:
                extra.pop("in_flight", None)  # the tool knows best whether it sent anything
            if "headers" in error.details and ev is not None:
                extra["headers"] = dict(ev.headers)  # plain and bounded, whatever the tool gave
            error.details.update(extra)
        if error.retry_after_s is not None:
            # a tool's own retry_after_s of nan, inf or -5 is garbage, as in a header: the
            # retry plugin backs off as usual, and the caller is not told to wait nan seconds
            error.retry_after_s = bound(error.retry_after_s, self.settings.max_retry_after_seconds)
        self._scrub(error)
        d = attempt_detail(ctx, len(ctx.attempts))
        d["kind"] = str(error.kind)
        if provider:
            d["provider"] = provider
        if alias:
            d["key"] = alias
        pattern = error.details.get("pattern")
        if pattern:
            d["pattern"] = pattern
        if error.retry_after_s is not None:
            d["retry_after_s"] = error.retry_after_s

    def _scrub(self, error: ErrorInfo) -> None:
        """Bound the message and remove every known key from the message and details."""
        msg = error.message
        if len(msg) > MAX_MESSAGE:
            msg = msg[:MAX_MESSAGE] + f"... ({len(error.message) - MAX_MESSAGE} characters cut)"
        if self.redactor:
            msg = self.redactor.text(msg)
            error.details = self.redactor.value(error.details)
        error.message = msg
        for k in BODY_KEYS:
            v = error.details.get(k)
            if v is None:
                continue
            if isinstance(v, str):
                if len(v) > MAX_DETAIL_BODY:
                    error.details[k] = v[:MAX_DETAIL_BODY]
                    error.details[f"{k}_truncated"] = True
            elif not _small_json(v):  # bytes, huge or deeply nested: a bounded text excerpt
                error.details[k] = json_excerpt(v, MAX_DETAIL_BODY)
                error.details[f"{k}_truncated"] = True

    @hookimpl
    def after_call(self, result: ToolResult, ctx: CallContext) -> None:
        err = result.error
        if err is not None:
            if self.redactor:
                self._scrub(err)
                result.content = self.redactor.value(result.content)
            if result.meta is ctx.meta:
                _align_details(ctx)
            return
        if result.meta is not ctx.meta or not ctx.attempts:
            return
        leases = ctx.state.get("ratelimit")
        rec = leases.get(ctx.attempt) if leases else None
        served_by = result.meta.served_by
        # A result recovered from an earlier attempt (retry's fallback_on_empty) was not
        # served by the last attempt: neither its lease nor its detail is the server's.
        last_served = ctx.attempts[-1].tool == served_by
        if not last_served:
            rec = None
        if rec is not None:
            provider = rec["provider"]
        else:  # the hot path: a success without a lease
            provider = self._tool_provider.get(served_by) if served_by else None
            if provider is None:
                tool = ctx.tool
                if tool is None or tool.name != served_by:
                    tool = ctx.kernel.get_tool(served_by) if served_by else None
                provider = tool.settings.get("provider") if tool is not None else None
                if not isinstance(provider, str) or not provider:
                    _align_details(ctx)
                    return
        served = {"tool": served_by, "provider": provider}
        if last_served:
            attempt_detail(ctx, len(ctx.attempts))["provider"] = provider
        if rec is not None and rec.get("alias"):
            served["key"] = rec["alias"]
        result.meta.extra["served_by"] = served
