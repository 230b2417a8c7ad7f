"""FastMCP's Host/Origin guard, remembering the requests it let through.

FastMCP's ``HostOriginGuardMiddleware`` (the DNS-rebinding protection in front
of the MCP endpoint) works its verdict out afresh on every request: it parses
the server address with ``ipaddress``, the request's origin with ``urllib`` and
matches the Host header against the allowed patterns — about 9 us a request,
a tenth of the served app's own work on a gateway ``tools/call``. Its verdict
depends only on the request's scheme, the server's address, and the first
``Host`` and ``Origin`` headers (read in FastMCP 4.2's guard; checked by
``tests/test_guard.py`` against the guard itself). ``RememberingGuard`` lets
FastMCP's guard judge every combination it has not seen, and remembers the
combinations it let through, so the same client's next request passes at
the cost of one header scan. Refusals are never remembered: every refused
request is judged, and answered, by FastMCP's guard. At most ``MAX_REMEMBERED``
combinations are kept, none with a Host and Origin of over 512 bytes together
(the client chooses them, before any auth).
"""

from __future__ import annotations

from typing import Any, Final

from fastmcp.server.http import HostOriginGuardMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["MAX_REMEMBERED", "RememberingGuard", "remember_guard_verdicts"]

MAX_REMEMBERED: Final = 256
#: Longer Host + Origin values are judged every time (a client chooses them, before auth).
_MAX_KEY_BYTES: Final = 512

_Key = tuple[Any, Any, bytes | None, bytes | None]


def _key(scope: Scope) -> _Key:
    """What the guard's verdict depends on: scheme, server, first Host, first Origin."""
    host = origin = None
    for name, value in scope["headers"]:
        if name == b"host":
            if host is None:
                host = value
        elif name == b"origin" and origin is None:
            origin = value
    server = scope.get("server")
    return (scope.get("scheme"), tuple(server) if server else None, host, origin)


class RememberingGuard(HostOriginGuardMiddleware):
    """``HostOriginGuardMiddleware`` that skips the checks for combinations it already passed."""

    def __init__(self, app: ASGIApp, *args: Any, **kwargs: Any) -> None:
        super().__init__(app, *args, **kwargs)
        self._next = app
        self.app = self._passed  # where FastMCP's guard sends what it lets through
        self._allowed: set[_Key] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _key(scope) in self._allowed:
            await self._next(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _passed(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            key = _key(scope)
            if len(key[2] or b"") + len(key[3] or b"") <= _MAX_KEY_BYTES:  # memory stays small
                if len(self._allowed) >= MAX_REMEMBERED:
                    self._allowed.clear()
                self._allowed.add(key)
        await self._next(scope, receive, send)


def remember_guard_verdicts(app: Any) -> bool:
    """Swap FastMCP's guard in ``app``'s middleware for ``RememberingGuard`` (same settings).

    Call before the app serves its first request (Starlette builds its stack then).
    Returns whether there was a guard to swap.
    """
    swapped = False
    for i, entry in enumerate(app.user_middleware):
        if entry.cls is HostOriginGuardMiddleware:
            app.user_middleware[i] = type(entry)(RememberingGuard, *entry.args, **entry.kwargs)
            swapped = True
    return swapped
