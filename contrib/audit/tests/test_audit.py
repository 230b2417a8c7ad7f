"""The audit plugin's behaviour, loaded the way users load it: from toolwire.toml."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

import toolwire_audit
from toolwire import Kernel, PluginError, ToolError, hookimpl, tool
from toolwire.state import StateStoreError
from toolwire_audit import AuditConfig, AuditPlugin

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@tool
def login(user: str, password: str) -> str:
    """Pretend to log in."""
    if password == "bad":
        raise ToolError("wrong password", kind="auth")
    return f"welcome {user}"


def kernel_for(tmp_path: Path, body: str, state: str = "memory://") -> tuple[Kernel, Path]:
    log = tmp_path / "audit.jsonl"
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(
        f'state = "{state}"\nenabled_plugins = ["audit"]\n[plugins.audit]\npath = "{log}"\n{body}'
    )
    k = Kernel.from_config(str(cfg))
    k.add_tool(login)
    return k, log


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


async def written(k: Kernel) -> None:
    """The lines of the calls made so far are in the file (a thread writes them)."""
    await k.get_plugin("audit").flush()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_one_line_per_call_with_redacted_args(tmp_path: Path, state: str) -> None:
    url = "memory://" if state == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    k, log = kernel_for(tmp_path, "include_args = true\n", state=url)
    async with k:
        await k.call("login", {"user": "ann", "password": "s3cret"}, call_id="c1", session_id="s")
        await k.call("login", {"user": "ann", "password": "bad"}, call_id="c2")
    got = lines(log)
    assert len(got) == 2
    assert got[0]["tool"] == "login" and got[0]["call_id"] == "c1" and got[0]["ok"] is True
    assert got[0]["args"] == {"user": "ann", "password": "***"}
    assert got[1]["ok"] is False and got[1]["error_kind"] == "auth"
    assert "s3cret" not in log.read_text()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_redis_state_under_trio_is_refused_at_start(
    tmp_path: Path, free_tcp_port: int
) -> None:
    """``state = "redis://..."`` in toolwire.toml, the kernel run under trio: redis.asyncio
    runs on asyncio only, and the kernel says so when it starts (no hang, no traceback from
    inside redis-py). Nothing is audited: no call was made."""
    k, log = kernel_for(tmp_path, "", state=f"redis://127.0.0.1:{free_tcp_port}/0")
    with pytest.raises(StateStoreError, match=r"needs asyncio.*sqlite:// or memory://"):
        await k.call("login", {"user": "ann", "password": "ok"})
    assert not log.exists() or log.read_text() == ""


async def test_calls_ending_before_before_call_are_audited_with_their_args(
    tmp_path: Path,
) -> None:
    """Before: invalid_args and not_found calls (before_call never runs for them) were
    audited without their args although include_args was on."""
    k, log = kernel_for(tmp_path, 'include_args = true\nredact_keys = ["Password"]\n')
    async with k:
        await k.call("login", {"user": 5, "password": "s3cret"}, call_id="bad")
        await k.call("logon", {"user": "ann", "PASSWORD": "s3cret"}, call_id="missing")
        await k.call("login", {"user": "ann", "password": "ok"}, call_id="fine")
    got = {line["call_id"]: line for line in lines(log)}
    assert got["bad"]["error_kind"] == "invalid_args"
    assert got["bad"]["args"] == {"user": 5, "password": "***"}
    assert got["missing"]["error_kind"] == "not_found"
    assert got["missing"]["args"] == {"user": "ann", "PASSWORD": "***"}
    assert got["fine"]["args"] == {"user": "ann", "password": "***"}
    assert "s3cret" not in log.read_text()

    k, log = kernel_for(tmp_path, "")  # include_args off: never recorded
    async with k:
        await k.call("login", {"user": 5, "password": "s3cret"}, call_id="bad")
    assert "args" not in lines(log)[-1]


async def test_only_errors_and_attempt_level(tmp_path: Path) -> None:
    k, log = kernel_for(tmp_path, 'only_errors = true\nlevel = "attempt"\n')
    async with k:
        await k.call("login", {"user": "a", "password": "ok"})
        await k.call("login", {"user": "a", "password": "bad"})
    got = lines(log)
    assert len(got) == 1
    assert got[0]["attempt_log"][0]["error_kind"] == "auth"  # type: ignore[index]


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ('level = "verbose"', "level"),
        ("queue_size = 0", "queue_size"),
        ("drain_timeout_s = 0", "drain_timeout_s"),
        ("drain_timeout_s = inf", "drain_timeout_s"),
    ],
)
def test_invalid_config_is_rejected(tmp_path: Path, setting: str, key: str) -> None:
    cfg = tmp_path / "toolwire.toml"
    cfg.write_text(f'enabled_plugins = ["audit"]\n[plugins.audit]\n{setting}\n')
    from toolwire import ConfigError

    with pytest.raises(ConfigError, match=rf"plugins\.audit\.{key}"):
        Kernel.from_config(str(cfg))


@pytest.mark.parametrize("where", ["under_a_file", "a_folder"])
async def test_a_path_that_cannot_be_opened_names_the_setting(tmp_path: Path, where: str) -> None:
    """Before: "startup failed: FileExistsError: [Errno 17] File exists", naming
    neither plugins.audit.path nor what to do."""
    (tmp_path / "afile").write_text("")
    path = tmp_path / "afile" / "audit.jsonl" if where == "under_a_file" else tmp_path
    k = Kernel(plugins=[AuditPlugin(AuditConfig(path=str(path)))])
    with pytest.raises(PluginError, match=r"plugins\.audit\.path = .*'-' for stderr"):
        await k.start()


async def test_a_relative_path_is_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: it was relative to whatever directory the process started in."""
    conf, cwd = tmp_path / "conf", tmp_path / "cwd"
    conf.mkdir()
    cwd.mkdir()
    cfg = conf / "toolwire.toml"
    cfg.write_text(
        'enabled_plugins = ["audit"]\n[tools]\nmodules = ["toolwire.examples"]\n'
        '[plugins.audit]\npath = "logs/audit.jsonl"\n'
    )
    monkeypatch.chdir(cwd)
    async with Kernel.from_config(str(cfg)) as k:
        await k.call("add", {"a": 1, "b": 2})
    assert [x["tool"] for x in lines(conf / "logs" / "audit.jsonl")] == ["add"]
    assert not (cwd / "logs").exists()


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
async def test_the_log_file_it_creates_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """Before: created with the umask's 0644, so every local user of a shared host read
    who called what (and the arguments, with include_args)."""
    old_umask = os.umask(0o022)
    try:
        k, log = kernel_for(tmp_path, "include_args = true\n")
        async with k:
            await k.call("login", {"user": "a", "password": "x"})
            await written(k)
            assert stat.S_IMODE(log.stat().st_mode) == 0o600
            log.rename(tmp_path / "audit.jsonl.1")  # rotated: the new file is private too
            await k.call("login", {"user": "b", "password": "x"})
            await written(k)
            assert stat.S_IMODE(log.stat().st_mode) == 0o600
        log.unlink()
        await k.call("login", {"user": "c", "password": "x"})  # after close: its own open
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        # a file that exists keeps the mode its owner gave it (a log rotator's, say)
        shared = tmp_path / "shared"
        shared.mkdir()
        (shared / "audit.jsonl").touch()
        (shared / "audit.jsonl").chmod(0o640)
        k2, log2 = kernel_for(shared, "")
        async with k2:
            await k2.call("login", {"user": "d", "password": "x"})
        assert stat.S_IMODE(log2.stat().st_mode) == 0o640 and len(lines(log2)) == 1
    finally:
        os.umask(old_umask)


async def test_a_rotated_log_is_followed_to_a_new_file(tmp_path: Path) -> None:
    """Before: after logrotate renamed the file, lines kept going to the renamed one."""
    k, log = kernel_for(tmp_path, "")
    async with k:
        await k.call("login", {"user": "a", "password": "x"})
        await written(k)
        log.rename(tmp_path / "audit.jsonl.1")
        await k.call("login", {"user": "b", "password": "x"})
    assert [x["tool"] for x in lines(tmp_path / "audit.jsonl.1")] == ["login"]
    assert len(lines(log)) == 1


async def test_a_failed_reopen_after_rotation_keeps_writing_to_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the old stream was closed first, so one failed open stopped the log for good."""
    k, log = kernel_for(tmp_path, "")
    async with k:
        await k.call("login", {"user": "a", "password": "x"})
        await written(k)
        rotated = tmp_path / "audit.jsonl.1"
        log.rename(rotated)
        real_open = toolwire_audit._open_log

        def refuse(path: Path) -> Any:
            if path == log:
                raise PermissionError("not allowed")
            return real_open(path)

        monkeypatch.setattr(toolwire_audit, "_open_log", refuse)
        await k.call("login", {"user": "b", "password": "x"})
        await written(k)
        monkeypatch.setattr(toolwire_audit, "_open_log", real_open)
        await k.call("login", {"user": "c", "password": "x"})
    assert len(lines(rotated)) == 2  # a, and b while the new file could not be opened
    assert len(lines(log)) == 1  # c, once it could


@tool
def configure(settings: dict[str, object], note: str = "") -> str:
    """Apply settings."""
    return "ok"


async def test_nested_credentials_and_known_secrets_are_not_written(tmp_path: Path) -> None:
    """Before: only top-level argument keys were redacted; a password one level down,
    or a configured secret's value in any argument, went to the audit file as is."""
    k, log = kernel_for(tmp_path, "include_args = true\n")
    k.add_tool(configure)
    k.add_secret("sk-live-123456", "API_KEY")
    args = {
        "settings": {"db": {"password": "hunter2!"}, "hooks": [{"Token": "tok-abcdef"}]},
        "note": "key is sk-live-123456",
    }
    async with k:
        r = await k.call("configure", args)
    assert r.content == {"result": "ok"}
    (line,) = lines(log)
    assert line["args"] == {
        "settings": {"db": {"password": "***"}, "hooks": [{"Token": "***"}]},
        "note": "key is [secret:API_KEY]",
    }
    text = log.read_text()
    assert "hunter2!" not in text and "tok-abcdef" not in text and "sk-live-123456" not in text


@tool
def connect(user: str) -> dict[str, object]:
    """Return a session, with its credentials."""
    return {"user": user, "session": {"token": "tok-abcdef", "note": "key sk-live-123456"}}


async def test_result_content_is_redacted_like_the_arguments(tmp_path: Path) -> None:
    """Before: with include_content, a tool's answer went to the file as is: a credential
    field, or a configured secret's value the tool echoed, was written in clear."""
    k, log = kernel_for(tmp_path, "include_content = true\n")
    k.add_tool(connect)
    k.add_secret("sk-live-123456", "API_KEY")
    async with k:
        r = await k.call("connect", {"user": "ann"})
    assert r.content["session"]["token"] == "tok-abcdef"  # the caller's result is untouched
    (line,) = lines(log)
    assert line["content"] == {
        "user": "ann",
        "session": {"token": "***", "note": "key [secret:API_KEY]"},
    }
    text = log.read_text()
    assert "tok-abcdef" not in text and "sk-live-123456" not in text


@tool
def call_api(request: dict[str, object]) -> dict[str, object]:
    """Call an API; answer with the tokens it returned."""
    return {"access_token": "at-9f8e7d6c", "refresh_token": "rt-1a2b3c4d", "scope": "read"}


async def test_fields_the_kernel_treats_as_credentials_are_not_written(tmp_path: Path) -> None:
    """Before: only the exact names in redact_keys were hidden: an ``access_token``,
    ``client_secret``, ``X-Api-Key``, ``Cookie`` or ``apiKey`` argument (names the
    kernel itself hides from every error) went to the audit file in clear."""
    k, log = kernel_for(tmp_path, "include_args = true\ninclude_content = true\n")
    k.add_tool(call_api)
    request = {
        "headers": {"X-Api-Key": "xk-5566778899", "Cookie": "sid=c00k1e-v4lue"},
        "body": {"client_secret": "cs-0011223344", "apiKey": "ak-abcdefabcd", "q": "lyon"},
    }
    async with k:
        r = await k.call("call_api", {"request": request})
    assert r.content["access_token"] == "at-9f8e7d6c"  # the caller's result is untouched
    (line,) = lines(log)
    assert line["args"] == {
        "request": {
            "headers": {"X-Api-Key": "[redacted]", "Cookie": "[redacted]"},
            "body": {"client_secret": "[redacted]", "apiKey": "[redacted]", "q": "lyon"},
        }
    }
    assert line["content"] == {
        "access_token": "[redacted]",
        "refresh_token": "[redacted]",
        "scope": "read",
    }
    text = log.read_text()
    for secret in ("xk-55", "c00k1e", "cs-00", "ak-ab", "at-9f", "rt-1a"):
        assert secret not in text


@tool
def scale(factor: float, limit: float) -> str:
    """Scale something."""
    return "ok"


def _strict_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


async def test_non_finite_numbers_in_the_arguments_keep_the_line_json(tmp_path: Path) -> None:
    """Before: a NaN or infinite argument was written as a bare ``NaN`` / ``Infinity``,
    which is not JSON: JSON.parse and other strict readers refused the line, and jq read
    it as null. It is now a string, as the kernel does for a result's content."""
    k, log = kernel_for(tmp_path, "include_args = true\n")
    k.add_tool(scale)
    async with k:
        r = await k.call("scale", {"factor": float("nan"), "limit": float("-inf")})
    assert not r.is_error
    (text,) = log.read_text().splitlines()
    line = json.loads(text, parse_constant=_strict_json)
    assert line["args"] == {"factor": "NaN", "limit": "-Infinity"}


async def test_a_lone_surrogate_in_a_name_or_argument_does_not_lose_the_line(
    tmp_path: Path,
) -> None:
    """Before: a JSON string with a lone surrogate escape (``"\\ud800"``, valid JSON
    that json.loads turns into an unencodable str) in a tool name, call id or argument
    made the UTF-8 write fail: the call left no line at all, so a caller could make
    calls the audit log never saw."""
    k, log = kernel_for(tmp_path, "include_args = true\n")
    name = json.loads('"rm_rf\\ud800"')
    user = json.loads('"ann\\udfff"')
    async with k:
        r = await k.call(name, {}, call_id="c1")
        assert r.error is not None and r.error.kind == "not_found"
        assert not r.meta.plugin_errors
        r = await k.call("login", {"user": user, "password": "s3cret"}, call_id="c2")
        assert not r.is_error and not r.meta.plugin_errors
    got = lines(log)
    assert [g["call_id"] for g in got] == ["c1", "c2"]
    assert got[0]["tool"] == name and got[0]["error_kind"] == "not_found"
    assert got[1]["args"] == {"user": user, "password": "***"}


async def test_a_call_ending_after_its_kernel_closed_is_still_recorded(tmp_path: Path) -> None:
    """Before: the plugin's shutdown closed the file while a call was in flight; that
    call's line was lost (and the error said 'used before startup')."""
    import anyio

    gate, running = anyio.Event(), anyio.Event()

    @tool
    async def slow() -> str:
        """Waits for the gate."""
        running.set()
        await gate.wait()
        return "done"

    k, log = kernel_for(tmp_path, "")
    k.add_tool(slow)
    results: list[object] = []
    await k.start()
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            results.append(await k.call("slow", {}, call_id="late"))

        tg.start_soon(call)
        await running.wait()
        await k.close()
        gate.set()
    (res,) = results
    assert res.meta.plugin_errors == []  # type: ignore[attr-defined]
    assert [(x["tool"], x["call_id"], x["ok"]) for x in lines(log)] == [("slow", "late", True)]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_lines_racing_shutdown_from_another_thread_are_never_lost(tmp_path: Path) -> None:
    """Before: a write checked the stream outside the lock, so a shutdown on another
    thread could close it between the check and the write (an error, the line lost).
    Now a line is queued, under the writer's lock, to the writer that is still taking
    lines (it writes them before it closes the file) or, once it has ended, to one
    that writes the lines of calls ending after the close: every line, once, whole,
    in order, from any thread and event loop."""
    import threading

    import anyio

    from toolwire import CallContext, ToolCall

    k, log = kernel_for(tmp_path, "")
    audit = k.get_plugin("audit")
    some_queued = threading.Event()
    errors: list[BaseException] = []
    async with k:
        res = await k.call("login", {"user": "ann", "password": "pw"}, call_id="c1")

        async def produce() -> None:  # on another thread's event loop
            for i in range(300):
                call = ToolCall(name="login", args={"user": "ann"}, call_id=f"t{i}")
                await audit.after_call(call, res, CallContext(call=call, kernel=k))
                if i == 50:
                    some_queued.set()

        def other_thread() -> None:
            try:
                anyio.run(produce)
            except BaseException as exc:
                errors.append(exc)
            finally:
                some_queued.set()

        producer = threading.Thread(target=other_thread)
        producer.start()
        await anyio.to_thread.run_sync(some_queued.wait)
    await anyio.to_thread.run_sync(producer.join)
    assert errors == []
    got = [x["call_id"] for x in lines(log)]
    assert got == ["c1"] + [f"t{i}" for i in range(300)]  # every line, once, whole


# -- the writer: audit I/O never runs on the event loop

#: How long a gated write waits before giving up: only a writer on the event loop
#: (which nothing else can then release) ever waits this long. A safety net against a
#: hung test, not a speed assertion.
_GATE_SAFETY_S = 5.0


class _GatedStream:
    """A text stream whose writes wait for ``release``: a stalled disk, NFS server, or a
    pipe whose reader stopped reading."""

    def __init__(self) -> None:
        import threading

        self.entered = threading.Event()
        self.release = threading.Event()
        self.events: list[str] = []
        self.chunks: list[str] = []
        self.closed = False
        # Only the audit writer's thread is held: what the test's own thread writes (a
        # log record a handler left by an earlier test sends to sys.stderr, which this
        # stream replaces) goes through, or the test would deadlock its own event loop.
        self._test_thread = threading.get_ident()

    def write(self, text: str) -> int:
        import threading

        if threading.get_ident() == self._test_thread:
            return sys.__stderr__.write(text) if sys.__stderr__ is not None else len(text)
        if not self.entered.is_set():
            self.events.append("write blocked")
            self.entered.set()
        if not self.release.wait(_GATE_SAFETY_S):
            self.events.append("write gave up waiting")
        self.chunks.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in "".join(self.chunks).splitlines()]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_stalled_write_does_not_block_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: the line was written (json.dumps, a stat, write and flush under a thread
    lock) on the event loop, so a write that stalled (a slow disk, NFS, stderr piped to a
    reader that stopped reading) stalled every other task of the loop with it: here, the
    one task that could release the write could not run until the write gave up."""
    import sys

    import anyio

    stream = _GatedStream()
    monkeypatch.setattr(sys, "stderr", stream)
    k = Kernel(plugins=[AuditPlugin(AuditConfig(path="-"))])
    k.add_tool(login)
    async with k:

        async def unrelated() -> None:  # another task of the same loop
            while not stream.entered.is_set():  # noqa: ASYNC110 - set by another thread
                await anyio.sleep(0.001)
            stream.events.append("another task ran")
            stream.release.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(unrelated)
            r = await k.call("login", {"user": "ann", "password": "pw"}, call_id="c1")
            assert not r.is_error and not r.meta.plugin_errors
    assert stream.events == ["write blocked", "another task ran"]
    assert [x["call_id"] for x in stream.lines()] == ["c1"]


class _GatedFile(_GatedStream):
    """The log file, its writes gated like ``_GatedStream``'s."""

    def __init__(self, real: Any) -> None:
        super().__init__()
        self._real = real

    def write(self, text: str) -> int:
        super().write(text)
        return int(self._real.write(text))

    def flush(self) -> None:
        self._real.flush()

    def fileno(self) -> int:
        return int(self._real.fileno())

    def close(self) -> None:
        self._real.close()
        self.events.append("file closed")
        self.closed = True


def gate_the_log(monkeypatch: pytest.MonkeyPatch) -> list[_GatedFile]:
    """Every file the plugin opens from now on is gated; the list of them."""
    real_open = toolwire_audit._open_log
    opened: list[_GatedFile] = []

    def gated(path: Path) -> Any:
        opened.append(_GatedFile(real_open(path)))
        return opened[-1]

    monkeypatch.setattr(toolwire_audit, "_open_log", gated)
    return opened


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_concurrent_lines_keep_their_order_and_a_full_queue_makes_calls_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Many calls at once, the writer stalled: no more than ``queue_size`` lines wait
    for it (the calls after them wait, on the loop, for room: none is dropped), a
    WARNING says why calls wait, and once the writer goes on every line is written,
    once, whole, each caller's lines in the order of its calls."""
    import sys

    import anyio

    stream = _GatedStream()
    monkeypatch.setattr(sys, "stderr", stream)
    # One task polls the full queue; the other waiting calls wait on its event (before,
    # every waiting call polled: thousands of wake-ups a second in a long stall).
    polling = {"now": 0, "most": 0, "polls": 0}
    real_sleep = toolwire_audit._poll_sleep

    async def counted(seconds: float) -> None:
        polling["now"] += 1
        polling["most"] = max(polling["most"], polling["now"])
        polling["polls"] += 1
        try:
            await real_sleep(seconds)
        finally:
            polling["now"] -= 1

    monkeypatch.setattr(toolwire_audit, "_poll_sleep", counted)
    k = Kernel(plugins=[AuditPlugin(AuditConfig(path="-", queue_size=5))])
    k.add_tool(login)
    done: list[str] = []
    ended_while_stalled: list[str] = []
    async with k:

        async def caller(t: int) -> None:
            for i in range(20):
                await k.call("login", {"user": "ann", "password": "pw"}, call_id=f"{t}-{i}")
                done.append(f"{t}-{i}")

        async with anyio.create_task_group() as tg:
            for t in range(10):
                tg.start_soon(caller, t)
            with anyio.fail_after(30):  # a safety net: the warning comes, or the test fails
                while "calls now wait for room" not in caplog.text:  # noqa: ASYNC110
                    await anyio.sleep(0.001)
            with anyio.fail_after(30):  # the other callers are waiting too, and polls go on
                while polling["polls"] < 20:  # noqa: ASYNC110
                    await anyio.sleep(0.001)
            ended_while_stalled[:] = done
            stream.release.set()
    assert polling["most"] == 1, polling
    assert stream.events == ["write blocked"]  # the one write that waited, no other
    assert len(ended_while_stalled) <= 5  # queue_size lines queued, the writer stalled
    got = [x["call_id"] for x in stream.lines()]
    assert sorted(got) == sorted(f"{t}-{i}" for t in range(10) for i in range(20))
    for t in range(10):
        assert [g for g in got if g.startswith(f"{t}-")] == [f"{t}-{i}" for i in range(20)]
    assert "(plugins.audit.queue_size)" in caplog.text and "stderr" in caplog.text


class _ShutdownProbe:
    """Its shutdown hook says when the kernel's close got to it: ordered after audit
    (descending order), it runs once audit's shutdown returned; before it, first."""

    def __init__(self, name: str, order: int, events: list[str]) -> None:
        self.name, self.order, self._events = name, order, events

    @hookimpl
    def shutdown(self) -> None:
        self._events.append(f"{self.name} shut down")


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_kernels_close_drains_the_queued_lines_and_then_closes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls returned while their lines still waited for a stalled disk: the
    kernel's close (audit's shutdown hook) waits until every one is written and the
    file closed; the plugins shut down after audit see the file closed."""
    import anyio

    opened = gate_the_log(monkeypatch)
    k, log = kernel_for(tmp_path, "")
    events: list[str] = []  # one list for the file and both probes: their order
    k.register(_ShutdownProbe("before_audit", 60, events))
    k.register(_ShutdownProbe("after_audit", 10, events))
    async with k:
        (f,) = opened
        f.events = events
        for i in range(50):
            r = await k.call("login", {"user": "ann", "password": "pw"}, call_id=f"c{i}")
            assert not r.is_error
        assert lines(log) == []  # returned, not written: the disk is stalled

        async def release_once_closing() -> None:
            with anyio.fail_after(30):
                while "before_audit shut down" not in events:  # noqa: ASYNC110
                    await anyio.sleep(0.001)
            events.append("released")
            f.release.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_once_closing)
            await k.close()
    assert events == [
        "write blocked",
        "before_audit shut down",
        "released",
        "file closed",
        "after_audit shut down",
    ]
    assert [x["call_id"] for x in lines(log)] == [f"c{i}" for i in range(50)]


async def test_a_drain_that_outlasts_drain_timeout_s_warns_and_the_lines_come_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk that stays stalled does not hold the kernel's close for ever: after
    ``drain_timeout_s`` it goes on, with a WARNING naming the file and how many lines
    wait; the writer thread still writes them when the disk comes back."""
    import anyio

    opened = gate_the_log(monkeypatch)
    k, log = kernel_for(tmp_path, "drain_timeout_s = 0.05\n")
    async with k:
        for i in range(3):
            await k.call("login", {"user": "ann", "password": "pw"}, call_id=f"c{i}")
    (f,) = opened
    assert f.events == ["write blocked"] and not f.closed  # the close returned meanwhile
    assert f"line(s) not yet written to {log}" in caplog.text
    assert "plugins.audit.drain_timeout_s (0.05s)" in caplog.text
    f.release.set()
    with anyio.fail_after(30):
        while not f.closed:  # noqa: ASYNC110 - closed by the writer thread
            await anyio.sleep(0.01)
    assert [x["call_id"] for x in lines(log)] == ["c0", "c1", "c2"]


class _DiskFull:
    """A log file on a disk that fills up: with ``full`` set, a write puts half its text
    in the file and fails with ENOSPC."""

    full = False

    def __init__(self, real: Any) -> None:
        self._real = real

    def write(self, text: str) -> int:
        if _DiskFull.full:
            self._real.write(text[: len(text) // 2])
            self._real.flush()
            raise OSError(28, "No space left on device")
        return int(self._real.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


async def test_a_failing_disk_is_logged_with_the_fix_and_calls_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, a write error was raised from after_call on the event loop. Now the
    writer thread logs it, naming the file, the error, the lines lost and what to do;
    the calls go on; the next line opens the file again and starts on a line of its own
    (the failed write left half a line)."""
    real_open = toolwire_audit._open_log
    monkeypatch.setattr(toolwire_audit, "_open_log", lambda path: _DiskFull(real_open(path)))
    monkeypatch.setattr(_DiskFull, "full", False)
    k, log = kernel_for(tmp_path, "")
    async with k:
        await k.call("login", {"user": "ann", "password": "pw"}, call_id="a")
        await written(k)
        _DiskFull.full = True
        r = await k.call("login", {"user": "ann", "password": "pw"}, call_id="b")
        await written(k)
        assert not r.is_error and r.meta.plugin_errors == []
        assert f"audit: cannot write to {log} (OSError: [Errno 28] No space left" in caplog.text
        assert "1 line(s) lost" in caplog.text and "free space on its disk" in caplog.text
        _DiskFull.full = False
        await k.call("login", {"user": "ann", "password": "pw"}, call_id="c")
    text = log.read_text().splitlines()
    assert len(text) == 3 and not text[1].endswith("}")  # b's half, on a line of its own
    assert [json.loads(text[0])["call_id"], json.loads(text[2])["call_id"]] == ["a", "c"]
    assert f"audit: writing to {log} again" in caplog.text


_NEVER_CLOSED = """
import sys, time
import anyio
import toolwire_audit
from toolwire import Kernel, tool
from toolwire_audit import AuditConfig, AuditPlugin

real_open = toolwire_audit._open_log


class Slow:  # a slow disk: each write takes a while
    def __init__(self, real):
        self._real = real

    def write(self, text):
        time.sleep(0.2)
        return self._real.write(text)

    def __getattr__(self, name):
        return getattr(self._real, name)


toolwire_audit._open_log = lambda path: Slow(real_open(path))


@tool
def add(a: int, b: int) -> int:
    \"\"\"Add.\"\"\"
    return a + b


async def main():
    k = Kernel(plugins=[AuditPlugin(AuditConfig(path=sys.argv[1]))])
    k.add_tool(add)
    for i in range(3):
        await k.call("add", {"a": i, "b": 1}, call_id=f"x{i}")
    print("returned", flush=True)  # and the kernel is never closed


anyio.run(main)
"""


def test_a_program_that_never_closes_its_kernel_still_gets_its_lines(tmp_path: Path) -> None:
    """The lines still queued when the interpreter exits are written before it does
    (the writer is a daemon thread: without that, they were lost with it)."""
    import subprocess
    import sys

    script, log = tmp_path / "never_closed.py", tmp_path / "audit.jsonl"
    script.write_text(_NEVER_CLOSED)
    proc = subprocess.run(
        [sys.executable, str(script), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout == "returned\n", proc.stderr
    assert [x["call_id"] for x in lines(log)] == ["x0", "x1", "x2"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_named_pipe_nobody_reads_fails_the_start_instead_of_hanging_it(
    tmp_path: Path,
) -> None:
    """Before: opening a FIFO for writing waits until a process opens it for reading, for
    ever: the kernel's start hung (it could not even be cancelled). Now the start fails
    at once, saying so; with a reader, the lines go through the pipe."""
    import threading

    import anyio

    fifo = tmp_path / "audit.pipe"
    os.mkfifo(fifo)
    k = Kernel(plugins=[AuditPlugin(AuditConfig(path=str(fifo)))])
    k.add_tool(login)
    with pytest.raises(PluginError, match=r"plugins\.audit\.path = .*no process reads"):
        await k.start()

    received: list[str] = []

    def reader() -> None:
        with open(fifo) as f:
            received.extend(f)

    reading = threading.Thread(target=reader)
    reading.start()
    while True:  # the reader's open returns once a writer opens the pipe: retry until then
        try:
            await k.start()
            break
        except PluginError:
            await anyio.sleep(0.01)
    async with k:
        await k.call("login", {"user": "ann", "password": "pw"}, call_id="c1")
    await anyio.to_thread.run_sync(reading.join)
    assert [json.loads(x)["call_id"] for x in received] == ["c1"]


async def test_lines_after_a_restart_wait_for_the_lines_the_last_close_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel closed before its writer could write (the disk stalled past
    ``drain_timeout_s``) and started again: the new run's lines come after the old
    run's in the log, not before. Before, the new run's writer thread wrote at once
    (here, on a file that was not stalled), and one caller's lines came out of order."""
    import anyio

    real_open = toolwire_audit._open_log
    opened = gate_the_log(monkeypatch)
    k, log = kernel_for(tmp_path, "drain_timeout_s = 0.05\n")
    async with k:
        for i in range(3):
            await k.call("login", {"user": "ann", "password": "pw"}, call_id=f"c{i}")
    (f,) = opened
    assert f.events == ["write blocked"]  # c0..c2 wait for the stalled write
    monkeypatch.setattr(toolwire_audit, "_open_log", real_open)
    async with k:
        await k.call("login", {"user": "ann", "password": "pw"}, call_id="c3")
        await anyio.sleep(0.2)  # time for a writer that does not wait to write c3
        f.release.set()
        with anyio.fail_after(30):
            await written(k)
    assert [x["call_id"] for x in lines(log)] == ["c0", "c1", "c2", "c3"]
