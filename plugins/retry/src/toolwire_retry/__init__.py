"""toolwire-retry: retries with backoff and jitter, fallback chains, a retry budget.

The plugin (``retry``, order 500) answers ``on_error`` with a decision on the
error the ratelimit plugin (order 400) classified: ``Retry(after_s)`` on the
same provider (another key at once, or exponential backoff with full jitter
honouring ``retry_after_s``), ``Fallback(tool)`` along the configured chain,
or nothing (the error stands; an exhausted chain becomes one ``unavailable``
error naming every provider's state). See docs/retry.md.

Other plugins set their tools' default chains with ``RetryPlugin.set_fallbacks``
(the operator's configuration wins), read the chain in effect with
``RetryPlugin.fallbacks_for``, and set one call's candidates with
``RetryPlugin.set_call_fallbacks(ctx, ...)`` or ``ctx.state["retry"]["fallbacks"]``.
"""

from __future__ import annotations

from ._config import BudgetConfig, FallbackSpec, RetryConfig, ToolPolicy
from ._plugin import EmptyResult, RetryBudget, RetryPlugin, is_empty

__all__ = [
    "BudgetConfig",
    "EmptyResult",
    "FallbackSpec",
    "RetryBudget",
    "RetryConfig",
    "RetryPlugin",
    "ToolPolicy",
    "is_empty",
]
__version__ = "0.1.0"
