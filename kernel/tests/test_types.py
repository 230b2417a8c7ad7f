from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid

import pydantic
import pytest

from toolwire import ErrorInfo, ToolResult, normalize_content
from toolwire._types import NotJSONError


class Model(pydantic.BaseModel):
    a: int
    when: dt.datetime


@dataclasses.dataclass
class DC:
    x: int
    tags: list[str]


def test_dict_passes_through_unchanged() -> None:
    d = {"a": 1, "b": [1, 2, {"c": None}]}
    assert normalize_content(d) is d


@pytest.mark.parametrize("value", [0, 1.5, "", "x", True, False, None, [], [1, "a"]])
def test_scalars_lists_and_none_are_wrapped(value: object) -> None:
    assert normalize_content(value) == {"result": value}


def test_pydantic_model_is_dumped_to_json_types() -> None:
    out = normalize_content(Model(a=1, when=dt.datetime(2026, 1, 2, tzinfo=dt.UTC)))
    assert out == {"a": 1, "when": "2026-01-02T00:00:00Z"}


def test_dataclass_is_dumped() -> None:
    assert normalize_content(DC(3, ["t"])) == {"x": 3, "tags": ["t"]}


def test_dict_with_non_json_values_is_made_json() -> None:
    u = uuid.UUID(int=1)
    assert normalize_content({"id": u}) == {"id": str(u)}


def test_unencodable_value_raises_typed_error() -> None:
    with pytest.raises(NotJSONError, match="object"):
        normalize_content(object())
    with pytest.raises(NotJSONError):
        normalize_content({"f": lambda: 1})


def test_nan_is_not_passed_through_as_a_float() -> None:
    out = normalize_content({"x": math.nan})
    assert out == {"x": "NaN"}


def test_result_helpers_and_raise_for_error() -> None:
    ok = ToolResult.ok(3, tool="t")
    assert ok.content == {"result": 3}
    assert ok.raise_for_error() is ok
    bad = ToolResult.fail("denied", "nope", retryable=False)
    assert bad.is_error
    assert bad.to_dict()["error"]["kind"] == "denied"
    from toolwire import ToolCallError

    with pytest.raises(ToolCallError, match="denied: nope"):
        bad.raise_for_error()


def test_error_info_to_dict_drops_exception() -> None:
    info = ErrorInfo("tool_error", "boom", exception=ValueError("x"), details={"d": 1})
    assert info.to_dict() == {
        "kind": "tool_error",
        "message": "boom",
        "retryable": False,
        "retry_after_s": None,
        "source": None,
        "details": {"d": 1},
    }


def test_an_odd_detail_is_described_in_its_place_and_the_others_kept() -> None:
    """Before: one detail that is not JSON (a response object, say) replaced them all
    with {"unserializable_details": ...}: the status and the reason were lost."""

    class Response:
        pass

    info = ErrorInfo("unavailable", "HTTP 503", details={"status": 503, "response": Response()})
    details = info.to_dict()["details"]
    assert details["status"] == 503
    assert details["response"].startswith("<not JSON: value of type Response")


def test_result_validates_with_pydantic_typeadapter() -> None:
    ta = pydantic.TypeAdapter(ToolResult)
    r = ToolResult.fail("tool_error", "boom", exception=ValueError("x"))
    dumped = ta.dump_python(r, mode="json")
    assert dumped["error"]["kind"] == "tool_error"
    assert dumped["error"]["exception"] is None
    assert ta.validate_python(dumped).error.kind == "tool_error"


def test_parse_retry_after_reads_both_forms_and_refuses_what_float_would_take() -> None:
    from email.utils import formatdate

    from toolwire import parse_retry_after

    now = 1_800_000_000.0
    assert parse_retry_after("120", now) == 120.0 and parse_retry_after(" +1.5 ", now) == 1.5
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now) == 30.0
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now) is None  # past
    for junk in (None, "", "-5", "nan", "inf", "1e3", "soon", "Wed, 99 Foo 2015", "9" * 20):
        assert parse_retry_after(junk, now) is None, junk
    import time

    ahead = parse_retry_after(formatdate(time.time() + 60, usegmt=True))  # from the wall clock
    assert ahead is not None and 55 < ahead <= 60


def test_parse_retry_after_reads_all_three_http_date_formats() -> None:
    """RFC 9110 § 5.6.7: a recipient MUST accept all three; the asctime form has no zone (it
    is UTC) and was taken for no hint. A date with no zone that is no HTTP-date still is."""
    from toolwire import parse_retry_after

    now = 784_111_777.0 - 30  # 30 s before Sun, 06 Nov 1994 08:49:37 GMT
    for text in (
        "Sun, 06 Nov 1994 08:49:37 GMT",  # IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT",  # obsolete RFC 850
        "Sun Nov  6 08:49:37 1994",  # obsolete asctime
        "Sun Nov 16 08:49:37 1994",
    ):
        expected = 30.0 if "16" not in text else 30.0 + 10 * 86400
        assert parse_retry_after(text, now) == expected, text
    for junk in ("Sun, 06 Nov 1994 08:49:37", "Sun, 06 Nov 1994 08:49:37 -0000"):
        assert parse_retry_after(junk, now) is None, junk


@pytest.mark.parametrize("bad", [math.inf, math.nan, -3.0, "10", True])
@pytest.mark.anyio
async def test_a_retry_after_no_wait_can_use_is_dropped_so_results_stay_json(bad: object) -> None:
    """Before: a tool's ToolError(retry_after_s=math.inf) ("never"), or a plugin's
    CallRejected with one, made `toolwire call` print `"retry_after_s": Infinity` (stdout
    that does not parse as JSON) and an idempotency record of the error fail to write."""
    import json

    from toolwire import CallRejected, Kernel, ToolError, hookimpl
    from toolwire.testing import FakeTool

    class Rejects:
        name = "rejects"

        @hookimpl
        def before_call(self, call: object) -> None:
            if getattr(call, "name", "") == "gate":
                raise CallRejected("quota", "used up", retry_after_s=bad)  # type: ignore[arg-type]

    class Classifies:
        name = "classifies"

        @hookimpl
        def on_error(self, error: ErrorInfo) -> None:
            error.retry_after_s = bad  # type: ignore[assignment]

    tool = FakeTool("flaky", script=[ToolError("never", kind="quota", retry_after_s=bad)])  # type: ignore[arg-type]
    async with Kernel(tools=[tool.tool, FakeTool("gate").tool], plugins=[Rejects()]) as k:
        for name in ("flaky", "gate"):
            r = await k.call(name, {})
            assert r.error is not None and r.error.retry_after_s is None, name
            json.dumps(r.to_dict(), allow_nan=False)
    # a classifier sets it after the kernel's check: to_dict still gives JSON
    async with Kernel(
        tools=[FakeTool("f2", script=[ToolError("x")]).tool], plugins=[Classifies()]
    ) as k:
        r = await k.call("f2", {})
        assert r.error is not None and r.error.to_dict()["retry_after_s"] is None
        json.dumps(r.to_dict(), allow_nan=False)
    ok = ErrorInfo("quota", "x", retry_after_s=2.5)
    assert ok.to_dict()["retry_after_s"] == 2.5


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_call_rejected_takes_a_bool_for_retryable(bad: object) -> None:
    """``CallRejected(retryable="yes")`` reached callers as the string ``"yes"`` in
    ``error.retryable`` (and in the JSON an MCP client gets); it is a TypeError naming
    the argument, which the kernel reports as the plugin's failure."""
    from toolwire import CallRejected

    with pytest.raises(TypeError, match=r"CallRejected\(retryable=...\) takes True or False"):
        CallRejected("denied", "no", retryable=bad)  # type: ignore[arg-type]
    assert CallRejected("denied", "no", retryable=True).retryable is True
