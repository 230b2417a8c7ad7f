"""Canonical, injective byte encoding of call arguments, and the keys derived from it.

Every value is written as a one-byte type tag followed by a self-delimiting
payload (a 4-byte big-endian length or count first wherever the size varies),
so the encoding of a sequence of values is never ambiguous: ``("ab", "c")``
and ``("a", "bc")`` encode differently, and so do ``1``, ``1.0``, ``True`` and
``"1"``. Dict entries and set members are sorted by their *encoded* bytes, so
the result depends neither on insertion order nor on ``PYTHONHASHSEED``.

Rule: two values encode the same exactly when they have the same type
(JSON arrays: list and tuple alike) and compare equal. So ``-0.0`` and ``0.0``,
``Decimal("1.0")`` and ``Decimal("1.00")``, and two tz-aware datetimes naming
the same instant in different zones share an encoding; values that only look
alike (``1`` / ``1.0`` / ``True``) do not.

Accepted: None, bool, int, float (finite), str, bytes/bytearray/memoryview,
list/tuple, dict, set/frozenset, UUID, datetime (aware and naive, kept apart),
date, time, timedelta, Decimal (finite), Enum members, pydantic models,
dataclass instances and ``PurePath``. Anything else (or NaN/Infinity, or
nesting deeper than :data:`MAX_DEPTH`) raises :class:`UnencodableArgumentError`
naming where it is. Classes (enums, models, dataclasses) are tagged by their
``__qualname__`` (not their module: a class defined in a script is
``__main__.X`` in one process and ``__mp_main__.X`` in a spawned one).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import math
import struct
import uuid
from decimal import Decimal
from pathlib import PurePath
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "UnencodableArgumentError",
    "canonical_bytes",
    "record_hash",
    "request_hash",
]

#: Deepest nesting accepted (a cycle ends here too).
MAX_DEPTH = 100

#: Versions the scheme: a future change of encoding never collides with old keys.
_MAGIC = b"toolwire-idempotency/1\x00"

_u32 = struct.Struct(">I").pack
_f64 = struct.Struct(">d").pack
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class UnencodableArgumentError(TypeError):
    """An argument has no deterministic encoding (its type, NaN/Infinity, depth).

    ``path`` says where, e.g. ``args.items[2].when``; ``type_name`` is the
    offending value's type.
    """

    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(reason)
        self.type_name = type_name
        self.reason = reason
        self._parts: list[str] = []

    @property
    def path(self) -> str:
        return "args" + "".join(reversed(self._parts))

    def __str__(self) -> str:
        return f"{self.path} ({self.type_name}): {self.reason}"


def _sized(tag: bytes, payload: bytes) -> bytes:
    if len(payload) > 0xFFFFFFFF:
        raise UnencodableArgumentError("bytes", "longer than 4 GiB")
    return tag + _u32(len(payload)) + payload


def _int(v: int) -> bytes:
    return _sized(b"i", v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True))


def _float(v: float) -> bytes:
    if not math.isfinite(v):
        raise UnencodableArgumentError("float", f"{v!r} is not a finite number")
    return b"f" + _f64(v + 0.0)  # + 0.0 turns -0.0 into 0.0


def _str(v: str) -> bytes:
    return _sized(b"s", v.encode("utf-8", "surrogatepass"))


def _decimal(v: Decimal) -> bytes:
    if not v.is_finite():
        raise UnencodableArgumentError("Decimal", f"{v!r} is not a finite number")
    sign, digits, exp = v.as_tuple()
    assert isinstance(exp, int)
    # strip trailing zeros: equal values, one encoding (Decimal("1.0") == Decimal("1.00"))
    n = len(digits)
    while n > 1 and digits[n - 1] == 0:
        n -= 1
        exp += 1
    text = "".join(map(str, digits[:n]))
    if text == "0":
        sign, exp = 0, 0
    return _sized(b"x", f"{'-' if sign else ''}{text}e{exp}".encode())


def _datetime(v: dt.datetime) -> bytes:
    offset = v.utcoffset()
    if offset is None:  # naive: its wall-clock fields, never the host's time zone
        return _sized(b"W", v.isoformat().encode())
    delta = v - _EPOCH  # the instant: same moment in any zone, same encoding
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return b"D" + _int(micros)


def _time(v: dt.time) -> bytes:
    offset = v.utcoffset()
    text = v.replace(tzinfo=None).isoformat()
    if offset is not None:
        text += f"@{offset.days * 86_400 + offset.seconds}.{offset.microseconds:06d}"
    elif v.tzinfo is not None:  # a zone whose offset depends on the date (ZoneInfo)
        text += f"@{v.tzinfo}"
    return _sized(b"h", text.encode())


def _class_name(obj: object) -> bytes:
    return _str(type(obj).__qualname__)


def _enc(v: Any, depth: int) -> bytes:
    t = type(v)
    if t is str:
        b: bytes = v.encode("utf-8", "surrogatepass")
        return b"s" + _u32(len(b)) + b
    if t is int:
        return _int(v)
    if t is dict:
        return _mapping(v, depth)
    if t is list or t is tuple:
        return _sequence(v, depth)
    if v is None:
        return b"N"
    if t is bool:
        return b"T" if v else b"F"
    if t is float:
        return _float(v)
    return _other(v, depth)


def _mapping(v: Any, depth: int) -> bytes:
    if depth >= MAX_DEPTH:
        raise UnencodableArgumentError(type(v).__name__, f"nested deeper than {MAX_DEPTH} levels")
    items = []
    for k, val in v.items():
        try:
            if type(k) is str:  # the common case, inlined
                kb = k.encode("utf-8", "surrogatepass")
                items.append((b"s" + _u32(len(kb)) + kb, _enc(val, depth + 1)))
            else:
                items.append((_enc(k, depth + 1), _enc(val, depth + 1)))
        except UnencodableArgumentError as exc:
            exc._parts.append(f"[{k!r}]")
            raise
    items.sort()
    return b"d" + _u32(len(items)) + b"".join([k + val for k, val in items])


def _sequence(v: Any, depth: int) -> bytes:
    if depth >= MAX_DEPTH:
        raise UnencodableArgumentError(type(v).__name__, f"nested deeper than {MAX_DEPTH} levels")
    parts = []
    for i, item in enumerate(v):
        try:
            parts.append(_enc(item, depth + 1))
        except UnencodableArgumentError as exc:
            exc._parts.append(f"[{i}]")
            raise
    return b"l" + _u32(len(parts)) + b"".join(parts)


def _other(v: Any, depth: int) -> bytes:
    # order matters: bool/IntEnum/StrEnum are int/str subclasses
    if isinstance(v, enum.Enum):
        return b"e" + _class_name(v) + _nested(v.value, depth, ".value")
    if isinstance(v, bool):
        return b"T" if v else b"F"
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):
        return _sized(b"s", str.encode(v, "utf-8", "surrogatepass"))
    if isinstance(v, dict):
        return _mapping(v, depth)
    if isinstance(v, (list, tuple)):
        return _sequence(v, depth)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _sized(b"b", bytes(v))
    if isinstance(v, (set, frozenset)):
        if depth >= MAX_DEPTH:
            raise UnencodableArgumentError(type(v).__name__, "nested too deep")
        members = sorted(_nested(m, depth, "{member}") for m in v)
        return b"S" + _u32(len(members)) + b"".join(members)
    if isinstance(v, uuid.UUID):
        return b"u" + v.bytes
    if isinstance(v, Decimal):
        return _decimal(v)
    if isinstance(v, dt.datetime):
        return _datetime(v)
    if isinstance(v, dt.date):
        return _sized(b"a", v.isoformat().encode())
    if isinstance(v, dt.time):
        return _time(v)
    if isinstance(v, dt.timedelta):
        return b"r" + _int((v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds)
    if isinstance(v, PurePath):
        return _sized(b"p", v.as_posix().encode("utf-8", "surrogateescape"))
    fields = _model_fields(v)
    if fields is not None:
        tag, values = fields
        return tag + _class_name(v) + _nested(values, depth, "")
    raise UnencodableArgumentError(
        type(v).__qualname__,
        "no deterministic encoding for this type; use JSON-compatible values, UUID, "
        "datetime, Decimal, bytes, set, Enum, a pydantic model or a dataclass",
    )


def _nested(v: Any, depth: int, where: str) -> bytes:
    if depth >= MAX_DEPTH:
        raise UnencodableArgumentError(type(v).__name__, f"nested deeper than {MAX_DEPTH} levels")
    try:
        return _enc(v, depth + 1)
    except UnencodableArgumentError as exc:
        if where:
            exc._parts.append(where)
        raise


def _model_fields(v: Any) -> tuple[bytes, dict[str, Any]] | None:
    """(tag, field values) of a pydantic model or a dataclass instance, else None."""
    cls = type(v)
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict) and hasattr(v, "model_dump"):
        values = {name: getattr(v, name) for name in model_fields}
        extra = getattr(v, "model_extra", None)
        if extra:
            values.update(extra)
        return b"m", values
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return b"c", {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
    return None


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of ``value`` (see the module docstring).

    Raises :class:`UnencodableArgumentError` for a value without one.
    """
    return _enc(value, 0)


def _head(tenant: str | None, tool: str, call_id: str) -> bytes:
    if type(tool) is str and type(call_id) is str and (tenant is None or type(tenant) is str):
        t = b"N" if tenant is None else _str(tenant)
        return b"".join((_MAGIC, t, _str(tool), _str(call_id)))
    return _MAGIC + _enc(tenant, 0) + _enc(tool, 0) + _enc(call_id, 0)


def record_hash(tenant: str | None, tool: str, call_id: str) -> str:
    """SHA-256 (hex) of (tenant, tool, call_id): where a call's record lives."""
    return hashlib.sha256(b"K" + _head(tenant, tool, call_id)).hexdigest()


def request_hash(tenant: str | None, tool: str, call_id: str, args: Any) -> str:
    """SHA-256 (hex) of (tenant, tool, call_id, canonical args): the request's identity."""
    return hashlib.sha256(b"R" + _head(tenant, tool, call_id) + _enc(args, 0)).hexdigest()


def hashes(tenant: str | None, tool: str, call_id: str, args: Any) -> tuple[str, str]:
    """``(record_hash, request_hash)`` computed together (the head is encoded once)."""
    head = _head(tenant, tool, call_id)
    return (
        hashlib.sha256(b"K" + head).hexdigest(),
        hashlib.sha256(b"R" + head + _enc(args, 0)).hexdigest(),
    )
