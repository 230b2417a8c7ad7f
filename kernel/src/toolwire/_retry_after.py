"""``Retry-After`` (RFC 9110 § 10.2.3), read one way by every HTTP tool source."""

from __future__ import annotations

import datetime
import re
import time
from email.utils import parsedate_to_datetime

__all__ = ["parse_retry_after"]

_SECONDS = re.compile(r"^\s*\+?(\d{1,15}(?:\.\d{1,9})?)\s*$")
#: RFC 9110's obsolete asctime form of an HTTP-date, the one without a zone (it is UTC).
_ASCTIME = re.compile(r"^[A-Za-z]{3} [A-Za-z]{3} [ \d]\d \d\d:\d\d:\d\d \d{4}$")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta seconds or an HTTP-date
    (any of RFC 9110's three formats).

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
    if when is None:
        return None
    if when.tzinfo is None:
        # RFC 9110 (5.6.7): every recipient must read asctime dates, which are UTC; any
        # other date without a zone is no HTTP-date
        if not _ASCTIME.match(text):
            return None
        when = when.replace(tzinfo=datetime.UTC)
    delta = when.timestamp() - (time.time() if now is None else now)
    return delta if delta >= 0 else None
