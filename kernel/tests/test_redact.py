"""Secrets never reach errors: config secrets and credential fields are hidden by the kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolwire import ErrorInfo, Kernel, ToolError, hookimpl, load_config, tool

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
