"""ToolStats: merging, the stored document, the summary."""

from __future__ import annotations

import json

from toolwire_profiling import ToolStats


def sample(offset: float = 0.0) -> ToolStats:
    s = ToolStats()
    for i in range(50):
        s.add_execution(10 + i + offset, None if i % 5 else "timeout")
    for i in range(5):
        s.add_signature(f"q:s{i}", 10 + i, max_signatures=3)
    s.calls, s.calls_ok, s.replays, s.retries, s.fallbacks, s.cancelled = 40, 30, 2, 10, 1, 1
    s.call_errors = {"timeout": 6}
    s.served_by = {"backup": 1}
    s.source = "local"
    return s


def test_document_round_trip() -> None:
    s = sample()
    back = ToolStats.from_doc(json.loads(json.dumps(s.to_doc())))
    assert back.to_doc() == s.to_doc()
    assert len(back.sigs) == 3  # capped when recording
    assert ToolStats.from_doc({"v": 99}).is_empty() and ToolStats.from_doc(None).is_empty()
    assert ToolStats.from_doc({"v": 1, "count": "x", "errors": [1], "min_ms": True}).count == 0


def test_merge_adds_everything() -> None:
    a, b = sample(), sample(offset=100)
    m = a.copy()
    m.merge(b, max_signatures=2)
    assert m.count == 100 and m.ok == 80 and m.errors == {"timeout": 20}
    assert m.sum_ms == a.sum_ms + b.sum_ms
    assert m.min_ms == 10 and m.max_ms == 159
    assert m.ok_sketch.count == 80 and m.err_sketch.count == 20
    assert m.calls == 80 and m.call_errors == {"timeout": 12} and m.served_by == {"backup": 2}
    assert len(m.sigs) == 2 and all(sk.count == 2 for sk in m.sigs.values())
    assert a.count == 50  # merge leaves its argument alone


def test_summary() -> None:
    s = sample().summary("t")
    assert s["tool"] == "t" and s["count"] == 50 and s["success_rate"] == 0.8
    assert s["error_count"] == 10 and s["errors"] == {"timeout": 10}
    assert s["calls"] == 40 and s["call_success_rate"] == 30 / 37  # replays and cancels excluded
    assert abs(s["p50_time_ms"] - 34) <= 0.34 and abs(s["success_p50_time_ms"] - 34) <= 0.34
    empty = ToolStats().summary("x")
    assert empty["count"] == 0 and empty["p50_time_ms"] is None and empty["success_rate"] is None
