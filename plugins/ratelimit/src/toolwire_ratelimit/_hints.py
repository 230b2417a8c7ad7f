"""When may a rate-limited or exhausted provider be tried again?

Parses ``Retry-After`` (seconds or HTTP-date), ``retry-after-ms``, the
``X-RateLimit-*`` / ``RateLimit-*`` families (delta seconds, epoch seconds,
Go-style durations, multi-window lists such as Brave's ``1, 1419704``) and
hints in a response body (``retry_after`` fields, "try again in 20s").

Every value is bounded: garbage, NaN, infinities and negative values are
ignored (None); huge values are capped by the caller's maximum.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from toolwire import parse_retry_after  # one reading of Retry-After for every source

__all__ = [
    "QUOTA_WINDOW_S",
    "ResetHints",
    "body_retry_after",
    "bound",
    "header_retry_after",
    "parse_duration",
    "parse_retry_after",
    "quota_fields_exhausted",
    "reset_hints",
]

#: X-RateLimit-Reset values above this are epoch timestamps, not deltas.
_EPOCH_S = 1_000_000_000.0
_EPOCH_MS = 1_000_000_000_000.0
#: A rate-limit window at least this long is a quota (daily, monthly...), not a burst limit.
QUOTA_WINDOW_S = 86_400.0

_NUMBER = re.compile(r"^\s*\+?(\d{1,15}(?:\.\d{1,9})?)\s*$")
_DURATION_PART = re.compile(r"(\d{1,12}(?:\.\d{1,9})?)(ms|us|µs|ns|h|m|s)")
_DURATION = re.compile(r"^(?:\d{1,12}(?:\.\d{1,9})?(?:ms|us|µs|ns|h|m|s)){1,6}$")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# "try again in 20s", "retry after 5 seconds", "please retry in 1.5 minutes" (linear: no nesting)
_BODY_TEXT = re.compile(
    r"(?:try again|retry)(?: after| in)? (\d{1,9}(?:\.\d{1,6})?) ?"
    r"(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)\b",
    re.IGNORECASE,
)
_BODY_KEYS_S = ("retry_after", "retryafter", "retry_after_seconds", "retry_after_s", "retry-after")
_BODY_KEYS_MS = ("retry_after_ms", "retryafterms", "retry-after-ms")


def bound(value: float | None, maximum: float) -> float | None:
    """``value`` if it is a finite number >= 0, capped at ``maximum``; else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(v) or v < 0:
        return None
    return min(v, maximum)


def _number(text: str) -> float | None:
    m = _NUMBER.match(text)
    return float(m.group(1)) if m else None


def parse_duration(text: str) -> float | None:
    """Seconds in ``"20"``, ``"1.5"``, ``"20ms"``, ``"6m0s"``, ``"1h2m3s"``; None for garbage."""
    text = text.strip()[:64]
    n = _number(text)
    if n is not None:
        return n
    if not _DURATION.match(text):
        return None
    return sum(float(v) * _UNIT_S[u] for v, u in _DURATION_PART.findall(text))


def _split(value: str | None) -> list[str]:
    if not value:
        return []
    return [p.strip() for p in value.split(",")[:8]]


def _reset_seconds(text: str, now: float) -> float | None:
    """One X-RateLimit-Reset value: delta seconds, epoch seconds/ms, or a duration."""
    n = _number(text)
    if n is None:
        return parse_duration(text)
    if n >= _EPOCH_MS:
        n = n / 1000.0 - now
    elif n >= _EPOCH_S:
        n = n - now
    return n if n >= 0 else None


def _policy_windows(value: str | None) -> list[float | None]:
    """Window lengths of ``X-RateLimit-Policy: 1;w=1, 2000;w=2592000``."""
    out: list[float | None] = []
    for part in _split(value):
        w = None
        for item in part.split(";")[1:4]:
            k, _, v = item.partition("=")
            if k.strip().lower() == "w":
                w = _number(v)
        out.append(w)
    return out


@dataclass(slots=True, frozen=True)
class ResetHints:
    """What the rate-limit headers say.

    ``rate_reset_s``: when the exhausted (or first) short window resets.
    ``quota_reset_s``: when an exhausted long window (>= 1 day) resets.
    ``quota_exhausted``: a window of at least a day has nothing left.
    """

    rate_reset_s: float | None = None
    quota_reset_s: float | None = None
    quota_exhausted: bool = False


_SINGLE_RESET_HEADERS = (
    "ratelimit-reset",
    "x-rate-limit-reset",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)


def reset_hints(headers: Mapping[str, str], now: float) -> ResetHints:
    """Parse the rate-limit header families (keys must be lower-case)."""
    resets = [_reset_seconds(v, now) for v in _split(headers.get("x-ratelimit-reset"))]
    remaining = [_number(v) for v in _split(headers.get("x-ratelimit-remaining"))]
    windows = _policy_windows(headers.get("x-ratelimit-policy"))
    rate: list[float] = []
    quota: list[float] = []
    exhausted_quota = False
    for i, rem in enumerate(remaining):
        if rem is None or rem > 0:
            continue
        reset = resets[i] if i < len(resets) else None
        window = windows[i] if i < len(windows) else None
        if window is not None and window >= QUOTA_WINDOW_S:
            exhausted_quota = True
            if reset is not None:
                quota.append(reset)
        elif reset is not None:
            rate.append(reset)
    rate_reset = max(rate) if rate else None
    if rate_reset is None and not exhausted_quota:
        known = [r for r in resets if r is not None]
        if known:
            rate_reset = min(known)
        else:
            singles = [
                _reset_seconds(headers[h], now) for h in _SINGLE_RESET_HEADERS if h in headers
            ]
            found = [s for s in singles if s is not None]
            rate_reset = max(found) if found else None
    return ResetHints(rate_reset, max(quota) if quota else None, exhausted_quota)


def header_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """``Retry-After`` or ``retry-after-ms`` (keys lower-case)."""
    ra = headers.get("retry-after")
    if ra is not None:
        v = parse_retry_after(ra, now)
        if v is not None:
            return v
    ms = headers.get("retry-after-ms")
    if ms is not None:
        n = _number(ms)
        if n is not None:
            return n / 1000.0
    return None


def _walk_dicts(obj: Any, max_depth: int = 5, max_nodes: int = 500) -> Iterator[Mapping[str, Any]]:
    """Dicts inside a parsed JSON value, breadth-first, bounded in depth and count."""
    queue: list[tuple[Any, int]] = [(obj, 0)]
    seen = 0
    while queue and seen < max_nodes:
        node, depth = queue.pop(0)
        seen += 1
        if isinstance(node, Mapping):
            yield node
            if depth < max_depth:
                queue.extend((v, depth + 1) for v in list(node.values())[:50])
        elif isinstance(node, list) and depth < max_depth:
            queue.extend((v, depth + 1) for v in node[:50])


def body_retry_after(body_json: Any, text: str) -> float | None:
    """A retry delay stated in the body: a ``retry_after``-like field, or a phrase."""
    if body_json is not None:
        for d in _walk_dicts(body_json):
            for k, v in list(d.items())[:100]:
                if not isinstance(k, str):
                    continue
                lk = k.lower()
                if lk in _BODY_KEYS_S or lk in _BODY_KEYS_MS:
                    n = v if isinstance(v, (int, float)) else None
                    if isinstance(v, str):
                        n = parse_duration(v)
                    if n is not None and not isinstance(n, bool):
                        return float(n) / (1000.0 if lk in _BODY_KEYS_MS else 1.0)
    m = _BODY_TEXT.search(text)
    if m:
        unit = m.group(2).lower()
        if unit.startswith(("ms", "milli")):
            factor = 1e-3
        elif unit.startswith("h"):
            factor = 3600.0
        elif unit.startswith("m"):
            factor = 60.0
        else:
            factor = 1.0
        return float(m.group(1)) * factor
    return None


def quota_fields_exhausted(body_json: Any) -> bool:
    """A ``quota_current >= quota_limit`` pair (Brave's monthly quota) anywhere shallow."""
    if body_json is None:
        return False
    for d in _walk_dicts(body_json, max_depth=4, max_nodes=200):
        cur, lim = d.get("quota_current"), d.get("quota_limit")
        if (
            isinstance(cur, (int, float))
            and isinstance(lim, (int, float))
            and not isinstance(cur, bool)
            and not isinstance(lim, bool)
            and lim > 0
            and cur >= lim
        ):
            return True
    return False
