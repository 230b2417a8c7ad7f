"""Fixtures: the anyio backend, in-process agents behind a host router, kernels using the plugin.

The helpers live in a2a_testkit.py, loaded here as the module
``toolwire_a2a_testkit`` (this directory is not a package: a ``tests``
package per distribution would collide when the whole workspace is collected).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from toolwire import Kernel
from toolwire_a2a import A2AConfig, A2APlugin

_spec = importlib.util.spec_from_file_location(
    "toolwire_a2a_testkit", Path(__file__).with_name("a2a_testkit.py")
)
assert _spec is not None and _spec.loader is not None
kit = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = kit
_spec.loader.exec_module(kit)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def research() -> Any:
    """A streaming-capable JSON-RPC agent at http://research.test."""
    return kit.make_agent(kit.RESEARCH)


@pytest.fixture
def router(research: Any) -> Any:
    return kit.Router({"research.test": research.app})


@pytest.fixture
async def make_kernel(router: Any) -> AsyncIterator[Any]:
    """``await make_kernel(config_dict, state=..., transport=...)`` -> (kernel, plugin), started.

    Every kernel made is closed at the end of the test.
    """
    made: list[Kernel] = []

    async def make(
        config: dict[str, Any] | None = None,
        *,
        state: str = "memory://",
        transport: Any = None,
    ) -> tuple[Kernel, A2APlugin]:
        cfg = A2AConfig.model_validate({"refresh_interval_s": 0, **(config or {})})
        plugin = A2APlugin(cfg, transport=transport or router)
        kernel = Kernel(plugins=[plugin], state=state)
        made.append(kernel)
        await kernel.start()
        return kernel, plugin

    yield make
    with anyio.CancelScope(shield=True):
        for k in made:
            await k.close()
