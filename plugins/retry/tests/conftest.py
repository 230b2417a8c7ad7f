"""Fixtures of the retry tests: two fake providers on 127.0.0.1, an httpx client, kernels."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from toolwire import CallContext, Clock, Kernel, tool
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin, lease_key
from toolwire_ratelimit.testing import FakeProvider
from toolwire_retry import RetryConfig, RetryPlugin

A1, A2, B1 = "alpha-secret-111111", "alpha-secret-222222", "beta-secret-333333"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def alpha() -> Iterator[FakeProvider]:
    with FakeProvider("alpha") as p:
        yield p


@pytest.fixture
def beta() -> Iterator[FakeProvider]:
    with FakeProvider("beta") as p:
        yield p


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


def http_tool(name: str, provider: str, base: str, client: httpx.AsyncClient, **opts: Any) -> Any:
    """A search tool that takes a key from the provider's pool and calls the fake API."""

    @tool(name=name, read_only=opts.pop("read_only", True), provider=provider, **opts)
    async def search(q: str, ctx: CallContext) -> dict[str, Any]:
        """Search."""
        async with lease_key(ctx, provider) as key:
            headers = {"X-Api-Key": key.secret} if key.secret else {}
            r = await client.get(f"{base}/search", params={"q": q}, headers=headers)
            r.raise_for_status()
            return dict(r.json())

    return search


MakeKernel = Callable[..., Kernel]


@pytest.fixture
def make_kernel(alpha: FakeProvider, beta: FakeProvider, client: httpx.AsyncClient) -> MakeKernel:
    """A kernel with alpha_search (keys a1, a2 unless ``alpha_keys``) and beta_search (key b1)."""

    def make(
        *,
        alpha_keys: list[dict[str, Any]] | None = None,
        chain: bool = True,
        clock: Clock | None = None,
        rl: dict[str, Any] | None = None,
        retry: dict[str, Any] | None = None,
        alpha_provider: dict[str, Any] | None = None,
        **kernel_kw: Any,
    ) -> Kernel:
        rl_cfg = {
            "providers": {
                "alpha": {
                    "tools": ["alpha_search"],
                    "keys": alpha_keys
                    if alpha_keys is not None
                    else [{"alias": "a1", "secret": A1}, {"alias": "a2", "secret": A2}],
                    **(alpha_provider or {}),
                },
                "beta": {"tools": ["beta_search"], "keys": [{"alias": "b1", "secret": B1}]},
            },
            **({"chain_order": ["alpha", "beta"]} if chain else {}),
            **(rl or {}),
        }
        retry_cfg = {"seed": 7, **(retry or {})}
        return Kernel(
            clock=clock if clock is not None else FakeClock(),
            plugins=[
                RateLimitPlugin(RateLimitConfig.model_validate(rl_cfg)),
                RetryPlugin(RetryConfig.model_validate(retry_cfg)),
            ],
            tools=[
                http_tool("alpha_search", "alpha", alpha.url, client),
                http_tool("beta_search", "beta", beta.url, client),
            ],
            **kernel_kw,
        )

    return make
