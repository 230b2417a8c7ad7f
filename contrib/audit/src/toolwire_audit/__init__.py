"""toolwire-audit: an example third-party plugin writing one JSON line per tool call.

It shows the whole plugin contract: an entry point in group ``toolwire``, a
pydantic ``Config`` validated from ``[plugins.audit]``, an ``order``, hooks
(sync and async), startup/shutdown, and per-call state kept in ``ctx.state``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolwire import CallContext, Kernel, PluginError, ToolCall, ToolResult, hookimpl

__all__ = ["AuditPlugin"]
__version__ = "0.1.0"

log = logging.getLogger("toolwire.audit")

#: Arguments nested deeper than this are not recorded (the line must always be written).
_MAX_DEPTH = 64


def _owner_only(path: str, flags: int) -> int:
    """``open``'s opener: a file it creates is readable by its owner only (0600).

    The lines hold who called what, and arguments with ``include_args``; on a
    shared host the umask's usual 0644 let every local user read them. A file
    that exists keeps its mode (a log rotator's ``create 0640``, say).
    """
    return os.open(path, flags, 0o600)


def _open_log(path: Path) -> IO[str]:
    # backslashreplace: a lone surrogate (valid JSON "\ud800", which json.loads turns
    # into a str UTF-8 cannot encode) is written as that same JSON escape; strict, the
    # whole line was refused and the call left no trace.
    return open(path, "a", encoding="utf-8", errors="backslashreplace", opener=_owner_only)


class AuditConfig(BaseModel):
    """``[plugins.audit]``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field("-", description="file to append JSON lines to; '-' means stderr")
    include_args: bool = Field(
        False, description="record call arguments (may contain personal data)"
    )
    include_content: bool = Field(
        False, description="record result content (redacted like the arguments)"
    )
    only_errors: bool = Field(False, description="record only calls that ended in an error")
    redact_keys: list[str] = Field(
        default_factory=lambda: ["password", "token", "api_key", "secret", "authorization"],
        description="argument keys whose values are replaced by '***'",
    )
    level: Literal["call", "attempt"] = Field(
        "call", description="one line per call, or per attempt too"
    )


class AuditPlugin:
    """One JSON line per call: time, tool, call id, outcome, error kind, duration, attempts."""

    name = "audit"
    order = 50  # outermost: sees every call, including replays and denials
    Config = AuditConfig

    def __init__(self, config: AuditConfig | None = None) -> None:
        self.config = config or AuditConfig()
        self._stream: IO[str] | None = None
        self._path: Path | None = None
        self._lock = threading.Lock()
        self._kernel: Kernel | None = None  # for its known secret values (kernel.redactor)

    # -- lifecycle
    @hookimpl
    def startup(self, kernel: Kernel) -> None:
        self._kernel = kernel
        if self.config.path == "-":
            self._stream = sys.stderr
        else:
            p = Path(self.config.path).expanduser()
            cfg_file = kernel.config.path if kernel.config is not None else None
            if not p.is_absolute() and cfg_file:
                p = Path(cfg_file).parent / p  # like every path in toolwire.toml
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                stream = _open_log(p)
            except OSError as exc:
                # "File exists" (a file where a folder of the path should be) or "Is a
                # directory" alone did not say which setting was wrong, nor what to do.
                raise PluginError(
                    self.name,
                    f"plugins.audit.path = {self.config.path!r}: cannot open {str(p)!r} for "
                    f"appending ({type(exc).__name__}: {exc}); set it to a file "
                    "in a folder this process can create or write to, or '-' for stderr",
                ) from exc
            self._path = p
            self._stream = stream

    @hookimpl
    def shutdown(self) -> None:
        # Under the lock: a line being written (on another thread) ends before the close,
        # and one written after it sees no stream and is appended on its own.
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is not None and stream is not sys.stderr:
                stream.close()

    # -- hooks
    @hookimpl
    def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        ctx.state["audit"] = self._call_fields(call)

    @hookimpl
    def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
        if self.config.only_errors and not result.is_error:
            return
        line: dict[str, Any] = {
            "ts": result.meta.started_at,
            "tool": call.name,
            "call_id": call.call_id,
            "session_id": call.session_id,
            "tenant": call.tenant,
            "ok": not result.is_error,
            "error_kind": result.error.kind if result.error else None,
            "duration_ms": round(result.meta.duration_ms, 3),
            "attempts": len(result.meta.attempts),
            "replayed": result.meta.replayed,
            "served_by": result.meta.served_by,
        }
        fields = ctx.state.get("audit")
        if fields is None:
            # The call ended before before_call ran (not_found, invalid_args, or a plugin
            # earlier in the order refused it): its arguments are the ones the caller sent.
            fields = self._call_fields(call)
        line.update(fields)
        if self.config.level == "attempt":
            line["attempt_log"] = [a.to_dict() for a in result.meta.attempts]
        if self.config.include_content:
            # Redacted like the arguments: a tool echoing a token or returning a
            # credential field must not put it in the log.
            line["content"] = self._redact(result.content)
        self._write(line)

    def _call_fields(self, call: ToolCall) -> dict[str, Any]:
        """What the line records of the call's input: its arguments, redacted, if asked."""
        return {"args": self._redact(call.args)} if self.config.include_args else {}

    def _redact(self, data: dict[str, Any]) -> dict[str, Any]:
        """Arguments or result content with ``redact_keys``, the fields the kernel treats
        as credentials (``Authorization``, ``Cookie``, ``X-Api-Key``, ``access_token``,
        ``client_secret``, ...) and known secret values hidden."""
        if self._kernel is not None:
            # The kernel's own rule, the one that keeps credentials out of its errors (a
            # list of exact names alone let an ``access_token`` or ``X-Api-Key`` through),
            # then ``redact_keys`` over it: those read ``***`` as before.
            data = self._kernel.redactor.data(data)
        keys = frozenset(k.lower() for k in self.config.redact_keys)
        out: dict[str, Any] = self._redact_value(data, keys, 0)
        return out

    def _redact_value(self, value: Any, keys: frozenset[str], depth: int) -> Any:
        """``value`` with ``redact_keys`` hidden at any depth (``_redact`` does the rest)."""
        if isinstance(value, dict | list | tuple) and depth >= _MAX_DEPTH:
            return f"[nested deeper than {_MAX_DEPTH} levels: not recorded]"
        if isinstance(value, dict):
            return {
                k: (
                    "***"
                    if isinstance(k, str) and k.lower() in keys
                    else self._redact_value(v, keys, depth + 1)
                )
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self._redact_value(v, keys, depth + 1) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            # A bare NaN / Infinity is not JSON (JSON.parse refuses the line, jq reads
            # null): written as a string, like the kernel does for a result's content.
            return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
        return value

    def _write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, ensure_ascii=False, default=str)
        with self._lock:  # the stream is checked and written under it: shutdown takes it too
            if self._stream is None:
                self._write_after_close(text, line)
                return
            if self._path is not None:
                self._reopen_if_rotated(self._path)
            self._stream.write(text + "\n")
            self._stream.flush()

    def _write_after_close(self, text: str, line: dict[str, Any]) -> None:
        """A call that ended after its kernel closed (shutdown hooks ran while it was in
        flight) is still recorded: the file is opened for that line alone.

        Called with ``self._lock`` held.
        """
        if self._kernel is None:  # never started: where to write is not known yet
            raise RuntimeError(
                f"audit plugin used before startup (the line of tool {line.get('tool')!r} "
                "is not written); use `async with kernel` or kernel.start()"
            )
        if self._path is None:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with _open_log(self._path) as f:
            f.write(text + "\n")

    def _reopen_if_rotated(self, path: Path) -> None:
        """logrotate renamed or removed the file: write to a new one at ``path``."""
        assert self._stream is not None
        try:
            moved = os.stat(path).st_ino != os.fstat(self._stream.fileno()).st_ino
        except FileNotFoundError:
            moved = True
        if moved:
            try:  # the new file first: if it cannot be opened, keep the old one
                path.parent.mkdir(parents=True, exist_ok=True)
                fresh = _open_log(path)
            except OSError as exc:
                log.warning(
                    "audit: cannot open %s after rotation (%s); still writing to the old file",
                    path,
                    exc,
                )
                return
            old, self._stream = self._stream, fresh
            old.close()
