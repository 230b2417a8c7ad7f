"""toolwire-a2a (work in progress)."""

from __future__ import annotations


class A2APlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "a2a"
