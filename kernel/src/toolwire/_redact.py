"""Keeping secrets out of errors: known secret values and credential-bearing fields.

The kernel knows the values the configuration resolved from ``$secretRef``
(and any a plugin adds with ``kernel.add_secret``). Every error it records —
message and details — is scrubbed before a plugin, a result, an event or a
store sees it: a known value becomes ``[secret:<NAME>]`` wherever it appears,
and the value of a field named like a credential (``Authorization``,
``Cookie``, ``X-Api-Key``, ``password``, ...) becomes ``[redacted]``. Only the
error path pays for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MIN_SECRET_LEN", "Redactor"]

#: Shorter values are not replaced inside text (too likely to match by accident).
MIN_SECRET_LEN = 6
#: How deep ``Redactor.data`` follows nested details.
MAX_DEPTH = 64

_CREDENTIAL_FIELD = re.compile(
    r"^(?:proxy-)?authorization$|^(?:set-)?cookie$|^x-(?:api|auth)-(?:key|token)$"
    r"|^api[-_]?key$|^(?:access|refresh|id|bearer|auth)[-_]?token$|^client[-_]?secret$"
    r"|^(?:secret|password|passwd|token)$",
    re.IGNORECASE,
)


class Redactor:
    """Replaces known secret values and credential fields in messages and details."""

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}  # value -> name
        self._pattern: re.Pattern[str] | None = None

    def add(self, value: str, name: str) -> None:
        """Remember a secret value under ``name`` (shown as ``[secret:<name>]``)."""
        if not isinstance(value, str) or len(value) < MIN_SECRET_LEN:
            return
        self._secrets[value] = name
        # Longest first: a secret that contains another is replaced whole.
        values = sorted(self._secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in values))

    def __len__(self) -> int:
        return len(self._secrets)

    def text(self, value: str) -> str:
        """``value`` with every known secret replaced."""
        pattern = self._pattern
        if pattern is None:
            return value
        return pattern.sub(lambda m: f"[secret:{self._secrets[m.group(0)]}]", value)

    def data(self, value: Any, _depth: int = 0) -> Any:
        """A copy of ``value`` (dicts, lists, strings) with secrets and credential fields hidden.

        Nesting deeper than ``MAX_DEPTH`` is replaced by a marker (a hostile body
        must not exhaust the stack, nor smuggle a secret below the limit).
        """
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping | list | tuple) and _depth >= MAX_DEPTH:
            return f"[nested deeper than {MAX_DEPTH} levels: dropped]"
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for k, v in value.items():
                if isinstance(k, str) and _CREDENTIAL_FIELD.match(k) and v:
                    out[k] = "[redacted]"
                else:
                    out[k] = self.data(v, _depth + 1)
            return out
        if isinstance(value, list | tuple):
            return type(value)(self.data(v, _depth + 1) for v in value)
        return value
