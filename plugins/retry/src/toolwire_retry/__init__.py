"""toolwire-retry (work in progress)."""

from __future__ import annotations


class RetryPlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "retry"
