"""``Retry-After`` (RFC 9110 § 10.2.3), read one way by every HTTP tool source."""

from __future__ import annotations

import re
import time
from email.utils import parsedate_to_datetime

__all__ = ["parse_retry_after"]

_SECONDS = re.compile(r"^\s*\+?(\d{1,15}(?:\.\d{1,9})?)\s*$")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta seconds or an HTTP-date.

    ``now``: the epoch seconds a date is measured from (default: the wall
    clock). None for a missing, negative, unparseable or past value — and for
    ``nan`` / ``inf``, which ``float()`` would have taken — so the caller's own
    backoff applies. Use it as a ``ToolError``'s ``retry_after_s``.
    """
    if value is None:
        return None
    text = value.strip()[:128]
    m = _SECONDS.match(text)
    if m:
        return float(m.group(1))
    if not text or text[0] in "+-":
        return None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    delta = when.timestamp() - (time.time() if now is None else now)
    return delta if delta >= 0 else None
