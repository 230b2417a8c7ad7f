"""Fixtures of the toolwire-mcp tests; the helpers live in toolwire_mcp_testkit.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import toolwire_mcp_testkit`

from toolwire_mcp_testkit import anyio_backend, node, serve_process

__all__ = ["anyio_backend", "node", "serve_process"]
