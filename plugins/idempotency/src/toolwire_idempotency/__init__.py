"""toolwire-idempotency (work in progress)."""

from __future__ import annotations


class IdempotencyPlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "idempotency"
