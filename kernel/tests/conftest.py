from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Kernel tests run on asyncio by default; some also parametrize trio."""
    return "asyncio"
