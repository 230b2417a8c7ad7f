"""Hostile MCP clients against ``toolwire serve`` over Streamable HTTP, on both paths.

Each bad request gets the protocol's error or an ``isError`` result naming the
problem, the same from the lean ``tools/call`` path as from FastMCP's handler;
the gateway keeps serving, and a client cannot make it write what it likes
to the log.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import pytest
from test_fastpath import TOOLS, asgi_client, both, envelope, headers_for, post, serving
from toolwire_mcp_testkit import eventually

from toolwire import Kernel
from toolwire_mcp import ServeConfig, create_http_app
from toolwire_mcp._calls import ServeGate
from toolwire_mcp._serve import route_foreign_logs

pytestmark = pytest.mark.anyio

_CALL = envelope("greet", {"name": "x"})
_H = headers_for(_CALL)
_SCALE_H = headers_for(envelope("scale"))


def _dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


def _with(**params: Any) -> bytes:
    """The greet call with ``params`` set (a value of None: the key left out)."""
    p = {**_CALL["params"], **params}
    return _dumps({**_CALL, "params": {k: v for k, v in p.items() if v is not None}})


def _scale(raw_arguments: bytes) -> bytes:
    return _dumps(envelope("scale", {"x": 0})).replace(b'{"x": 0}', raw_arguments)


_INVALID_REQUEST = (400, -32600)
_INVALID_PARAMS = (400, -32602)
_HEADER_MISMATCH = (400, -32020)
_PARSE_ERROR = (400, -32700)
_OK = (200, None)

#: name -> (body, headers, (status, JSON-RPC error code or None for a result)).
CASES: dict[str, tuple[bytes, dict[str, str], tuple[int, int | None]]] = {
    "empty_batch": (b"[]", _H, _INVALID_REQUEST),
    "batch": (_dumps([_CALL, envelope("greet", {"name": "y"}, rid=2)]), _H, _INVALID_REQUEST),
    "mixed_batch": (_dumps([_CALL, 5, "x", None]), _H, _INVALID_REQUEST),
    "id_null": (_dumps(envelope("greet", {"name": "x"}, rid=None)), _H, _INVALID_REQUEST),
    "id_float": (_dumps(envelope("greet", {"name": "x"}, rid=1.5)), _H, _INVALID_REQUEST),
    "id_bool": (_dumps(envelope("greet", {"name": "x"}, rid=False)), _H, _INVALID_REQUEST),
    "id_object": (_dumps(envelope("greet", {"name": "x"}, rid={"a": 1})), _H, _INVALID_REQUEST),
    "id_huge_int": (_dumps(envelope("greet", {"name": "x"}, rid=10**30)), _H, _OK),
    "id_negative": (_dumps(envelope("greet", {"name": "x"}, rid=-5)), _H, _OK),
    "id_long_string": (_dumps(envelope("greet", {"name": "x"}, rid="i" * 100_000)), _H, _OK),
    "jsonrpc_1_0": (_dumps({**_CALL, "jsonrpc": "1.0"}), _H, _INVALID_REQUEST),
    "params_list": (_dumps({**_CALL, "params": [1]}), _H, _INVALID_REQUEST),
    "params_string": (_dumps({**_CALL, "params": "x"}), _H, _INVALID_REQUEST),
    "params_null": (_dumps({**_CALL, "params": None}), _H, _INVALID_PARAMS),
    "arguments_string": (_dumps(envelope("greet", "x")), _H, _INVALID_PARAMS),
    "arguments_number": (_dumps(envelope("greet", 5)), _H, _INVALID_PARAMS),
    "meta_list": (_with(_meta=[]), _H, _INVALID_PARAMS),
    "meta_string": (_with(_meta="x"), _H, _INVALID_PARAMS),
    "name_number": (_with(name=5), _H, _HEADER_MISMATCH),
    "name_with_nul": (_with(name="gr\x00eet"), _H, _HEADER_MISMATCH),
    "name_lone_surrogate": (_with(name="gr\udc00"), _H, _HEADER_MISMATCH),
    "lone_surrogate_argument": (_dumps(envelope("greet", {"name": "\ud800"})), _H, _OK),
    "nested_too_deep": (
        _dumps(_CALL).replace(b'{"name": "x"}', b'{"d": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        _H,
        _PARSE_ERROR,
    ),
    "trailing_garbage": (_dumps(_CALL) + b"xx", _H, _PARSE_ERROR),
    "not_utf8": (_dumps(_CALL).replace(b'"x"', b'"\xe9"'), _H, _PARSE_ERROR),
    "empty_body": (b"", _H, _PARSE_ERROR),
    "number_1e400": (_scale(b'{"x": 1e400}'), _SCALE_H, _OK),
    "number_minus_zero": (_scale(b'{"x": -0.0}'), _SCALE_H, _OK),
    "number_nan_literal": (_scale(b'{"x": NaN}'), _SCALE_H, _OK),
    "duplicate_id_keys": (_dumps(_CALL).replace(b'"id": 1', b'"id": 1, "id": "two"'), _H, _OK),
    "method_header_disagrees": (
        _dumps(_CALL),
        {**_H, "mcp-method": "tools/list"},
        _HEADER_MISMATCH,
    ),
    "name_header_missing": (
        _dumps(_CALL),
        {k: v for k, v in _H.items() if k != "mcp-name"},
        _HEADER_MISMATCH,
    ),
    "name_header_other_case": (_dumps(_CALL), {**_H, "mcp-name": "GREET"}, _HEADER_MISMATCH),
}


async def test_hostile_bodies_and_headers_get_the_same_answer_on_both_paths() -> None:
    """Each answer is the protocol's error (or a result), alike from both paths."""
    wrong: list[str] = []
    async with both() as (fast, slow):
        for case, (raw, hdrs, (status, code)) in CASES.items():
            expected = await post(slow.url, None, hdrs, raw=raw)
            got = await post(fast.url, None, hdrs, raw=raw)
            if got != expected:
                wrong.append(f"{case}: lean {got!r:.300} != FastMCP {expected!r:.300}")
                continue
            got_status, ctype, answer = got
            if got_status != status or ctype != "application/json":
                wrong.append(f"{case}: {got_status} {ctype} {answer!r:.300}")
            elif code is not None and answer.get("error", {}).get("code") != code:
                wrong.append(f"{case}: expected error {code}, got {answer!r:.300}")
            elif code is None and "result" not in answer:
                wrong.append(f"{case}: expected a result, got {answer!r:.300}")
        # and the gateway still answers an ordinary call on the lean path
        taken = fast.fast.taken if fast.fast is not None else -1
        status, _, answer = await post(fast.url, _CALL)
        assert fast.fast is not None and fast.fast.taken == taken + 1
    assert not wrong, "\n".join(wrong)
    assert answer["result"]["structuredContent"] == {"result": "hello x"}


async def test_ids_of_any_size_come_back_exactly() -> None:
    async with both() as (fast, slow):
        for rid in (10**30, -(2**63) - 1, "i" * 100_000, "\u2028\U0001f600"):
            body = envelope("greet", {"name": "x"}, rid=rid)
            for served in (fast, slow):
                _, _, answer = await post(served.url, body)
                assert answer["id"] == rid


async def test_a_notification_where_a_request_belongs_is_accepted_unanswered() -> None:
    body = {k: v for k, v in _CALL.items() if k != "id"}
    async with both() as (fast, slow):
        got = await post(fast.url, None, _H, raw=_dumps(body))
        assert got == await post(slow.url, None, _H, raw=_dumps(body))
    assert got[:2] == (202, "")


@contextmanager
def _records(name: str, level: int = logging.DEBUG) -> Iterator[list[logging.LogRecord]]:
    """The records logger ``name`` lets through its filters while the block runs."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger(name)
    handler, old_level = Keep(level), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


async def test_a_clients_unknown_tool_name_is_not_written_to_the_log() -> None:
    """Before: FastMCP's handler wrapped each unknown name in a tool, whose SEP-986 check
    logged five warnings quoting the name whole: a client wrote up to 4 MiB to the log per
    request, unthrottled."""
    name = "no such tool " + "z" * 50_000
    body = envelope(name, {})
    async with Kernel(tools=TOOLS) as k:
        app = create_http_app(k, ServeConfig(transport="http", port=0, fast_path=False))
        with _records("mcp.shared.tool_name_validation") as logged:
            async with asgi_client(app) as c:
                r = await c.post("/mcp", json=body, headers=headers_for(body))
    result = r.json()["result"]
    assert result["isError"] is True
    assert result["_meta"]["io.toolwire/error"]["kind"] == "not_found"
    assert logged == []


@contextmanager
def _foreign_logs_routed() -> Iterator[None]:
    """``route_foreign_logs()`` as ``toolwire serve`` runs it; the loggers restored after."""
    names = ("fastmcp", "mcp", "uvicorn", "uvicorn.error", "uvicorn.access", "httpx2")
    names += ("mcp.client.stdio", "mcp.server.stdio", "mcp.server.streamable_http")
    saved = {}
    for n in names:
        lg = logging.getLogger(n)
        saved[n] = (list(lg.filters), list(lg.handlers), lg.propagate, lg.level)
    try:
        route_foreign_logs()
        yield
    finally:
        for n, (filters, handlers, propagate, level) in saved.items():
            lg = logging.getLogger(n)
            lg.filters[:], lg.handlers[:] = filters, handlers
            lg.propagate, lg.level = propagate, level


def _cut_off(port: int, head: bytes, part: bytes) -> None:
    """Send a request's head and part of its body, then leave."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head + part)


def _head(port: int, extra: str) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in _H.items())
    return f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{lines}{extra}\r\n".encode()


@pytest.mark.parametrize("fast_path", [True, False])
async def test_a_body_cut_off_midway_leaves_no_traceback_in_the_log(fast_path: bool) -> None:
    """Before: FastMCP's 2026-07-28 handler let ``ClientDisconnect`` rise to uvicorn, which
    logged "Exception in ASGI application" with a traceback; five a minute filled the
    throttle that message shares with the server's real errors, hiding them."""
    raw = _dumps(_CALL)
    with _foreign_logs_routed(), _records("uvicorn.error", logging.WARNING) as logged:
        seen: list[logging.LogRecord] = []  # the tracebacks, filtered out or not
        spy = logging.Filter()
        spy.filter = lambda r: not r.exc_info or seen.append(r) is None  # type: ignore[method-assign]
        logging.getLogger("uvicorn.error").filters.insert(0, spy)  # sees what the others drop
        async with Kernel(tools=TOOLS) as k, serving(k, fast_path=fast_path) as served:
            port = int(served.url.split(":")[2].split("/")[0])
            # chunked: not taken by the lean path (it needs a Content-Length), so FastMCP reads
            chunked = _head(port, "transfer-encoding: chunked\r\n")
            part = b"%x\r\n" % len(raw) + raw[:10]
            await anyio.to_thread.run_sync(_cut_off, port, chunked, part)
            sized = _head(port, f"content-length: {len(raw)}\r\n")
            await anyio.to_thread.run_sync(_cut_off, port, sized, raw[:10])
            await eventually(lambda: len(seen) >= (2 if not fast_path else 1))
            # still serving
            _, _, answer = await post(served.url, _CALL)
            assert answer["result"]["structuredContent"] == {"result": "hello x"}
    assert all("ClientDisconnect" in repr(r.exc_info) for r in seen), seen
    assert logged == []


async def test_over_the_body_limit_is_413_on_both_paths() -> None:
    async with both() as (fast, slow):
        for served in (fast, slow):
            port = int(served.url.split(":")[2].split("/")[0])
            head = _head(port, f"content-length: {5 * 1024 * 1024}\r\n")
            answer = await anyio.to_thread.run_sync(_exchange, port, head + b"{" * 1024)
            assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
            chunk = b" " * (1 << 20)
            chunked = (
                _head(port, "transfer-encoding: chunked\r\n")
                + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 5
            )
            answer = await anyio.to_thread.run_sync(_exchange, port, chunked)
            assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert fast.fast is not None and fast.fast.taken == 0


def _first_bytes(port: int, data: bytes) -> bytes:
    """Send ``data``, read the first bytes of the answer, and leave."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10.0)
        s.sendall(data)
        return s.recv(16)


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data``; what comes back until the server closes, or within 2 s of quiet."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(2.0)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed under a body it refused: its answer was sent first
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


async def test_pipelined_calls_are_answered_in_order_each_with_its_own_id() -> None:
    async with Kernel(tools=TOOLS) as k, serving(k) as served:
        port = int(served.url.split(":")[2].split("/")[0])
        data = b""
        for i, name in enumerate(("ann", "bob", "cy")):
            raw = _dumps(envelope("greet", {"name": name}, rid=f"r{i}"))
            close = "connection: close\r\n" if name == "cy" else ""
            data += _head(port, f"content-length: {len(raw)}\r\n{close}") + raw
        answer = await anyio.to_thread.run_sync(_exchange, port, data)
        assert served.fast is not None and served.fast.taken == 3
    assert answer.count(b"HTTP/1.1 200 OK") == 3, answer
    decoder = json.JSONDecoder()  # each answer's JSON ends where the next answer's head starts
    parts = answer.decode().split("\r\n\r\n")[1:]
    bodies = [decoder.raw_decode(p)[0] for p in parts]
    assert [(b["id"], b["result"]["structuredContent"]) for b in bodies] == [
        ("r0", {"result": "hello ann"}),
        ("r1", {"result": "hello bob"}),
        ("r2", {"result": "hello cy"}),
    ]


async def test_the_same_id_in_flight_many_times_gets_each_its_own_answer() -> None:
    names = [f"n{i}" for i in range(30)]
    async with both() as (fast, slow):
        answers: dict[tuple[str, str], Any] = {}

        async def call(url: str, name: str) -> None:
            body = envelope("greet", {"name": name}, rid=7)
            answers[url, name] = await post(url, body)

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(call, fast.url, name)
                tg.start_soon(call, slow.url, name)
    for (_, name), (status, _, answer) in answers.items():
        assert status == 200 and answer["id"] == 7
        assert answer["result"]["structuredContent"] == {"result": f"hello {name}"}
    assert len(answers) == 60


async def test_a_client_leaving_mid_stream_leaves_no_call_behind() -> None:
    gate = ServeGate()
    body = envelope("steps", {"n": 3}, meta={"progressToken": "t"})
    raw = _dumps(body)
    async with Kernel(tools=TOOLS) as k, serving(k, gate=gate) as served:
        port = int(served.url.split(":")[2].split("/")[0])
        head = _head(port, f"content-length: {len(raw)}\r\n")
        request = head.replace(b"mcp-name: greet", b"mcp-name: steps") + raw
        for _ in range(5):
            first = await anyio.to_thread.run_sync(_first_bytes, port, request)
            assert first.startswith(b"HTTP/1.1 200"), first  # the answer began; leave
        await eventually(lambda: gate.inflight == 0)
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(served.url, json=body, headers=headers_for(body))
        assert served.fast is not None and served.fast.taken == 6
    assert r.headers["content-type"] == "text/event-stream"
    assert '"structuredContent":{"done":3}' in r.text
