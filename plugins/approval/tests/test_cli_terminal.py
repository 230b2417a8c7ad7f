"""`toolwire approvals ...`, and the terminal prompt of `toolwire call`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from approval_testkit import Pending, Recorder, plugin

from toolwire import TERMINAL_EXTENSION as TOOLWIRE_TERMINAL
from toolwire import Kernel, Terminal, ToolResult, load_config
from toolwire.cli import build_cli_kernel, main
from toolwire_approval import TERMINAL_EXTENSION, TerminalPrompt, offer_terminal


def config(tmp_path: Path, **approval: str) -> Path:
    rules = ", ".join(f'{k} = "{v}"' for k, v in approval.items())
    path = tmp_path / "toolwire.toml"
    path.write_text(
        f'state = "sqlite:///{tmp_path / "state.db"}"\nenabled_plugins = ["approval"]\n\n'
        '[tools]\nmodules = ["toolwire.examples"]\n\n'
        f"[plugins.approval]\ntools = {{ {rules} }}\n"
    )
    return path


def call(path: Path, args: dict[str, Any], **kw: Any) -> ToolResult:
    async def go() -> ToolResult:
        async with Kernel.from_config(load_config(path)) as kernel:
            return await kernel.call("add", args, **kw)

    return anyio.run(go)


def cli(capsys: pytest.CaptureFixture[str], path: Path, *argv: str) -> tuple[int, Any]:
    code = main(["--config", str(path), "approvals", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_list_show_approve_reject_and_audit_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, add="REQUIRED")
    first = call(path, {"a": 1, "b": 2}, call_id="run-1", timeout=0.1)
    assert first.error is not None and first.error.kind == "timeout"  # left pending

    code, listed = cli(capsys, path, "list")
    assert code == 0 and [r["tool"] for r in listed] == ["add"]
    rid = listed[0]["id"]
    code, out = cli(capsys, path, "approve", rid, "--args", '{"a": 5, "b": "two"}')
    assert code == 1 and out["error"]["kind"] == "invalid_args"
    assert out["error"]["problems"][0]["field"] == "b"
    code, out = cli(capsys, path, "approve", rid, "--fingerprint", "f" * 64)
    assert code == 1 and out["error"]["kind"] == "fingerprint_mismatch"
    code, out = cli(capsys, path, "approve", rid, "--args", '{"a": 5, "b": 2}', "--by", "ops")
    assert code == 0 and out["status"] == "approved" and out["decision"]["via"] == "cli"

    resumed = call(path, {"a": 1, "b": 2}, call_id="run-1")
    assert resumed.content == {"result": 7}  # the edited arguments ran
    assert resumed.meta.approval is not None and resumed.meta.approval["by"] == "ops"

    code, shown = cli(capsys, path, "show", rid)
    assert code == 0 and shown["used_at"] is not None
    assert [a["event"] for a in shown["audit"]] == [
        "requested",
        "refused",
        "refused",
        "approved",
        "executed",
    ]

    call(path, {"a": 3, "b": 3}, timeout=0.1)
    code, [second] = cli(capsys, path, "list")
    code, out = cli(capsys, path, "reject", second["id"], "--reason", "nope")
    assert code == 0 and out["decision"]["reason"] == "nope"
    code, out = cli(capsys, path, "reject", second["id"])
    assert code == 1 and out["error"]["kind"] == "already_decided"
    code, out = cli(capsys, path, "list", "--status", "all", "--tool", "add")
    assert sorted(r["status"] for r in out) == ["approved", "rejected"]
    code, out = cli(capsys, path, "audit", "--limit", "2")
    assert [a["event"] for a in out] == ["requested", "rejected"]
    code, out = cli(capsys, path, "show", "missing")
    assert code == 1 and out["error"]["kind"] == "not_found"


def test_approvals_reads_the_store_beside_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config file without `state` keeps the embedded store next to itself, where
    `toolwire call` and `toolwire serve` wait; before, `approvals` read `.toolwire/` of
    the working directory, listed nothing and could not release the waiting call."""
    conf, cwd = tmp_path / "conf", tmp_path / "cwd"
    conf.mkdir()
    cwd.mkdir()
    path = conf / "toolwire.toml"
    path.write_text(
        'enabled_plugins = ["approval"]\n[tools]\nmodules = ["toolwire.examples"]\n'
        '[plugins.approval]\ntools = { add = "REQUIRED" }\nrequired_timeout_s = 0.05\n'
    )
    monkeypatch.chdir(cwd)
    assert main(["--config", str(path), "call", "add", "--args", '{"a": 1, "b": 2}']) == 1
    capsys.readouterr()
    code, listed = cli(capsys, path, "list", "--status", "all")
    assert code == 0 and [r["tool"] for r in listed] == ["add"]
    assert (conf / ".toolwire" / "state.db").exists() and not (cwd / ".toolwire").exists()


def test_the_hints_name_the_config_so_they_work_from_another_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 'decide with toolwire approvals ...' hints carry --config: run as printed from
    another directory, without it, they opened another store and answered 'not found'."""
    conf, cwd = tmp_path / "my conf", tmp_path / "elsewhere"
    conf.mkdir()
    cwd.mkdir()
    path = conf / "toolwire.toml"
    path.write_text(
        'enabled_plugins = ["approval"]\n[tools]\nmodules = ["toolwire.examples"]\n'
        '[plugins.approval]\ntools = { add = "REQUIRED" }\n'
    )
    hints: list[str] = []

    async def go() -> ToolResult:  # the kernel `toolwire call` and `toolwire serve` build
        async with build_cli_kernel(load_config(path)) as kernel:
            kernel.events.subscribe(
                lambda e: hints.append(e.data["decide"]["cli"]), kinds=["approval_required"]
            )
            return await kernel.call("add", {"a": 1, "b": 2}, timeout=0.2)

    assert anyio.run(go).is_error  # left pending
    [hint] = hints
    approve = hint.split(" | ")[0]
    assert approve.startswith(f"toolwire --config '{path}' approvals approve ")
    monkeypatch.chdir(cwd)
    argv = shlex.split(approve)[1:]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "approved"


def test_a_bad_section_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, add="SOMETIMES")
    assert main(["--config", str(path), "approvals", "list"]) == 2
    assert "plugins.approval.tools.add" in capsys.readouterr().err


@pytest.mark.anyio
async def test_the_kernels_terminal_is_asked_on() -> None:
    """What ``toolwire call`` offers on a terminal: the kernel's ``Terminal``."""
    rfd, wfd = os.pipe()
    os.write(wfd, b"y\n")
    shown: list[str] = []
    p = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[p])
    rec = Recorder()
    rec.add_to(kernel)
    try:
        async with kernel:
            res = await kernel.call(
                "send_email",
                {"to": "a@x"},
                extensions={TOOLWIRE_TERMINAL: Terminal(rfd, shown.append)},
            )
    finally:
        os.close(rfd)
        os.close(wfd)
    assert not res.is_error and rec.runs == [{"to": "a@x", "body": "hi", "count": 1}]
    assert res.meta.approval is not None and res.meta.approval["via"] == "terminal"
    assert any("needs approval" in line for line in shown)


# ------------------------------------------------------------ the prompt
def scripted(*lines: str | None) -> tuple[TerminalPrompt, list[str]]:
    feed = list(lines)
    shown: list[str] = []

    async def read_line() -> str | None:
        return feed.pop(0) if feed else None

    return TerminalPrompt(read_line, shown.append, user="tess"), shown


@pytest.mark.anyio
async def test_the_prompt_approves_with_edits_after_bad_answers() -> None:
    p = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[p])
    rec = Recorder()
    rec.add_to(kernel)
    prompt, shown = scripted(
        "maybe", "e", "{not json", "e", '{"to": "b@x", "count": "x"}', "e", '{"to": "b@x"}'
    )
    async with kernel:
        res = await kernel.call(
            "send_email", {"to": "a@x"}, extensions={TERMINAL_EXTENSION: prompt}
        )
    assert not res.is_error and rec.runs == [{"to": "b@x", "body": "hi", "count": 1}]
    assert res.meta.approval is not None and res.meta.approval["by"] == "tess"
    assert res.meta.approval["via"] == "terminal"
    text = "".join(shown)
    assert "tool 'send_email' needs approval" in text and '"to": "a@x"' in text
    assert "answer y, n or e" in text and "not valid JSON" in text
    assert "edited arguments for tool 'send_email' are invalid" in text
    assert "approved" in text


#: Right-to-left override: "ann@corp.example\u202emoc.live@" shows as "ann@corp.example@evil.com".
SPOOF = "ann@corp.example\u202emoc.live@"


@pytest.mark.anyio
async def test_the_prompt_shows_invisible_and_reordering_characters_escaped() -> None:
    """Before: the arguments were printed with their format and control characters (bidi
    overrides, zero-width spaces, C1 controls) as they were, so an argument could make the
    terminal show other text than the one approved."""
    p = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[p])
    rec = Recorder()
    rec.add_to(kernel)
    prompt, shown = scripted("n", "")
    args = {"to": SPOOF, "body": "zero\u200bwidth \x9b31m"}
    async with kernel:
        await kernel.call("send_email", args, extensions={TERMINAL_EXTENSION: prompt})
    text = "".join(shown)
    assert not any(c in text for c in "\u202e\u200b\x9b")
    assert "\\u202e" in text and "\\u200b" in text and "\\u009b" in text
    assert "ann@corp.example" in text and rec.runs == []


@pytest.mark.anyio
async def test_the_prompt_offered_by_context_rejects_with_a_reason() -> None:
    p = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[p])
    rec = Recorder()
    rec.add_to(kernel)
    prompt, _ = scripted("n", "not now")
    token = offer_terminal(prompt)
    try:
        async with kernel:
            res = await kernel.call("send_email", {"to": "a@x"})
    finally:
        token.var.reset(token)
    assert res.error is not None and res.error.kind == "denied"
    assert res.error.details["reason"] == "not now" and rec.runs == []


@pytest.mark.anyio
async def test_other_channels_still_decide_while_the_prompt_waits() -> None:
    p = plugin(default="REQUIRED")
    kernel = Kernel(plugins=[p])
    Recorder().add_to(kernel)
    never = anyio.Event()

    async def read_line() -> str | None:
        await never.wait()  # nobody types
        return None

    prompt = TerminalPrompt(read_line, lambda _: None)
    p.add_callback(lambda req: None)
    pending = Pending(kernel)

    async def approve_soon() -> None:
        await p.approve((await pending.next())["id"], by="web")

    async with kernel, anyio.create_task_group() as tg:
        tg.start_soon(approve_soon)
        res = await kernel.call(
            "send_email", {"to": "a@x"}, extensions={TERMINAL_EXTENSION: prompt}
        )
    assert not res.is_error and res.meta.approval is not None
    assert res.meta.approval["by"] == "web"


def _read_until(fd: int, marker: bytes, seconds: float = 30.0) -> bytes:
    import select

    out = b""
    end = time.monotonic() + seconds
    while marker not in out:
        left = end - time.monotonic()
        assert left > 0, f"no {marker!r} in {out!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                out += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    return out


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_toolwire_call_prompts_on_a_real_terminal(tmp_path: Path) -> None:
    path = config(tmp_path, add="REQUIRED")
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWIRE_")}
    argv = ["--config", str(path), "call", "add", "--args", '{"a": 2, "b": 3}']
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolwire.cli", *argv],
        stdin=slave,
        stderr=slave,
        stdout=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    os.close(slave)
    try:
        seen = _read_until(master, b"[e]dit arguments: ")
        assert b"tool 'add' needs approval" in seen
        os.write(master, b"y\n")
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    result = json.loads(out)
    assert proc.returncode == 0 and result["content"] == {"result": 5}
    assert result["meta"]["approval"]["via"] == "terminal"


def test_bad_audit_limits_and_request_statuses_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --limit -1 dropped the oldest entry, --limit 0 returned them all, and
    requests(status="all" / "bogus") returned []."""
    path = config(tmp_path, add="REQUIRED")
    call(path, {"a": 1, "b": 2}, call_id="run-1", timeout=0.1)  # one request, left pending
    for bad in ("-1", "0", "x"):
        with pytest.raises(SystemExit) as exc:
            main(["--config", str(path), "approvals", "audit", "--limit", bad])
        assert exc.value.code == 2
        assert "give a whole number >= 1" in capsys.readouterr().err
    code, out = cli(capsys, path, "audit", "--limit", "1")
    assert code == 0 and len(out) == 1

    async def statuses() -> None:
        async with Kernel.from_config(load_config(path)) as k:
            approval = k.get_plugin("approval")
            assert [r.status for r in await approval.requests(status="all")] == ["pending"]
            with pytest.raises(ValueError, match="status 'bogus': use one of pending"):
                await approval.requests(status="bogus")
            with pytest.raises(ValueError, match="limit 0"):
                await approval.audit_log(limit=0)

    anyio.run(statuses)


def test_an_id_undecodable_in_the_locale_is_an_unknown_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `toolwire approvals show $'\\xff'` (argv decodes it to a lone surrogate) ended
    in a traceback from the state store ("not valid Unicode text")."""
    path = config(tmp_path, add="REQUIRED")
    bad = b"\xff".decode(sys.getfilesystemencoding(), "surrogateescape")
    for argv in (("show", bad), ("approve", bad), ("reject", bad)):
        code, out = cli(capsys, path, *argv)
        assert code == 1 and out["error"]["kind"] == "not_found", argv
    assert cli(capsys, path, "audit", bad) == (0, [])


def test_config_may_follow_the_subcommand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `toolwire approvals list --config PATH` (where `toolwire call`, `tools` and
    `stats` take it) was argparse's "unrecognized arguments: --config PATH"."""
    path = config(tmp_path, add="REQUIRED")
    call(path, {"a": 1, "b": 2}, call_id="run-1", timeout=0.1)  # left pending
    monkeypatch.chdir(tmp_path.parent)  # not next to the file: only the option finds it
    assert main(["approvals", "list", "--config", str(path)]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert main(["approvals", "show", listed["id"], "-c", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == listed["id"]
    assert main(["approvals", "reject", listed["id"], "-c", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "rejected"
