"""Keys appear only by alias: replace every known secret in text and JSON values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["MIN_SECRET_LEN", "Redactor"]

#: Shorter secrets are not redacted (they would garble ordinary text); a key
#: this short is rejected with a warning when a pool is built.
MIN_SECRET_LEN = 6
_MAX_DEPTH = 32


class Redactor:
    """Replaces known secrets (and their URL-encoded forms) by ``[key:<alias>]``."""

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}  # variant -> alias
        self._rx: re.Pattern[str] | None = None

    def update(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Add (alias, secret) pairs."""
        for alias, secret in pairs:
            if len(secret) < MIN_SECRET_LEN:
                continue
            for variant in {secret, quote(secret, safe=""), quote_plus(secret)}:
                self._secrets[variant] = alias
        if self._secrets:
            alts = sorted(self._secrets, key=len, reverse=True)
            self._rx = re.compile("|".join(re.escape(s) for s in alts))

    def __bool__(self) -> bool:
        return self._rx is not None

    def text(self, s: str) -> str:
        """``s`` with every known secret replaced."""
        rx = self._rx
        if rx is None or not s:
            return s
        return rx.sub(lambda m: f"[key:{self._secrets[m.group(0)]}]", s)

    def contains(self, s: str) -> bool:
        """Whether ``s`` holds a known secret."""
        return self._rx is not None and bool(s) and self._rx.search(s) is not None

    def value(self, v: Any, depth: int = 0) -> Any:
        """A copy of a JSON-like value with secrets replaced in every string (keys too)."""
        if self._rx is None:
            return v
        if isinstance(v, str):
            return self.text(v)
        if depth > _MAX_DEPTH:
            return "..."
        if isinstance(v, Mapping):
            return {
                (self.text(k) if isinstance(k, str) else k): self.value(x, depth + 1)
                for k, x in v.items()
            }
        if isinstance(v, (list, tuple)):
            return [self.value(x, depth + 1) for x in v]
        if isinstance(v, (bytes, bytearray)):
            return self.text(bytes(v).decode("utf-8", "replace"))
        return v
