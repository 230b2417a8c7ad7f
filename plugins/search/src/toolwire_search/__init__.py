"""toolwire-search (work in progress)."""

from __future__ import annotations


class SearchPlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "search"
