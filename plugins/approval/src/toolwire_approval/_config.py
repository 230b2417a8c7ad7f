"""``[plugins.approval]``: policies, rules, timeouts and channels."""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator

from toolwire.state import MAX_TTL_S

__all__ = ["ANNOTATION_HINTS", "ApprovalConfig", "Policy", "parse_policy"]


class Policy(enum.StrEnum):
    """How a tool's calls are approved.

    - ``NONE``: the call runs without asking anyone.
    - ``LAZY``: someone is asked; the call proceeds when nobody answers within
      ``lazy_timeout_s`` (an explicit rejection still stops it).
    - ``REQUIRED``: the call waits until someone approves or rejects it; after
      ``required_timeout_s`` it is rejected with reason ``timeout``.
    """

    NONE = "NONE"
    LAZY = "LAZY"
    REQUIRED = "REQUIRED"

    @property
    def strictness(self) -> int:
        """0 for NONE, 1 for LAZY, 2 for REQUIRED (the stricter rule wins a tie)."""
        return _STRICTNESS[self]


#: The longest timeout or retention accepted (about 31 years): a bound, not a use case.
MAX_SECONDS = MAX_TTL_S

_STRICTNESS = {Policy.NONE: 0, Policy.LAZY: 1, Policy.REQUIRED: 2}

#: MCP tool annotations a rule may name (matched when the tool sets the hint to true).
ANNOTATION_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
_HINTS_BY_LOWER = {h.lower(): h for h in ANNOTATION_HINTS}


def parse_policy(value: Any) -> Policy:
    """``"required"``, ``"REQUIRED"``, ``True`` (REQUIRED) or ``False`` (NONE) as a Policy.

    Raises ``ValueError`` naming the accepted values.
    """
    if isinstance(value, Policy):
        return value
    if isinstance(value, bool):
        return Policy.REQUIRED if value else Policy.NONE
    if isinstance(value, str):
        try:
            return Policy(value.strip().upper())
        except ValueError:
            pass
    raise ValueError(f"expected 'NONE', 'LAZY' or 'REQUIRED', got {value!r}")


PolicyField = Annotated[Policy, BeforeValidator(parse_policy)]


class ApprovalConfig(BaseModel):
    """``[plugins.approval]`` in ``toolwire.toml`` (see plugins/approval/README.md).

    With no configuration every tool runs without approval, except tools that
    declare ``approval = "LAZY" | "REQUIRED"`` in their own settings
    (``@tool(approval="REQUIRED")``).
    """

    model_config = ConfigDict(extra="forbid")

    default: PolicyField = Field(Policy.NONE, description="policy of tools no rule matches")
    tools: dict[str, PolicyField] = Field(
        default_factory=dict,
        description="by tool name: exact names, or globs (`send_*`, `mcp_github_*`)",
    )
    tags: dict[str, PolicyField] = Field(
        default_factory=dict, description="by tag (the strictest matching tag wins)"
    )
    sources: dict[str, PolicyField] = Field(
        default_factory=dict,
        description="by tool source (`local`, `mcp:<server>`, `a2a:<agent>`; globs allowed)",
    )
    annotations: dict[str, PolicyField] = Field(
        default_factory=dict,
        description="by MCP annotation set to true (`destructiveHint = 'REQUIRED'`)",
    )
    use_tool_settings: bool = Field(
        True, description="honour a tool's own `approval` setting (`@tool(approval=...)`)"
    )
    # Finite and bounded: they become state-store TTLs, which refuse infinity (every call
    # of a tool needing approval failed with kind 'internal' on `required_timeout_s = inf`).
    lazy_timeout_s: float = Field(
        30.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description="LAZY: proceed after this long"
    )
    required_timeout_s: float = Field(
        3600.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="REQUIRED: reject (reason 'timeout') after this long",
    )
    retention_s: float = Field(
        7 * 86400.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="decided requests and audit entries are kept this long in the state store",
    )
    key_prefix: str = Field(
        "toolwire:approval", min_length=1, description="state keys start with this"
    )
    mcp_elicitation: bool = Field(
        True, description="ask the MCP client's user when the client supports elicitation"
    )
    terminal: bool = Field(True, description="prompt at the terminal in `toolwire call`")
    http_prefix: str = Field("/approvals", description="path of the HTTP API on the gateway")
    http_token: SecretStr | None = Field(
        None,
        description="bearer token approvers send to the HTTP API; a token of its own, not the "
        "gateway's (every MCP client holds that one, and could approve its own calls); write "
        '{"$secretRef" = "NAME"}. Unset: the HTTP API answers 403',
    )

    @field_validator("annotations", mode="before")
    @classmethod
    def _hint_names(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for name, policy in value.items():
            hint = _HINTS_BY_LOWER.get(str(name).lower())
            if hint is None:
                raise ValueError(
                    f"unknown annotation {name!r}; use one of {', '.join(ANNOTATION_HINTS)}"
                )
            if hint in spelled:
                # Hints match case-insensitively: the two entries were merged and the later
                # one won silently, whichever policy the operator meant.
                raise ValueError(
                    f"{spelled[hint]!r} and {name!r} both set the annotation {hint!r} (hint "
                    "names are case-insensitive); keep one"
                )
            spelled[hint] = str(name)
            out[hint] = policy
        return out

    @field_validator("http_token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        raw = value.get_secret_value()
        if not raw.strip():
            raise ValueError('is empty; set a token of its own, e.g. {"$secretRef" = "NAME"}')
        if raw != raw.strip() or any(c in raw for c in "\r\n\0"):
            raise ValueError(
                "has leading or trailing whitespace, a line break or NUL, which no client "
                "can send in an Authorization header (a secret read with its trailing "
                "newline?); remove it"
            )
        if not (raw.isascii() and raw.isprintable()):
            # The server reads the header as Latin-1 and compares UTF-8: a UTF-8 client
            # (curl on a UTF-8 terminal) sending the very token got 401 for ever.
            raise ValueError(
                "has characters outside printable ASCII, which HTTP clients send in "
                "different encodings (the token would be refused as wrong); use ASCII "
                "letters, digits and punctuation"
            )
        return value

    @field_validator("http_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or value == "/" or value.endswith("/"):
            raise ValueError("must start with '/' and not end with it, e.g. '/approvals'")
        return value
