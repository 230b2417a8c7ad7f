"""Argument validation: pydantic for ``@tool`` tools, a JSON-Schema subset otherwise.

Tools built from Python functions carry a pydantic validator. Tools that only
have a JSON Schema (remote MCP tools, A2A agents) are checked here against the
common subset: ``type``, ``required``, ``properties``, ``additionalProperties:
false``, ``enum``, ``const``, ``items``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``anyOf``/``oneOf`` (any branch) and local
``$ref`` into ``$defs``. Keywords outside the subset are not enforced (the
remote side still validates); the errors name the field and the expected type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

__all__ = ["ArgsError", "describe_validation_error", "validate_json_schema"]


class ArgsError(ValueError):
    """Arguments do not match a tool's schema. ``problems`` lists (field, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, t: str) -> bool:
    if t in ("integer", "number") and isinstance(value, bool):
        return False
    if t == "integer" and isinstance(value, float):
        return value.is_integer()
    py = _TYPES.get(t)
    return True if py is None else isinstance(value, py)


def _check(
    value: Any, schema: Any, path: str, root: Mapping[str, Any], out: list[tuple[str, str]]
) -> None:
    if not isinstance(schema, Mapping):
        return
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, Mapping) else {}
        _check(value, target, path, root, out)
        return
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            for b in branches:
                trial: list[tuple[str, str]] = []
                _check(value, b, path, root, trial)
                if not trial:
                    break
            else:
                out.append((path, f"does not match any allowed shape ({key})"))
                return
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_type_ok(value, x) for x in types):
            expected = " or ".join(str(x) for x in types)
            out.append((path, f"expected {expected}, got {type(value).__name__} {value!r:.60}"))
            return
    if "enum" in schema and value not in schema["enum"]:
        out.append((path, f"must be one of {schema['enum']!r}, got {value!r:.60}"))
    if "const" in schema and value != schema["const"]:
        out.append((path, f"must be {schema['const']!r}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append((path, f"must be >= {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            out.append((path, f"must be <= {schema['maximum']}"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append((path, f"must have at least {schema['minLength']} characters"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append((path, f"must have at most {schema['maxLength']} characters"))
    if isinstance(value, (list, tuple)) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]" if path else f"[{i}]", root, out)
    if isinstance(value, dict):
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        for req in schema.get("required", ()) or ():
            if req not in value:
                out.append((_join(path, req), "field required"))
        for k, v in value.items():
            if k in props:
                _check(v, props[k], _join(path, k), root, out)
            elif schema.get("additionalProperties") is False:
                out.append((_join(path, k), "unexpected argument"))
            elif isinstance(schema.get("additionalProperties"), Mapping):
                _check(v, schema["additionalProperties"], _join(path, k), root, out)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate_json_schema(args: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``args`` against ``schema`` (the subset above); returns a dict copy."""
    problems: list[tuple[str, str]] = []
    _check(dict(args), schema, "", schema, problems)
    if problems:
        raise ArgsError(problems)
    return dict(args)


def describe_validation_error(
    exc: pydantic.ValidationError | ArgsError,
) -> tuple[str, list[dict[str, Any]]]:
    """(one-line message, structured problems) for an args validation failure."""
    problems: list[dict[str, Any]] = []
    if isinstance(exc, ArgsError):
        for f, m in exc.problems:
            problems.append({"field": f, "message": m})
    else:
        for err in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in err.get("loc", ()))
            typ = err.get("type", "")
            if typ == "missing":
                msg = "field required"
            elif typ == "extra_forbidden":
                msg = "unexpected argument"
            else:
                msg = f"{err.get('msg', 'invalid')} (got {err.get('input')!r:.60})"
            problems.append({"field": loc, "message": msg, "type": typ})
    text = "; ".join(
        f"field {p['field']!r}: {p['message']}" if p["field"] else p["message"] for p in problems
    )
    return text, problems
