"""Conversions between kernel results and MCP results, and remote schema validation.

Imports only ``mcp_types``, ``jsonschema`` and ``jsonschema_rs`` (not the FastMCP
server or client).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import jsonschema.exceptions  # type: ignore[import-untyped]
import jsonschema.validators  # type: ignore[import-untyped]
import jsonschema_rs
import mcp_types
import pydantic_core

from toolwire import ArgsError, ErrorKind, ToolResult

from ._keys import CALL_ID_META_KEY, ERROR_META_KEY, RESULT_META_KEY

__all__ = [
    "CALL_ID_META_KEY",
    "ERROR_META_KEY",
    "RESULT_META_KEY",
    "content_blocks",
    "make_validator",
    "quick_check",
    "remote_error",
    "remote_value",
    "render_text",
    "result_meta",
    "utf8_safe",
    "wire_blocks",
]

_KINDS = frozenset(k.value for k in ErrorKind)
_TEXT_LIMIT = 2000


# ----------------------------------------------------------- kernel -> MCP
def render_text(result: ToolResult) -> str:
    """The text rendering of a kernel result.

    Errors read ``<kind>: <message>``; a bare ``{"result": "<text>"}`` is the
    text itself; anything else is the JSON of ``content``. Lone surrogates,
    which UTF-8 cannot carry (a tool echoing a ``"\\ud800"`` escape), become
    U+FFFD.
    """
    text = _render(result)
    return text if text.isascii() else utf8_text(text)


def _render(result: ToolResult) -> str:
    if result.is_error:
        err = result.error
        if err is not None:
            return f"{err.kind}: {err.message}"
    content = result.content
    if len(content) == 1:
        only = content.get("result")
        if type(only) is str:
            return only
    try:
        return pydantic_core.to_json(content).decode()  # compact, UTF-8 as is
    except pydantic_core.PydanticSerializationError:  # a lone surrogate somewhere
        return pydantic_core.to_json(utf8_safe(content)).decode()


def utf8_text(text: str) -> str:
    """``text``, with each lone surrogate replaced by U+FFFD when it has any."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def utf8_safe(value: Any) -> Any:
    """A JSON value with each lone surrogate in its strings (keys too) replaced by U+FFFD.

    Python strings may hold them (``json`` reads ``"\\ud800"``); UTF-8, and so
    the JSON an MCP answer is sent as, cannot. For the rare answer that fails
    to encode, not the hot path.
    """
    t = type(value)
    if t is str:
        return utf8_text(value)
    if t is dict:
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [utf8_safe(v) for v in value]
    return value


_BLOCKS: Any = None  # TypeAdapter(list[ContentBlock]), built on first use


def _block_adapter() -> Any:
    global _BLOCKS
    if _BLOCKS is None:
        from pydantic import TypeAdapter

        _BLOCKS = TypeAdapter(list[mcp_types.ContentBlock])
    return _BLOCKS


def content_blocks(result: ToolResult) -> list[mcp_types.ContentBlock]:
    """The MCP content of a kernel result.

    A success whose content is exactly ``{"content": [<MCP content blocks>]}``
    — what an upstream's image, audio or resource result becomes (see
    ``remote_value``), or what a local tool returns to send one — goes out as
    those blocks, so an image reaches the client as an image. Anything else is
    one text block (``render_text``).
    """
    if not result.is_error:
        content = result.content
        blocks = content.get("content") if len(content) == 1 else None
        if isinstance(blocks, list) and blocks and all(isinstance(b, dict) for b in blocks):
            try:
                out: list[mcp_types.ContentBlock] = _block_adapter().validate_python(blocks)
            except ValueError:
                pass  # not MCP content blocks after all: the JSON goes out as text
            else:
                return out
    return [mcp_types.TextContent(type="text", text=render_text(result))]


def wire_blocks(blocks: list[mcp_types.ContentBlock]) -> list[dict[str, Any]]:
    """Content blocks as JSON, as the MCP SDK serializes them."""
    dumped: list[dict[str, Any]] = _block_adapter().dump_python(
        blocks, mode="json", by_alias=True, exclude_none=True
    )
    return dumped


def result_meta(result: ToolResult) -> dict[str, Any]:
    """The ``_meta`` of an MCP result made from a kernel result."""
    m = result.meta
    out: dict[str, Any] = {
        RESULT_META_KEY: {
            "call_id": m.call_id,
            "tool": m.tool,
            "served_by": m.served_by,
            "replayed": m.replayed,
            "attempts": len(m.attempts),
            "duration_ms": round(m.duration_ms, 3),
        }
    }
    approval = m.approval
    if approval is not None and approval.get("status") != "not_required":
        # A person (or a policy) decided this call: the client learns how, and that
        # arguments it did not send may have run (``edited``).
        out[RESULT_META_KEY]["approval"] = approval
    if result.error is not None:
        out[ERROR_META_KEY] = result.error.to_dict()
    return out


# ----------------------------------------------------------- MCP -> kernel
def _block_text(blocks: list[mcp_types.ContentBlock]) -> str:
    return "\n".join(b.text for b in blocks if isinstance(b, mcp_types.TextContent))


def _dump_block(block: mcp_types.ContentBlock) -> dict[str, Any]:
    return block.model_dump(mode="json", by_alias=True, exclude_none=True)


def remote_value(result: mcp_types.CallToolResult) -> dict[str, Any]:
    """The JSON object a successful remote result stands for.

    Structured content (an object) passes through; a non-object structured
    value becomes ``{"result": value}``; text-only content becomes
    ``{"result": "<text>"}``; other content blocks (images, resources) are kept
    as MCP content in ``{"content": [...]}``.
    """
    sc = result.structured_content
    if isinstance(sc, dict):
        return sc
    if sc is not None:
        return {"result": sc}
    blocks = list(result.content or [])
    if all(isinstance(b, mcp_types.TextContent) for b in blocks):
        return {"result": _block_text(blocks)}
    return {"content": [_dump_block(b) for b in blocks]}


_HEURISTICS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Unknown tool\b", re.I), ErrorKind.NOT_FOUND),
    (re.compile(r"\brate[- ]limit", re.I), ErrorKind.RATE_LIMIT),
    (re.compile(r"\btimed out\b|\btimeout\b", re.I), ErrorKind.TIMEOUT),
    (
        re.compile(r"\bvalidation errors? for\b|\binvalid arguments?\b", re.I),
        ErrorKind.INVALID_ARGS,
    ),
)


def remote_error(
    result: mcp_types.CallToolResult, *, server: str, remote_tool: str
) -> tuple[str, str, float | None, dict[str, Any]]:
    """(kind, message, retry_after_s, details) for a remote ``isError`` result.

    The kind is what the remote says when it is recognisable: a toolwire
    gateway's ``_meta["io.toolwire/error"]``, a structured
    ``{"error": {"kind": ...}}`` with a known kind, or FastMCP's standard
    messages (unknown tool, rate limited, timed out, validation error);
    otherwise ``tool_error``.
    """
    text = _block_text(list(result.content or []))
    kind: str = ErrorKind.TOOL_ERROR
    message = text or "the remote tool reported an error without a message"
    retry_after: float | None = None
    remote_info: Any = (result.meta or {}).get(ERROR_META_KEY)
    sc = result.structured_content
    remote_details: Mapping[str, Any] | None = None
    remote_kind: str | None = None
    if isinstance(remote_info, Mapping) and isinstance(remote_info.get("kind"), str):
        if remote_info["kind"] in _KINDS:
            kind = str(remote_info["kind"])
        else:  # a kind this gateway does not know: kept in details, not trusted
            remote_kind = str(remote_info["kind"])
        if isinstance(remote_info.get("message"), str):
            message = remote_info["message"]
        ra = remote_info.get("retry_after_s")
        if isinstance(ra, (int, float)) and not isinstance(ra, bool) and 0 <= ra < math.inf:
            retry_after = float(ra)
        if isinstance(remote_info.get("details"), Mapping):
            remote_details = remote_info["details"]
    elif (
        isinstance(sc, Mapping)
        and isinstance(sc.get("error"), Mapping)
        and sc["error"].get("kind") in _KINDS
    ):
        kind = str(sc["error"]["kind"])
        if isinstance(sc["error"].get("message"), str):
            message = sc["error"]["message"]
    else:
        for pattern, k in _HEURISTICS:
            if pattern.search(text):
                kind = k
                break
    details: dict[str, Any] = {
        "server": server,
        "remote_tool": remote_tool,
        "remote_text": text[:_TEXT_LIMIT],
    }
    if sc is not None:
        details["remote_structured_content"] = sc
    if remote_kind is not None:
        details["remote_kind"] = remote_kind
    if kind == ErrorKind.TOOL_ERROR and remote_info is None:
        # The remote tool ran and failed: the server had the call, which may have acted
        # (not to be repeated, whatever its text suggests to a classifier: "503 Service
        # Unavailable" from the tool's own backend is no outage of this server).
        details["in_flight"] = True
    if remote_details:
        # A toolwire upstream's details travel on (a chain of gateways keeps them); the
        # facts a caller acts on are lifted: the outcome is unknown, the HTTP status.
        details["remote_details"] = dict(remote_details)
        for lifted in ("in_flight", "status"):
            if lifted in remote_details:
                details.setdefault(lifted, remote_details[lifted])
    return kind, f"MCP server {server!r}, tool {remote_tool!r}: {message}", retry_after, details


# -------------------------------------------------------------- validation
def _field(path: Any) -> str:
    out = ""
    for p in path:
        out = f"{out}[{p}]" if isinstance(p, int) else (f"{out}.{p}" if out else str(p))
    return out


def _problems(err: jsonschema.exceptions.ValidationError) -> list[tuple[str, str]]:
    base = _field(err.absolute_path)
    inst = err.instance
    if err.validator == "required" and isinstance(inst, Mapping):
        missing = [k for k in err.validator_value if k not in inst]
        return [(f"{base}.{k}" if base else str(k), "field required") for k in missing]
    if err.validator == "additionalProperties" and isinstance(inst, Mapping):
        props = err.schema.get("properties", {}) if isinstance(err.schema, Mapping) else {}
        extra = [k for k in inst if k not in props]
        if extra:
            return [(f"{base}.{k}" if base else str(k), "unexpected argument") for k in extra]
    if err.validator == "type":
        return [(base, f"expected {err.validator_value}, got {type(inst).__name__} {inst!r:.60}")]
    return [(base, err.message[:300])]


#: Keywords whose meaning the two validators may apply differently (regular expression
#: dialects, float division): a schema using any of them is checked by ``jsonschema`` alone.
_NOT_QUICK = frozenset({"pattern", "patternProperties", "multipleOf"})
#: In draft 2019-09, ``jsonschema`` counts fewer properties as evaluated than the spec
#: (and jsonschema-rs) does.
_NOT_QUICK_2019 = _NOT_QUICK | {"unevaluatedProperties", "unevaluatedItems"}
#: Keywords whose value maps names to subschemas (the names are no keywords).
_NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
#: Keywords whose value is an instance, not a schema.
_INSTANCES = frozenset({"enum", "const", "default", "examples"})


def _uses(schema: Any, keys: frozenset[str]) -> bool:
    """Whether any of the keywords ``keys`` appears anywhere in ``schema``.

    Every mapping is searched, not only the subschemas of known keywords: a
    ``$ref`` may point anywhere in the document (``#/components/schemas/X``).
    Names of properties and definitions are not taken for keywords; a name
    elsewhere may be, which only costs the quick check.
    """
    if isinstance(schema, list):
        return any(_uses(v, keys) for v in schema)
    if not isinstance(schema, Mapping):
        return False
    for k, v in schema.items():
        if k in _INSTANCES:
            continue
        if k in _NAMED_SCHEMAS and isinstance(v, Mapping):
            if any(_uses(sub, keys) for sub in v.values()):
                return True
        elif k in keys or _uses(v, keys):
            return True
    return False


def _no_retrieval(uri: str) -> Any:
    raise LookupError(f"{uri} is not fetched")  # as jsonschema: no remote $ref is retrieved


#: The draft ``jsonschema`` picked -> the same draft in jsonschema-rs.
_RS_DRAFTS: dict[Any, Any] = {
    jsonschema.Draft4Validator: jsonschema_rs.Draft4Validator,
    jsonschema.Draft6Validator: jsonschema_rs.Draft6Validator,
    jsonschema.Draft7Validator: jsonschema_rs.Draft7Validator,
    jsonschema.Draft201909Validator: jsonschema_rs.Draft201909Validator,
    jsonschema.Draft202012Validator: jsonschema_rs.Draft202012Validator,
}


def _meta_id(uri: Any) -> str:
    return uri.rstrip("#") if isinstance(uri, str) else ""


def _plain(value: Any) -> bool:
    """JSON as ``jsonschema`` sees it: dicts with str keys, lists, str, int, bool, None
    and finite floats (jsonschema-rs takes ``inf`` for no type at all, and tuples for
    arrays)."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return True
    if t is float:
        return math.isfinite(value)
    if t is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if t is list:
        return all(_plain(v) for v in value)
    return False


def quick_check(schema: Mapping[str, Any], draft: Any = None) -> Any:
    """A fast acceptance test for ``schema`` (jsonschema-rs), or None where there is none.

    ``draft``: the ``jsonschema`` validator class that checks ``schema``
    (as ``make_validator`` picks it when None); jsonschema-rs is told the same
    draft, and a ``$schema`` that ``jsonschema`` does not know by that exact
    name gets no quick check (the two would guess differently).

    The returned ``ok(instance)`` is True only when jsonschema-rs finds the
    instance valid. Only a True is taken as a verdict: on False, the caller
    asks ``jsonschema``, whose answer (and error messages) stand. So the check
    never rejects what ``jsonschema`` accepts; it saves the 10-15 us that
    ``jsonschema`` spends on a valid instance of a small schema (callgrind:
    about a tenth of a gateway call). Formats are annotations here, as in
    ``jsonschema`` without a format checker; no remote ``$ref`` is fetched
    (such a schema gets no quick check); a schema using ``pattern``,
    ``patternProperties`` or ``multipleOf`` anywhere gets none either, nor a
    2019-09 schema using ``unevaluated*``. An instance that is not plain
    JSON (a tuple, ``inf``) is left to ``jsonschema``.
    """
    if draft is None:
        draft = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    rs_draft = _RS_DRAFTS.get(draft)
    if rs_draft is None:
        return None
    if "$schema" in schema and _meta_id(schema["$schema"]) != _meta_id(
        draft.META_SCHEMA.get("$id", draft.META_SCHEMA.get("id"))
    ):
        return None  # not the draft's own name: jsonschema fell back to its default
    keys = _NOT_QUICK_2019 if draft is jsonschema.Draft201909Validator else _NOT_QUICK
    try:
        if _uses(schema, keys):
            return None
    except RecursionError:  # nested too deep to search: jsonschema alone
        return None
    try:
        checker = rs_draft(dict(schema), validate_formats=False, retriever=_no_retrieval)
    except Exception:  # a construct jsonschema-rs does not take
        return None

    def ok(instance: Any) -> bool:
        try:
            return _plain(instance) and bool(checker.is_valid(instance))
        except Exception:  # let jsonschema judge
            return False

    return ok


def make_validator(schema: Mapping[str, Any]) -> Any:
    """A kernel ``validator`` for a remote tool: full JSON Schema via ``jsonschema``.

    Returns None when the schema itself is invalid (the kernel's subset checker
    is used instead and the remote side still validates). The validator raises
    ``ArgsError`` naming every bad field. Valid arguments are recognised by
    ``quick_check`` first where it applies.
    """
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        checker = cls(schema)
    except jsonschema.exceptions.SchemaError:
        return None
    quick = quick_check(schema, cls)

    def validate(args: Mapping[str, Any]) -> dict[str, Any]:
        data = dict(args)
        if quick is not None and quick(data):
            return data
        errors = sorted(checker.iter_errors(data), key=lambda e: _field(e.absolute_path))
        if errors:
            problems: list[tuple[str, str]] = []
            for e in errors:
                problems.extend(_problems(e))
            raise ArgsError(problems)
        return data

    return validate
