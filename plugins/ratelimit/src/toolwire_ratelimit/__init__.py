"""toolwire-ratelimit (work in progress)."""

from __future__ import annotations


class RateLimitPlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "ratelimit"
