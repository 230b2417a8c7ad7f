"""Tests of the template plugin, written the way a plugin author would."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from toolwire_stamp import StampConfig, StampPlugin

from toolwire import Kernel
from toolwire.testing import FakeTool

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_results_are_stamped(kernel: Kernel, register_plugin: Callable[..., object]) -> None:
    register_plugin(StampPlugin(StampConfig(label="seen-by-stamp")))
    kernel.add_tool(FakeTool("lookup", script=[{"ok": True}]).tool)
    result = await kernel.call("lookup", {})
    assert result.content == {"ok": True}
    assert result.meta.extra["stamp"] == "seen-by-stamp"


async def test_listed_tools_are_refused_and_do_not_run(
    kernel: Kernel, register_plugin: Callable[..., object]
) -> None:
    register_plugin(StampPlugin(StampConfig(refuse=["wipe"])))
    wipe = FakeTool("wipe", script=[{"wiped": True}])
    kernel.add_tool(wipe.tool)
    result = await kernel.call("wipe", {})
    assert result.error is not None and result.error.kind == "denied"
    assert "refused by the stamp plugin" in result.error.message
    assert wipe.calls == [] and "stamp" not in result.meta.extra


def test_the_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="labl"):
        StampConfig.model_validate({"labl": "typo"})
