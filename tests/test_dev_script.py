"""`./dev`, the developer entry point of the README."""

from __future__ import annotations

import subprocess
from pathlib import Path

DEV = Path(__file__).resolve().parent.parent / "dev"


def dev(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(DEV), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_an_unknown_command_fails_and_says_so() -> None:
    """Before: `./dev tets` printed the usage and exited 0, so a CI step with a mistyped
    command passed without running anything."""
    r = dev("tets")
    assert r.returncode == 2
    assert "dev: unknown command 'tets'" in r.stderr and "./dev test" in r.stderr
    for ok in ((), ("help",), ("-h",), ("--help",)):
        r = dev(*ok)
        assert r.returncode == 0 and "./dev serve" in r.stdout, ok
