"""Secrets never reach errors: config secrets and credential fields are hidden by the kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolwire import (
    CallContext,
    CallRejected,
    ErrorInfo,
    Kernel,
    ToolCall,
    ToolError,
    ToolResult,
    hookimpl,
    load_config,
    tool,
)

pytestmark = pytest.mark.anyio

TOKEN = "sk-live-0123456789abcdef"


@tool
def leaky(mode: str) -> str:
    """Fails in ways that carry credentials."""
    if mode == "details":
        raise ToolError(
            f"upstream refused Bearer {TOKEN}",
            kind="auth",
            details={
                "status": 401,
                "headers": {"Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"},
                "body": {"api_key": "whatever-it-was", "echo": f"key={TOKEN}"},
            },
        )
    raise RuntimeError(f"connect failed for https://api.example.com/?key={TOKEN}")


def write(tmp_path: Path) -> Path:
    path = tmp_path / "toolwire.toml"
    path.write_text(
        'state = "memory://"\nenabled_plugins = []\n'
        "[plugins]\n"
        '[server]\nauth_token = { "$secretRef" = "UPSTREAM_TOKEN" }\n'
    )
    return path


async def test_config_secrets_and_credential_fields_are_hidden_in_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSTREAM_TOKEN", TOKEN)
    seen: list[ErrorInfo] = []

    class Watcher:
        name = "watcher"

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            seen.append(error)

    kernel = Kernel.from_config(write(tmp_path))
    kernel.add_tool(leaky)
    kernel.register(Watcher())
    async with kernel:
        r1 = await kernel.call("leaky", {"mode": "details"})
        r2 = await kernel.call("leaky", {"mode": "raise"})
    for r in (r1, r2):
        assert r.error is not None
        dumped = repr(r.to_dict())
        assert TOKEN not in dumped and "[secret:UPSTREAM_TOKEN]" in dumped
    details: dict[str, Any] = r1.error.details  # type: ignore[union-attr]
    assert details["headers"] == {"Authorization": "[redacted]", "Content-Type": "text/plain"}
    assert details["body"]["api_key"] == "[redacted]"
    assert details["status"] == 401
    assert all(TOKEN not in e.message for e in seen) and len(seen) == 2  # plugins too


def test_the_config_does_not_show_its_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSTREAM_TOKEN", TOKEN)
    cfg = load_config(write(tmp_path))
    assert cfg.server["auth_token"] == TOKEN  # plugins still get the value
    assert TOKEN not in repr(cfg) and TOKEN not in str(cfg)
    assert "[secret:UPSTREAM_TOKEN]" in repr(cfg)
    assert cfg.secret_names == ["UPSTREAM_TOKEN"]


async def test_code_can_add_secrets_and_errors_without_them_are_untouched() -> None:
    kernel = Kernel(tools=[leaky])
    async with kernel:
        plain = await kernel.call("leaky", {"mode": "raise"})
        assert plain.error is not None and TOKEN in plain.error.message  # nothing known yet
        kernel.add_secret(TOKEN, "EXAMPLE_KEY")
        kernel.add_secret("abc", "TOO_SHORT")  # ignored: would match by accident
        hidden = await kernel.call("leaky", {"mode": "raise"})
    assert hidden.error is not None
    assert hidden.error.message == (
        "RuntimeError: connect failed for https://api.example.com/?key=[secret:EXAMPLE_KEY]"
    )


async def test_a_rejection_a_plugin_raises_is_scrubbed_like_every_other_error() -> None:
    """hooks.md: errors are scrubbed before anyone sees them. Before: a `CallRejected`
    from `before_call` or from a `ctx.before_first_attempt` step reached the result, and
    every after_call, with the known secret and credential fields in it."""
    seen: list[str] = []

    class Gate:
        name = "gate"

        @hookimpl
        def before_call(self, call: ToolCall, ctx: CallContext) -> None:
            if call.args["mode"] == "before_call":
                raise CallRejected(
                    "auth", f"upstream refused key={TOKEN}", details={"api_key": TOKEN}
                )

            async def step() -> None:
                raise CallRejected("denied", f"policy server said no to {TOKEN}")

            ctx.before_first_attempt = [("gate", step)]

        @hookimpl
        def after_call(self, result: ToolResult) -> None:
            seen.append(repr(result.to_dict()))

    kernel = Kernel(tools=[leaky], plugins=[Gate()])
    kernel.add_secret(TOKEN, "EXAMPLE_KEY")
    async with kernel:
        first = await kernel.call("leaky", {"mode": "before_call"})
        step = await kernel.call("leaky", {"mode": "before_first_attempt"})
    assert first.error is not None and step.error is not None
    assert first.error.message == "upstream refused key=[secret:EXAMPLE_KEY]"
    assert first.error.details == {"api_key": "[redacted]"}
    assert step.error.message == "policy server said no to [secret:EXAMPLE_KEY]"
    assert len(seen) == 2 and all(TOKEN not in s for s in seen)


class _Says:
    """A plugin that answers with an error result of its own, naming a secret."""

    name, order = "says", 100

    def __init__(self, hook: str) -> None:
        self.hook = hook

    @hookimpl
    def before_call(self) -> ToolResult | None:
        if self.hook != "before_call":
            return None
        return ToolResult.from_error(ErrorInfo("denied", "key sk-live-123456 is not allowed"))

    @hookimpl
    def after_call(self, result: ToolResult) -> ToolResult | None:
        if self.hook != "after_call":
            return None
        return ToolResult.from_error(ErrorInfo("denied", "key sk-live-123456 is not allowed"))


@pytest.mark.parametrize("hook", ["before_call", "after_call"])
async def test_an_error_result_a_plugin_makes_is_scrubbed_too(hook: str) -> None:
    """Before: a plugin's own error result (a short-circuit, a replacement) went out with
    the secret it named, in the error and in the content that repeats it."""

    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    kernel = Kernel(tools=[ping], plugins=[_Says(hook)])
    kernel.add_secret("sk-live-123456", "api")
    res = await kernel.call("ping", {})
    assert res.error is not None and res.error.kind == "denied"
    assert "sk-live-123456" not in res.error.message
    assert "sk-live-123456" not in str(res.content) and "[secret:api]" in str(res.content)
