"""``RememberingGuard`` decides exactly as FastMCP's Host/Origin guard, remembered or not."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fastmcp.server.http import HostOriginGuardMiddleware
from starlette.types import Message, Receive, Scope, Send

from toolwire import Kernel
from toolwire_mcp._guard import MAX_REMEMBERED, RememberingGuard
from toolwire_mcp._serve import create_http_app

pytestmark = pytest.mark.anyio

HOSTS = [b"127.0.0.1:8000", b"localhost:8000", b"[::1]:8000", b"evil.example", b"", None]
ORIGINS = [
    None,
    b"http://127.0.0.1:8000",
    b"http://localhost:3000",
    b"https://evil.example",
    b"http://api.example.com",
    b"null",
]
SERVERS = [("127.0.0.1", 8000), ("0.0.0.0", 8000), ("10.0.0.5", 80), ["::1", 8000], None]
SETTINGS: list[dict[str, Any]] = [
    {"mode": "auto"},
    {"mode": "strict"},
    {"mode": "auto", "allowed_hosts": ["api.example.com", "*.internal"]},
    {"mode": "auto", "allowed_origins": ["http://api.example.com"]},
    {"mode": "strict", "allowed_hosts": ["*"], "allowed_origins": ["https://*.example"]},
]


def _scope(scheme: str, server: Any, host: bytes | None, origin: bytes | None) -> Scope:
    headers = [(b"accept", b"*/*")]
    if host is not None:
        headers.append((b"host", host))
    if origin is not None:
        headers.append((b"origin", origin))
    return {"type": "http", "scheme": scheme, "server": server, "headers": headers}


async def _verdict(app: Any, scope: Scope) -> tuple[str, int | None]:
    """('passed', None), or ('refused', status)."""
    out: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        out.append(message)

    await app(scope, receive, send)
    if out and out[0]["type"] == "http.response.start":
        return "refused", out[0]["status"]
    return "passed", None


async def _inner(scope: Scope, receive: Receive, send: Send) -> None:
    pass


@pytest.mark.parametrize("settings", SETTINGS)
async def test_remembered_verdicts_are_fastmcps_verdicts(settings: dict[str, Any]) -> None:
    fastmcp_guard = HostOriginGuardMiddleware(_inner, **settings)
    remembering = RememberingGuard(_inner, **settings)
    cases = list(itertools.product(["http", "https"], SERVERS, HOSTS, ORIGINS))
    verdicts = set()
    for round_ in range(2):  # the second round is answered from what the first remembered
        for case in cases:
            expected = await _verdict(fastmcp_guard, _scope(*case))
            got = await _verdict(remembering, _scope(*case))
            assert got == expected, (round_, case)
            verdicts.add(expected)
    assert {v[0] for v in verdicts} == {"passed", "refused"}  # the matrix exercises both
    assert remembering._allowed  # and something was remembered


async def test_the_first_host_header_is_the_one_judged() -> None:
    guard = RememberingGuard(_inner, mode="auto")
    ok = _scope("http", ("127.0.0.1", 8000), b"127.0.0.1:8000", None)
    assert await _verdict(guard, ok) == ("passed", None)
    # the same first Host, a second one after it: FastMCP reads the first, so do we
    twice = dict(ok, headers=[*ok["headers"], (b"host", b"evil.example")])
    assert await _verdict(guard, twice) == await _verdict(HostOriginGuardMiddleware(_inner), twice)
    evil_first = dict(ok, headers=[(b"host", b"evil.example"), (b"host", b"127.0.0.1:8000")])
    assert await _verdict(guard, evil_first) == ("refused", 421)


async def test_refusals_are_never_remembered_and_the_memory_is_bounded() -> None:
    guard = RememberingGuard(_inner, mode="strict", allowed_hosts=["*"])
    for i in range(MAX_REMEMBERED + 50):  # any Host is allowed: every one is a new entry
        host = f"h{i}.example".encode()
        verdict = await _verdict(guard, _scope("http", ("10.0.0.5", 80), host, None))
        assert verdict == ("passed", None)
        assert len(guard._allowed) <= MAX_REMEMBERED
    long_host = b"h" * 600 + b".example"  # judged every time: not worth the memory
    verdict = await _verdict(guard, _scope("http", ("10.0.0.5", 80), long_host, None))
    assert verdict == ("passed", None)
    assert not any(key[2] == long_host for key in guard._allowed)
    strict = RememberingGuard(_inner, mode="strict")
    bad = _scope("http", ("127.0.0.1", 8000), b"evil.example", None)
    for _ in range(3):
        assert await _verdict(strict, bad) == ("refused", 421)
    assert not strict._allowed


def test_the_served_app_uses_the_remembering_guard() -> None:
    app = create_http_app(Kernel())
    classes: list[Any] = [m.cls for m in app.user_middleware]
    assert RememberingGuard in classes
    assert HostOriginGuardMiddleware not in classes
