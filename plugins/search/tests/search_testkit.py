"""Helpers of the search tests, loaded by conftest.py as ``toolwire_search_testkit``.

(This directory is not a package: every distribution has a ``tests`` folder and
``--import-mode=importlib`` would make two ``tests`` packages collide.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from toolwire import Kernel
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin
from toolwire_retry import RetryConfig, RetryPlugin
from toolwire_search import SearchConfig, SearchPlugin

#: Copies of ../shared/fixtures/search (see fixtures/README in the plugin README).
FIXTURES = Path(__file__).with_name("fixtures")
SHARED_FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "search"

BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
EXA_URL = "https://api.exa.ai/search"
SEARX = "https://searx.test"
SEARX_URL = f"{SEARX}/search"

B1, B2 = "brave-secret-key-111111", "brave-secret-key-222222"
E1, E2 = "exa-secret-key-333333", "exa-secret-key-444444"


def load(name: str) -> Any:
    """A fixture: parsed JSON for ``.json``, text otherwise."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return json.loads(text) if name.endswith(".json") else text


def headers_of(name: str) -> dict[str, str]:
    """The headers recorded next to a fixture (``<name>.headers.json``)."""
    data = load(name.removesuffix(".json") + ".headers.json")
    return dict(data["headers"])


def env(**keys: str) -> dict[str, str]:
    """An environment with only the given search variables."""
    return dict(keys)


def make_kernel(
    *,
    environ: Mapping[str, str] | None = None,
    search: Mapping[str, Any] | None = None,
    rl: Mapping[str, Any] | None = None,
    retry: Mapping[str, Any] | None = None,
    with_retry: bool = True,
    with_ratelimit: bool = True,
    clock: FakeClock | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    **kernel_kw: Any,
) -> Kernel:
    """A kernel with the ratelimit, retry and search plugins (fake clock, memory state)."""
    plugins: list[object] = []
    if with_ratelimit:
        plugins.append(RateLimitPlugin(RateLimitConfig.model_validate(dict(rl or {}))))
    if with_retry:
        plugins.append(RetryPlugin(RetryConfig.model_validate({"seed": 3, **(retry or {})})))
    plugins.append(
        SearchPlugin(
            SearchConfig.model_validate(dict(search or {})),
            environ=dict(environ or {}),
            transport=transport,
        )
    )
    return Kernel(clock=clock or FakeClock(), plugins=plugins, **kernel_kw)


def by_key(
    header: str, replies: Mapping[str, httpx.Response | Callable[[], httpx.Response]]
) -> Callable[[httpx.Request], httpx.Response]:
    """A respx side effect answering according to the key sent in ``header``."""

    def answer(request: httpx.Request) -> httpx.Response:
        reply = replies[request.headers.get(header, "")]
        return reply() if callable(reply) else reply

    return answer


def keys_sent(route: Any, header: str) -> list[str]:
    """The keys a respx route received, in order."""
    return [c.request.headers.get(header, "") for c in route.calls]
