"""The HTTP API: list, read and decide approval requests (Starlette routes).

``toolwire serve --transport http`` mounts these routes behind the same bearer
auth as its MCP endpoint. Every body and answer is JSON::

    GET  /approvals                    {"approvals": [request, ...]}  (?status=pending|approved|rejected|expired|all, ?tool=)
    GET  /approvals/{id}               request + "audit": [entries]
    POST /approvals/{id}               {"decision": "approve"|"reject", "args"?, "reason"?, "comment"?, "by"?, "fingerprint"?}
    POST /approvals/{id}/approve       {"args"?, "comment"?, "by"?, "fingerprint"?}
    POST /approvals/{id}/reject        {"reason"?, "by"?, "fingerprint"?}

Errors: ``{"error": {"kind", "message", "request_id", ...}}`` with 400 (bad
body), 404 (unknown id), 409 (already decided, expired, other arguments),
422 (edited arguments invalid; ``problems`` lists them), 503 (state store down).
"""

from __future__ import annotations

import json
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


def _error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "message": message, **extra}}, status_code=status)


def build_routes(plugin: ApprovalPlugin, prefix: str = "/approvals") -> list[BaseRoute]:
    """The API's routes under ``prefix``, deciding through ``plugin``."""

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
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
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

    return [
        Route(prefix, list_requests, methods=["GET"]),
        Route(prefix + "/{id}", one_request, methods=["GET", "POST"]),
        Route(prefix + "/{id}/approve", approve, methods=["POST"]),
        Route(prefix + "/{id}/reject", reject, methods=["POST"]),
    ]
