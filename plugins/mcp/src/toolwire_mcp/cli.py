"""`toolwire serve` (work in progress)."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    """Register nothing yet."""
