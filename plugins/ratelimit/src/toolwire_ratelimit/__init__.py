"""toolwire-ratelimit: classify tool failures, rotate API keys, limit outbound rates.

The plugin (``ratelimit``, order 400) answers ``on_error`` by classifying the
error in place (``kind``, ``retryable``, ``retry_after_s``,
``details["pattern"]``) and returns None; ``toolwire-retry`` decides what to
do. Tools get their API keys from a ``KeyPool``::

    from toolwire_ratelimit import lease_key

    @tool(read_only=True, provider="brave")
    async def web_search_brave(query: str, ctx: CallContext) -> dict:
        async with lease_key(ctx, "brave") as key:      # a healthy key, fairly rotated
            r = await client.get(URL, params={"q": query},
                                 headers={"X-Subscription-Token": key.secret})
            r.raise_for_status()                          # failures are classified and reported
            return r.json()

See docs/ratelimit.md.
"""

from __future__ import annotations

from toolwire import CallContext, Kernel

from ._classify import CLASSIFIABLE, KIND_RULES, PRECEDENCE, Classification, default_patterns
from ._config import (
    KeySpec,
    PatternSpec,
    ProviderConfig,
    RateLimitConfig,
    RateSpec,
    ToolConfig,
    load_config_file,
    with_config_file,
)
from ._evidence import Evidence, gather
from ._hints import parse_duration, parse_retry_after, reset_hints
from ._plugin import RateLimitPlugin, attempt_detail
from ._pool import ApiKey, Availability, KeyLease, KeyPool, LeaseContext, PoolUnavailable
from ._redact import Redactor

__all__ = [
    "CLASSIFIABLE",
    "KIND_RULES",
    "PRECEDENCE",
    "ApiKey",
    "Availability",
    "Classification",
    "Evidence",
    "KeyLease",
    "KeyPool",
    "KeySpec",
    "LeaseContext",
    "PatternSpec",
    "PoolUnavailable",
    "ProviderConfig",
    "RateLimitConfig",
    "RateLimitPlugin",
    "RateSpec",
    "Redactor",
    "ToolConfig",
    "attempt_detail",
    "default_patterns",
    "gather",
    "key_pool",
    "lease_key",
    "load_config_file",
    "parse_duration",
    "parse_retry_after",
    "reset_hints",
    "with_config_file",
]
__version__ = "0.1.0"


def key_pool(where: CallContext | Kernel, provider: str) -> KeyPool:
    """The ``KeyPool`` of ``provider`` on the kernel of ``where`` (a CallContext or a Kernel)."""
    kernel = where.kernel if isinstance(where, CallContext) else where
    return RateLimitPlugin.of(kernel).pool(provider)


def lease_key(ctx: CallContext, provider: str) -> LeaseContext:
    """``async with lease_key(ctx, "brave") as key:`` — use ``key.secret``, ``key.alias``.

    Picks a healthy key (smooth weighted round-robin), waits for the outbound
    rate limit if one is configured, and on exit reports the outcome: success,
    or the classified failure (cooldown, quarantine, suspension). Raises
    ``PoolUnavailable`` when no key can be used now.
    """
    return key_pool(ctx, provider).lease(ctx)
