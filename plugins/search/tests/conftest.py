"""Fixtures of the search tests. Helpers live in search_testkit.py, loaded here as
``toolwire_search_testkit`` (this directory is deliberately not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import respx

_spec = importlib.util.spec_from_file_location(
    "toolwire_search_testkit", Path(__file__).with_name("search_testkit.py")
)
assert _spec is not None and _spec.loader is not None
kit = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = kit
_spec.loader.exec_module(kit)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    """respx over every httpx request of the test; unmatched requests fail the test."""
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


@pytest.fixture(autouse=True)
def _no_search_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see real keys from the developer's environment."""
    for var in ("BRAVE_API_KEY", "EXA_API_KEY", "SEARXNG_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def tk() -> Any:
    """The test kit module."""
    return kit
