"""A mergeable quantile sketch with a relative-error guarantee (DDSketch-style).

Values (durations in milliseconds) fall into logarithmic buckets: bucket ``i``
holds the values ``x`` with ``gamma**(i-1) < x <= gamma**i``, where
``gamma = (1 + alpha) / (1 - alpha)``. A quantile is answered with the
bucket's representative ``2 * gamma**i / (gamma + 1)``, which is within a
relative error ``alpha`` of every value of the bucket. So, for any ``q``, the
estimate is within ``alpha`` (1 %) of the exact ``q``-quantile, defined as the
value of rank ``floor(q * (n - 1))`` in the sorted data (the "lower" quantile).
The guarantee holds for every positive value down to ``MIN_VALUE_MS`` (1 ns);
smaller values and zeros are counted in a zero bucket and reported as ``0``.

Sketches merge by adding bucket counts, so the sketches of several processes
add up to exactly the sketch of all their values: the fleet-wide quantiles
keep the same 1 % bound. The number of buckets depends on the spread of the
data only: about 116 buckets per factor of 10, so at most ~1,400 for a
range of 1 µs to one day (a typical tool needs a few dozen).

Reference: Masson, Rim, Lee, "DDSketch: A Fast and Fully-Mergeable Quantile
Sketch with Relative-Error Guarantees", VLDB 2019.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ALPHA", "MIN_VALUE_MS", "Sketch"]

#: Relative accuracy of every quantile answered by a ``Sketch``.
ALPHA = 0.01
GAMMA = (1.0 + ALPHA) / (1.0 - ALPHA)
_INV_LN_GAMMA = 1.0 / math.log(GAMMA)
_REPR_FACTOR = 2.0 / (GAMMA + 1.0)
#: Smaller values (and zeros) go to the zero bucket and read back as 0.
MIN_VALUE_MS = 1e-6

_log = math.log
_ceil = math.ceil


class Sketch:
    """Bucket counts of a stream of non-negative values; see the module docstring.

    ``add`` costs a logarithm and a dict update. ``quantile`` sorts the
    buckets (a few dozen typically): call it for reports, not per value.
    """

    __slots__ = ("bins", "count", "zero")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.zero = 0
        self.count = 0

    def add(self, value: float, n: int = 1) -> None:
        """Record ``value`` (``n`` times)."""
        self.count += n
        if value > MIN_VALUE_MS:
            i = _ceil(_log(value) * _INV_LN_GAMMA)
            bins = self.bins
            bins[i] = bins.get(i, 0) + n
        else:
            self.zero += n

    def merge(self, other: Sketch) -> None:
        """Add ``other``'s values to this sketch (``other`` is unchanged)."""
        bins = self.bins
        for i, c in other.bins.items():
            bins[i] = bins.get(i, 0) + c
        self.zero += other.zero
        self.count += other.count

    def copy(self) -> Sketch:
        """An independent copy."""
        s = Sketch()
        s.bins = dict(self.bins)
        s.zero = self.zero
        s.count = self.count
        return s

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0 <= q <= 1) within 1 %, or None when empty."""
        if self.count <= 0:
            return None
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be within [0, 1], not {q!r}")
        rank = q * (self.count - 1)
        seen = self.zero
        if seen > rank:
            return 0.0
        for i in sorted(self.bins):
            seen += self.bins[i]
            if seen > rank:
                return _REPR_FACTOR * GAMMA**i
        # Only reachable when counts were edited by hand: answer the largest bucket.
        return _REPR_FACTOR * GAMMA ** max(self.bins) if self.bins else 0.0

    def quantiles(self, qs: tuple[float, ...]) -> list[float | None]:
        """Several quantiles with one sort (``qs`` ascending)."""
        if self.count <= 0:
            return [None] * len(qs)
        out: list[float | None] = []
        items = sorted(self.bins.items())
        seen = self.zero
        k = 0
        last = 0.0
        for q in qs:
            rank = q * (self.count - 1)
            if seen > rank:
                out.append(last if k else 0.0)
                continue
            while k < len(items):
                i, c = items[k]
                k += 1
                seen += c
                last = _REPR_FACTOR * GAMMA**i
                if seen > rank:
                    break
            out.append(last)
        return out

    # -- storage -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"o": first bucket, "c": [counts...], "z": zeros}``."""
        if not self.bins:
            return {"o": 0, "c": [], "z": self.zero}
        lo, hi = min(self.bins), max(self.bins)
        counts = [0] * (hi - lo + 1)
        for i, c in self.bins.items():
            counts[i - lo] = c
        return {"o": lo, "c": counts, "z": self.zero}

    @classmethod
    def from_dict(cls, data: Any) -> Sketch:
        """The sketch stored by ``to_dict`` (malformed data gives an empty sketch)."""
        s = cls()
        if not isinstance(data, dict):
            return s
        lo = data.get("o", 0)
        counts = data.get("c", [])
        zero = data.get("z", 0)
        if not isinstance(lo, int) or not isinstance(counts, list) or not isinstance(zero, int):
            return s
        total = max(zero, 0)
        for k, c in enumerate(counts):
            if isinstance(c, int) and c > 0:
                s.bins[lo + k] = c
                total += c
        s.zero = max(zero, 0)
        s.count = total
        return s

    def __repr__(self) -> str:
        return f"Sketch(count={self.count}, buckets={len(self.bins)})"
