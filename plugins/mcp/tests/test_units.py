"""Configuration models, auth resolution, MCP <-> kernel conversions, remote schema validation."""

from __future__ import annotations

from typing import Any

import mcp_types
import pydantic
import pytest

from toolwire import ArgsError, ToolResult
from toolwire_mcp import MCPConfig, ServeConfig, ServerConfig, resolve_auth_token
from toolwire_mcp._convert import make_validator, remote_error, remote_value, render_text


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"command": "x", "url": "http://h/mcp"}, "either `command`"),
        ({}, "give `command`"),
        ({"url": "ftp://h"}, "must start with http"),
        ({"command": "x", "transport": "http"}, "needs transport 'stdio'"),
        ({"url": "http://h", "transport": "stdio"}, "needs transport 'http' or 'sse'"),
        ({"command": "x", "transport": "stdio", "type": "sse"}, "disagree"),
        ({"command": "x", "colour": "red"}, "Extra inputs"),
        ({"command": "x", "timeout": 0}, "greater than 0"),
    ],
)
def test_server_entries_are_checked(entry: dict[str, Any], needle: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=needle):
        ServerConfig.model_validate(entry)


def test_server_transport_is_inferred_like_mcp_servers() -> None:
    assert ServerConfig(command="uvx").kind == "stdio"
    assert ServerConfig(url="http://h:1/mcp").kind == "http"
    assert ServerConfig(url="http://h:1/sse").kind == "sse"
    assert ServerConfig.model_validate({"url": "http://h/x", "type": "sse"}).kind == "sse"
    assert ServerConfig(url="https://h/mcp", transport="streamable-http").kind == "http"
    assert ServerConfig(command="a", timeout=2500).timeout_s == 2.5
    secret = ServerConfig.model_validate({"url": "https://h/mcp", "auth": "tok"})
    assert "tok" not in repr(secret) and secret.target() == "https://h/mcp"


def test_plugin_config_names_and_template() -> None:
    cfg = MCPConfig.model_validate(
        {"servers": {"a": {"command": "x"}, "b": {"command": "y", "namespace": "bee"}}}
    )
    assert cfg.tool_name("a", "run") == "a_run" and cfg.tool_name("b", "run") == "bee_run"
    dotted = MCPConfig(name_template="{server}.{tool}")
    assert dotted.tool_name("a", "run") == "a.run"
    with pytest.raises(pydantic.ValidationError, match=r"must contain \{tool\}"):
        MCPConfig(name_template="{server}")
    with pytest.raises(pydantic.ValidationError, match="only"):
        MCPConfig(name_template="{tool}_{host}")
    with pytest.raises(pydantic.ValidationError, match="server name"):
        MCPConfig.model_validate({"servers": {"bad name!": {"command": "x"}}})
    with pytest.raises(pydantic.ValidationError, match="reconnect_max_s"):
        MCPConfig(reconnect_initial_s=5, reconnect_max_s=1)


@pytest.mark.parametrize(
    ("cfg", "env", "expected"),
    [
        ({}, {}, None),
        ({}, {"TOOLS_AUTH_TOKEN": "t"}, "t"),
        ({"auth_token": "cfg"}, {"TOOLS_AUTH_TOKEN": "env"}, "cfg"),
        ({"auth_token": "cfg"}, {"TOOLS_AUTH_ENABLED": "false"}, None),
        ({}, {"TOOLS_AUTH_ENABLED": "true", "TOOLS_AUTH_TOKEN": "t"}, "t"),
        ({"auth_enabled": False, "auth_token": "cfg"}, {}, None),
        ({"auth_enabled": False, "auth_token": "cfg"}, {"TOOLS_AUTH_ENABLED": "1"}, "cfg"),
    ],
)
def test_auth_token_resolution(
    cfg: dict[str, Any], env: dict[str, str], expected: str | None
) -> None:
    assert resolve_auth_token(ServeConfig.model_validate(cfg), env) == expected


def test_auth_enabled_without_a_token_names_what_to_set() -> None:
    with pytest.raises(ValueError, match="TOOLS_AUTH_TOKEN"):
        resolve_auth_token(ServeConfig(), {"TOOLS_AUTH_ENABLED": "true"})
    with pytest.raises(ValueError, match="expected true or false"):
        resolve_auth_token(ServeConfig(), {"TOOLS_AUTH_ENABLED": "maybe"})
    with pytest.raises(pydantic.ValidationError, match="must start with '/'"):
        ServeConfig(path="mcp")


def test_text_rendering() -> None:
    assert render_text(ToolResult.ok("plain text")) == "plain text"
    assert render_text(ToolResult.ok({"a": 1, "b": [1, 2]})) == '{"a":1,"b":[1,2]}'
    assert render_text(ToolResult.ok(3)) == '{"result":3}'
    assert render_text(ToolResult.fail("denied", "no way")) == "denied: no way"


def _result(**kw: Any) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult.model_validate(kw)


def test_remote_values_become_json_objects() -> None:
    text = mcp_types.TextContent(type="text", text="hi")
    assert remote_value(_result(content=[text], structured_content={"a": 1})) == {"a": 1}
    assert remote_value(_result(content=[text], structured_content=[1, 2])) == {"result": [1, 2]}
    assert remote_value(_result(content=[text, text])) == {"result": "hi\nhi"}
    img = mcp_types.ImageContent(type="image", data="aGk=", mime_type="image/png")
    out = remote_value(_result(content=[img]))
    assert out == {"content": [{"type": "image", "data": "aGk=", "mimeType": "image/png"}]}


def test_remote_error_kinds_are_recognised() -> None:
    def kind(**kw: Any) -> tuple[str, str, float | None]:
        k, msg, ra, details = remote_error(
            _result(is_error=True, **kw), server="s", remote_tool="t"
        )
        assert details["server"] == "s" and details["remote_tool"] == "t"
        return k, msg, ra

    def text(t: str) -> list[mcp_types.TextContent]:
        return [mcp_types.TextContent(type="text", text=t)]

    tw = {"io.toolwire/error": {"kind": "quota", "message": "monthly quota", "retry_after_s": 60}}
    assert kind(content=text("quota: monthly quota"), _meta=tw) == (
        "quota",
        "MCP server 's', tool 't': monthly quota",
        60.0,
    )
    sc = {"error": {"kind": "conflict", "message": "version mismatch"}}
    assert kind(content=text("x"), structured_content=sc)[0] == "conflict"
    assert (
        kind(content=text("x"), structured_content={"error": {"kind": "weird"}})[0] == "tool_error"
    )
    assert kind(content=text("Unknown tool: 'zap'"))[0] == "not_found"
    assert kind(content=text("Rate limited by upstream API, please retry later"))[0] == "rate_limit"
    assert kind(content=text("Upstream request timed out, please retry"))[0] == "timeout"
    assert kind(content=text("1 validation error for call[add]"))[0] == "invalid_args"
    assert kind(content=text("disk full"))[0] == "tool_error"
    assert "without a message" in kind(content=[])[1]


def test_remote_schemas_are_validated_with_full_json_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]+$"},
            "tags": {"type": "array", "items": {"type": "integer"}},
            "mode": {"enum": ["fast", "slow"]},
            "nested": {
                "type": "object",
                "properties": {"x": {"type": "number"}},
                "required": ["x"],
            },
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    check = make_validator(schema)
    assert check is not None
    assert check({"name": "abc", "tags": [1]}) == {"name": "abc", "tags": [1]}
    with pytest.raises(ArgsError) as exc:
        check({"tags": [1, "x"], "mode": "medium", "nested": {}, "extra": True})
    problems = dict(exc.value.problems)
    assert problems["name"] == "field required"
    assert problems["extra"] == "unexpected argument"
    assert problems["tags[1]"].startswith("expected integer")
    assert "medium" in problems["mode"]
    assert problems["nested.x"] == "field required"
    with pytest.raises(ArgsError, match="does not match"):
        check({"name": "ABC"})  # `pattern` is enforced (the kernel's subset checker skips it)
    assert make_validator({"type": "object", "properties": {"a": {"type": 5}}}) is None
