"""Fixtures of the toolwire-approval tests; the helpers live in approval_testkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import approval_testkit`

from approval_testkit import anyio_backend

__all__ = ["anyio_backend"]
