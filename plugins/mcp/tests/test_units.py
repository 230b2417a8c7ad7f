"""Configuration models, auth resolution, MCP <-> kernel conversions, remote schema validation."""

from __future__ import annotations

import logging
from typing import Any

import jsonschema
import mcp_types
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire import ArgsError, ToolResult
from toolwire_mcp import MCPConfig, ServeConfig, ServerConfig, resolve_auth_token
from toolwire_mcp._convert import (
    make_validator,
    quick_check,
    remote_error,
    remote_value,
    render_text,
)


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
        ({"command": "x", "timeout": 0}, "whole number of milliseconds > 0"),
        ({"url": "http://h/mcp", "max_answer_bytes": 10}, "greater than or equal to 1024"),
        ({"url": "http://h/sse", "max_answer_bytes": 4096}, "does not apply to a legacy SSE"),
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


def test_secrets_of_an_http_entry_stay_out_of_messages() -> None:
    """Before: a header value or token with a trailing newline (a secret file's) failed every
    connection with httpx2's "Illegal header value b'<the secret>\\n'", quoted in each log
    line, error and status; a password or key in the URL was in every message naming it."""
    for entry, needle in [
        ({"headers": {"X-Api-Key": "hunter2\n"}}, "header 'X-Api-Key': its value contains"),
        ({"headers": {"X Key": "v"}}, "header name 'X Key'"),
        ({"auth": "hunter2\r\n"}, "the token contains a line break"),
    ]:
        with pytest.raises(pydantic.ValidationError, match=needle) as info:
            ServerConfig.model_validate({"url": "https://h/mcp", **entry})
        msgs = " ".join(str(e["msg"]) for e in info.value.errors())  # what toolwire shows
        assert "hunter2" not in msgs
    cfg = ServerConfig(url="https://me:hunter2@h:8/mcp?api_key=hunter3&debug#top")
    assert cfg.target() == "https://***@h:8/mcp?api_key=***&debug#top"
    assert ServerConfig(url="https://hunter2@h/mcp").target() == "https://***@h/mcp"


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


def test_a_configured_token_switched_off_is_warned_about() -> None:
    """Before: TOOLS_AUTH_ENABLED=false silently opened a gateway whose token was set."""
    from toolwire_mcp._config import auth_switched_off

    with_token = ServeConfig.model_validate({"auth_token": "s3cret-token"})
    off = {"TOOLS_AUTH_ENABLED": "false"}
    note = auth_switched_off(with_token, off)
    assert note is not None and "TOOLS_AUTH_ENABLED=false" in note
    assert "s3cret-token" not in note  # never quoted
    assert resolve_auth_token(with_token, off) is None  # still off, as asked
    by_env = auth_switched_off(ServeConfig(), {**off, "TOOLS_AUTH_TOKEN": "t"})
    assert by_env is not None and "TOOLS_AUTH_ENABLED=false" in by_env
    by_file = ServeConfig.model_validate({"auth_token": "t", "auth_enabled": False})
    assert "[server] auth_enabled = false" in (auth_switched_off(by_file, {}) or "")
    assert auth_switched_off(with_token, {}) is None  # on: nothing to say
    assert auth_switched_off(ServeConfig(), off) is None  # no token: nothing switched off


def test_auth_enabled_without_a_token_names_what_to_set() -> None:
    with pytest.raises(ValueError, match="TOOLS_AUTH_TOKEN"):
        resolve_auth_token(ServeConfig(), {"TOOLS_AUTH_ENABLED": "true"})
    with pytest.raises(ValueError, match="expected true or false"):
        resolve_auth_token(ServeConfig(), {"TOOLS_AUTH_ENABLED": "maybe"})
    with pytest.raises(pydantic.ValidationError, match="must start with '/'"):
        ServeConfig(path="mcp")


def test_a_token_no_client_can_send_is_refused_without_quoting_it() -> None:
    """Before: a token read with its trailing newline was taken, and every request got 401
    (an HTTP header value loses its surrounding whitespace)."""
    for cfg, env, where in (
        ({"auth_token": "s3cret-tok\n"}, {}, r"\[server\] auth_token"),
        ({}, {"TOOLS_AUTH_TOKEN": " s3cret-tok"}, "TOOLS_AUTH_TOKEN"),
        ({}, {"TOOLS_AUTH_TOKEN": "s3cret\x00tok"}, "TOOLS_AUTH_TOKEN"),
    ):
        with pytest.raises(ValueError, match=where) as err:
            resolve_auth_token(ServeConfig.model_validate(cfg), env)
        assert "s3cret" not in str(err.value)
    assert resolve_auth_token(ServeConfig(), {"TOOLS_AUTH_TOKEN": "two words"}) == "two words"


def test_an_empty_token_is_refused_unless_auth_is_switched_off() -> None:
    for cfg, env in (({"auth_token": ""}, {}), ({}, {"TOOLS_AUTH_TOKEN": ""})):
        with pytest.raises(ValueError, match="set but empty"):
            resolve_auth_token(ServeConfig.model_validate(cfg), env)
        off = ServeConfig.model_validate({**cfg, "auth_enabled": False})
        assert resolve_auth_token(off, env) is None  # off, as asked
        assert (
            resolve_auth_token(ServeConfig.model_validate(cfg), {**env, "TOOLS_AUTH_ENABLED": "0"})
            is None
        )
    both = ServeConfig.model_validate({"auth_token": ""})
    assert resolve_auth_token(both, {"TOOLS_AUTH_TOKEN": "t"}) == "t"  # the variable fills in


def test_a_token_beyond_ascii_is_refused_without_quoting_it() -> None:
    """Before: a token such as 's3cret-pässwort' was taken, and every client got 401: the
    server reads header bytes as Latin-1, curl sends UTF-8, Python's clients refuse."""
    from toolwire_mcp._serve import BearerTokenVerifier

    for cfg, env, where in (
        ({"auth_token": "s3cret-pässwort"}, {}, r"\[server\] auth_token"),
        ({}, {"TOOLS_AUTH_TOKEN": "s3cret-🔑"}, "TOOLS_AUTH_TOKEN"),
        ({}, {"TOOLS_AUTH_TOKEN": "s3cret\x1btok"}, "TOOLS_AUTH_TOKEN"),
    ):
        with pytest.raises(ValueError, match=where) as err:
            resolve_auth_token(ServeConfig.model_validate(cfg), env)
        assert "s3cret" not in str(err.value) and "printable ASCII" in str(err.value)
    with pytest.raises(ValueError, match="printable ASCII"):
        BearerTokenVerifier("s3cret-pässwort")  # create_server(auth_token=...) too
    ok = "A-z0-9._~+/=!#$%&'*^`|"
    assert resolve_auth_token(ServeConfig(), {"TOOLS_AUTH_TOKEN": ok}) == ok


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


# The quick check (jsonschema-rs) may only ever accept what jsonschema accepts.
_QUICK_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "message": {"type": "string", "minLength": 1},
            "times": {"type": "integer", "minimum": 0, "default": 1},
            "ratio": {"type": "number", "exclusiveMaximum": 1},
            "flag": {"type": "boolean"},
            "pattern": {"type": "string"},  # a property *named* pattern is no regex
        },
        "required": ["message"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
            "mode": {"enum": [1, "fast", None]},
            "one": {"const": 1},
            "any": {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": 2}]},
            "node": {"$ref": "#/$defs/node"},
        },
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
            }
        },
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date-time"}},
        "dependencies": {"when": ["zone"]},
    },
    {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "number"}},
    # numeric bounds without a type: jsonschema-rs takes inf for no number at all
    {"properties": {"n": {"maximum": 10}, "x": {"not": {"type": "number"}}}},
    {"type": "array", "items": {"exclusiveMinimum": 0}, "maxItems": 3},
]

_KEYS = [
    "message",
    "times",
    "ratio",
    "flag",
    "pattern",
    "tags",
    "mode",
    "one",
    "any",
    "node",
    "next",
    "v",
    "when",
    "zone",
    "x",
    "n",
]
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()  # inf and nan too (1e400 parses as inf)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)  # an in-process caller's tuple
        | st.dictionaries(
            st.sampled_from(_KEYS),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(index=st.integers(0, len(_QUICK_SCHEMAS) - 1), instance=_json)
def test_the_quick_check_never_accepts_what_jsonschema_rejects(index: int, instance: Any) -> None:
    schema = _QUICK_SCHEMAS[index]
    quick = quick_check(schema)
    assert quick is not None
    if quick(instance):
        jsonschema.validators.validator_for(schema)(schema).validate(instance)


def test_the_quick_check_takes_valid_arguments_and_leaves_the_rest_to_jsonschema() -> None:
    schema = _QUICK_SCHEMAS[0]
    quick = quick_check(schema)
    assert quick is not None
    assert quick({"message": "hi", "times": 2, "pattern": "^a"})
    assert quick({"message": "hi", "times": 2.0})  # 2.0 is an integer, as in jsonschema
    assert not quick({"message": "hi", "times": True})
    assert not quick({"message": ""})
    assert not quick({"message": "hi", "extra": 1})
    assert not quick({"message": object()})  # not JSON: jsonschema judges
    assert not quick({"message": "hi", "ratio": float("inf")})
    assert not quick({"message": "hi", "flag": (True,)})  # a tuple is no array to jsonschema
    # formats are annotations, as in jsonschema without a format checker
    assert quick_check(_QUICK_SCHEMAS[2])({"when": "not a date", "zone": "Z"})
    # the same errors as before for what it does not take
    check = make_validator(schema)
    with pytest.raises(ArgsError) as exc:
        check({"times": "2"})
    assert dict(exc.value.problems) == {
        "message": "field required",
        "times": "expected integer, got str '2'",
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.1}}},
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
        {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"},
        {"type": "object", "properties": {"a": {"allOf": [{"pattern": "^x"}]}}},
        {  # a $ref may point anywhere in the document: everything is searched
            "type": "object",
            "components": {"schemas": {"P": {"type": "number", "multipleOf": 0.01}}},
            "properties": {"p": {"$ref": "#/components/schemas/P"}},
        },
        {  # a $schema jsonschema does not know by that name (it falls back to 2020-12)
            "$schema": "https://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"s": {"maxLength": 3}},
        },
        {  # jsonschema's 2019-09 counts fewer properties as evaluated than the spec
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "additionalProperties": {},
            "unevaluatedProperties": False,
        },
    ],
)
def test_schemas_the_quick_check_might_read_differently_get_none(schema: dict[str, Any]) -> None:
    """Regex dialects, float division, remote references, unknown or old drafts: jsonschema
    alone."""
    assert quick_check(schema) is None


def test_the_quick_check_uses_the_draft_jsonschema_uses() -> None:
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "definitions": {"s": {"type": "string"}},
        "properties": {"s": {"$ref": "#/definitions/s", "maxLength": 3}},  # maxLength ignored
    }
    quick = quick_check(draft7)
    assert quick is not None and quick({"s": "long enough"})
    jsonschema.Draft7Validator(draft7).validate({"s": "long enough"})  # as jsonschema says
    assert quick_check({"$schema": "http://json-schema.org/draft-07/schema", "type": "object"})


def test_a_schema_nested_too_deep_to_search_gets_no_quick_check() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(5000):
        deep = {"anyOf": [deep]}
    assert quick_check(deep) is None


def test_multiple_of_is_left_to_jsonschema() -> None:
    # jsonschema rejects 0.3 as a multiple of 0.1 (float division): the verdict stands
    check = make_validator({"type": "object", "properties": {"n": {"multipleOf": 0.1}}})
    with pytest.raises(ArgsError, match="multiple"):
        check({"n": 0.3})


def test_repeat_throttle_lets_a_burst_through_then_counts_the_rest() -> None:
    from toolwire_mcp._serve import RepeatThrottle

    now = [0.0]
    throttle = RepeatThrottle(burst=3, window_s=60.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("mcp.client.stdio", logging.ERROR, __file__, 1, msg, None, None)

    passed = [throttle.filter(record("Failed to parse")) for _ in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert throttle.filter(record("another message"))  # counted apart
    now[0] = 61.0
    first = record("Failed to parse")
    assert throttle.filter(first)
    assert first.getMessage() == (
        "Failed to parse (7 more like this in the last 61s were not logged)"
    )
    assert throttle.filter(record("Failed to parse"))  # a new window, a new burst


def test_remote_error_trusts_only_known_kinds_and_sane_retry_hints() -> None:
    from toolwire_mcp._convert import remote_error

    def result(info: dict[str, Any]) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text="nope")],
            is_error=True,
            _meta={"io.toolwire/error": info},
        )

    kind, _, retry, details = remote_error(
        result({"kind": "weird_kind", "message": "m", "retry_after_s": -5}),
        server="s",
        remote_tool="t",
    )
    assert kind == "tool_error" and details["remote_kind"] == "weird_kind"
    assert retry is None  # a negative hint is no hint
    kind, _, retry, details = remote_error(
        result(
            {
                "kind": "rate_limit",
                "message": "m",
                "retry_after_s": 2,
                "details": {"status": 429, "server": "deeper"},
            }
        ),
        server="s",
        remote_tool="t",
    )
    assert kind == "rate_limit" and retry == 2.0
    assert details["status"] == 429 and details["server"] == "s"  # ours stays ours
    assert details["remote_details"] == {"status": 429, "server": "deeper"}


def test_a_long_stderr_line_is_kept_short() -> None:
    """Before: the last 20 stderr lines were kept whole (a 300 MiB line without a newline took
    the gateway from 92 to 395 MB)."""
    import threading

    from toolwire_mcp._upstream import _MAX_STDERR_LINE, _StderrTap

    tap = _StderrTap("noisy")
    writer = threading.Thread(
        target=lambda: (tap.writer.write("x" * 1_000_000 + "\nshort line\n"), tap.close())
    )
    writer.start()
    writer.join(30)
    tap._thread.join(30)
    assert list(tap.tail)[-1] == "short line"
    long = list(tap.tail)[-2]
    assert long.startswith("x" * 100) and len(long) < _MAX_STDERR_LINE + 100
    assert long.endswith(f"... ({1_000_000 - _MAX_STDERR_LINE} more characters on this line)")


@pytest.mark.parametrize(
    ("entry", "stray"),
    [
        ({"command": "srv", "headers": {"x": "1"}}, "`headers`"),
        ({"command": "srv", "auth": "t"}, "`auth`"),
        ({"command": "srv", "max_answer_bytes": 4096}, "`max_answer_bytes`"),
        ({"url": "http://h/mcp", "env": {"A": "1"}}, "`env`"),
        ({"url": "http://h/mcp", "args": ["-v"], "cwd": "/tmp"}, "`args`, `cwd`"),
    ],
)
def test_keys_of_the_other_kind_of_server_are_config_errors(
    entry: dict[str, Any], stray: str
) -> None:
    """Before: headers on a stdio entry or env on an HTTP entry were ignored without a word."""
    verb = "do" if ", " in stray else "does"
    with pytest.raises(pydantic.ValidationError, match=f"{stray} {verb} not apply to"):
        ServerConfig.model_validate(entry)


@pytest.mark.parametrize("bad", [1.5, 0.5, 0, -100, True])
def test_a_timeout_that_is_not_whole_milliseconds_says_the_unit(bad: Any) -> None:
    """Before: `timeout = 1.5` (seconds, as one guesses) got pydantic's "Input should be a
    valid integer, got a number with a fractional part", naming no unit."""
    with pytest.raises(pydantic.ValidationError, match="whole number of milliseconds > 0"):
        ServerConfig.model_validate({"command": "srv", "timeout": bad})


def test_a_timeout_in_whole_milliseconds_is_kept() -> None:
    for good, ms in ((1500, 1500), (2000.0, 2000), ("2500", 2500)):
        assert ServerConfig.model_validate({"command": "srv", "timeout": good}).timeout == ms


def test_timed_http_protocol_takes_a_finite_positive_deadline() -> None:
    from toolwire_mcp import timed_http_protocol

    assert timed_http_protocol(2.5).read_timeout_s == 2.5
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite number of seconds > 0"):
            timed_http_protocol(bad)
    assert timed_http_protocol(2.5).max_head_bytes == 64 * 1024
    assert timed_http_protocol(2.5, None).max_head_bytes is None
    assert timed_http_protocol(2.5, 4096).max_head_bytes == 4096
    for bad_cap in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="max_head_bytes must be a whole number >= 1"):
            timed_http_protocol(2.5, bad_cap)  # type: ignore[arg-type]


def test_upstream_json_with_a_lone_surrogate_is_read() -> None:
    """Before: the direct HTTP path failed such an answer as a parse error (tool_error)."""
    from toolwire_mcp._lenient import from_json

    assert from_json(b'{"text": "caf\\udce9"}') == {"text": "caf\udce9"}
    assert from_json(b'{"ok": 1}') == {"ok": 1}
    for bad in (b"{not json", b'{"a": 1', b'{"a": "\\udce9" NaN}'):
        with pytest.raises(ValueError):
            from_json(bad)


def test_the_repr_of_a_server_shows_env_and_header_names_not_values() -> None:
    """Before: repr() and str() of a ServerConfig (and of the MCPConfig holding it) showed
    `env` and `headers` values: API keys, Authorization headers, resolved $secretRefs."""
    http = ServerConfig(url="http://x/mcp", headers={"Authorization": "Bearer HDRSECRET"})
    stdio = ServerConfig(command="srv", env={"API_KEY": "ENVSECRET"})
    whole = MCPConfig(servers={"h": http, "s": stdio})
    for shown in (repr(http), str(http), repr(stdio), str(stdio), repr(whole), str(whole)):
        assert "HDRSECRET" not in shown and "ENVSECRET" not in shown, shown
    assert "'Authorization': '***'" in repr(http) and "'API_KEY': '***'" in repr(stdio)
    assert stdio.env == {"API_KEY": "ENVSECRET"}  # the values themselves are unchanged
