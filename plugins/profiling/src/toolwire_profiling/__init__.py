"""toolwire-profiling: latency statistics, time estimates and OpenTelemetry for tool calls.

Enable it by installing it (every installed plugin loads) or with
``enabled_plugins = ["profiling"]``; configure it under ``[plugins.profiling]``
(see docs/profiling.md). Use it from code::

    from toolwire import Kernel
    from toolwire_profiling import ProfilingPlugin

    profiling = ProfilingPlugin()
    async with Kernel(tools=[...], plugins=[profiling]) as kernel:
        await kernel.call("search", {"q": "x"})
        profiling.get_statistics("search")   # count, success_rate, p50_time_ms, ...
        profiling.estimate_time("search", {"q": "y"})
"""

from __future__ import annotations

from ._config import AdaptiveTimeoutsConfig, ProfilingConfig
from ._plugin import AttemptRecord, CallRecord, Estimate, ProfilingPlugin
from ._sketch import ALPHA, Sketch
from ._stats import ToolStats, args_signature

__all__ = [
    "ALPHA",
    "AdaptiveTimeoutsConfig",
    "AttemptRecord",
    "CallRecord",
    "Estimate",
    "ProfilingConfig",
    "ProfilingPlugin",
    "Sketch",
    "ToolStats",
    "__version__",
    "args_signature",
]
__version__ = "0.1.0"
