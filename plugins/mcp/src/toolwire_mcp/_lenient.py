"""Reading upstream JSON that strict parsers refuse only for lone surrogates.

Python's ``json.dumps`` writes text cut mid-character as ``"\\ud800"``: valid
JSON text, but an unpaired UTF-16 surrogate, which ``pydantic_core`` (and so
the MCP SDK) refuses. The SDK's stdio reader then drops the message — the
answer to a call, which then waits for its timeout, for ever without one —
and the HTTP paths failed the call. Such messages are read with Python's
``json`` instead; the surrogates reach the kernel as they are, and
``toolwire serve`` replaces them on the way out.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pydantic_core
from pydantic import ValidationError

log = logging.getLogger("toolwire.mcp")

__all__ = ["from_json", "install_stdio_reader"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def from_json(data: bytes | str) -> Any:
    """``pydantic_core.from_json``, falling back to ``json.loads`` (no NaN or Infinity)."""
    try:
        return pydantic_core.from_json(data)
    except ValueError:
        try:
            return json.loads(data, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError):
            pass
        raise  # the strict parser's error, which names the problem


_installed = False


def _unreadable_answer(obj: Any, exc: ValidationError, types: Any) -> Any:
    """A JSON-RPC error answering request ``obj["id"]``, for a line that names a request
    it answers but is no valid response (a null or missing result, a malformed error).

    The SDK's stdio reader drops such a line (it logs it; nothing ties the failure to
    the request), so the call waited for ever without a ``timeout``. The error is
    worded as the SDK's HTTP transport words an unreadable answer ("Failed to parse
    JSON response"), so both transports fail the call alike. None: not such a line.
    """
    if not isinstance(obj, dict) or "method" in obj:
        return None
    rid = obj.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        return None
    shape = types.JSONRPCError if "error" in obj else types.JSONRPCResponse
    try:  # the problems of the response it means to be (not of the union's first member)
        shape.model_validate(obj, by_name=False)
    except ValidationError as own:
        exc = own
    errors = exc.errors(include_url=False)
    if errors:
        where = ".".join(str(p) for p in errors[0]["loc"])
        problem = f"{where}: {errors[0]['msg']}" if where else errors[0]["msg"]
    else:
        problem = str(exc)
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=rid,
        error=types.ErrorData(
            code=types.PARSE_ERROR,
            message=f"Failed to parse JSON response: not a valid JSON-RPC response ({problem})",
        ),
    )


def install_stdio_reader() -> None:
    """Make the MCP SDK's stdio client read such lines too (idempotent).

    Replaces ``mcp.client.stdio._parse_line`` with a version that, when the
    strict parse fails, tries ``json.loads``; a line that reads as JSON, names
    the request it answers and is no valid response answers that request with
    a parse error (``_unreadable_answer``: before, the call waited for ever); any
    other line neither reads keeps the SDK's own handling (logged, surfaced to
    the session). Does nothing when the SDK is laid out otherwise.
    """
    global _installed
    if _installed:
        return
    try:
        import mcp_types as types
        from mcp.client import stdio
        from mcp.shared.message import SessionMessage
    except ImportError:  # pragma: no cover - another SDK layout
        return
    original = getattr(stdio, "_parse_line", None)
    adapter = getattr(types, "jsonrpc_message_adapter", None)
    if original is None or adapter is None:
        log.debug("the MCP SDK's stdio reader is laid out anew: lone surrogates stay unread")
        return

    def parse_line(line: str) -> Any:
        try:
            return SessionMessage(adapter.validate_json(line, by_name=False))
        except ValueError:
            pass
        obj: Any = None
        try:
            obj = json.loads(line, parse_constant=_no_constant)
            return SessionMessage(adapter.validate_python(obj, by_name=False))
        except ValidationError as exc:
            answer = _unreadable_answer(obj, exc, types)
            if answer is not None:
                log.warning(
                    "MCP server answered request %r with no valid JSON-RPC response: %s",
                    obj["id"],
                    answer.error.message,
                )
                return SessionMessage(answer)
            return original(line)
        except (ValueError, RecursionError):
            return original(line)  # logs and surfaces the error, as the SDK does

    stdio._parse_line = parse_line
    _installed = True
