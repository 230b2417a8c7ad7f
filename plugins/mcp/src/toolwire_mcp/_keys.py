"""``_meta`` keys toolwire reads and writes on MCP messages (no heavy imports)."""

from __future__ import annotations

__all__ = ["CALL_ID_META_KEY", "ERROR_META_KEY", "RESULT_META_KEY"]

#: ``_meta`` key of a ``tools/call`` request carrying the call id (idempotency key).
CALL_ID_META_KEY = "io.toolwire/call-id"
#: ``_meta`` key of an error result: the full ``ErrorInfo`` (kind, message, retryable...).
ERROR_META_KEY = "io.toolwire/error"
#: ``_meta`` key of every result: call id, tool, served_by, replayed, attempts, duration.
RESULT_META_KEY = "io.toolwire/result"
