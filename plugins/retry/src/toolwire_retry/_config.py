"""``[plugins.retry]``: backoff policy, fallback chains, the retry budget."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

__all__ = ["BudgetConfig", "FallbackSpec", "RetryConfig", "ToolPolicy"]


class FallbackSpec(BaseModel):
    """A fallback target, optionally with different arguments (merged over the call's)."""

    model_config = ConfigDict(extra="forbid")

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


def _as_spec(v: Any) -> Any:
    return {"tool": v} if isinstance(v, str) else v


Fallback = Annotated[FallbackSpec, BeforeValidator(_as_spec)]


class _Policy(BaseModel):
    """Keys shared by the global section and ``tools.<name>``; None means "inherit"."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int | None = Field(
        None, ge=1, le=100, description="attempts per call, fallbacks included"
    )
    max_provider_attempts: int | None = Field(
        None, ge=1, le=100, description="attempts on one provider before failing over"
    )
    max_elapsed_s: float | None = Field(
        None, gt=0, description="no retry or fallback starts after this"
    )
    base_s: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,  # inf: every retry slept cap_s, or with cap_s = inf never ran
        description="first backoff step (full jitter)",
    )
    cap_s: float | None = Field(
        None, ge=0, description="longest single sleep; a longer retry-after fails over instead"
    )
    request_timeout_seconds: float | None = Field(
        None, gt=0, description="per-attempt timeout for tools that set none"
    )
    fallback_on_empty: bool | None = Field(
        None, description="an empty result counts as a soft failure"
    )
    idempotent: bool | None = Field(
        None,
        description="safe to repeat after a timeout or a lost connection even if it has side effects",
    )


class ToolPolicy(_Policy):
    """``[plugins.retry.tools.<name>]``."""

    retry: bool = Field(True, description="false: never retry or fail over this tool")
    fallbacks: list[Fallback] | None = Field(
        None, description="overrides chain_order for this tool"
    )


class BudgetConfig(BaseModel):
    """A token bucket against retry storms: retries and fallbacks spend one token."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    ratio: float = Field(0.2, ge=0, le=10, description="tokens each call earns")
    min_per_s: float = Field(
        1.0, ge=0, description="tokens earned per second regardless of traffic"
    )
    burst: float = Field(20.0, ge=1, description="most tokens banked")


class RetryConfig(_Policy):
    """``[plugins.retry]``. See docs/retry.md.

    The aggregation keys ``chain_order``, ``max_provider_attempts``,
    ``request_timeout_seconds`` and ``fallback_on_empty`` may also come from
    ``[plugins.ratelimit]`` (globally and per provider); keys set here win.
    """

    config_file: str | None = Field(None, description="a YAML/TOML/JSON file with these keys")
    chain_order: list[str] | None = Field(
        None, description="providers (or tools) in fallback order"
    )
    fallbacks: dict[str, list[Fallback]] = Field(
        default_factory=dict, description="tool -> fallback tools (or providers), in order"
    )
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    seed: int | None = Field(None, description="seed the jitter (tests)")

    @field_validator("chain_order")
    @classmethod
    def _no_duplicates(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            dup = sorted({x for x in v if v.count(x) > 1})
            if dup:
                raise ValueError(f"listed more than once: {dup}")
        return v


#: Defaults of the inheritable keys when nothing sets them.
DEFAULTS: dict[str, Any] = {
    "max_attempts": 4,
    "max_provider_attempts": 2,
    "max_elapsed_s": 60.0,
    "base_s": 0.25,
    "cap_s": 20.0,
    "request_timeout_seconds": None,
    "fallback_on_empty": False,
    "idempotent": False,
}
