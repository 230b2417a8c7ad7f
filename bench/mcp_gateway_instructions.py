"""MCP gateway cost in instructions per call, counted by callgrind: a figure load cannot move.

``bench/mcp_gateway.py`` measures time, which on a shared machine swings with
whatever else runs (its (c)/(a) ratio ranged 1.33-1.86 for the same code on
one day). This counts the instructions each server process executes per
``tools/call`` under ``valgrind --tool=callgrind``, for:

- (a) a bare FastMCP server with the ``echo`` tool (the baseline),
- (b) ``toolwire serve`` serving the same ``echo`` as a local tool,
- (c) ``toolwire serve`` fronting (a) through the ``mcp`` plugin — the
  gateway process alone (the (a) behind it runs natively, uncounted).

Each server starts twice under callgrind; after a warm-up, one run makes
``--low`` calls and the other ``--high``; the difference divided by
``high - low`` is the per-call count (start-up and warm-up cancel out). The
calls are raw 2026-07-28 ``tools/call`` POSTs over one keep-alive connection
(httpx). Prints instructions per call and the ratios to (a).

Needs valgrind (Debian: ``apt-get install valgrind``). Takes several minutes:
a server starts about 50x slower under callgrind.

Run: ``uv run python bench/mcp_gateway_instructions.py [--low N] [--high N] [--servers abc]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from mcp_gateway import ARGS, EXPECTED, env, free_port, start_bare, stop

HERE = Path(__file__).resolve().parent
_COLLECTED = re.compile(r"Collected : (\d+)")
_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}
_BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": ARGS, "_meta": _META},
    }
)
_HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2026-07-28",
    "mcp-method": "tools/call",
    "mcp-name": "echo",
}
_READY_S = 900.0  # a cold start under callgrind, imports and an upstream connect included


def _call(client: httpx.Client, url: str) -> bool:
    try:
        r = client.post(url, content=_BODY, headers=_HEADERS)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        return False
    text = r.text
    if text.startswith("event:") or "\ndata:" in text:  # SSE: the last data line
        text = [ln[5:] for ln in text.splitlines() if ln.startswith("data:")][-1]
    result = json.loads(text).get("result", {})
    return bool(result.get("structuredContent") == EXPECTED)


def _count(start: Callable[[Path], subprocess.Popen[bytes]], url: str, calls: int) -> int:
    """Instructions the server process ran, started under callgrind, for warm-up + ``calls``."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "callgrind.log"
        proc = start(log)
        try:
            with httpx.Client(timeout=300) as client:
                deadline = time.monotonic() + _READY_S
                warm = 0
                while warm < 5:  # the same warm-up in both runs once the server answers
                    if _call(client, url):
                        warm += 1
                    elif time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"server at {url} never answered:\n{log.read_text()}")
                    else:
                        time.sleep(1)
                for _ in range(calls):
                    if not _call(client, url):
                        raise RuntimeError(f"a call to {url} failed")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        m = _COLLECTED.search(log.read_text(errors="replace"))
        if m is None:
            raise RuntimeError(f"no callgrind count in {log}:\n{log.read_text()}")
        return int(m.group(1))


def _at(
    start: Callable[[Path, int], subprocess.Popen[bytes]], port: int, log: Path
) -> subprocess.Popen[bytes]:
    return start(log, port)


def _valgrind(cmd: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
            env=env(),
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--low", type=int, default=20, help="calls in the first run")
    p.add_argument("--high", type=int, default=220, help="calls in the second run")
    p.add_argument("--servers", default="abc", help="which of a, b, c to count")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    if args.high <= args.low:
        p.error("--high must be larger than --low")

    port_up = free_port()
    url_up = f"http://127.0.0.1:{port_up}/mcp"
    upstream = start_bare(port_up)  # natively: (c)'s upstream
    work = Path(tempfile.mkdtemp(prefix="toolwire-bench-"))
    per_call: dict[str, float] = {}
    try:

        def bare(log: Path, port: int) -> subprocess.Popen[bytes]:
            return _valgrind(
                [sys.executable, str(HERE / "mcp_gateway.py"), "--serve-bare", str(port)], log
            )

        def toolwire(name: str, extra: str) -> Callable[[Path, int], subprocess.Popen[bytes]]:
            def start(log: Path, port: int) -> subprocess.Popen[bytes]:
                cfg = work / f"{name}.toml"
                cfg.write_text(
                    f'state = "memory://"\n{extra}[server]\ntransport = "http"\nport = {port}\n'
                )
                return _valgrind(
                    [sys.executable, "-m", "toolwire.cli", "--config", str(cfg), "serve"],
                    log,
                    cwd=work,
                )

            return start

        starters = {
            "a": bare,
            "b": toolwire("served", 'enabled_plugins = []\n[tools]\nmodules = ["mcp_gateway"]\n'),
            "c": toolwire(
                "gateway",
                'enabled_plugins = ["mcp"]\n'
                '[plugins.mcp]\nname_template = "{tool}"\ncache_tools = false\n'
                "connect_timeout_s = 300\n"
                f'[plugins.mcp.servers.bare]\nurl = "{url_up}"\n',
            ),
        }
        for key in args.servers:
            counts = []
            for calls in (args.low, args.high):
                port = free_port()
                url = f"http://127.0.0.1:{port}/mcp"
                counts.append(_count(functools.partial(_at, starters[key], port), url, calls))
            per_call[key] = (counts[1] - counts[0]) / (args.high - args.low)
            print(f"({key}) {per_call[key] / 1e6:.3f} M instructions per call", flush=True)
    finally:
        stop(upstream)
        shutil.rmtree(work, ignore_errors=True)

    names = {
        "a": "(a) bare FastMCP",
        "b": "(b) toolwire serve",
        "c": "(c) gateway -> (a), gateway alone",
    }
    print(f"\n{'server':<36}{'M instr/call':>14}{'vs (a)':>9}")
    for key, n in per_call.items():
        ratio = f"{n / per_call['a']:.2f}" if "a" in per_call else "-"
        print(f"{names[key]:<36}{n / 1e6:>14.3f}{ratio:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
