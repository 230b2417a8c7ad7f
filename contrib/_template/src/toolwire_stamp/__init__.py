"""toolwire-stamp: stamps every result with a label, and can refuse listed tools.

A template for third-party plugins (contrib/_template in the toolwire
repository): a config model, hooks that keep per-call state in ``ctx.state``,
a typed refusal, and tests with ``toolwire.testing``. Copy it and rename.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from toolwire import CallContext, CallRejected, ToolCall, ToolResult, hookimpl

__all__ = ["StampConfig", "StampPlugin", "__version__"]
__version__ = "0.1.0"


class StampConfig(BaseModel):
    """``[plugins.stamp]`` in toolwire.toml (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(default="stamped", min_length=1, description="written to result.meta.extra")
    refuse: list[str] = Field(
        default_factory=list, description="tools this plugin refuses to run (error kind denied)"
    )


class StampPlugin:
    """The stamp plugin: stamps results, refuses the tools listed in ``refuse``."""

    name = "stamp"  # the entry-point name
    order = 600  # where it sits among the hooks (first-party: 100..500, tool sources 900..910)
    Config = StampConfig  # the kernel validates [plugins.stamp] with it

    def __init__(self, config: StampConfig | None = None) -> None:
        self.config = config or StampConfig()  # configuration only: no per-call state here

    @hookimpl
    def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        if call.name in self.config.refuse:
            raise CallRejected(
                "denied",
                f"tool {call.name!r} is refused by the stamp plugin; "
                "remove it from [plugins.stamp] refuse to allow it",
            )
        ctx.state[self.name] = {"attempt_seen": ctx.attempt}  # per-call state

    @hookimpl
    def after_call(self, result: ToolResult, ctx: CallContext) -> None:
        if self.name in ctx.state:  # the call got past before_call
            result.meta.extra[self.name] = self.config.label
