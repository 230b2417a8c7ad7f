"""toolwire-audit: an example third-party plugin writing one JSON line per tool call.

It shows the whole plugin contract: an entry point in group ``toolwire``, a
pydantic ``Config`` validated from ``[plugins.audit]``, an ``order``, hooks
(sync and async), startup/shutdown, and per-call state kept in ``ctx.state``.

The lines are written by a thread of the plugin's own (``_Writer``): the event loop
only queues them, so a slow disk, an NFS server or a stderr pipe whose reader stopped
reading never stalls the kernel's other calls.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from toolwire import CallContext, Kernel, PluginError, ToolCall, ToolResult, hookimpl

__all__ = ["AuditPlugin"]
__version__ = "0.1.0"

log = logging.getLogger("toolwire.audit")

#: Arguments nested deeper than this are not recorded (the line must always be written).
_MAX_DEPTH = 64

#: How often a task waiting for the writer looks again (it doubles up to the maximum):
#: a thread has no event loop to tell, and the plugin may serve several loops.
_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.01

#: While writes fail, the ERROR saying how many lines were lost is repeated this often.
_REPORT_EVERY_S = 60.0


def _owner_only(path: str, flags: int) -> int:
    """``open``'s opener: a file it creates is readable by its owner only (0600).

    The lines hold who called what, and arguments with ``include_args``; on a
    shared host the umask's usual 0644 let every local user read them. A file
    that exists keeps its mode (a log rotator's ``create 0640``, say).

    Opened non-blocking, then made blocking again: a named pipe that no process reads
    is then refused (ENXIO) rather than waited for, for ever.
    """
    fd = os.open(path, flags | _NONBLOCK, 0o600)
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _open_log(path: Path) -> IO[str]:
    # backslashreplace: a lone surrogate (valid JSON "\ud800", which json.loads turns
    # into a str UTF-8 cannot encode) is written as that same JSON escape; strict, the
    # whole line was refused and the call left no trace.
    return open(path, "a", encoding="utf-8", errors="backslashreplace", opener=_owner_only)


def _ends_mid_line(path: Path) -> bool:
    """The file at ``path`` ends with part of a line (a write that failed half-way)."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _close_quietly(stream: IO[str]) -> None:
    try:
        stream.close()
    except (OSError, ValueError):  # its buffer could not be flushed: already reported
        pass


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
    queue_size: int = Field(
        1000,
        ge=1,
        description="lines waiting for the writer thread before a call waits to queue its own",
    )
    drain_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="how long the kernel's close waits for the queued lines to be written",
    )


class _Writer:
    """The thread that writes one plugin's lines, in the order they were queued.

    Every open, ``stat`` (rotation), write, flush and close of the log happens on this
    thread, never on an event loop. Lines wait in a queue that ``queue_size`` bounds
    (``offer`` refuses a line when it is full; the caller waits, on its own loop).
    ``close`` makes the thread write what is queued, close the file and end; until it
    has ended it still takes lines (a call that ends after the kernel closed).
    """

    def __init__(
        self,
        path: Path | None,
        stream: IO[str] | None,
        *,
        queue_size: int,
        drain_timeout_s: float,
        first: str | None = None,
        after: _Writer | None = None,
    ) -> None:
        """``stream``: the log, opened (``None``: opened at the first line). ``first``: a
        writer for the lines of calls that ended after the close, this one first (it
        opens the file, writes them, closes it and ends). ``after``: the writer of the
        same log before this one, still writing what its close left: this one writes
        nothing until it has ended, so the log keeps the order of the calls."""
        self.path = path  # None: stderr, looked up at each write (it may be redirected)
        self.queue_size = queue_size
        self.drain_timeout_s = drain_timeout_s  # at the interpreter's exit
        self._stream = stream  # the thread's alone from now on
        self._cond = threading.Condition()
        self._lines: deque[str] = deque(() if first is None else (first,))
        self._queued = len(self._lines)  # lines taken so far
        self._handled = 0  # lines written, or lost to a write error that was logged
        self._closing = first is not None
        self._accepting = True
        self.finished = threading.Event()  # the thread ended, the file is closed
        self.stall_warned = False  # a full queue was warned about (until it empties)
        self._lost = 0  # lines lost since the last report
        self._failing = False
        self._last_report = 0.0
        self._torn = False  # a failed write may have left part of a line in the file
        self._after = after
        _WRITERS.add(self)
        self._thread = threading.Thread(
            target=self._run, name=f"toolwire-audit-writer({path or '-'})", daemon=True
        )
        self._thread.start()

    # -- any thread
    def offer(self, text: str, *, force: bool = False) -> int | None:
        """Queue ``text``: its sequence number; ``None`` when the queue is full (never with
        ``force``); ``0`` when the thread is ending and takes no more lines."""
        with self._cond:
            if not self._accepting:
                return 0
            if not force and self._queued - self._handled >= self.queue_size:
                return None
            self._lines.append(text)
            self._queued += 1
            self._cond.notify()
            return self._queued

    def close(self) -> int:
        """Write what is queued, close the file, end. The number of lines left then."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            return self._queued - self._handled

    def full(self) -> bool:
        """The queue is at ``queue_size`` and the thread still takes lines."""
        with self._cond:
            return self._accepting and self._queued - self._handled >= self.queue_size

    def handled(self, seq: int) -> bool:
        """Line ``seq`` was written (or lost to an error that was logged)."""
        with self._cond:
            return self._handled >= seq or self.finished.is_set()

    @property
    def last(self) -> int:
        with self._cond:
            return self._queued

    @property
    def backlog(self) -> int:
        with self._cond:
            return self._queued - self._handled

    def join(self, timeout: float) -> bool:
        """For a thread without an event loop (the interpreter's exit)."""
        self._thread.join(timeout)
        return self.finished.is_set()

    # -- the writer's thread
    def _run(self) -> None:
        try:
            if self._after is not None:  # the last run's lines first (a stalled disk)
                self._after.finished.wait()
                self._after = None
            while True:
                with self._cond:
                    while not self._lines and not self._closing:
                        self.stall_warned = False
                        self._cond.wait()
                    if not self._lines:  # closing, and everything written
                        self._accepting = False
                        break
                    batch = list(self._lines)
                    self._lines.clear()
                try:
                    self._write("".join(line + "\n" for line in batch), len(batch))
                except Exception as exc:  # a bug here must not end the thread
                    self._lost_lines(len(batch), exc)
                with self._cond:
                    self._handled += len(batch)
        finally:
            with self._cond:
                self._accepting = False
                left = self._queued - self._handled
            if left:  # only a bug gets here with lines queued
                log.error("audit: %d line(s) for %s were not written", left, self._where)
            if self._stream is not None:
                _close_quietly(self._stream)
                self._stream = None
            if self._lost:
                self._report()
            self.finished.set()

    @property
    def _where(self) -> str:
        return str(self.path) if self.path is not None else "stderr"

    def _write(self, text: str, n: int) -> None:
        if self.path is None:
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except Exception as exc:
                self._lost_lines(n, exc)
            else:
                self._recovered()
            return
        try:
            stream = self._current_stream(self.path)
            if self._torn:  # the line a failed write cut off ends here, whole lines follow
                self._torn = False
                if _ends_mid_line(self.path):
                    text = "\n" + text
            stream.write(text)
            stream.flush()
        except Exception as exc:  # OSError mostly; a stream closed under it, ValueError
            # The file is closed and opened anew for the next lines: the buffer of a
            # stream whose flush failed still holds them, a later flush would write them
            # after lines that came later.
            if self._stream is not None:
                _close_quietly(self._stream)
                self._stream = None
            self._torn = True
            self._lost_lines(n, exc)
        else:
            self._recovered()

    def _current_stream(self, path: Path) -> IO[str]:
        """The open log; logrotate renamed or removed the file: a new one at ``path``."""
        if self._stream is None:  # after a write error, or the first line after the close
            path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = _open_log(path)
            return self._stream
        try:
            moved = os.stat(path).st_ino != os.fstat(self._stream.fileno()).st_ino
        except OSError:  # removed (FileNotFoundError), or a stale NFS handle
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
                return self._stream
            old, self._stream = self._stream, fresh
            _close_quietly(old)
        return self._stream

    def _lost_lines(self, n: int, exc: BaseException) -> None:
        """A write failed: its lines are lost, and said so (at most once a minute)."""
        self._lost += n
        first = not self._failing
        self._failing = True
        if first or time.monotonic() - self._last_report >= _REPORT_EVERY_S:
            self._report(exc)

    def _report(self, exc: BaseException | None = None) -> None:
        self._last_report = time.monotonic()
        what = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        if self.path is None:
            fix = "make sure whatever reads stderr keeps reading"
        elif isinstance(exc, OSError) and exc.errno == errno.ENXIO:
            fix = "it is a named pipe no process reads: start its reader"
        else:
            fix = (
                "free space on its disk or fix its permissions (the file is opened again "
                "for the next line)"
            )
        log.error(
            "audit: cannot write to %s%s: %d line(s) lost; tool calls go on unaudited until "
            "a write succeeds: %s, or set plugins.audit.path to a writable file",
            self._where,
            what,
            self._lost,
            fix,
        )
        self._lost = 0

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            if self._lost:
                self._report()
            log.warning("audit: writing to %s again", self._where)


#: Every writer whose thread may still run: drained at the interpreter's exit.
_WRITERS: weakref.WeakSet[_Writer] = weakref.WeakSet()


async def _poll_sleep(seconds: float) -> None:
    """The pause between two looks at a full queue (a hook for tests to count them)."""
    await anyio.sleep(seconds)


@atexit.register
def _drain_at_exit() -> None:
    """A program that never closed its kernel still gets its lines written."""
    for writer in list(_WRITERS):
        if not writer.finished.is_set():
            writer.close()
            writer.join(writer.drain_timeout_s)


class AuditPlugin:
    """One JSON line per call: time, tool, call id, outcome, error kind, duration, attempts."""

    name = "audit"
    order = 50  # outermost: sees every call, including replays and denials
    Config = AuditConfig

    def __init__(self, config: AuditConfig | None = None) -> None:
        self.config = config or AuditConfig()
        self._path: Path | None = None  # None: stderr
        self._lock = threading.Lock()  # held for no I/O: the writer's thread does that
        #: per event-loop thread: set when the queue, full, has room again (``_room``)
        self._room_events: dict[int, anyio.Event] = {}
        self._writer: _Writer | None = None
        self._open = False  # between startup and shutdown
        self._kernel: Kernel | None = None  # for its known secret values (kernel.redactor)

    # -- lifecycle
    @hookimpl
    async def startup(self, kernel: Kernel) -> None:
        path: Path | None = None
        stream: IO[str] | None = None
        if self.config.path != "-":
            cfg_file = kernel.config.path if kernel.config is not None else None
            # Abandoned if the start is cancelled (an NFS open may hang): a file it
            # opens later is dropped, and closed by the garbage collector.
            path, stream = await anyio.to_thread.run_sync(
                self._open_at_start, cfg_file, abandon_on_cancel=True
            )
        with self._lock:
            self._kernel = kernel
            self._path = path
            self._open = True
            # A writer still finishing the lines of the previous run goes on; the new
            # one waits for it when both write the same log.
            self._writer = self._new_writer(path, stream)

    def _new_writer(
        self, path: Path | None, stream: IO[str] | None, first: str | None = None
    ) -> _Writer:
        """A writer for ``path``; one of the same log still writing (its close timed out)
        goes first."""
        last = self._writer
        busy = last is not None and not last.finished.is_set() and last.path == path
        return _Writer(
            path,
            stream,
            queue_size=self.config.queue_size,
            drain_timeout_s=self.config.drain_timeout_s,
            first=first,
            after=last if busy else None,
        )

    def _open_at_start(self, cfg_file: str | None) -> tuple[Path, IO[str]]:
        """The log's path, opened (in a worker thread: a file system may be slow)."""
        path = Path(self.config.path).expanduser()
        if not path.is_absolute() and cfg_file:
            path = Path(cfg_file).parent / path  # like every path in toolwire.toml
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return path, _open_log(path)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # see _owner_only
                raise PluginError(
                    self.name,
                    f"plugins.audit.path = {self.config.path!r}: {str(path)!r} is a named "
                    "pipe and no process reads it; start its reader first, or set the path "
                    "to a file, or '-' for stderr",
                ) from exc
            # "File exists" (a file where a folder of the path should be) or "Is a
            # directory" alone did not say which setting was wrong, nor what to do.
            raise PluginError(
                self.name,
                f"plugins.audit.path = {self.config.path!r}: cannot open {str(path)!r} for "
                f"appending ({type(exc).__name__}: {exc}); set it to a file "
                "in a folder this process can create or write to, or '-' for stderr",
            ) from exc

    @hookimpl
    async def shutdown(self) -> None:
        """Drain: wait (``drain_timeout_s`` at most) until the writer has written every
        queued line and closed the file."""
        with self._lock:
            self._open = False
            writer = self._writer
        if writer is None:
            return
        writer.close()
        if not await self._wait(writer.finished.is_set, self.config.drain_timeout_s):
            log.warning(
                "audit: %d line(s) not yet written to %s after plugins.audit.drain_timeout_s "
                "(%gs): the kernel closes without them; its writer thread goes on writing "
                "them while the process runs. Check that the disk (or stderr's reader) is "
                "not stalled, or raise drain_timeout_s",
                writer.backlog,
                writer.path or "stderr",
                self.config.drain_timeout_s,
            )

    async def flush(self) -> None:
        """Wait until every line queued so far is written (or lost to a write error,
        which is logged). The kernel's close does it; call it to read the log meanwhile."""
        writer = self._writer
        if writer is not None:
            last = writer.last
            await self._wait(lambda: writer.handled(last), None)

    # -- hooks
    @hookimpl
    def before_call(self, call: ToolCall, ctx: CallContext) -> None:
        ctx.state["audit"] = self._call_fields(call)

    @hookimpl
    async def after_call(self, call: ToolCall, result: ToolResult, ctx: CallContext) -> None:
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
        await self._write(line)

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

    # -- queueing (the event loop's side: no I/O here)
    async def _write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, ensure_ascii=False, default=str)
        writer, seq, late = self._offer(text, line)
        if seq is None:  # the queue is full: wait for room, on this loop
            writer, seq, late = await self._offer_when_room(text, line, writer)
        # A call that ended after its kernel closed (shutdown ran while it was in flight):
        # nothing will drain the line later, so the call waits for it.
        if late and not await self._wait(lambda: writer.handled(seq), self.config.drain_timeout_s):
            log.warning(
                "audit: the line of tool %r, which ended after its kernel closed, is "
                "not yet written to %s after plugins.audit.drain_timeout_s (%gs); the "
                "writer thread goes on writing it while the process runs",
                line.get("tool"),
                writer.path or "stderr",
                self.config.drain_timeout_s,
            )

    def _offer(
        self, text: str, line: dict[str, Any], *, force: bool = False
    ) -> tuple[_Writer, int | None, bool]:
        """Queue ``text``: (writer, sequence number or None when full, after the close)."""
        with self._lock:
            if self._kernel is None:  # never started: where to write is not known yet
                raise RuntimeError(
                    f"audit plugin used before startup (the line of tool {line.get('tool')!r} "
                    "is not written); use `async with kernel` or kernel.start()"
                )
            writer = self._writer
            seq = writer.offer(text, force=force) if writer is not None else 0
            if writer is None or seq == 0:
                # Closed, and its writer ended: one for the lines after the close. It
                # opens the file, writes them and closes it again.
                writer = self._writer = self._new_writer(self._path, None, first=text)
                seq = 1
            return writer, seq, not self._open

    async def _offer_when_room(
        self, text: str, line: dict[str, Any], writer: _Writer
    ) -> tuple[_Writer, int, bool]:
        """Wait, without blocking the loop, until the writer takes the line."""
        if not writer.stall_warned:
            writer.stall_warned = True
            log.warning(
                "audit: %d lines are waiting to be written to %s (plugins.audit.queue_size): "
                "calls now wait for room before they return; the disk, the file system or "
                "stderr's reader is slower than the calls, or stalled",
                writer.queue_size,
                writer.path or "stderr",
            )
        try:
            while True:
                await self._room(writer)
                writer, seq, late = self._offer(text, line)
                if seq is not None:
                    return writer, seq, late
        except BaseException:
            # Cancelled (after_call has at most 5 s when its call is cancelled): the line
            # is queued anyway, over the bound, rather than lost.
            self._offer(text, line, force=True)
            raise

    async def _room(self, writer: _Writer) -> None:
        """Return once ``writer`` has room for a line (or takes no more).

        One task per event loop (thread) polls the writer; the other calls waiting for
        room wait on its event: a long stall with many calls waiting costs one wake-up
        per poll, not one per call."""
        tid = threading.get_ident()
        waiting = self._room_events.get(tid)
        if waiting is not None:
            await waiting.wait()
            return
        event = self._room_events[tid] = anyio.Event()
        try:
            delay = _POLL_FIRST_S
            while writer.full():
                await _poll_sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
        finally:
            del self._room_events[tid]
            event.set()

    @staticmethod
    async def _wait(done: Callable[[], bool], within_s: float | None) -> bool:
        """Poll ``done()`` for ``within_s`` seconds at most (None: until it is); whether it
        is. The writer is a thread: it has no event loop to tell."""
        delay = _POLL_FIRST_S
        with anyio.move_on_after(math.inf if within_s is None else within_s):
            while not done():
                await anyio.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
        return bool(done())
