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


def test_result_validates_with_pydantic_typeadapter() -> None:
    ta = pydantic.TypeAdapter(ToolResult)
    r = ToolResult.fail("tool_error", "boom", exception=ValueError("x"))
    dumped = ta.dump_python(r, mode="json")
    assert dumped["error"]["kind"] == "tool_error"
    assert dumped["error"]["exception"] is None
    assert ta.validate_python(dumped).error.kind == "tool_error"
