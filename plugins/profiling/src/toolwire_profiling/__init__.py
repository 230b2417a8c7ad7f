"""toolwire-profiling (work in progress)."""

from __future__ import annotations


class ProfilingPlugin:
    """Placeholder so the entry point resolves while the plugin is being written."""

    name = "profiling"
