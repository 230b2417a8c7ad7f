"""Classification: kinds, precedence, the safety gate, hints, hostile input."""

from __future__ import annotations

import json
import time
from email.utils import formatdate

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire import ErrorInfo, Kernel, Tool, ToolError, build_tool
from toolwire.testing import FakeClock
from toolwire_ratelimit import (
    PatternSpec,
    ProviderConfig,
    RateLimitConfig,
    RateLimitPlugin,
    gather,
    parse_duration,
    parse_retry_after,
    reset_hints,
)

# Shapes of real provider errors (see the search fixtures: Brave, Exa).
BRAVE_429 = {
    "type": "ErrorResponse",
    "error": {
        "id": "6c3b2f0e",
        "status": 429,
        "detail": "Request rate limit exceeded for plan",
        "meta": {
            "plan": "Free",
            "rate_limit": 1,
            "rate_current": 1,
            "quota_limit": 2000,
            "quota_current": 15,
        },
        "code": "RATE_LIMITED",
    },
}
BRAVE_QUOTA = {
    "type": "ErrorResponse",
    "error": {
        "status": 429,
        "detail": "Request rate limit exceeded for plan",
        "meta": {"quota_limit": 2000, "quota_current": 2000, "component": "rate_limiter"},
        "code": "RATE_LIMITED",
    },
}
BRAVE_HEADERS = {
    "X-RateLimit-Limit": "1, 2000",
    "X-RateLimit-Policy": "1;w=1, 2000;w=2592000",
    "X-RateLimit-Remaining": "0, 1985",
    "X-RateLimit-Reset": "1, 1419704",
}
BRAVE_TOKEN = {
    "type": "ErrorResponse",
    "error": {"status": 422, "code": "SUBSCRIPTION_TOKEN_INVALID"},
}
EXA_402 = {"requestId": "f3a1", "error": "You have run out of credits.", "tag": "NO_MORE_CREDITS"}
EXA_BUDGET = {
    "requestId": "0a1b",
    "error": "This API key has exceeded its spending budget.",
    "tag": "API_KEY_BUDGET_EXCEEDED",
}
EXA_401 = {"requestId": "1122", "error": "Invalid API key"}
EXA_429 = {"error": "rate limit exceeded"}
OPENAI_QUOTA = {
    "error": {
        "message": "You exceeded your current quota",
        "type": "insufficient_quota",
        "code": "insufficient_quota",
    }
}


def classify(
    exc: BaseException | ErrorInfo, **kw: object
) -> tuple[str, bool, str | None, float | None]:
    c = RateLimitPlugin().classify(exc, **kw)  # type: ignore[arg-type]
    return c.kind, c.retryable, c.pattern, c.retry_after_s


def http_error(
    status: int, body: object = b"", headers: dict[str, str] | None = None
) -> httpx.HTTPStatusError:
    content = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    assert isinstance(content, (bytes, str))
    req = httpx.Request("GET", "https://api.example.test/search?q=x")
    resp = httpx.Response(status, headers=headers or {}, content=content, request=req)
    try:
        resp.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return exc
    raise AssertionError("no error raised")


@pytest.mark.parametrize(
    ("status", "body", "headers", "kind", "pattern"),
    [
        (429, EXA_429, {}, "rate_limit", "default.rate_limit.text"),
        (429, b"", {}, "rate_limit", "default.rate_limit.text"),  # httpx says "Too Many Requests"
        (429, BRAVE_429, BRAVE_HEADERS, "rate_limit", "default.rate_limit.text"),
        (429, BRAVE_QUOTA, {}, "quota", "default.body.quota_exhausted"),
        (429, OPENAI_QUOTA, {}, "quota", "default.quota.insufficient_quota"),
        (402, EXA_402, {}, "quota", "default.quota.credits"),
        (402, EXA_BUDGET, {}, "quota", "default.quota.budget"),
        (402, b"", {}, "quota", "default.status.402"),
        (401, EXA_401, {}, "auth", "default.auth.invalid_key"),
        (403, b"<html>forbidden</html>", {}, "auth", "default.status.403"),
        (422, BRAVE_TOKEN, {}, "auth", "default.auth.invalid_key"),
        (503, b"Service Unavailable", {}, "unavailable", "default.unavailable.text"),
        (502, b"", {}, "unavailable", "default.unavailable.text"),  # "Bad Gateway"
        (520, b"", {}, "unavailable", "default.status.520"),
        (
            403,
            b"You have exceeded a secondary rate limit",
            {},
            "rate_limit",
            "default.rate_limit.text",
        ),
    ],
)
def test_http_status_errors_from_httpx(
    status: int, body: object, headers: dict[str, str], kind: str, pattern: str
) -> None:
    got = classify(http_error(status, body, headers))
    assert (got[0], got[2]) == (kind, pattern)
    assert got[1] == (kind in ("rate_limit", "unavailable", "timeout"))


def test_bare_statuses() -> None:
    for status, kind in [
        (429, "rate_limit"),
        (402, "quota"),
        (401, "auth"),
        (408, "timeout"),
        (503, "unavailable"),
        (529, "unavailable"),
    ]:
        assert classify(ToolError("failed", status=status))[:3] == (
            kind,
            kind in ("rate_limit", "unavailable", "timeout"),
            f"default.status.{status}",
        )


def test_an_unmatched_500_is_terminal() -> None:
    assert classify(http_error(500, b"internal error: division by zero")) == (
        "tool_error",
        False,
        None,
        None,
    )
    c = RateLimitPlugin().classify(ToolError("boom", status=500, details={"body": "oops"}))
    assert not c.failover and c.pattern is None


def test_deny_patterns_override_allow_patterns() -> None:
    body = {"error": {"code": "context_length_exceeded", "message": "rate limit"}}
    kind, retryable, pattern, _ = classify(http_error(429, body))
    assert (kind, retryable, pattern) == ("tool_error", False, "default.deny.context_length")


def test_precedence_quota_over_auth_over_rate_limit() -> None:
    # a 429 whose body says insufficient_quota is quota
    assert classify(ToolError("x", status=429, details={"body": OPENAI_QUOTA}))[0] == "quota"
    # quota and auth words together: quota wins
    assert classify(ToolError("invalid api key; insufficient_quota", status=401))[0] == "quota"
    assert classify(ToolError("rate limited; invalid api key", status=400))[0] == "auth"
    # text evidence beats a bare status; a declared kind takes part in the precedence
    assert classify(ToolError("insufficient_quota", kind="rate_limit"))[0] == "quota"


def test_tool_error_reports_status_headers_and_body() -> None:
    exc = ToolError(
        "upstream said no",
        status=429,
        details={"headers": {"Retry-After": "7"}, "body": b'{"error": "slow down"}'},
    )
    assert classify(exc) == ("rate_limit", True, "default.rate_limit.text", 7.0)


def test_the_whole_cause_chain_is_read() -> None:
    try:
        try:
            raise http_error(429, EXA_429, {"Retry-After": "3"})
        except httpx.HTTPStatusError as inner:
            raise RuntimeError("search backend failed") from inner
    except RuntimeError as outer:
        exc: BaseException = outer
    assert classify(exc) == ("rate_limit", True, "default.rate_limit.text", 3.0)
    # implicit chaining (__context__) too, and exception groups
    try:
        try:
            raise ConnectionRefusedError("nope")
        except ConnectionRefusedError:
            raise ValueError("wrapped") from None
    except ValueError as e:
        suppressed = e
    assert classify(suppressed)[0] == "tool_error"  # `from None` hides the context
    group = ExceptionGroup("several", [ValueError("a"), TimeoutError("b")])
    assert classify(group)[:3] == ("timeout", True, "default.exception.timeout")


def test_exception_classes() -> None:
    req = httpx.Request("GET", "http://x")
    assert classify(httpx.ReadTimeout("slow", request=req))[0] == "timeout"
    assert classify(httpx.ConnectError("refused", request=req))[0] == "unavailable"
    assert classify(ConnectionResetError())[0] == "unavailable"
    assert classify(KeyError("x"))[0] == "tool_error"


def _failing(exc: BaseException, cause: BaseException | None = None) -> Tool:
    def fail() -> None:
        """Fails."""
        raise exc from cause

    return build_tool(fail)


@pytest.mark.anyio
async def test_a_connection_broken_after_the_request_went_out_is_in_flight() -> None:
    """``details.in_flight = true`` (the outcome is unknown: the retry plugin does not
    repeat a tool with side effects) when the chain says the request went out, and only
    then."""
    req = httpx.Request("POST", "http://x")
    cases: list[tuple[BaseException, bool | None]] = [
        (httpx.RemoteProtocolError("Server disconnected", request=req), True),
        (httpx.ReadError("reset", request=req), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (httpx.ConnectError("refused", request=req), None),
        (ConnectionRefusedError(111, "refused"), None),
        (ToolError("gone", kind="unavailable", details={"in_flight": False}), False),
    ]
    for exc, expected in cases:
        async with Kernel(
            tools=[_failing(exc)], plugins=[RateLimitPlugin()], clock=FakeClock()
        ) as kernel:
            res = await kernel.call("fail")
        assert res.error is not None and res.error.kind == "unavailable", exc
        assert res.error.details.get("in_flight") is expected, exc
    # a connect error caused by a reset (a TLS handshake cut short): nothing was sent
    wrapped = httpx.ConnectError("handshake", request=req)
    async with Kernel(
        tools=[_failing(wrapped, ConnectionResetError())], plugins=[RateLimitPlugin()]
    ) as kernel:
        res = await kernel.call("fail")
    assert res.error is not None and "in_flight" not in res.error.details


def test_a_kernel_timeout_and_declared_kinds() -> None:
    info = ErrorInfo("timeout", "tool 'x' timed out", exception=TimeoutError())
    assert classify(info)[:3] == ("timeout", True, "declared.timeout")
    assert classify(ToolError("upstream busy", kind="unavailable"))[:3] == (
        "unavailable",
        True,
        "declared.unavailable",
    )
    strict = RateLimitPlugin(RateLimitConfig(trust_tool_kinds=False))
    c = strict.classify(ToolError("upstream busy", kind="unavailable"))
    assert (c.kind, c.retryable, c.pattern) == ("unavailable", False, None)


def test_remote_error_results_of_the_mcp_plugin() -> None:
    info = ErrorInfo(
        "tool_error",
        "MCP server 'up', tool 'search': failed",
        details={"server": "up", "remote_text": "Error: 429 Too Many Requests"},
    )
    assert classify(info)[0] == "rate_limit"
    info = ErrorInfo(
        "tool_error",
        "MCP server 'up': failed",
        details={"remote_structured_content": {"error": {"code": "insufficient_quota"}}},
    )
    assert classify(info)[0] == "quota"
    # a non-numeric "status" (the MCP plugin's connection state) is ignored
    info = ErrorInfo("unavailable", "not connected", details={"status": "connecting"})
    assert classify(info)[0] == "unavailable"


def test_provider_and_tool_patterns() -> None:
    cfg = RateLimitConfig.model_validate(
        {
            "providers": {
                "acme": {
                    "tools": ["acme_search"],
                    "rate_limit_patterns": ["please wait", {"id": "acme-busy", "status": [418]}],
                    "deny_patterns": ["bad query"],
                    "retryable_statuses": [500],
                }
            },
            "tools": {"other": {"unavailable_patterns": ["flaky"]}},
        }
    )
    p = RateLimitPlugin(cfg)
    c = p.classify(ToolError("please wait a bit", status=400), tool="acme_search")
    assert (c.kind, c.pattern) == ("rate_limit", "providers.acme.rate_limit_patterns[0]")
    assert p.classify(ToolError("x", status=418), provider="acme").pattern == "acme-busy"
    assert p.classify(ToolError("x", status=500), provider="acme").pattern == (
        "providers.acme.retryable_statuses.500"
    )
    assert p.classify(ToolError("x", status=500)).pattern is None  # not for other providers
    assert p.classify(
        ToolError("bad query: rate limit", status=429), tool="acme_search"
    ).pattern == ("providers.acme.deny_patterns[0]")
    assert p.classify(ToolError("flaky"), tool="other").kind == "unavailable"
    assert p.classify(ToolError("flaky"), tool="acme_search").kind == "tool_error"
    # defaults can be switched off
    bare = RateLimitPlugin(RateLimitConfig(use_default_patterns=False))
    assert bare.classify(ToolError("x", status=429)).kind == "tool_error"


def test_patterns_are_case_insensitive() -> None:
    p = RateLimitPlugin(RateLimitConfig(rate_limit_patterns=["Hold Your Horses"]))
    assert p.classify(ToolError("HOLD YOUR HORSES")).kind == "rate_limit"


# --------------------------------------------------------------- retry-after
def test_retry_after_seconds_date_garbage_negative_huge() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(" 1.5 ", now) == 1.5
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now) == pytest.approx(30.0)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now) is None  # in the past
    for garbage in ("-5", "soon", "", "1e9999", "NaN", "+-3", "Thu, 99 Foo 2024"):
        assert parse_retry_after(garbage, now) is None, garbage
    huge = classify(
        ToolError("x", status=429, details={"headers": {"Retry-After": "999999999999"}})
    )
    assert huge[3] == 31 * 86400.0  # capped
    neg = classify(ToolError("x", status=429, details={"headers": {"Retry-After": "-3"}}))
    assert neg[3] is None


@pytest.mark.anyio
async def test_retry_after_http_date_uses_the_kernel_clock() -> None:
    # The kernel's clock is years behind the wall clock: a date 60 s after the kernel's
    # "now" is 60 s away for the plugin, and long past by time.time().
    clock = FakeClock(start=1_000_000_000.0)
    error = ToolError(
        "x",
        status=503,
        details={"headers": {"Retry-After": formatdate(clock.time() + 60, usegmt=True)}},
    )
    p = RateLimitPlugin()
    async with Kernel(plugins=[p], clock=clock):
        assert p.classify(error).retry_after_s == 60.0
    # Outside a kernel the plugin reads the wall clock, by which that date has passed.
    assert RateLimitPlugin().classify(error).retry_after_s is None
    now = time.time()
    soon = ToolError(
        "x", status=503, details={"headers": {"Retry-After": formatdate(now + 60, usegmt=True)}}
    )
    c = RateLimitPlugin().classify(soon)
    assert c.retry_after_s is not None and 55 <= c.retry_after_s <= 61


def test_rate_limit_reset_headers() -> None:
    now = 1_700_000_000.0
    h = {k.lower(): v for k, v in BRAVE_HEADERS.items()}
    r = reset_hints(h, now)
    assert (r.rate_reset_s, r.quota_exhausted) == (1.0, False)
    monthly = dict(h, **{"x-ratelimit-remaining": "1, 0"})
    r = reset_hints(monthly, now)
    assert r.quota_exhausted and r.quota_reset_s == 1419704.0
    assert reset_hints({"x-ratelimit-reset": str(int(now + 42))}, now).rate_reset_s == 42.0
    assert reset_hints({"x-ratelimit-reset-requests": "6m0s"}, now).rate_reset_s == 360.0
    assert reset_hints({"x-ratelimit-reset": "garbage, -4"}, now).rate_reset_s is None
    assert parse_duration("1h2m3.5s") == 3723.5 and parse_duration("20ms") == 0.02
    assert parse_duration("1h" * 40) is None
    # an exhausted monthly window on a 429 is quota, with the window's reset
    c = RateLimitPlugin().classify(
        ToolError(
            "Request rate limit exceeded",
            status=429,
            details={"headers": {**BRAVE_HEADERS, "X-RateLimit-Remaining": "1, 0"}},
        )
    )
    assert (c.kind, c.pattern, c.retry_after_s) == (
        "quota",
        "default.headers.quota_window",
        1419704.0,
    )


def test_body_hints() -> None:
    assert (
        classify(ToolError("x", status=429, details={"body": {"error": {"retry_after": 12}}}))[3]
        == 12.0
    )
    assert (
        classify(ToolError("x", status=429, details={"body": {"retry_after_ms": 1500}}))[3] == 1.5
    )
    assert (
        classify(ToolError("Rate limit reached. Please try again in 20s.", status=429))[3] == 20.0
    )
    assert classify(ToolError("Too many requests, retry after 2 minutes", status=429))[3] == 120.0
    assert classify(ToolError("rate limited, try again in 350ms", status=429))[3] == pytest.approx(
        0.35
    )
    # a quota waits for its window's reset, never for a body's "try again in 20s"
    assert classify(ToolError("insufficient_quota: please try again in 20s", status=429)) == (
        "quota",
        False,
        "default.quota.insufficient_quota",
        None,
    )
    assert classify(ToolError("x", status=402, details={"body": {"retry_after": 12}}))[3] is None


# ------------------------------------------------------------ hostile input
HOSTILE = {
    "5 MB of HTML": b"<html><body>" + b"<div>rate limit</div>" * 250_000 + b"</body></html>",
    "invalid UTF-8": b"\xff\xfe\xfa rate\x80limit \xc3\x28 too many requests \xed\xa0\x80",
    "deeply nested JSON text": b"[" * 200_000 + b"]" * 200_000,
    "deeply nested JSON dict": "nested",
    "ReDoS-shaped": b"a" * 100_000 + b"!",
    "ReDoS-shaped words": (b"rate " * 20_000) + b"!",
    "huge message": "huge",
}


def _hostile(name: str) -> ToolError:
    raw: object = HOSTILE[name]
    if raw == "nested":
        node: dict[str, object] = {"error": "too many requests"}
        for _ in range(50_000):
            node = {"n": node}
        raw = node
    if raw == "huge":
        return ToolError("x" * 5_000_000 + " too many requests", status=500)
    return ToolError(
        "upstream failed",
        status=503,
        details={"body": raw, "headers": {"content-type": "text/html; charset=utf-8"}},
    )


# What each hostile input classifies as: the evidence read stays within its bounds
# (MAX_MESSAGE, MAX_JSON_DEPTH, the rendered-size limit); what lies beyond is not read.
HOSTILE_EXPECTED: dict[str, tuple[str, str | None]] = {
    "5 MB of HTML": ("rate_limit", "default.rate_limit.text"),
    "invalid UTF-8": ("rate_limit", "default.rate_limit.text"),  # still read, past bad bytes
    "deeply nested JSON text": ("unavailable", "default.status.503"),
    "deeply nested JSON dict": ("unavailable", "default.status.503"),  # text past the bounds
    "ReDoS-shaped": ("unavailable", "default.status.503"),
    "ReDoS-shaped words": ("unavailable", "default.status.503"),  # "rate" alone is no limit
    "huge message": ("tool_error", None),  # the text is past the first 2 KiB; 500 alone
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_classifies_deterministically(name: str) -> None:
    """Speed on these inputs is measured in bench/ratelimit_classify.py, not here."""
    p = RateLimitPlugin()
    exc = _hostile(name)
    first = p.classify(exc)
    assert p.classify(exc) == first
    assert (first.kind, first.pattern) == HOSTILE_EXPECTED[name]


@pytest.mark.parametrize("max_body", [256, 8192, 1 << 20])
def test_patterns_search_at_most_17_messages_of_2_kib_and_the_body_bound(max_body: int) -> None:
    """ratelimit.md: every regex searches the messages (the ErrorInfo's and one per
    exception, at most 17 of 2 KiB) and max_body_bytes of body, joined with newlines;
    its worst-case cost for a configured pattern is stated for that length."""
    exc: BaseException = ValueError("c" * 5000)
    for _ in range(30):  # a chain longer than the 16 exceptions read
        try:
            raise ValueError("c" * 5000) from exc
        except ValueError as e:
            exc = e
    top = ToolError("b" * 5000, status=500, details={"body": "a" * (3 << 20)})
    top.__cause__ = exc
    info = ErrorInfo(kind="tool_error", message="i" * 5000, exception=top)
    ev = gather(info, max_body=max_body)
    assert len(ev.messages) == 17 and all(len(m) == 2048 for m in ev.messages)
    assert ev.body_text == "a" * max_body
    assert len(ev.text) == 17 * 2048 + 17 + max_body


@settings(max_examples=200, deadline=None)
@given(
    body=st.one_of(st.binary(max_size=4096), st.text(max_size=4096)),
    status=st.one_of(st.none(), st.integers(100, 599)),
    headers=st.dictionaries(st.text(max_size=30), st.text(max_size=60), max_size=8),
)
def test_any_input_classifies_without_raising(
    body: object, status: int | None, headers: dict[str, str]
) -> None:
    p = RateLimitPlugin()
    exc = ToolError("failed", status=status, details={"body": body, "headers": headers})
    a = p.classify(exc)
    assert a == p.classify(exc)
    assert a.retry_after_s is None or 0 <= a.retry_after_s <= 31 * 86400.0
    if a.pattern is None:
        assert not a.retryable and not a.failover


def test_pattern_spec_needs_a_condition() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PatternSpec.model_validate({"id": "x"})
    ProviderConfig.model_validate({"rate_limit_patterns": [{"status": 429}]})
