"""The canonical encoding behind the keys: unit cases and Hypothesis properties."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import os
import pickle
import random
import subprocess
import sys
import uuid
import zoneinfo
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire_idempotency import (
    UnencodableArgumentError,
    canonical_bytes,
    record_hash,
    request_hash,
)

enc = canonical_bytes


# -- strategies ---------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def reference(value: Any) -> str:
    """An independent canonical form of a JSON value (json.dumps keeps 1 / 1.0 / true apart)."""

    def norm(v: Any) -> Any:
        if isinstance(v, float) and v == 0.0:
            return 0.0  # -0.0 == 0.0: one encoding
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v

    return json.dumps(norm(value), sort_keys=True)


def shuffled(value: Any, rnd: random.Random) -> Any:
    """``value`` with every dict rebuilt in another insertion order."""
    if isinstance(value, dict):
        items = [(k, shuffled(v, rnd)) for k, v in value.items()]
        rnd.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


# -- properties ---------------------------------------------------------------------


@given(json_values, st.randoms(use_true_random=False))
def test_dict_key_order_never_matters(value: Any, rnd: random.Random) -> None:
    assert enc(shuffled(value, rnd)) == enc(value)


@given(
    st.lists(json_values, min_size=2, max_size=6, unique_by=reference),
    st.randoms(use_true_random=False),
)
def test_list_order_always_matters(items: list[Any], rnd: random.Random) -> None:
    permuted = list(items)
    rnd.shuffle(permuted)
    if [reference(x) for x in permuted] == [reference(x) for x in items]:
        permuted.reverse()
    assert enc(permuted) != enc(items)


@given(json_values, json_values)
def test_encoding_is_injective_on_json_values(a: Any, b: Any) -> None:
    assert (enc(a) == enc(b)) == (reference(a) == reference(b))


@given(json_values)
def test_a_value_and_its_json_round_trip_encode_alike(value: Any) -> None:
    assert enc(json.loads(json.dumps(value))) == enc(value)


@given(st.integers())
def test_distinct_types_stay_distinct(n: int) -> None:
    forms: list[Any] = [n, str(n), Decimal(n), [n], {"n": n}]
    if abs(n) < 2**53:
        forms.append(float(n))
    if n in (0, 1):
        forms.append(bool(n))
    encodings = [enc(f) for f in forms]
    assert len(set(encodings)) == len(forms)


@given(st.text(max_size=6), st.text(max_size=6), st.text(max_size=6), st.text(max_size=6))
def test_fields_never_run_into_each_other(a: str, b: str, c: str, d: str) -> None:
    if (a, b) != (c, d):
        assert record_hash(None, a, b) != record_hash(None, c, d)
        assert enc([a, b]) != enc([c, d])


@given(st.sets(st.text(max_size=5), max_size=8))
def test_sets_are_order_free_and_not_lists(members: set[str]) -> None:
    assert enc(members) == enc(frozenset(sorted(members, reverse=True)))
    assert enc(members) != enc(sorted(members))


# -- unit cases ---------------------------------------------------------------------


def test_one_one_point_zero_and_true_differ() -> None:
    assert len({enc(1), enc(1.0), enc(True), enc("1"), enc(Decimal(1)), enc(b"1")}) == 6
    assert len({enc(0), enc(0.0), enc(False), enc(None), enc(""), enc([]), enc({})}) == 7


def test_concatenation_is_never_ambiguous() -> None:
    assert record_hash(None, "ab", "c") != record_hash(None, "a", "bc")
    assert record_hash("t", "ool", "c") != record_hash("to", "ol", "c")
    assert record_hash(None, "tool", "c") != record_hash("", "tool", "c")  # no tenant != ""
    assert request_hash(None, "t", "c", {"a": "b"}) != request_hash(None, "t", "c", {"ab": ""})


def test_equal_values_of_one_type_share_an_encoding() -> None:
    assert enc(-0.0) == enc(0.0)
    assert enc(Decimal("1.0")) == enc(Decimal("1.00")) == enc(Decimal("1"))
    assert enc(Decimal("-0")) == enc(Decimal("0.000"))
    assert enc(Decimal("1E+2")) == enc(Decimal("100"))
    assert enc(Decimal("1.5")) != enc(Decimal("15"))
    paris = dt.timezone(dt.timedelta(hours=2))
    utc = dt.datetime(2024, 5, 1, 8, 0, tzinfo=dt.UTC)
    assert enc(utc) == enc(dt.datetime(2024, 5, 1, 10, 0, tzinfo=paris))  # the same instant
    assert enc(utc) != enc(utc.replace(tzinfo=None))  # naive is another type
    assert enc((1, 2)) == enc([1, 2])  # both JSON arrays
    assert enc({1, 2}) == enc(frozenset({2, 1}))


def test_extended_types() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert enc(u) != enc(str(u)) and enc(u) == enc(uuid.UUID(str(u)))
    assert enc(b"abc") != enc("abc") and enc(bytearray(b"abc")) == enc(b"abc")
    assert enc(dt.date(2024, 1, 2)) != enc("2024-01-02")
    assert enc(dt.time(10, 30)) != enc(dt.time(10, 30, tzinfo=dt.UTC))
    paris = zoneinfo.ZoneInfo("Europe/Paris")  # no fixed offset without a date
    assert enc(dt.time(10, 30, tzinfo=paris)) not in (
        enc(dt.time(10, 30)),
        enc(dt.time(10, 31, tzinfo=paris)),
    )
    assert enc(dt.timedelta(seconds=90)) == enc(dt.timedelta(minutes=1, seconds=30))
    assert enc(PurePosixPath("/a/b")) != enc("/a/b")


class Color(enum.Enum):
    RED = "red"


class Size(enum.IntEnum):
    ONE = 1


class Level(enum.StrEnum):
    HIGH = "high"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Model(pydantic.BaseModel):
    when: dt.datetime
    tags: set[str]
    point: Point | None = None


def test_enums_models_and_dataclasses() -> None:
    assert enc(Color.RED) != enc("red")
    assert enc(Size.ONE) != enc(1)
    assert enc(Level.HIGH) != enc("high")
    assert enc(Point(1, 2)) != enc({"x": 1, "y": 2})
    assert enc(Point(1, 2)) == enc(Point(1, 2)) != enc(Point(2, 1))
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    a = Model(when=when, tags={"a", "b", "c"}, point=Point(1, 2))
    b = Model(point=Point(1, 2), tags={"c", "b", "a"}, when=when)
    assert enc(a) == enc(b)
    assert enc(a) != enc(a.model_dump())
    assert enc(a) != enc(Model(when=when, tags={"a"}, point=Point(1, 2)))


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        ({"x": math.nan}, "args['x']", "float"),
        ({"x": [1, math.inf]}, "args['x'][1]", "float"),
        ({"d": Decimal("NaN")}, "args['d']", "Decimal"),
        ({"o": object()}, "args['o']", "object"),
        ({"p": Point(1, object())}, "args['p']['y']", "object"),  # type: ignore[arg-type]
        ({"c": 1j}, "args['c']", "complex"),
    ],
)
def test_unencodable_values_name_where(value: Any, path: str, type_name: str) -> None:
    with pytest.raises(UnencodableArgumentError) as info:
        enc(value)
    assert info.value.path == path
    assert info.value.type_name == type_name
    assert isinstance(info.value, TypeError)


def test_cycles_and_absurd_depth_are_refused() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(UnencodableArgumentError, match="deeper"):
        enc(cycle)
    deep: Any = 1
    for _ in range(150):
        deep = [deep]
    with pytest.raises(UnencodableArgumentError, match="deeper"):
        enc(deep)


# -- stability across processes and PYTHONHASHSEED ----------------------------------


def sample_values(seed: int = 7, count: int = 60) -> list[Any]:
    """Deterministic values heavy in sets and dicts (hash-seed-sensitive in CPython)."""
    rnd = random.Random(seed)

    def word() -> str:
        return "".join(rnd.choice("abcdefghijé✓") for _ in range(rnd.randint(0, 6)))

    def value(depth: int) -> Any:
        kind = rnd.randrange(9 if depth < 3 else 5)
        if kind == 0:
            return rnd.randint(-(2**70), 2**70)
        if kind == 1:
            return rnd.uniform(-1e6, 1e6)
        if kind == 2:
            return word()
        if kind == 3:
            return {word() for _ in range(rnd.randint(0, 8))}
        if kind == 4:
            return Decimal(rnd.randint(-(10**6), 10**6)).scaleb(-rnd.randint(0, 4))
        if kind == 5:
            return {word(): value(depth + 1) for _ in range(rnd.randint(0, 6))}
        if kind == 6:
            return [value(depth + 1) for _ in range(rnd.randint(0, 4))]
        if kind == 7:
            return frozenset(rnd.randint(0, 100) for _ in range(rnd.randint(0, 6)))
        return uuid.UUID(int=rnd.getrandbits(128))

    return [{"v": value(0), "when": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)} for _ in range(count)]


_CHILD = """
import pickle, sys
from toolwire_idempotency import request_hash
values = pickle.load(open(sys.argv[1], "rb"))
for v in values:
    print(request_hash("tenant", "tool", "call", v))
"""


@pytest.mark.parametrize("seed", ["0", "12345", "random"])
def test_keys_are_stable_across_processes_and_hash_seeds(tmp_path: Path, seed: str) -> None:
    values = sample_values()
    here = [request_hash("tenant", "tool", "call", v) for v in values]
    data = tmp_path / "values.pickle"
    data.write_bytes(pickle.dumps(values))  # sets are rebuilt in the child's hash order
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(data)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == here


@settings(max_examples=50)
@given(json_values)
def test_request_hash_depends_on_args(value: Any) -> None:
    assert request_hash(None, "t", "c", value) != request_hash(None, "t", "c", [value])
