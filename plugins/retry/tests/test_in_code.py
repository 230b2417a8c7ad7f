"""The retry plugin configured in code, as a framework embedding the kernel does."""

from __future__ import annotations

import logging

import pytest

from toolwire import Kernel, ToolError, tool
from toolwire_ratelimit import RateLimitPlugin
from toolwire_retry import RetryConfig, RetryPlugin

pytestmark = pytest.mark.anyio

NO_RATELIMIT = "plugin 'retry': the ratelimit plugin is not registered"


def flaky_tool() -> tuple[object, list[int]]:
    runs: list[int] = []

    @tool(read_only=True)
    def flaky() -> dict[str, int]:
        """Fails once with a 503, then answers."""
        runs.append(1)
        if len(runs) == 1:
            raise ToolError("upstream busy", kind="unavailable", status=503)
        return {"runs": len(runs)}

    return flaky, runs


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_without_the_ratelimit_plugin_startup_says_why_nothing_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: RetryPlugin() alone started silently, and a flaky tool's 503 ended the
    call after one attempt, with nothing saying that the classifier was missing."""
    flaky, runs = flaky_tool()
    with caplog.at_level(logging.WARNING, logger="toolwire.retry"):
        async with Kernel(tools=[flaky], plugins=[RetryPlugin()]) as kernel:
            result = await kernel.call("flaky")
    assert result.is_error and len(runs) == 1  # what the warning explains
    warned = [r.getMessage() for r in caplog.records if NO_RATELIMIT in r.getMessage()]
    assert len(warned) == 1
    assert "RateLimitPlugin()" in warned[0] and "error.retryable" in warned[0]


async def test_with_the_ratelimit_plugin_a_flaky_tool_is_retried_without_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky, runs = flaky_tool()
    plugins = [RateLimitPlugin(), RetryPlugin(RetryConfig(base_s=0.001, cap_s=0.01))]
    with caplog.at_level(logging.WARNING, logger="toolwire.retry"):
        async with Kernel(tools=[flaky], plugins=plugins) as kernel:
            result = await kernel.call("flaky")
    assert not result.is_error and result.content == {"runs": 2} and len(runs) == 2
    assert [a.decision for a in result.meta.attempts] == ["retry", None]
    assert not [r for r in caplog.records if NO_RATELIMIT in r.getMessage()]
