"""``[plugins.profiling]``: every key, its default and what it does (docs/profiling.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolwire.state import MAX_TTL_S

__all__ = ["AdaptiveTimeoutsConfig", "ProfilingConfig"]

Switch = Literal["auto", "on", "off"]
#: The longest interval or retention accepted (about 31 years). Finite: a retention of
#: infinity became a state-store TTL, which refused it, so no figure was ever stored.
MAX_SECONDS = MAX_TTL_S
Milliseconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class AdaptiveTimeoutsConfig(BaseModel):
    """``[plugins.profiling.adaptive_timeouts]``: opt-in timeouts from the estimates."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="tighten each call's deadline to estimate x factor")
    factor: float = Field(5.0, ge=1.0, description="timeout = estimate x factor, then bounded")
    min_s: float = Field(1.0, gt=0, description="never a timeout below this many seconds")
    max_s: float = Field(300.0, gt=0, description="never a timeout above this many seconds")
    min_samples: int = Field(
        20, ge=1, description="successful executions the estimate needs before it is used"
    )
    tools: list[str] = Field(
        default_factory=list, description="only these tools (empty: every tool)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveTimeoutsConfig:
        if self.min_s > self.max_s:
            raise ValueError(f"min_s ({self.min_s}) must not exceed max_s ({self.max_s})")
        return self


class ProfilingConfig(BaseModel):
    """``[plugins.profiling]``."""

    model_config = ConfigDict(extra="forbid")

    key_prefix: str = Field(
        "profiling",
        min_length=1,
        description="state-store keys are '<key_prefix>:v1:<tool>'; processes that share "
        "a prefix (and a store) share their figures",
    )
    flush_interval_s: float = Field(
        5.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="how often a process writes its new figures to the state store",
    )
    refresh_interval_s: float = Field(
        30.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="how often a busy process re-reads every tool's stored figures",
    )
    retention_s: float | None = Field(
        None,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="stored figures of a tool not called for this long expire",
    )
    recent_calls: int = Field(
        1000, ge=0, description="how many recent call records to keep in memory"
    )
    default_estimate_ms: float = Field(
        1000.0, gt=0, allow_inf_nan=False, description="estimate for a tool without enough history"
    )
    default_estimates_ms: dict[str, Milliseconds] = Field(
        default_factory=dict, description="per-tool estimates without enough history"
    )
    min_samples: int = Field(
        5, ge=1, description="successful executions a signature or tool needs to be an estimate"
    )
    similar_calls: bool = Field(
        True, description="estimate from calls with the same argument signature first"
    )
    signature_args: dict[str, list[str]] = Field(
        default_factory=dict,
        description="per tool, the arguments whose exact value is part of the signature",
    )
    max_signatures: int = Field(64, ge=0, description="signatures kept per tool")
    tracing: Switch = Field(
        "auto",
        description="OpenTelemetry spans: 'auto' when a tracer provider is configured, 'on', 'off'",
    )
    metrics: Switch = Field(
        "auto",
        description="OpenTelemetry metrics: 'auto' when a meter provider is configured, 'on', 'off'",
    )
    adaptive_timeouts: AdaptiveTimeoutsConfig = Field(default_factory=AdaptiveTimeoutsConfig)
