"""MCP gateway overhead: bare FastMCP vs `toolwire serve`, over Streamable HTTP.

One run, same tool, same machine, four servers (each its own process):

- (a) bare: a FastMCP server with the ``echo`` tool,
- (b) served: ``toolwire serve --transport http`` serving the same ``echo`` as a
  local tool (no plugins, memory state),
- (c) gateway: ``toolwire serve --transport http`` fronting (a) through the
  ``mcp`` plugin (the tool keeps its name: ``name_template = "{tool}"``),
- (d) relay: a TCP relay doing no work in front of (a) — what any proxy pays
  for the extra hop on this machine, so (c) - (d) is toolwire's own work,
- (e) with ``--pin-gateway CPU`` only: (c) again, its process pinned to one
  CPU (as ``taskset -c CPU toolwire serve`` would), reported beside (c) so an
  operator can see what pinning does on their machine; the targets are
  judged on (c), which runs as ``toolwire serve`` does by default.

For each: per-call latency (sequential calls: mean, p50, p95; the servers take
turns every ``--block`` calls, so drift hits all alike) and throughput
(sequential, and 20 concurrent callers), measured with FastMCP clients in this
process. Prints the figures and the ratios against (a), and each server
process's own CPU per sequential call (its event-loop thread, from
``/proc/PID/schedstat``): on a shared machine whose speed drifts, the CPU
ratio of servers measured in the same blocks is the steadier figure.

Targets (issue #3): (b)/(a) latency <= 1.15 and throughput >= 0.9;
(c)/(a) latency <= 1.4.

Run: ``uv run python bench/mcp_gateway.py [--calls N] [--concurrency C] [--pin-gateway CPU]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from fastmcp import Client, FastMCP

from toolwire import tool

HERE = Path(__file__).resolve().parent


# The tool under test, twice: as a FastMCP function tool and as a toolwire tool.
def _echo(message: str, times: int = 1) -> dict[str, Any]:
    return {"message": message * times, "length": len(message) * times}


bare = FastMCP("bare")
bare.tool(name="echo", description="Echo a message.")(_echo)


@tool(name="echo", description="Echo a message.")
def echo(message: str, times: int = 1) -> dict[str, Any]:
    """Echo a message."""
    return _echo(message, times)


# --------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWIRE_", "TOOLS_AUTH_"))}
    e["PYTHONPATH"] = str(HERE) + os.pathsep + e.get("PYTHONPATH", "")
    e["FASTMCP_LOG_LEVEL"] = "WARNING"
    return e


def start_bare(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__)), "--serve-bare", str(port)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def start_relay(port: int, upstream_port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__)), "--serve-relay", str(port), str(upstream_port)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def _relay(port: int, upstream_port: int) -> None:
    """A TCP relay doing no work: the floor any proxy pays for the extra hop."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
        finally:
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def start_toolwire(
    config: Path, workdir: Path, cpus: set[int] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``toolwire serve`` on ``config``; ``cpus``: pin the process to these CPUs (Linux).

    Pinned, a small launcher sets its own affinity and then execs the server, so
    every thread the server starts inherits it.
    """
    cmd = [sys.executable, "-m", "toolwire.cli", "--config", str(config), "serve"]
    if cpus is not None:
        launch = (
            "import os, sys; os.sched_setaffinity(0, {%s}); os.execv(sys.argv[1], sys.argv[1:])"
        )
        cmd = [sys.executable, "-c", launch % ", ".join(map(str, sorted(cpus))), *cmd]
    proc = subprocess.Popen(
        cmd, cwd=workdir, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode()
        if not line:
            break
        m = re.search(r"at (http://\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"toolwire serve did not start ({config})")


async def wait_http(url: str) -> None:
    with anyio.fail_after(60):
        while True:
            try:
                async with Client(url, timeout=5) as c:
                    await c.list_tools()
                return
            except Exception:
                await anyio.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# ---------------------------------------------------------------- measuring
ARGS = {"message": "hello", "times": 2}
EXPECTED = {"message": "hellohello", "length": 10}


@dataclass
class Figures:
    mean_ms: float
    p50_ms: float
    p95_ms: float
    seq_per_s: float
    conc_per_s: float


def cpu_s(pid: int) -> float:
    """CPU time a process's main thread (the event loop) has used so far, in seconds.

    From ``/proc/PID/schedstat`` (nanoseconds); 0.0 where there is no such file.
    """
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


async def latencies(
    urls: dict[str, str], pids: dict[str, int], calls: int, block: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Sequential per-call latency of each server, the servers taking turns in blocks.

    Within a block of ``block`` calls a server is warm, as under steady use;
    taking turns block by block means whatever else the machine does (and the
    client's own garbage collection) hits every server alike, so the ratios
    are steadier than whole runs done one server after another.

    Also returns the CPU seconds each server's own process spent over its
    blocks (``pids``): on a shared machine whose speed drifts, the CPU ratio
    between servers measured in the same blocks is the steadier figure.
    """
    out: dict[str, list[float]] = {key: [] for key in urls}
    cpu: dict[str, float] = dict.fromkeys(urls, 0.0)
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            key: await stack.enter_async_context(Client(url, timeout=30))
            for key, url in urls.items()
        }
        for c in clients.values():
            await c.list_tools()
            for _ in range(max(20, calls // 10)):  # warm up
                r = await c.call_tool_mcp("echo", ARGS)
                assert not r.is_error, r
        for _ in range(max(1, calls // block)):
            for key, c in clients.items():
                c0 = cpu_s(pids[key])
                for _ in range(block):
                    s = time.perf_counter()
                    r = await c.call_tool_mcp("echo", ARGS)
                    out[key].append((time.perf_counter() - s) * 1000)
                    assert r.structured_content == EXPECTED, r
                cpu[key] += cpu_s(pids[key]) - c0
    return out, cpu


async def throughput(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    """(sequential, concurrent) calls per second against one server."""
    async with Client(url, timeout=30) as c:
        for _ in range(20):
            await c.call_tool_mcp("echo", ARGS)
        t0 = time.perf_counter()
        for _ in range(calls):
            r = await c.call_tool_mcp("echo", ARGS)
            assert not r.is_error
        seq = calls / (time.perf_counter() - t0)
        per_worker = max(1, calls // concurrency)

        async def worker() -> None:
            for _ in range(per_worker):
                r = await c.call_tool_mcp("echo", ARGS)
                assert not r.is_error

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        conc = per_worker * concurrency / (time.perf_counter() - t0)
    return seq, conc


async def run(calls: int, concurrency: int, rounds: int, block: int, pin: int | None) -> int:
    port_a = free_port()
    url_a = f"http://127.0.0.1:{port_a}/mcp"
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "served.toml").write_text(
            'state = "memory://"\nenabled_plugins = []\n'
            '[tools]\nmodules = ["mcp_gateway"]\n'
            '[server]\ntransport = "http"\nport = 0\n'
        )
        (work / "gateway.toml").write_text(
            'state = "memory://"\nenabled_plugins = ["mcp"]\n'
            '[server]\ntransport = "http"\nport = 0\n'
            '[plugins.mcp]\nname_template = "{tool}"\ncache_tools = false\n'
            f'[plugins.mcp.servers.bare]\nurl = "{url_a}"\n'
        )
        try:
            procs.append(start_bare(port_a))
            await wait_http(url_a)
            proc_b, url_b = start_toolwire(work / "served.toml", work)
            procs.append(proc_b)
            proc_c, url_c = start_toolwire(work / "gateway.toml", work)
            procs.append(proc_c)
            await wait_http(url_b)
            await wait_http(url_c)
            port_d = free_port()
            procs.append(start_relay(port_d, port_a))
            url_d = f"http://127.0.0.1:{port_d}/mcp"
            await wait_http(url_d)
            urls = {"a": url_a, "b": url_b, "c": url_c, "d": url_d}
            if pin is not None:
                proc_e, url_e = start_toolwire(work / "gateway.toml", work, {pin})
                procs.append(proc_e)
                await wait_http(url_e)
                urls["e"] = url_e
            pids = {key: p.pid for key, p in zip(urls, procs, strict=True)}
            lat: dict[str, list[float]] = {key: [] for key in urls}
            cpu: dict[str, float] = dict.fromkeys(urls, 0.0)
            tput: dict[str, list[tuple[float, float]]] = {key: [] for key in urls}
            for _ in range(rounds):
                per_call, spent = await latencies(urls, pids, calls, block)
                for key, values in per_call.items():
                    lat[key].extend(values)
                    cpu[key] += spent[key]
                for key, url in urls.items():
                    tput[key].append(await throughput(url, calls, concurrency))
        finally:
            for p in procs:
                stop(p)

    def figures(key: str) -> Figures:
        ms = sorted(lat[key])
        return Figures(
            mean_ms=statistics.fmean(ms),
            p50_ms=ms[len(ms) // 2],
            p95_ms=ms[int(len(ms) * 0.95) - 1],
            seq_per_s=max(t[0] for t in tput[key]),
            conc_per_s=max(t[1] for t in tput[key]),
        )

    fig = {key: figures(key) for key in lat}
    a, b, c, d = fig["a"], fig["b"], fig["c"], fig["d"]
    names = {
        "a": "(a) bare FastMCP",
        "b": "(b) toolwire serve",
        "c": "(c) toolwire -> (a)",
        "d": "(d) TCP relay -> (a)",
        "e": f"(e) (c) on CPU {pin}",
    }
    print(
        f"latency: {rounds} x {calls} sequential calls per server, the servers taking turns "
        f"every {block} calls; throughput: best of {rounds} runs ({calls} sequential calls, then "
        f"{concurrency} concurrent callers)"
    )
    print(
        f"{'server':<22}{'mean ms':>9}{'p50 ms':>9}{'p95 ms':>9}{'seq/s':>9}{'conc/s':>9}"
        f"{'cpu ms':>9}"
    )
    for key, f in fig.items():
        print(
            f"{names[key]:<22}{f.mean_ms:>9.3f}{f.p50_ms:>9.3f}{f.p95_ms:>9.3f}"
            f"{f.seq_per_s:>9.0f}{f.conc_per_s:>9.0f}{cpu[key] / len(lat[key]) * 1000:>9.3f}"
        )
    print(
        "cpu ms: the server process's own CPU per sequential call (for (c), the gateway's "
        "alone; (a)'s work is on top)"
    )
    checks = [
        ("(b)/(a) latency (mean)", b.mean_ms / a.mean_ms, "<=", 1.15),
        ("(b)/(a) latency (p50)", b.p50_ms / a.p50_ms, "<=", 1.15),
        ("(b)/(a) throughput sequential", b.seq_per_s / a.seq_per_s, ">=", 0.9),
        (f"(b)/(a) throughput {concurrency} concurrent", b.conc_per_s / a.conc_per_s, ">=", 0.9),
        ("(c)/(a) latency (mean)", c.mean_ms / a.mean_ms, "<=", 1.4),
        ("(c)/(a) latency (p50)", c.p50_ms / a.p50_ms, "<=", 1.4),
    ]
    print(f"gateway CPU / (a) CPU per call: {cpu['c'] / cpu['a']:.2f}")
    print(
        f"the hop alone (d)/(a): mean {d.mean_ms / a.mean_ms:.2f}, p50 {d.p50_ms / a.p50_ms:.2f}; "
        f"toolwire's own work per call, (c) - (d): mean {c.mean_ms - d.mean_ms:.3f} ms, "
        f"p50 {c.p50_ms - d.p50_ms:.3f} ms"
    )
    if "e" in fig:
        e = fig["e"]
        print(
            f"(e)/(a), the gateway pinned to CPU {pin} (not a target; (c) is the default): "
            f"mean {e.mean_ms / a.mean_ms:.2f}, p50 {e.p50_ms / a.p50_ms:.2f}; "
            f"its CPU per call {cpu['e'] / len(lat['e']) * 1000:.3f} ms against (c)'s "
            f"{cpu['c'] / len(lat['c']) * 1000:.3f} ms"
        )
    ok = True
    for label, ratio, op, target in checks:
        met = ratio <= target if op == "<=" else ratio >= target
        ok &= met
        print(f"{label:<36}{ratio:>6.2f}  (target {op} {target}) {'ok' if met else 'MISSED'}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=400, help="sequential calls per round")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block", type=int, default=50, help="calls per server before the next")
    p.add_argument(
        "--pin-gateway",
        type=int,
        metavar="CPU",
        help="also measure (e): the gateway (c) pinned to this CPU (Linux; informational)",
    )
    p.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--serve-relay", type=int, nargs=2, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_relay:
        asyncio.run(_relay(*args.serve_relay))
        return 0
    if args.serve_bare:
        bare.run(
            transport="http",
            host="127.0.0.1",
            port=args.serve_bare,
            show_banner=False,
            log_level="warning",
        )
        return 0
    if args.pin_gateway is not None and not hasattr(os, "sched_setaffinity"):
        p.error("--pin-gateway needs os.sched_setaffinity (Linux)")
    code: int = anyio.run(
        run, args.calls, args.concurrency, args.rounds, args.block, args.pin_gateway
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
