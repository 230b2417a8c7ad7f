"""Example tools bundled with toolwire: what ``toolwire serve`` offers with no config.

They are small, dependency-free and safe to expose: arithmetic, text and time
helpers, plus a stateful counter ``ToolSet`` that shows serial execution.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import zoneinfo
from typing import Literal

from pydantic import BaseModel

from ._tool import ToolSet, tool

__all__ = ["Counter", "add", "echo", "now", "text_stats", "word_hash"]


@tool(read_only=True, idempotent=True, tags=["math"])
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool(read_only=True, idempotent=True, tags=["text", "debug"])
async def echo(message: str, upper: bool = False) -> dict[str, str]:
    """Return the message unchanged (or upper-cased): a connectivity check.

    Args:
        message: Text to send back.
        upper: Upper-case the text first.
    """
    return {"message": message.upper() if upper else message}


@tool(read_only=True, tags=["time"])
def now(timezone: str = "UTC") -> str:
    """Current date and time in ISO 8601 for an IANA time zone.

    Args:
        timezone: IANA zone name such as "Europe/Paris"; default UTC.
    """
    try:
        tz = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown time zone {timezone!r}; use an IANA name like 'Europe/Paris'"
        ) from exc
    return _dt.datetime.now(tz).isoformat(timespec="seconds")


class TextStats(BaseModel):
    """Counts for a piece of text."""

    characters: int
    words: int
    lines: int


@tool(read_only=True, idempotent=True, tags=["text"])
def text_stats(text: str) -> TextStats:
    """Count the characters, words and lines of a text.

    Args:
        text: The text to measure.
    """
    return TextStats(
        characters=len(text), words=len(text.split()), lines=len(text.splitlines()) or 0
    )


@tool(read_only=True, idempotent=True, tags=["text"])
def word_hash(text: str, algorithm: Literal["sha256", "sha1", "md5"] = "sha256") -> str:
    """Hex digest of a text's UTF-8 bytes.

    Args:
        text: The text to hash.
        algorithm: Hash function to use.
    """
    return hashlib.new(algorithm, text.encode()).hexdigest()


class Counter(ToolSet):
    """A stateful counter: its calls run one at a time (``serial = True``)."""

    serial = True
    namespace = "counter"

    def __init__(self) -> None:
        self.value = 0

    @tool(tags=["state"])
    def increment(self, by: int = 1) -> int:
        """Add to the counter and return the new value.

        Args:
            by: How much to add.
        """
        self.value += by
        return self.value

    @tool(read_only=True, tags=["state"])
    def get(self) -> int:
        """Current value of the counter."""
        return self.value


counter = Counter()
"""The module-level instance ``toolwire.examples`` contributes (``counter_*`` tools)."""
