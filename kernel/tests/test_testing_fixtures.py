"""The pytest fixtures third-party plugin authors get from `toolwire.testing`."""

from __future__ import annotations

import os
import re
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


def test_the_helpers_work_in_a_program_without_pytest(tmp_path: Path) -> None:
    """pytest is no dependency of toolwire: `from toolwire.testing import FakeTool` in a
    program without it must work (before: `No module named 'pytest'`, imported at the top
    for the fixtures alone). Outside a test a missing Redis is an error saying so."""
    program = textwrap.dedent(
        """
        import sys
        sys.modules["pytest"] = None  # as if pytest were not installed
        import anyio
        from toolwire import Kernel
        from toolwire.testing import FakeClock, FakeTool, RecordingPlugin, fake_clock
        from toolwire.testing import require_redis

        async def main():
            clock = FakeClock()
            await clock.sleep(2.5)
            tool = FakeTool("t", script=[{"n": 1}])
            rec = RecordingPlugin("rec")
            r = await Kernel(tools=[tool.tool], plugins=[rec], clock=clock).call("t", {})
            print(r.content, clock.sleeps, rec.log, type(fake_clock()).__name__)

        anyio.run(main)
        assert "pytest" not in sys.modules or sys.modules["pytest"] is None
        try:
            require_redis("redis://127.0.0.1:1/0")
        except RuntimeError as exc:
            print("RuntimeError:", exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    r = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = r.stdout.splitlines()
    assert (
        first
        == "{'n': 1} [2.5] [('rec', 'before_call', 't'), ('rec', 'after_call', 't')] FakeClock"
    )
    assert second.startswith("RuntimeError: no Redis answers at redis://127.0.0.1:1/0")
    assert "TOOLWIRE_REDIS_URL" in second


def test_every_fixture_is_registered_through_the_pytest11_entry_point(tmp_path: Path) -> None:
    """The fixtures reach pytest through the entry point (no conftest, no import), now that
    pytest is imported lazily by the module that defines them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    _, sep, ours = r.stdout.partition("fixtures defined from toolwire.testing")
    assert sep, r.stdout
    ours = ours.split(" fixtures defined from ")[0]
    listed = {m[1] for m in re.finditer(r"^(\w+) -- ", ours, re.MULTILINE)}
    assert listed == {"fake_clock", "kernel", "register_plugin", "redis_url", "redis_cluster_url"}
