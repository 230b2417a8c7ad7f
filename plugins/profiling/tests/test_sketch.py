"""The quantile sketch keeps its stated 1 % relative error against exact quantiles."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire_profiling import ALPHA, Sketch
from toolwire_profiling._sketch import MIN_VALUE_MS

QS = (0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)


def exact(sorted_values: list[float], q: float) -> float:
    """The lower quantile: the value of rank floor(q * (n - 1))."""
    return sorted_values[math.floor(q * (len(sorted_values) - 1))]


def assert_within(sketch: Sketch, values: list[float]) -> float:
    """Every quantile of QS within ALPHA of the exact one; returns the worst relative error."""
    s = sorted(values)
    worst = 0.0
    for q in QS:
        want = exact(s, q)
        got = sketch.quantile(q)
        assert got is not None
        if want <= MIN_VALUE_MS:
            assert got == 0.0
            continue
        err = abs(got - want) / want
        worst = max(worst, err)
        assert err <= ALPHA * (1 + 1e-9), f"q={q}: got {got}, exact {want}, error {err:.4%}"
    return worst


R = random.Random(7)

DISTRIBUTIONS: dict[str, Callable[[random.Random], float]] = {
    "uniform 1-100 ms": lambda r: r.uniform(1, 100),
    "lognormal (median 20 ms, sigma 1)": lambda r: r.lognormvariate(math.log(20), 1.0),
    "exponential (mean 50 ms)": lambda r: r.expovariate(1 / 50),
    "pareto heavy tail": lambda r: 5 * r.paretovariate(1.2),
    "bimodal cache hit/miss": lambda r: (
        r.gauss(0.4, 0.05) if r.random() < 0.8 else r.gauss(250, 40)
    ),
    "microseconds": lambda r: r.uniform(0.001, 0.02),
    "hours": lambda r: r.uniform(1, 5) * 3_600_000,
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_quantiles_within_one_percent_of_exact(name: str) -> None:
    gen = DISTRIBUTIONS[name]
    r = random.Random(name)
    values = [max(gen(r), 1e-3) for _ in range(20_000)]
    sk = Sketch()
    for v in values:
        sk.add(v)
    assert sk.count == len(values)
    worst = assert_within(sk, values)
    assert worst > 0  # the sketch is approximate: a zero error would mean the test is vacuous


def test_quantiles_matches_quantile() -> None:
    r = random.Random(1)
    sk = Sketch()
    for _ in range(5000):
        sk.add(r.lognormvariate(2, 1.5))
    qs = (0.0, 0.5, 0.9, 0.99, 1.0)
    assert sk.quantiles(qs) == [sk.quantile(q) for q in qs]


def test_merge_is_exactly_the_sketch_of_the_union() -> None:
    r = random.Random(3)
    parts = [[r.expovariate(1 / (10 * (i + 1))) for _ in range(3000)] for i in range(4)]
    whole = Sketch()
    merged = Sketch()
    for part in parts:
        s = Sketch()
        for v in part:
            s.add(v)
            whole.add(v)
        merged.merge(s)
    assert merged.bins == whole.bins and merged.count == whole.count == 12_000
    assert_within(merged, [v for p in parts for v in p])


def test_storage_round_trip_through_json() -> None:
    r = random.Random(4)
    sk = Sketch()
    values = [r.uniform(0.5, 900) for _ in range(2000)] + [0.0, 0.0]
    for v in values:
        sk.add(v)
    back = Sketch.from_dict(json.loads(json.dumps(sk.to_dict())))
    assert back.bins == sk.bins and back.zero == sk.zero == 2 and back.count == sk.count
    assert_within(back, values)


def test_zeros_empty_and_bad_input() -> None:
    sk = Sketch()
    assert sk.quantile(0.5) is None and sk.quantiles((0.5, 0.9)) == [None, None]
    sk.add(0.0)
    sk.add(0.0)
    sk.add(10.0)
    assert sk.quantile(0.0) == 0.0 and sk.quantile(0.5) == 0.0
    assert abs(sk.quantile(1.0) - 10.0) <= 0.1  # type: ignore[operator]
    with pytest.raises(ValueError, match="within"):
        sk.quantile(1.5)
    assert Sketch.from_dict("garbage").count == 0
    assert Sketch.from_dict({"o": 3, "c": [1, "x", -2, 2], "z": 1}).count == 4


def test_bucket_count_is_bounded_by_the_range() -> None:
    sk = Sketch()
    v = 0.001
    while v < 86_400_000:  # 1 µs .. one day, in ms
        sk.add(v)
        v *= 1.001
    assert len(sk.bins) <= 1450


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=300,
    )
)
def test_property_any_data_any_quantile(values: list[float]) -> None:
    sk = Sketch()
    for v in values:
        sk.add(v)
    assert_within(sk, values)
