"""The pytest fixtures third-party plugin authors get from `toolwire.testing`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def test_the_kernel_fixture_closes_the_kernel_after_the_test(tmp_path: Path) -> None:
    """A plugin's shutdown hook runs and its spawned task is cancelled when the test ends."""
    marker = tmp_path / "events.txt"
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(
            f"""
            import anyio
            import pytest
            from toolwire import hookimpl
            from toolwire.testing import FakeTool

            pytestmark = pytest.mark.anyio
            LOG = {str(marker)!r}


            def note(line):
                with open(LOG, "a") as f:
                    f.write(line + "\\n")


            class Lifecycle:
                name = "lifecycle"

                @hookimpl
                async def startup(self, kernel):
                    async def forever():
                        try:
                            await anyio.sleep_forever()
                        finally:
                            note("task cancelled")

                    kernel.spawn(forever)

                @hookimpl
                async def shutdown(self, kernel):
                    note("shutdown")


            @pytest.fixture
            def anyio_backend():
                return "asyncio"


            async def test_uses_the_fixture(kernel, register_plugin):
                register_plugin(Lifecycle())
                kernel.add_tool(FakeTool("t", script=[{{"ok": True}}]).tool)
                assert (await kernel.call("t", {{}})).content == {{"ok": True}}
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.read_text().splitlines() == ["shutdown", "task cancelled"]
