"""toolwire-approval: human-in-the-loop approval of tool calls.

``ApprovalPlugin`` (entry point ``approval``, order 300) applies a policy per
tool — ``NONE``, ``LAZY`` (proceed when nobody answers in time) or
``REQUIRED`` (wait for a decision) — chosen by name, glob, tag, source, MCP
annotation or the tool's own ``approval`` setting. Pending requests and
decisions live in the kernel's state store; approvers decide through
in-process callbacks, the gateway's HTTP API, MCP elicitation, a terminal
prompt or ``toolwire approvals``; ``approval_required`` events feed UIs.
"""

from __future__ import annotations

from ._channels import (
    ELICIT_EXTENSION,
    ELICIT_SCHEMA,
    INPUT_REQUIRED,
    TERMINAL_EXTENSION,
    Elicitor,
    TerminalPrompt,
    offer_terminal,
)
from ._config import ApprovalConfig, Policy
from ._plugin import ApprovalCallback, ApprovalPlugin
from ._rules import Resolution, RuleSet
from ._types import (
    AlreadyDecidedError,
    ApprovalDecision,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalRequest,
    Approve,
    FingerprintMismatchError,
    InvalidEditError,
    Reject,
    UnknownApprovalError,
    fingerprint,
)

__version__ = "0.1.0"

__all__ = [
    "ELICIT_EXTENSION",
    "ELICIT_SCHEMA",
    "INPUT_REQUIRED",
    "TERMINAL_EXTENSION",
    "AlreadyDecidedError",
    "ApprovalCallback",
    "ApprovalConfig",
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalExpiredError",
    "ApprovalPlugin",
    "ApprovalRequest",
    "Approve",
    "Elicitor",
    "FingerprintMismatchError",
    "InvalidEditError",
    "Policy",
    "Reject",
    "Resolution",
    "RuleSet",
    "TerminalPrompt",
    "UnknownApprovalError",
    "__version__",
    "fingerprint",
    "offer_terminal",
]
