"""Per-tool figures: the in-memory accumulator, its stored form, and call signatures.

One ``ToolStats`` holds everything the plugin knows about one tool, at two
levels:

- **executions** (attempts that ran the tool, and ``record_execution``):
  count, successes, errors by kind, the sum/min/max of durations, one
  duration sketch for successes and one for failures, and per-signature
  sketches of successful durations (for "similar call" estimates);
- **calls** (requested through the kernel under this name): count, successes,
  errors by kind, replays, retries, fallbacks, cancellations, and who served
  them when it was not the tool itself.

Every field is a count or a sum, so two ``ToolStats`` merge by adding (min and
max by min and max): the stored figure of a fleet is the merge of every
process's deltas.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

from ._sketch import ALPHA, Sketch

__all__ = ["QUANTILES", "ToolStats", "args_signature"]

QUANTILES = (0.5, 0.9, 0.99)
DOC_VERSION = 1
_MAX_SIG_LEN = 96


def _shape(v: Any) -> str:
    """A coarse description of one argument value: its type and size class."""
    t = type(v)
    if t is str:
        return f"s{len(v).bit_length()}"
    if t is bool:
        return "t" if v else "f"
    if t is int:
        return f"i{v.bit_length()}" if v >= 0 else f"i-{(-v).bit_length()}"
    if t is float:
        if v != v:
            return "fnan"
        if v in (float("inf"), float("-inf")):
            return "finf"
        m = int(abs(v)).bit_length()
        return f"f{m}" if v >= 0 else f"f-{m}"
    if v is None:
        return "n"
    if t is list or t is tuple:
        return f"l{len(v).bit_length()}"
    if t is dict:
        return f"d{len(v).bit_length()}"
    return "o"


def args_signature(args: Mapping[str, Any] | None, exact: Collection[str] = ()) -> str:
    """A coarse signature of a call's arguments: calls that share it are "similar".

    Each argument contributes its name and a size class: strings, lists and
    objects by length within a factor of 2 (``s3``: 4-7 characters), numbers by
    magnitude within a factor of 2 (``i10``: 512-1023), booleans and null by
    value. Arguments named in ``exact`` contribute their exact value (e.g. a
    ``model`` or ``engine`` argument that changes the cost). Long signatures
    are hashed. ``{}`` and None give ``"-"``.
    """
    if not args:
        return "-"
    parts = []
    for k in sorted(args):
        v = args[k]
        if k in exact:
            try:
                text = json.dumps(v, sort_keys=True, default=str)
            except (TypeError, ValueError):
                text = repr(v)
            parts.append(f"{k}={text[:48]}")
        else:
            parts.append(f"{k}:{_shape(v)}")
    sig = ",".join(parts)
    if len(sig) > _MAX_SIG_LEN:
        sig = "#" + hashlib.blake2b(sig.encode("utf-8", "replace"), digest_size=8).hexdigest()
    return sig


def _add_counts(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _counts(v: Any) -> dict[str, int]:
    if not isinstance(v, dict):
        return {}
    return {str(k): n for k, n in v.items() if _int(n)}


class ToolStats:
    """Everything known about one tool (see the module docstring)."""

    __slots__ = (
        "call_errors",
        "calls",
        "calls_ok",
        "cancelled",
        "count",
        "err_sketch",
        "errors",
        "fallbacks",
        "max_ms",
        "min_ms",
        "ok",
        "ok_sketch",
        "replays",
        "retries",
        "served_by",
        "sigs",
        "source",
        "sum_ms",
        "updated_at",
    )

    def __init__(self) -> None:
        # executions
        self.count = 0
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.sum_ms = 0.0
        self.min_ms: float | None = None
        self.max_ms: float | None = None
        self.ok_sketch = Sketch()
        self.err_sketch = Sketch()
        self.sigs: dict[str, Sketch] = {}
        # calls
        self.calls = 0
        self.calls_ok = 0
        self.call_errors: dict[str, int] = {}
        self.replays = 0
        self.retries = 0
        self.fallbacks = 0
        self.cancelled = 0
        self.served_by: dict[str, int] = {}
        # facts
        self.source: str | None = None
        self.updated_at: float | None = None

    # -- recording (the hot path) --------------------------------------------
    def add_execution(self, duration_ms: float, error_kind: str | None) -> None:
        """One execution of the tool: its duration and None (success) or its error kind."""
        self.count += 1
        self.sum_ms += duration_ms
        mn = self.min_ms
        if mn is None or duration_ms < mn:
            self.min_ms = duration_ms
        mx = self.max_ms
        if mx is None or duration_ms > mx:
            self.max_ms = duration_ms
        if error_kind is None:
            self.ok += 1
            self.ok_sketch.add(duration_ms)
        else:
            errors = self.errors
            errors[error_kind] = errors.get(error_kind, 0) + 1
            self.err_sketch.add(duration_ms)

    def add_signature(self, sig: str, duration_ms: float, max_signatures: int) -> None:
        """A successful execution of a call with signature ``sig``."""
        sk = self.sigs.get(sig)
        if sk is None:
            if len(self.sigs) >= max_signatures:
                return
            sk = self.sigs[sig] = Sketch()
        sk.add(duration_ms)

    # -- merging ---------------------------------------------------------------
    def merge(self, other: ToolStats, max_signatures: int | None = None) -> None:
        """Add ``other``'s figures to these (``other`` is unchanged)."""
        self.count += other.count
        self.ok += other.ok
        _add_counts(self.errors, other.errors)
        self.sum_ms += other.sum_ms
        if other.min_ms is not None and (self.min_ms is None or other.min_ms < self.min_ms):
            self.min_ms = other.min_ms
        if other.max_ms is not None and (self.max_ms is None or other.max_ms > self.max_ms):
            self.max_ms = other.max_ms
        self.ok_sketch.merge(other.ok_sketch)
        self.err_sketch.merge(other.err_sketch)
        for sig, sk in other.sigs.items():
            mine = self.sigs.get(sig)
            if mine is None:
                self.sigs[sig] = sk.copy()
            else:
                mine.merge(sk)
        if max_signatures is not None and len(self.sigs) > max_signatures:
            keep = sorted(self.sigs.items(), key=lambda kv: (-kv[1].count, kv[0]))
            self.sigs = dict(keep[:max_signatures])
        self.calls += other.calls
        self.calls_ok += other.calls_ok
        _add_counts(self.call_errors, other.call_errors)
        self.replays += other.replays
        self.retries += other.retries
        self.fallbacks += other.fallbacks
        self.cancelled += other.cancelled
        _add_counts(self.served_by, other.served_by)
        if other.source is not None:
            self.source = other.source
        if other.updated_at is not None and (
            self.updated_at is None or other.updated_at > self.updated_at
        ):
            self.updated_at = other.updated_at

    def copy(self) -> ToolStats:
        """An independent copy."""
        out = ToolStats()
        out.merge(self)
        return out

    def is_empty(self) -> bool:
        """Nothing recorded."""
        return self.count == 0 and self.calls == 0

    # -- reading -----------------------------------------------------------------
    def all_sketch(self) -> Sketch:
        """The durations of every execution, successful or not."""
        s = self.ok_sketch.copy()
        s.merge(self.err_sketch)
        return s

    def summary(self, tool: str) -> dict[str, Any]:
        """The figures ``get_statistics`` returns (see docs/profiling.md)."""
        p50, p90, p99 = self.all_sketch().quantiles(QUANTILES)
        ok50, ok90, ok99 = self.ok_sketch.quantiles(QUANTILES)
        n = self.count
        finished = self.calls - self.replays - self.cancelled
        return {
            "tool": tool,
            "source": self.source,
            "count": n,
            "success_count": self.ok,
            "error_count": n - self.ok,
            "success_rate": (self.ok / n) if n else None,
            "avg_time_ms": (self.sum_ms / n) if n else None,
            "min_time_ms": self.min_ms,
            "max_time_ms": self.max_ms,
            "p50_time_ms": p50,
            "p90_time_ms": p90,
            "p99_time_ms": p99,
            "success_p50_time_ms": ok50,
            "success_p90_time_ms": ok90,
            "success_p99_time_ms": ok99,
            "errors": dict(sorted(self.errors.items())),
            "calls": self.calls,
            "call_success_rate": (self.calls_ok / finished) if finished > 0 else None,
            "call_errors": dict(sorted(self.call_errors.items())),
            "replays": self.replays,
            "retries": self.retries,
            "fallbacks": self.fallbacks,
            "cancelled": self.cancelled,
            "served_by": dict(sorted(self.served_by.items())),
            "signatures": len(self.sigs),
            "relative_accuracy": ALPHA,
            "updated_at": self.updated_at,
        }

    # -- storage -----------------------------------------------------------------
    def to_doc(self) -> dict[str, Any]:
        """The JSON document kept in the state store."""
        return {
            "v": DOC_VERSION,
            "count": self.count,
            "ok": self.ok,
            "errors": self.errors,
            "sum_ms": self.sum_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "ok_sketch": self.ok_sketch.to_dict(),
            "err_sketch": self.err_sketch.to_dict(),
            "sigs": {k: v.to_dict() for k, v in self.sigs.items()},
            "calls": self.calls,
            "calls_ok": self.calls_ok,
            "call_errors": self.call_errors,
            "replays": self.replays,
            "retries": self.retries,
            "fallbacks": self.fallbacks,
            "cancelled": self.cancelled,
            "served_by": self.served_by,
            "source": self.source,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_doc(cls, doc: Any) -> ToolStats:
        """The figures stored by ``to_doc``; unknown or malformed parts read as empty."""
        s = cls()
        if not isinstance(doc, dict) or doc.get("v") != DOC_VERSION:
            return s
        s.count = _int(doc.get("count"))
        s.ok = _int(doc.get("ok"))
        s.errors = _counts(doc.get("errors"))
        s.sum_ms = _num(doc.get("sum_ms")) or 0.0
        s.min_ms = _num(doc.get("min_ms"))
        s.max_ms = _num(doc.get("max_ms"))
        s.ok_sketch = Sketch.from_dict(doc.get("ok_sketch"))
        s.err_sketch = Sketch.from_dict(doc.get("err_sketch"))
        sigs = doc.get("sigs")
        if isinstance(sigs, dict):
            s.sigs = {str(k): Sketch.from_dict(v) for k, v in sigs.items()}
        s.calls = _int(doc.get("calls"))
        s.calls_ok = _int(doc.get("calls_ok"))
        s.call_errors = _counts(doc.get("call_errors"))
        s.replays = _int(doc.get("replays"))
        s.retries = _int(doc.get("retries"))
        s.fallbacks = _int(doc.get("fallbacks"))
        s.cancelled = _int(doc.get("cancelled"))
        s.served_by = _counts(doc.get("served_by"))
        src = doc.get("source")
        s.source = src if isinstance(src, str) else None
        s.updated_at = _num(doc.get("updated_at"))
        return s
