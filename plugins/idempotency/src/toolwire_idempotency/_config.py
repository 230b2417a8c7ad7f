"""``[plugins.idempotency]``: the plugin's configuration and its environment overrides."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from toolwire import ConfigError
from toolwire.state import MAX_TTL_S

__all__ = ["ENV_ENABLED", "ENV_TTL_SECS", "IdempotencyConfig", "apply_env"]

#: Honoured environment variables (the names older deployments already use).
ENV_ENABLED = "TOOL_IDEMPOTENCY_ENABLED"
ENV_TTL_SECS = "TOOL_IDEMPOTENCY_TTL_SECS"

#: The longest ``ttl_secs`` / ``lease_secs`` accepted (about 31 years): beyond it a
#: Redis expiry in milliseconds overflows, and infinity is no expiry at all.
MAX_SECS = MAX_TTL_S

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class IdempotencyConfig(BaseModel):
    """``[plugins.idempotency]`` in ``toolwire.toml`` (see docs/idempotency.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True, description="de-duplicate calls at all (env TOOL_IDEMPOTENCY_ENABLED)"
    )
    ttl_secs: float = Field(
        3600.0,
        gt=0,
        le=MAX_SECS,
        allow_inf_nan=False,
        description="how long a result is kept for replays (env TOOL_IDEMPOTENCY_TTL_SECS)",
    )
    prefix: str = Field(
        "toolwire", min_length=1, description="records live at {prefix}:idempotency:{hash}"
    )
    lease_secs: float = Field(
        10.0,
        gt=0,
        le=MAX_SECS,
        allow_inf_nan=False,
        description="a running call's claim lapses this long after its owner stops renewing it",
    )
    wait_secs: float = Field(
        30.0, ge=0, description="how long a duplicate waits for the in-flight original"
    )
    on_in_flight: Literal["wait", "error"] = Field(
        "wait", description="'wait' for the original's result, or answer `conflict` at once"
    )
    on_store_error: Literal["fail_closed", "fail_open"] = Field(
        "fail_closed",
        description="state store down: refuse the call (`unavailable`) or run it unprotected",
    )
    cache_errors: bool = Field(
        False, description="keep terminal tool errors for replays (retryable ones never are)"
    )
    max_result_bytes: int = Field(
        1_048_576, gt=0, description="larger results are not kept; replays get an error"
    )
    max_stored_bytes: int | None = Field(
        None,
        gt=0,
        description="results kept per ttl_secs window, in all; beyond it results are not "
        "kept (replays get an error, as for max_result_bytes). Bounds the results kept at "
        "about twice this (each one not kept still leaves a ~200-byte marker). None: "
        "bounded by ttl_secs alone",
    )
    exempt_tools: list[str] = Field(
        default_factory=list, description="tools never de-duplicated (no store access)"
    )
    exempt_read_only: bool = Field(False, description="exempt every read-only tool as well")
    read_only_tools: list[str] = Field(
        default_factory=list,
        description="tools treated as read-only besides those with readOnlyHint",
    )
    require_call_id: bool = Field(
        False, description="a call without call_id is an `invalid_args` error"
    )
    unknown_after_interrupt: bool = Field(
        False,
        description="a side-effecting call whose running attempt ended by a timeout or a "
        "cancellation keeps its record: replays get `conflict` / outcome_unknown instead of "
        "running it again (default: the claim is released and a replay runs it)",
    )
    unknown_after_interrupt_tools: list[str] = Field(
        default_factory=list,
        description="tools for which unknown_after_interrupt is on, whatever its global value",
    )


def _parse_bool(var: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"expected true or false, got {raw!r}", key=var)


def _parse_secs(var: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > MAX_SECS:
        raise ConfigError(
            f"expected a positive number of seconds up to {MAX_SECS:g}, got {raw!r}", key=var
        )
    return value


def apply_env(config: IdempotencyConfig, env: Mapping[str, str]) -> IdempotencyConfig:
    """``config`` with ``TOOL_IDEMPOTENCY_ENABLED`` / ``TOOL_IDEMPOTENCY_TTL_SECS`` applied.

    Set (non-empty) variables win over the file. A malformed value is a
    ``ConfigError`` naming the variable.
    """
    update: dict[str, object] = {}
    raw = env.get(ENV_ENABLED)
    if raw is not None and raw.strip():
        update["enabled"] = _parse_bool(ENV_ENABLED, raw)
    raw = env.get(ENV_TTL_SECS)
    if raw is not None and raw.strip():
        update["ttl_secs"] = _parse_secs(ENV_TTL_SECS, raw)
    return config.model_copy(update=update) if update else config
