"""The ``retry`` plugin: Retry / Fallback / Recover decisions from classified errors."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from toolwire import (
    ArgsError,
    CallContext,
    ErrorInfo,
    Fallback,
    Kernel,
    Recover,
    Retry,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    describe_validation_error,
    hookimpl,
    plugin_not_loaded,
    validate_json_schema,
)
from toolwire_ratelimit import Availability, RateLimitPlugin, attempt_detail, with_config_file

from ._config import DEFAULTS, BudgetConfig, FallbackSpec, RetryConfig

__all__ = ["EmptyResult", "RetryBudget", "RetryPlugin", "is_empty"]

log = logging.getLogger("toolwire.retry")

#: Keys a provider section of [plugins.ratelimit] may set for this plugin.
_AGGREGATION_KEYS = ("max_provider_attempts", "request_timeout_seconds", "fallback_on_empty")
_KEY_KINDS = ("rate_limit", "quota", "auth")
#: Where a tool or a plugin puts this call's fallback candidates (see docs/retry.md).
CALL_FALLBACKS = "fallbacks"


def _unfit(tool: Tool, args: dict[str, Any]) -> str | None:
    """Why ``tool``'s schema rejects ``args`` (as the kernel would check them), or None."""
    try:
        if tool.validator is not None:
            tool.validator(args)
        else:
            validate_json_schema(args, tool.input_schema)
    except (ArgsError, pydantic.ValidationError) as exc:
        return describe_validation_error(exc)[0]
    return None


def _without_filled_defaults(
    args: dict[str, Any], origin: Tool | None, target: Tool, extra: Mapping[str, Any]
) -> dict[str, Any] | None:
    """``args`` without the values the kernel filled in from ``origin``'s defaults that
    ``target`` does not take (None: nothing to drop).

    The call's arguments were validated for the requested tool, defaults included: a
    fallback taking fewer parameters (``search(q, count=10)`` -> ``search_lite(q)``)
    would otherwise reject arguments the caller never gave.
    """
    if origin is None:
        return None
    props = origin.input_schema.get("properties")
    taken = target.input_schema.get("properties")
    if not isinstance(props, Mapping) or not isinstance(taken, Mapping):
        return None
    drop = [
        k
        for k, v in args.items()
        if k not in extra
        and k not in taken
        and isinstance(props.get(k), Mapping)
        and "default" in props[k]
        and props[k]["default"] == v
    ]
    if not drop:
        return None
    return {k: v for k, v in args.items() if k not in drop}


def _delay(seconds: float | None) -> float | None:
    """``seconds`` when it is a finite number >= 0, else None."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(seconds) if math.isfinite(seconds) and seconds >= 0 else None


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _specs(
    targets: object, where: str, tool: str | None = None, *, strict: bool = True
) -> list[FallbackSpec]:
    """Validate fallback targets: tool or provider names, ``FallbackSpec``s, or
    ``{"tool": ..., "args": {...}}`` mappings. Returns fresh ``FallbackSpec`` copies.
    ``strict``: also reject ``tool`` itself and repeated targets (else they are skipped
    when the chain is resolved)."""
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        raise TypeError(
            f"{where}: expected a list of fallback targets (tool or provider names, "
            f"FallbackSpec), got {type(targets).__name__}"
            + (f" {targets!r}; write [{targets!r}]" if isinstance(targets, str) else "")
        )
    out: list[FallbackSpec] = []
    seen: set[str] = set()
    for i, t in enumerate(targets):
        if isinstance(t, str):
            spec = FallbackSpec(tool=t)
        elif isinstance(t, FallbackSpec):
            spec = t.model_copy(deep=True)
        elif isinstance(t, Mapping):
            try:
                spec = FallbackSpec.model_validate(dict(t))
            except ValueError as exc:
                raise ValueError(f"{where}[{i}]: not a fallback target: {exc}") from None
        else:
            raise TypeError(
                f"{where}[{i}]: a fallback target is a tool or provider name (str), a "
                f"FallbackSpec or a {{'tool', 'args'}} mapping, not {type(t).__name__}"
            )
        if not spec.tool.strip():
            raise ValueError(f"{where}[{i}]: empty tool name")
        if strict and tool is not None and spec.tool == tool:
            raise ValueError(f"{where}[{i}]: tool {tool!r} cannot fall back to itself")
        if strict and spec.tool in seen:
            raise ValueError(f"{where}[{i}]: {spec.tool!r} is listed more than once")
        seen.add(spec.tool)
        out.append(spec)
    return out


def is_empty(value: Any) -> bool:
    """Whether a tool's return value is "empty": None, "", [], {}, or ``{"results": []}``."""
    if value is None or value == "" or value == [] or value == {}:
        return True
    if isinstance(value, Mapping) and "results" in value:
        return not value["results"]
    return False


class EmptyResult(ToolError):
    """Raised for a tool with ``fallback_on_empty`` when it returns an empty result."""

    def __init__(self, tool: str, value: Any) -> None:
        super().__init__(
            f"tool {tool!r} returned an empty result (fallback_on_empty)",
            kind="unavailable",
            details={
                "empty": True,
                "classified_by": "retry",
                "pattern": "retry.fallback_on_empty",
                "failover": True,
            },
        )
        self.value = value


class RetryBudget:
    """A token bucket that stops retry storms: each call earns ``ratio`` tokens,
    time earns ``min_per_s``, at most ``burst`` are banked; every retry or
    fallback spends one. Per kernel (process-local on purpose: it protects this
    process's upstreams from this process's retries)."""

    def __init__(self, cfg: BudgetConfig) -> None:
        self.cfg = cfg
        self.tokens = cfg.burst
        self._t: float | None = None

    def deposit(self) -> None:
        """One call started."""
        t = self.tokens + self.cfg.ratio
        self.tokens = t if t < self.cfg.burst else self.cfg.burst

    def take(self, now: float) -> bool:
        """Spend a token for a retry; False when the budget is exhausted."""
        if not self.cfg.enabled:
            return True
        if self._t is not None and now > self._t:
            self.tokens = min(self.cfg.burst, self.tokens + (now - self._t) * self.cfg.min_per_s)
        self._t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RetryPlugin:
    """Decides what to do about classified failures (see docs/retry.md).

    - ``Retry(after_s)`` on the same provider: rotate to another key at once,
      or back off exponentially with full jitter, honouring ``retry_after_s``;
    - ``Fallback(tool)`` along the chain (``fallbacks`` / ``chain_order``),
      skipping providers whose pool cannot serve now;
    - give up: the error stays as classified, or — when the chain is
      exhausted — becomes one ``unavailable`` error naming, per provider, why
      and when it may be tried again.

    Only errors the classifier matched are acted on (``retryable`` or
    ``details["failover"]``); anything else is terminal.
    """

    name = "retry"
    order = 500
    Config = RetryConfig

    def __init__(self, config: RetryConfig | None = None) -> None:
        self.config = config or RetryConfig()
        self._rng = random.Random(self.config.seed)
        self.budget = RetryBudget(self.config.budget)
        self._prepared: dict[str, tuple[Tool, dict[str, Any]]] = {}
        #: tool -> (source plugin, chain): default chains other plugins set (set_fallbacks)
        self._defaults: dict[str, tuple[str, list[FallbackSpec]]] = {}
        self._kernel: Kernel | None = None  # for fallbacks_for's chain_order view

    # ------------------------------------------------------------ fallback API
    def set_fallbacks(
        self, tool: str, targets: Sequence[str | FallbackSpec], *, source: str
    ) -> bool:
        """Register the default fallback chain of ``tool`` on behalf of plugin ``source``.

        ``targets`` are tool or provider names (a provider stands for its first
        tool) or ``FallbackSpec``s (a target with different arguments); ``[]``
        means "never fall over". The operator's configuration always wins: when
        ``[plugins.retry] fallbacks`` or ``[plugins.retry.tools.<tool>] fallbacks``
        names a chain for ``tool``, nothing is registered and this returns False.
        It also returns False (with a warning) when another plugin registered a
        chain for ``tool`` first. Calling it again from the same ``source``
        replaces that source's chain. True: the chain is in effect.

        Raises:
            TypeError: ``tool``, ``source`` or ``targets`` (or one of them) has the
                wrong type — e.g. a bare string instead of a list.
            ValueError: an empty tool or source name, a target naming ``tool``
                itself, or a target listed twice.
        """
        if not isinstance(tool, str):
            raise TypeError(f"set_fallbacks: tool must be a str, not {type(tool).__name__}")
        if not isinstance(source, str):
            raise TypeError(f"set_fallbacks: source must be a str, not {type(source).__name__}")
        if not tool.strip():
            raise ValueError("set_fallbacks: empty tool name")
        if not source.strip():
            raise ValueError("set_fallbacks: empty source (the name of the calling plugin)")
        specs = _specs(targets, f"set_fallbacks({tool!r}) targets", tool)
        if self._operator_chain(tool) is not None:
            if self._defaults.get(tool, ("",))[0] == source:
                del self._defaults[tool]
            log.debug(
                "plugin %r: the operator configured the fallbacks of %r; keeping them", source, tool
            )
            return False
        held = self._defaults.get(tool)
        if held is not None and held[0] != source:
            log.warning(
                "plugin %r wants to set the fallbacks of tool %r, but plugin %r set them first; "
                "keeping %r's (configure [plugins.retry] fallbacks.%s to decide)",
                source,
                tool,
                held[0],
                held[0],
                tool,
            )
            return False
        self._defaults[tool] = (source, specs)
        return True

    def clear_fallbacks(self, tool: str, *, source: str) -> bool:
        """Drop the chain ``source`` registered for ``tool``; False if it had none."""
        held = self._defaults.get(tool)
        if held is None or held[0] != source:
            return False
        del self._defaults[tool]
        return True

    def fallbacks_for(self, tool: str) -> list[FallbackSpec]:
        """The fallback chain a call of ``tool`` walks (without a per-call override).

        The operator's list (``tools.<tool>.fallbacks``, then ``fallbacks``), else
        the one a plugin set with ``set_fallbacks``, else the entries after the
        tool's provider (or the tool) in ``chain_order``. Names are as
        configured: providers are resolved to their tools when a call falls over,
        and targets that are no tool at that moment are skipped. A copy: changing
        it changes nothing.
        """
        specs = self._configured_chain(tool)
        if specs is None:
            kernel = self._kernel
            rl = self._rl(kernel) if kernel is not None else None
            provider = self._provider(kernel, rl, tool) if kernel is not None else None
            return [FallbackSpec(tool=t) for t in self._order_after(rl, tool, provider)]
        return [s.model_copy(deep=True) for s in specs]

    @staticmethod
    def set_call_fallbacks(ctx: CallContext, targets: Sequence[str | FallbackSpec] | None) -> bool:
        """Set the fallback candidates of this call only (None: back to the configured chain).

        Call it from the requested tool (before its attempt fails) or from a
        ``before_call`` hook. It writes ``ctx.state["retry"]["fallbacks"]`` — the
        documented per-call key, which may also be set directly. The candidates
        replace the chain of the call's tool, operator's included; everything
        else still applies (``retry = false`` tools, budgets, pools that cannot
        serve are skipped, nothing is tried twice). The chain is fixed at the
        call's first fallback decision: returns False (and changes nothing)
        when that already happened.
        """
        st: dict[str, Any] = ctx.state.setdefault("retry", {})
        if "chain" in st:
            return False
        if targets is None:
            st.pop(CALL_FALLBACKS, None)
        else:
            st[CALL_FALLBACKS] = _specs(targets, "set_call_fallbacks targets", ctx.call.name)
        return True

    def _operator_chain(self, tool: str) -> list[FallbackSpec] | None:
        tp = self.config.tools.get(tool)
        if tp is not None and tp.fallbacks is not None:
            return tp.fallbacks
        return self.config.fallbacks.get(tool)

    def _configured_chain(self, tool: str) -> list[FallbackSpec] | None:
        """The operator's list for ``tool``, else a plugin's (None: use chain_order)."""
        specs = self._operator_chain(tool)
        if specs is None:
            held = self._defaults.get(tool)
            specs = held[1] if held is not None else None
        return specs

    def _order_after(
        self, rl: RateLimitPlugin | None, tool: str, provider: str | None
    ) -> list[str]:
        """The ``chain_order`` entries after ``tool``'s provider (or ``tool`` itself)."""
        order = self.config.chain_order
        if order is None:
            order = rl.settings.chain_order if rl is not None else []
        if provider is not None and provider in order:
            return list(order[order.index(provider) + 1 :])
        if tool in order:
            return list(order[order.index(tool) + 1 :])
        return []

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _rl(kernel: Kernel) -> RateLimitPlugin | None:
        try:
            return RateLimitPlugin.of(kernel)
        except LookupError:
            return None

    def _provider(
        self, kernel: Kernel, rl: RateLimitPlugin | None, tool: str, error: ErrorInfo | None = None
    ) -> str | None:
        if error is not None and isinstance(error.details.get("provider"), str):
            return str(error.details["provider"])
        if rl is not None:
            return rl.provider_of(tool)
        t = kernel.get_tool(tool)
        p = t.settings.get("provider") if t is not None else None
        return p if isinstance(p, str) else None

    def policy(self, tool: str, provider: str | None, rl: RateLimitPlugin | None) -> dict[str, Any]:
        """The effective policy of ``tool``: defaults < [plugins.ratelimit] (global) <
        [plugins.retry] (global) < [plugins.ratelimit.providers.<p>] < [plugins.retry.tools.<t>]."""
        out = dict(DEFAULTS)
        if rl is not None:
            for k in _AGGREGATION_KEYS:
                v = getattr(rl.settings, k)
                if v is not None:
                    out[k] = v
        for k in DEFAULTS:
            v = getattr(self.config, k)
            if v is not None:
                out[k] = v
        if rl is not None and provider is not None:
            pc = rl.provider_config(provider)
            if pc is not None:
                for k in _AGGREGATION_KEYS:
                    v = getattr(pc, k)
                    if v is not None:
                        out[k] = v
        tp = self.config.tools.get(tool)
        if tp is not None:
            for k in DEFAULTS:
                v = getattr(tp, k)
                if v is not None:
                    out[k] = v
        return out

    def _policy_of(self, kernel: Kernel, tool: Tool) -> dict[str, Any]:
        """The policy of ``tool`` (cached per tool object; the cache is cleared on startup)."""
        cached = self._prepared.get(tool.name)
        if cached is not None and cached[0] is tool:
            return cached[1]
        rl = self._rl(kernel)
        pol = self.policy(tool.name, self._provider(kernel, rl, tool.name), rl)
        self._prepared[tool.name] = (tool, pol)
        return pol

    def _prepare(self, ctx: CallContext, tool: Tool) -> None:
        """``request_timeout_seconds`` and ``fallback_on_empty`` for the attempts on ``tool``.

        Through the call's context (``ctx.attempt_timeout_s``, ``ctx.check_result``),
        never by changing the ``Tool``: other kernels may share the object.
        """
        pol = self._policy_of(ctx.kernel, tool)
        st = ctx.state.setdefault("retry", {})
        timeout = pol["request_timeout_seconds"]
        if ctx.attempt_timeout_s is None or st.get("timeout_set"):
            if timeout is not None and tool.timeout_s is None:
                ctx.attempt_timeout_s = float(timeout)
                st["timeout_set"] = True
            elif st.get("timeout_set"):
                ctx.attempt_timeout_s = None
                st["timeout_set"] = False
        if pol["fallback_on_empty"]:
            ctx.check_result = self._check_empty
        elif ctx.check_result == self._check_empty:
            ctx.check_result = None

    @staticmethod
    def _check_empty(tool: Tool, content: dict[str, Any]) -> ToolError | None:
        """``fallback_on_empty``: an empty result fails the attempt (the chain goes on)."""
        value: Any = content
        if len(content) == 1 and "result" in content:
            value = content["result"]
        return EmptyResult(tool.name, value) if is_empty(value) else None

    @staticmethod
    def _repeatable(tool: Tool | None, pol: Mapping[str, Any]) -> bool:
        """May this tool run again after a timeout or a lost connection (it may have done
        its work)?"""
        if pol["idempotent"]:
            return True
        if tool is None:
            return False
        ann = tool.annotations
        return bool(ann.readOnlyHint or ann.idempotentHint)

    def _chain(
        self,
        kernel: Kernel,
        rl: RateLimitPlugin | None,
        tool: str,
        provider: str | None,
        override: list[FallbackSpec] | None = None,
        unknown: list[str] | None = None,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Fallback candidates of ``tool``: this call's ``override``, else the explicit
        list (operator's, else a plugin's), else the entries after its provider (or
        itself) in ``chain_order``. Providers resolve to their first tool; targets that
        name neither a tool nor a provider with tools are appended to ``unknown``."""
        specs = override if override is not None else self._configured_chain(tool)
        if specs is not None:
            entries = [(e.tool, e.args) for e in specs]
        else:
            entries = [(x, {}) for x in self._order_after(rl, tool, provider)]
        out: list[tuple[str, dict[str, Any]]] = []
        seen = {tool}
        for target, args in entries:
            resolved = self._resolve(kernel, rl, target)
            if resolved is None:
                if unknown is not None and target not in unknown:
                    unknown.append(target)
                # an explicit list names it on purpose: a typo, or a tool not loaded
                log.log(
                    logging.WARNING if specs is not None else logging.DEBUG,
                    "fallback %r of tool %r is neither a tool nor a provider with tools; "
                    "skipped (check the fallbacks of %r, or that the tool is loaded)",
                    target,
                    tool,
                    tool,
                )
                continue
            if resolved not in seen:
                seen.add(resolved)
                out.append((resolved, args))
        return out

    @staticmethod
    def _resolve(kernel: Kernel, rl: RateLimitPlugin | None, target: str) -> str | None:
        if kernel.get_tool(target) is not None:
            return target
        if rl is not None:
            tools = rl.tools_of(target)
        else:
            tools = sorted(
                t.name for t in kernel.list_tools() if t.settings.get("provider") == target
            )
        return tools[0] if tools else None

    def _jitter(self, pol: Mapping[str, Any], n: int) -> float:
        """Full jitter: uniform(0, min(cap, base * 2**(n-1)))."""
        ceiling = min(float(pol["cap_s"]), float(pol["base_s"]) * (2 ** min(n - 1, 30)))
        return self._rng.uniform(0.0, ceiling)

    # -------------------------------------------------------------- hooks
    @hookimpl
    def startup(self, kernel: Kernel) -> None:
        self._prepared.clear()
        self._kernel = kernel
        if self._rl(kernel) is None:
            # Nothing marks an error retryable then (the kernel never does): every failed
            # call would end after one attempt, with no word on why.
            why = (
                str(plugin_not_loaded(kernel.config, "ratelimit"))
                if kernel.config is not None
                else "the ratelimit plugin is not registered (pass RateLimitPlugin() to "
                "Kernel(plugins=[...]) next to RetryPlugin())"
            )
            log.warning(
                "plugin 'retry': %s; it classifies failed attempts, and without it this plugin "
                "retries or fails over only errors that an on_error hook of yours marks "
                "retryable (error.retryable = True)",
                why,
            )
        if self.config.config_file:
            self.config = with_config_file(self.config, kernel, "plugins.retry")
            self.budget = RetryBudget(self.config.budget)
            if self.config.seed is not None:
                self._rng = random.Random(self.config.seed)

    @hookimpl
    def before_call(self, ctx: CallContext) -> None:
        b = self.budget  # deposit(), inlined: this runs on every call
        t = b.tokens + b.cfg.ratio
        b.tokens = t if t < b.cfg.burst else b.cfg.burst
        tool = ctx.tool
        if tool is not None:
            pol = self._policy_of(ctx.kernel, tool)
            if pol["fallback_on_empty"] or (
                pol["request_timeout_seconds"] is not None and tool.timeout_s is None
            ):
                self._prepare(ctx, tool)

    @hookimpl
    async def on_error(
        self, call: ToolCall, error: ErrorInfo, ctx: CallContext
    ) -> Retry | Fallback | Recover | None:
        kernel = ctx.kernel
        st: dict[str, Any] | None = ctx.state.get("retry")
        if st is None or "t0" not in st:  # (a tool may have set this call's fallbacks)
            # the call started this long ago, in the kernel clock's terms (FakeClock-friendly)
            since = time.perf_counter() - ctx.started_at
            if st is None:
                st = ctx.state["retry"] = {}
            st["t0"] = kernel.clock.monotonic() - since
        rl = self._rl(kernel)
        tool = kernel.get_tool(call.name)
        provider = self._provider(kernel, rl, call.name, error)
        pkey = provider or f"tool:{call.name}"
        per: dict[str, int] = st.setdefault("per", {})
        per[pkey] = per.get(pkey, 0) + 1
        tried: list[str] = st.setdefault("tried", [ctx.call.name])
        if call.name not in tried:
            tried.append(call.name)
        st.setdefault("failed", {})[pkey] = {
            "tool": call.name,
            "provider": provider,
            "kind": str(error.kind),
            "pattern": error.details.get("pattern"),
            "retry_after_s": _delay(error.retry_after_s),
            "at": kernel.clock.time(),
        }
        detail = attempt_detail(ctx, len(ctx.attempts))
        if isinstance(error.exception, EmptyResult) and "empty" not in st:
            st["empty"] = (call.name, error.exception.value)
        pol = self.policy(call.name, provider, rl)
        tp = self.config.tools.get(call.name)
        if tp is not None and not tp.retry:
            res = self._give_up(error, st, detail, "retries are off for this tool", terminal=True)
            return self._after_fallback(res, error, st, call.name)
        if not (error.retryable or error.details.get("failover")):
            res = self._give_up(error, st, detail, None, terminal=True)
            return self._after_fallback(res, error, st, call.name)
        # A timeout, or a connection lost after the request went out (``in_flight``:
        # an upstream MCP server that crashed mid-call, an answer that broke off),
        # leaves the outcome unknown: the first attempt may have done its work. A
        # timeout that says nothing was sent (``in_flight`` false: still waiting for a
        # connection) is an outage like any other.
        in_flight = error.details.get("in_flight")
        status = error.details.get("status")
        unknown = (
            "timed out"
            if str(error.kind) == "timeout" and in_flight is not False
            else f"failed with HTTP {status} after the request reached the server "
            "(details.in_flight: the outcome is unknown)"
            if in_flight is True and isinstance(status, int) and status >= 500
            else "lost its connection during the call (details.in_flight: the outcome is unknown)"
            if in_flight is True
            else None
        )
        if unknown is not None and not self._repeatable(tool, pol):
            unsafe = (
                f"not retried: tool {call.name!r} {unknown} and may have side effects; "
                "mark it read_only/idempotent or set idempotent = true in [plugins.retry.tools]"
            )
            error.details["retry"] = unsafe
            # nor by its caller: a retryable flag would invite the second run refused here
            error.retryable = False
            res = self._give_up(error, st, detail, unsafe, terminal=True)
            return self._after_fallback(res, error, st, call.name)
        left = float(pol["max_elapsed_s"]) - (kernel.clock.monotonic() - float(st["t0"]))
        time_left = ctx.time_left()
        if time_left is not None:
            left = min(left, time_left)
        own = int(pol["max_attempts"])
        if len(ctx.attempts) >= min(own, kernel.max_attempts):
            limit = min(own, kernel.max_attempts)
            whose = (
                ""
                if own == kernel.max_attempts
                else ", the retry policy's"
                if own < kernel.max_attempts
                else ", the kernel's"
            )
            return await self._exhausted(
                error, st, ctx, rl, detail, f"max_attempts ({limit}{whose}) reached"
            )
        if left <= 0:
            return await self._exhausted(error, st, ctx, rl, detail, "max_elapsed_s reached")
        wait, why = await self._same_provider(error, provider, rl, per[pkey], pol, left)
        key_issue = str(error.kind) in _KEY_KINDS or str(
            error.details.get("pattern", "")
        ).startswith("pool.")
        if wait is not None and not (key_issue and wait > 0):
            return self._retry(wait, detail, ctx, error, why, tool)
        fb = await self._fallback(ctx, st, rl, kernel, detail)
        if fb is not None:
            if not self.budget.take(kernel.clock.monotonic()):
                return self._no_budget(error, st, detail)
            return fb
        if wait is not None:
            return self._retry(wait, detail, ctx, error, why, tool)
        return await self._exhausted(error, st, ctx, rl, detail, why)

    @hookimpl
    def after_call(self, result: ToolResult, ctx: CallContext) -> None:
        st = ctx.state.get("retry")
        if st and "recovered" in st and not result.is_error:
            result.meta.served_by = st["recovered"]
            result.meta.extra["recovered"] = "fallback_on_empty"

    # ------------------------------------------------------------ decisions
    async def _same_provider(
        self,
        error: ErrorInfo,
        provider: str | None,
        rl: RateLimitPlugin | None,
        n: int,
        pol: Mapping[str, Any],
        left: float,
    ) -> tuple[float | None, str | None]:
        """(seconds to wait before retrying the same provider, or None; why not)."""
        if error.details.get("empty"):
            return None, "empty result: failing over only"
        if n >= int(pol["max_provider_attempts"]):
            return None, f"max_provider_attempts ({pol['max_provider_attempts']}) reached"
        kind = str(error.kind)
        # what the failure asks for, when it is a usable number (nan, inf, -5: back off as usual)
        ra = _delay(error.retry_after_s)
        pool = rl.pool(provider) if rl is not None and provider is not None else None
        av: Availability | None = await pool.availability() if pool is not None else None
        if av is not None and not av.available and av.retry_at is None:
            return None, av.reason
        pattern = str(error.details.get("pattern") or "")
        if av is not None and av.state == "suspended":
            wait = av.retry_after_s or 0.0
        elif pattern.startswith("outbound."):  # our own outbound rate: wait for the slot
            wait = ra if ra is not None else self._jitter(pol, n)
        elif kind in _KEY_KINDS or pattern.startswith("pool."):
            if av is not None and av.available and pool is not None and pool.has_keys:
                wait = 0.0  # rotate to another key now
            elif av is not None and not av.available and av.retry_after_s is not None:
                wait = av.retry_after_s
            elif kind == "rate_limit" and error.retryable:
                wait = ra if ra is not None else self._jitter(pol, n)
            else:
                return None, f"{kind}: no other key to rotate to"
        elif error.retryable:
            wait = ra if ra is not None else self._jitter(pol, n)
        else:
            return None, f"{kind} is not retryable on the same provider"
        if wait > float(pol["cap_s"]):
            return None, f"retry-after {wait:.3f}s exceeds cap_s ({pol['cap_s']}s): not sleeping"
        if wait >= left:
            return None, f"retry-after {wait:.3f}s exceeds the time left ({max(left, 0.0):.3f}s)"
        return wait, None

    def _retry(
        self,
        wait: float,
        detail: dict[str, Any],
        ctx: CallContext,
        error: ErrorInfo,
        why: str | None,
        tool: Tool | None,
    ) -> Retry | Recover | None:
        if not self.budget.take(ctx.kernel.clock.monotonic()):
            return self._no_budget(error, ctx.state["retry"], detail)
        if tool is not None:
            # The next attempt runs under request_timeout_seconds again: another plugin may
            # have dropped the attempt timeout it set (profiling's adaptive timeout is for
            # the first attempt only), which left the retry with no timeout at all.
            self._prepare(ctx, tool)
        detail["decision"] = "retry"
        detail["slept_ms"] = round(wait * 1000.0, 3)
        return Retry(after_s=wait, reason=why or f"{error.kind} ({error.details.get('pattern')})")

    def _no_budget(
        self, error: ErrorInfo, st: dict[str, Any], detail: dict[str, Any]
    ) -> Recover | None:
        """No token left: give up (an empty result a candidate returned still stands)."""
        error.details["gave_up"] = "retry budget exhausted (too many retries across calls)"
        detail["decision"] = "give_up"
        detail.pop("to", None)
        detail["reason"] = error.details["gave_up"]
        log.warning("retry budget exhausted: not retrying %s errors for a while", error.kind)
        return self._give_up(error, st, detail, error.details["gave_up"], terminal=True)

    async def _fallback(
        self,
        ctx: CallContext,
        st: dict[str, Any],
        rl: RateLimitPlugin | None,
        kernel: Kernel,
        detail: dict[str, Any],
    ) -> Fallback | None:
        chain = st.get("chain")
        if chain is None:  # fixed at the call's first fallback decision
            origin = ctx.call.name
            raw = st.get(CALL_FALLBACKS)
            override = (
                None
                if raw is None
                else _specs(raw, f"ctx.state['retry'][{CALL_FALLBACKS!r}]", strict=False)
            )
            chain = st["chain"] = self._chain(
                kernel,
                rl,
                origin,
                self._provider(kernel, rl, origin),
                override,
                st.setdefault("unknown", []),
            )
        tried: list[str] = st["tried"]
        skipped: dict[str, Any] = st.setdefault("skipped", {})
        for cand, extra in chain:
            if cand in tried:
                continue
            tool = kernel.get_tool(cand)
            if tool is None:
                continue
            tp = self.config.tools.get(cand)
            cprov = self._provider(kernel, rl, cand)
            if tp is not None and not tp.retry:
                continue
            if rl is not None and cprov is not None:
                av = await rl.pool(cprov).availability()
                if not av.available:
                    skipped[cprov] = av
                    continue
            args = {**ctx.call.args, **extra} if extra else dict(ctx.call.args)
            unfit = _unfit(tool, args)
            if unfit is not None:
                trimmed = _without_filled_defaults(
                    args, kernel.get_tool(ctx.call.name), tool, extra
                )
                if trimmed is not None and _unfit(tool, trimmed) is None:
                    args, unfit = trimmed, None
            if unfit is not None:  # the kernel would end the call here: try the next one
                st.setdefault("unfit", {})[cand] = unfit
                continue
            tried.append(cand)
            self._prepare(ctx, tool)
            detail["decision"] = "fallback"
            detail["to"] = cand
            return Fallback(cand, args=args, reason=f"fall over to {cand!r}")
        return None

    @staticmethod
    def _after_fallback(
        res: Recover | None, error: ErrorInfo, st: dict[str, Any], tool: str
    ) -> Recover | None:
        """A fallback target's error that ends the call says which tools failed before it:
        it is the answer to a call of another tool, which the caller would not know."""
        tried: list[str] = st.get("tried") or []
        if res is not None or not tried or tool == tried[0]:
            return res
        before = [
            f for f in st.get("failed", {}).values() if f["tool"] != tool and f["tool"] in tried
        ]
        error.details["fallback_of"] = tried[0]
        error.details["tried"] = [
            {"tool": f["tool"], "provider": f["provider"], "kind": f["kind"]} for f in before
        ]
        said = ", ".join(f"{f['tool']!r} failed with {f['kind']}" for f in before)
        error.message += f" (a fallback for {tried[0]!r}" + (f": {said}" if said else "") + ")"
        return res

    def _give_up(
        self,
        error: ErrorInfo,
        st: dict[str, Any],
        detail: dict[str, Any],
        why: str | None,
        *,
        terminal: bool,
    ) -> Recover | None:
        if "empty" in st:
            tool, value = st["empty"]
            st["recovered"] = tool
            detail["decision"] = "recover"
            detail["reason"] = "every candidate was empty or failed: the first empty result stands"
            return Recover(value, reason="fallback_on_empty")
        detail.setdefault("decision", "give_up")
        if why:
            detail["reason"] = why
            if terminal:  # (the exhausted paths set it themselves, after aggregating)
                error.details.setdefault("gave_up", why)
        return None

    async def _exhausted(
        self,
        error: ErrorInfo,
        st: dict[str, Any],
        ctx: CallContext,
        rl: RateLimitPlugin | None,
        detail: dict[str, Any],
        why: str | None,
    ) -> Recover | None:
        res = self._give_up(error, st, detail, why, terminal=False)
        if res is not None or not (st.get("chain") or st.get("unknown")):
            if why:
                error.details.setdefault("gave_up", why)
            return res
        await self._aggregate(error, st, ctx, rl, why)
        if why:
            error.details["gave_up"] = why
        return None

    async def _aggregate(
        self,
        error: ErrorInfo,
        st: dict[str, Any],
        ctx: CallContext,
        rl: RateLimitPlugin | None,
        why: str | None = None,
    ) -> None:
        """Turn the last error into one ``unavailable`` naming every candidate's state."""
        kernel = ctx.kernel
        now = kernel.clock.time()
        origin = ctx.call.name
        names: list[tuple[str, str | None]] = [(origin, self._provider(kernel, rl, origin))]
        names += [(c, self._provider(kernel, rl, c)) for c, _ in st.get("chain", [])]
        failed: dict[str, Any] = st.get("failed", {})
        skipped: dict[str, Availability] = st.get("skipped", {})
        unfit: dict[str, str] = st.get("unfit", {})
        providers: dict[str, Any] = {}
        parts: list[str] = []
        for tool, prov in names:
            key = prov or f"tool:{tool}"
            label = prov or tool
            if label in providers:
                continue
            retry_at: float | None = None
            av: Availability | None = skipped.get(prov) if prov else None
            if av is None and rl is not None and prov is not None:
                current = await rl.pool(prov).availability()
                av = None if current.available else current
            f = failed.get(key)
            if f is not None:
                reason = f"failed with {f['kind']}" + (
                    f" (pattern {f['pattern']})" if f["pattern"] else ""
                )
                if av is not None:
                    reason += f"; {av.reason}"
                    retry_at = av.retry_at
                elif f["retry_after_s"] is not None:
                    retry_at = f["at"] + float(f["retry_after_s"])
                else:
                    retry_at = now
            elif av is not None:
                reason, retry_at = f"skipped: {av.reason}", av.retry_at
            elif tool in unfit:
                reason, retry_at = (
                    f"skipped: its schema rejects the arguments ({unfit[tool]})",
                    None,
                )
            else:
                reason, retry_at = "not tried", now
            if retry_at is None:
                when = "only after an operator fixes it"
            elif retry_at <= now:
                when = "may be tried again now"
            else:
                when = f"may be tried again at {_iso(retry_at)} (in {retry_at - now:.0f}s)"
            providers[label] = {"tool": tool, "reason": reason, "retry_at": retry_at}
            parts.append(f"{label}: {reason}; {when}")
        for target in st.get("unknown", []):
            if target in providers:
                continue
            reason = (
                f"skipped: neither a tool nor a provider with tools (check the fallbacks "
                f"of {origin!r}, or that the tool is loaded)"
            )
            providers[target] = {"tool": None, "reason": reason, "retry_at": None}
            parts.append(f"{target}: {reason}; only after an operator fixes it")
        last = {
            "kind": str(error.kind),
            "message": error.message,
            "pattern": error.details.get("pattern"),
        }
        error.kind = "unavailable"
        stopped = f" (gave up: {why})" if why else ""
        error.message = f"no provider could serve {origin!r}{stopped}: " + " | ".join(parts)
        soonest = [p["retry_at"] for p in providers.values() if p["retry_at"] is not None]
        error.retry_after_s = max(0.0, min(soonest) - now) if soonest else None
        error.retryable = bool(soonest)
        error.details["providers"] = providers
        error.details["last_error"] = last
        error.details["pattern"] = "retry.exhausted"
