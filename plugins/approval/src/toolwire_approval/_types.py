"""Approval requests, decisions and errors (the plugin's public data types)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

__all__ = [
    "PENDING",
    "APPROVED",
    "REJECTED",
    "EXPIRED",
    "AlreadyDecidedError",
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalExpiredError",
    "ApprovalRequest",
    "Approve",
    "FingerprintMismatchError",
    "InvalidEditError",
    "Reject",
    "UnknownApprovalError",
    "fingerprint",
    "jsonable_args",
]

PENDING, APPROVED, REJECTED, EXPIRED = "pending", "approved", "rejected", "expired"


# ------------------------------------------------------------------ decisions
@dataclass(frozen=True, slots=True)
class Approve:
    """Approve the call; ``args`` (optional) replaces its arguments after validation.

    ``by`` names who decided (free text: a user name, a service); ``comment``
    goes to the audit log.
    """

    by: str | None = None
    args: dict[str, Any] | None = None
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """Reject the call: it ends with kind ``denied`` and ``reason``, and never runs."""

    reason: str = "rejected"
    by: str | None = None


ApprovalDecision = Approve | Reject


# ------------------------------------------------------------------- requests
@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One approval request, as an approver (a UI, a callback, the HTTP API) sees it.

    ``status`` is ``pending``, ``approved``, ``rejected`` or ``expired`` (still
    pending after ``expires_at``: nobody waits for it any more, no decision is
    accepted). ``decision`` (once decided) holds ``action`` (``approve`` /
    ``reject``), ``by``, ``via`` (``api``, ``callback``, ``http``, ``cli``,
    ``terminal``, ``mcp_elicitation``, ``lazy_timeout``, ``timeout``), ``at``,
    ``reason``, ``comment``, ``edited`` and the edited ``args``.
    """

    id: str
    tool: str
    args: dict[str, Any]
    fingerprint: str
    policy: str
    rule: str
    status: str
    created_at: float
    expires_at: float
    call_id: str | None = None
    session_id: str | None = None
    tenant: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    source: str = ""
    via: str | None = None
    decision: dict[str, Any] | None = None
    used_at: float | None = None

    @classmethod
    def from_record(cls, rec: dict[str, Any], now: float) -> ApprovalRequest:
        """The request stored as ``rec`` (a state-store value), as seen at ``now``."""
        status = rec["status"]
        if status == PENDING and now >= rec["expires_at"]:
            status = EXPIRED
        info = rec.get("tool_info") or {}
        return cls(
            id=rec["id"],
            tool=rec["tool"],
            args=rec["args"],
            fingerprint=rec["fingerprint"],
            policy=rec["policy"],
            rule=rec["rule"],
            status=status,
            created_at=rec["created_at"],
            expires_at=rec["expires_at"],
            call_id=rec.get("call_id"),
            session_id=rec.get("session_id"),
            tenant=rec.get("tenant"),
            description=info.get("description", ""),
            input_schema=info.get("input_schema") or {},
            annotations=info.get("annotations") or {},
            tags=list(info.get("tags") or []),
            source=info.get("source", ""),
            via=rec.get("via"),
            decision=rec.get("decision"),
            used_at=rec.get("used_at"),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (what the HTTP API and the events carry)."""
        return {
            "id": self.id,
            "tool": self.tool,
            "args": self.args,
            "fingerprint": self.fingerprint,
            "policy": self.policy,
            "rule": self.rule,
            "status": self.status,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "call_id": self.call_id,
            "session_id": self.session_id,
            "tenant": self.tenant,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
            "tags": self.tags,
            "source": self.source,
            "via": self.via,
            "decision": self.decision,
            "used_at": self.used_at,
        }


# --------------------------------------------------------------------- errors
class ApprovalError(Exception):
    """A decision could not be recorded. ``status`` is the matching HTTP status."""

    status: int = 400
    kind: str = "approval_error"

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "message", "request_id"}`` (the HTTP API's error body)."""
        return {"kind": self.kind, "message": str(self), "request_id": self.request_id}


class UnknownApprovalError(ApprovalError):
    """No approval request has this id (never existed, or past its retention)."""

    status = 404
    kind = "not_found"


class AlreadyDecidedError(ApprovalError):
    """The request was approved or rejected already; the first decision stands."""

    status = 409
    kind = "already_decided"


class ApprovalExpiredError(ApprovalError):
    """The request timed out before this decision arrived."""

    status = 409
    kind = "expired"


class FingerprintMismatchError(ApprovalError):
    """The decision names other arguments than the request's: it is refused."""

    status = 409
    kind = "fingerprint_mismatch"


class InvalidEditError(ApprovalError):
    """Edited arguments do not match the tool's input schema.

    ``problems`` lists ``{"field", "message"}``.
    """

    status = 422
    kind = "invalid_args"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None = None,
        problems: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id)
        self.problems = problems or []

    def to_dict(self) -> dict[str, Any]:
        """The error body, with the problems."""
        return {**super().to_dict(), "problems": self.problems}


# ---------------------------------------------------------------- fingerprint
def jsonable_args(args: dict[str, Any]) -> dict[str, Any]:
    """Validated args as JSON-native values (datetimes, models... are dumped).

    Raises ``ValueError`` for what the state store cannot keep: NaN or Infinity
    (the kernel's float validation lets them through), nesting past pydantic's limit.
    """
    out = pydantic_core.to_jsonable_python(args)
    if not isinstance(out, dict):  # pragma: no cover - args are always a dict
        raise TypeError("arguments must be a JSON object")
    try:
        json.dumps(out, allow_nan=False)
    except ValueError:
        raise ValueError("they contain NaN or Infinity, which JSON cannot carry") from None
    return out


def fingerprint(tool: str, args: dict[str, Any]) -> str:
    """sha256 (hex) of the tool name and its JSON-native args, key order ignored."""
    text = json.dumps(
        {"tool": tool, "args": args},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=True,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
