"""toolwire-idempotency: a replayed tool call returns the stored result, never runs twice.

An agent resuming from a checkpoint replays tool calls with the same
``call_id`` and args; this plugin answers them from the state store instead of
sending the email again. See docs/idempotency.md.

    from toolwire import Kernel
    from toolwire_idempotency import IdempotencyConfig, IdempotencyPlugin

    kernel = Kernel(state="sqlite:///state.db", plugins=[IdempotencyPlugin()])
"""

from __future__ import annotations

from ._canonical import (
    UnencodableArgumentError,
    canonical_bytes,
    record_hash,
    request_hash,
)
from ._config import ENV_ENABLED, ENV_TTL_SECS, IdempotencyConfig
from ._plugin import IdempotencyCounters, IdempotencyPlugin

__all__ = [
    "ENV_ENABLED",
    "ENV_TTL_SECS",
    "IdempotencyConfig",
    "IdempotencyCounters",
    "IdempotencyPlugin",
    "UnencodableArgumentError",
    "__version__",
    "canonical_bytes",
    "record_hash",
    "request_hash",
]
__version__ = "0.1.0"
