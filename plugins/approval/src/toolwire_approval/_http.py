"""The HTTP API: list, read and decide approval requests (Starlette routes).

Every request must carry ``Authorization: Bearer <http_token>``, the token of
``[plugins.approval] http_token`` (401 otherwise); without one configured,
every route answers 403. Not the gateway's token: every MCP client holds that
one, and the API is how a call waiting for a person is released, so a client
could approve its own calls. The routes check the token themselves
(``toolwire_auth`` on each route: ``toolwire serve`` mounts them without its
own bearer check, still behind its Host/Origin guard). Every body and answer
is JSON::

    GET  /approvals                    {"approvals": [request, ...]}  (?status=pending|approved|rejected|expired|all, ?tool=)
    GET  /approvals/{id}               request + "audit": [entries]
    POST /approvals/{id}               {"decision": "approve"|"reject", "args"?, "reason"?, "comment"?, "by"?, "fingerprint"?}
    POST /approvals/{id}/approve       {"args"?, "comment"?, "by"?, "fingerprint"?}
    POST /approvals/{id}/reject        {"reason"?, "by"?, "fingerprint"?}

Errors: ``{"error": {"kind", "message", "request_id", ...}}`` with 400 (bad
body), 401 (missing or wrong token), 403 (no ``http_token`` configured), 404
(unknown id), 409 (already decided, expired, other arguments), 413 (a body
over 1 MiB), 422 (edited arguments invalid; ``problems`` lists them), 503
(state store down).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from toolwire.state import StateStoreError

from ._types import ApprovalDecision, ApprovalError, Approve, Reject

if TYPE_CHECKING:
    from ._plugin import ApprovalPlugin

__all__ = ["build_routes"]

_STATUSES = ("pending", "approved", "rejected", "expired", "all")
#: The body keys of each decision ("decision" too, on POST /approvals/{id}).
_KEYS = {
    "approve": frozenset({"args", "comment", "by", "fingerprint"}),
    "reject": frozenset({"reason", "by", "fingerprint"}),
}


#: The largest body a decision may have (edited arguments included).
MAX_BODY_BYTES = 1 << 20

_NO_TOKEN = (
    "the approval HTTP API is off: it needs a token of its own, [plugins.approval] "
    'http_token = {"$secretRef" = "NAME"} (not the gateway\'s token: every MCP client holds '
    "that one, and could approve its own calls). Meanwhile decide with `toolwire approvals "
    "approve|reject <id>` on the same state store"
)

Endpoint = Callable[[Request], Awaitable[JSONResponse]]


class _TooLarge(Exception):
    pass


def _error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "message": message, **extra}}, status_code=status)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def _read_body(request: Request) -> bytes:
    """The body, refused (``_TooLarge``) past ``MAX_BODY_BYTES`` before more is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def build_routes(plugin: ApprovalPlugin, prefix: str = "/approvals") -> list[BaseRoute]:
    """The API's routes under ``prefix``, deciding through ``plugin``, behind its ``http_token``.

    Each route carries ``toolwire_auth``: a function telling whether a bearer
    token opens it (``toolwire serve`` refuses to start when its own token does).
    """
    token = plugin.config.http_token
    expected = _digest(token.get_secret_value()) if token is not None else None

    def accepts(given: str) -> bool:
        """Whether ``given`` is the API's token (compared in constant time)."""
        return expected is not None and hmac.compare_digest(_digest(given), expected)

    def guarded(endpoint: Endpoint) -> Endpoint:
        async def checked(request: Request) -> JSONResponse:
            if expected is None:
                return _error(403, "forbidden", _NO_TOKEN)
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not accepts(given.strip()):
                response = _error(
                    401,
                    "auth",
                    "missing or wrong bearer token: send Authorization: Bearer <token>, the "
                    "token of [plugins.approval] http_token",
                )
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
            return await endpoint(request)

        return checked

    async def list_requests(request: Request) -> JSONResponse:
        status = request.query_params.get("status", "pending")
        if status not in _STATUSES:
            return _error(400, "bad_request", f"status must be one of {', '.join(_STATUSES)}")
        tool = request.query_params.get("tool") or None
        try:
            found = await plugin.requests(status=None if status == "all" else status, tool=tool)
        except StateStoreError as exc:
            return _error(503, "unavailable", f"the state store failed: {exc}")
        return JSONResponse({"approvals": [r.to_dict() for r in found]})

    async def one_request(request: Request) -> JSONResponse:
        rid = request.path_params["id"]
        if request.method == "GET":
            try:
                req = await plugin.get(rid)
                audit = await plugin.audit_log(rid)
            except ApprovalError as exc:
                return JSONResponse({"error": exc.to_dict()}, status_code=exc.status)
            except StateStoreError as exc:
                return _error(503, "unavailable", f"the state store failed: {exc}")
            return JSONResponse({**req.to_dict(), "audit": audit})
        return await _decide(request, rid, None)

    async def approve(request: Request) -> JSONResponse:
        return await _decide(request, request.path_params["id"], "approve")

    async def reject(request: Request) -> JSONResponse:
        return await _decide(request, request.path_params["id"], "reject")

    async def _decide(request: Request, rid: str, action: str | None) -> JSONResponse:
        try:
            raw = await _read_body(request)
        except _TooLarge:
            return _error(
                413,
                "too_large",
                f"the body is over {MAX_BODY_BYTES} bytes; nothing was decided",
                request_id=rid,
            )
        try:
            body = json.loads(raw) if raw.strip() else {}
        except RecursionError:
            return _error(400, "bad_request", "the body is nested too deeply", request_id=rid)
        except ValueError as exc:
            return _error(400, "bad_request", f"the body is not valid JSON: {exc}", request_id=rid)
        if not isinstance(body, dict):
            return _error(400, "bad_request", "the body must be a JSON object", request_id=rid)
        action = action or body.get("decision")
        if action not in ("approve", "reject"):
            return _error(
                400,
                "bad_request",
                'say "decision": "approve" or "reject" (or POST .../approve)',
                request_id=rid,
            )
        # An unknown key is refused, not ignored: {"arguments": {...}} (for "args") would
        # otherwise approve the call with its original arguments instead of the edited ones.
        allowed = _KEYS[action] | ({"decision"} if "decision" in body else set())
        unknown = sorted(set(body) - allowed)
        if unknown:
            return _error(
                400,
                "bad_request",
                f"unknown key(s) {', '.join(map(repr, unknown))} in the body; to "
                f"{action}, send {', '.join(sorted(allowed))}. Nothing was decided",
                request_id=rid,
            )
        by = body.get("by")
        fp = body.get("fingerprint")
        for name in ("by", "fingerprint", "reason", "comment"):
            value = body.get(name)
            if value is not None and not isinstance(value, str):
                return _error(400, "bad_request", f"{name!r} must be a string", request_id=rid)
        decision: ApprovalDecision
        if action == "approve":
            args = body.get("args")
            if args is not None and not isinstance(args, dict):
                return _error(422, "invalid_args", "'args' must be a JSON object", request_id=rid)
            decision = Approve(by=by, args=args, comment=body.get("comment"))
        else:
            decision = Reject(reason=body.get("reason") or "rejected over HTTP", by=by)
        client = request.client.host if request.client is not None else None
        try:
            done = await plugin.decide(rid, decision, via="http", fingerprint=fp, client=client)
        except ApprovalError as exc:
            return JSONResponse({"error": exc.to_dict()}, status_code=exc.status)
        except StateStoreError as exc:
            return _error(503, "unavailable", f"the state store failed: {exc}")
        return JSONResponse(done.to_dict())

    routes = [
        Route(prefix, guarded(list_requests), methods=["GET"]),
        Route(prefix + "/{id}", guarded(one_request), methods=["GET", "POST"]),
        Route(prefix + "/{id}/approve", guarded(approve), methods=["POST"]),
        Route(prefix + "/{id}/reject", guarded(reject), methods=["POST"]),
    ]
    for route in routes:
        route.toolwire_auth = accepts  # type: ignore[attr-defined]
    return list(routes)
