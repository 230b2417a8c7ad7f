"""``[server] forwarded_allow_ips``: whose ``X-Forwarded-*`` headers `toolwire serve` believes.

uvicorn on its own believes them from 127.0.0.1, so on a gateway bound to
loopback any local process could name the client address a plugin records
(the approval audit's ``client``). The tests run ``run_server`` itself over
HTTP with a plugin route that answers the address and scheme it sees.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from toolwire import ConfigError, Kernel

pytestmark = pytest.mark.anyio

FORWARDED = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}


class WhoAmI:
    name = "whoami"

    def http_routes(self) -> list[Any]:
        async def whoami(request: Request) -> JSONResponse:
            client = request.client.host if request.client is not None else None
            return JSONResponse({"client": client, "scheme": request.url.scheme})

        return [Route("/whoami", whoami)]


async def _seen(**server: Any) -> dict[str, Any]:
    """What the route sees of a request carrying ``FORWARDED`` from 127.0.0.1."""
    from toolwire_mcp_testkit import running_server

    from toolwire_mcp import ServeConfig

    cfg = ServeConfig(transport="http", port=0, **server)
    async with (
        Kernel(plugins=[WhoAmI()]) as kernel,
        running_server(kernel, cfg) as info,
        httpx.AsyncClient() as client,
    ):
        answer = await client.get(f"http://127.0.0.1:{info['port']}/whoami", headers=FORWARDED)
    assert answer.status_code == 200, answer.text
    seen: dict[str, Any] = answer.json()
    return seen


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # run_server needs asyncio (uvicorn, FastMCP)


async def test_forwarded_headers_are_not_believed_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    assert await _seen() == {"client": "127.0.0.1", "scheme": "http"}


async def test_the_configured_proxies_are_believed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    seen = await _seen(forwarded_allow_ips=["127.0.0.0/8"])
    assert seen == {"client": "203.0.113.9", "scheme": "https"}
    other = await _seen(forwarded_allow_ips=["10.0.0.1"])
    assert other == {"client": "127.0.0.1", "scheme": "http"}


async def test_every_entry_the_config_accepts_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a network written with host bits ('127.0.0.1/8') passed the check, but
    uvicorn parses networks strictly and took it for a host name that never matches; a
    '*' beside other entries was taken for a literal too. Both proxies went unbelieved,
    silently."""
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    believed = {"client": "203.0.113.9", "scheme": "https"}
    assert await _seen(forwarded_allow_ips=["127.0.0.1/8"]) == believed
    assert await _seen(forwarded_allow_ips=["10.0.0.1", "*"]) == believed


async def test_uvicorns_variable_still_names_the_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.0.0.1, 127.0.0.1")
    assert await _seen() == {"client": "203.0.113.9", "scheme": "https"}
    # an empty list in the config wins over the variable: nobody is believed
    assert await _seen(forwarded_allow_ips=[]) == {"client": "127.0.0.1", "scheme": "http"}


def test_an_entry_that_is_no_address_is_a_config_error() -> None:
    import argparse

    from toolwire_mcp.cli import serve_config

    with pytest.raises(ConfigError, match=r"'proxy\.internal' is not an IP address or network"):
        serve_config(
            {"transport": "http", "forwarded_allow_ips": ["proxy.internal"]},
            "toolwire.toml",
            argparse.Namespace(),
        )
