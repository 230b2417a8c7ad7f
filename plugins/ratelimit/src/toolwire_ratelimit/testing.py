"""A fake HTTP provider for tests: a real server on 127.0.0.1 that misbehaves on command.

Standard library only (``http.server`` in a thread), so tests exercise a real
socket and a real HTTP client (httpx) end to end::

    from toolwire_ratelimit.testing import FakeProvider, Reply

    with FakeProvider("brave") as api:
        api.script(Reply(429, headers={"Retry-After": "2"}), Reply(200))   # then success
        api.script(Reply(401, json={"error": "Invalid API key"}), key="sk-bad")
        ... call tools that request api.url ...
        assert api.count() == 2

A script's last reply repeats. The request's key is read from the ``api_key``
or ``key`` query parameter, ``X-Api-Key``, ``X-Subscription-Token`` or
``Authorization: Bearer``; a reply may echo it
back in its body (``echo_key=True``), as some providers do.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeProvider", "Reply", "Request"]


@dataclass
class Reply:
    """One scripted answer.

    ``json`` (a JSON body) or ``body`` (bytes/str, sent as is); ``hang``: read
    the request and never answer (until the server stops); ``drop``: read the
    request and close the connection without an answer (the upstream may have
    done the work); ``delay``: seconds to wait before answering; ``echo_key``: add ``{"echo": "<the key sent>"}``
    to a JSON body (or append the key to a text body).
    """

    status: int = 200
    json: Any = None
    body: bytes | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    drop: bool = False
    delay: float = 0.0
    echo_key: bool = False


@dataclass(frozen=True)
class Request:
    """What the fake provider received."""

    method: str
    path: str
    query: dict[str, list[str]]
    key: str | None
    body: bytes


def _key_of(headers: Any, query: dict[str, list[str]]) -> str | None:
    for q in ("api_key", "key"):
        if query.get(q):
            return query[q][0]
    for h in ("X-Api-Key", "X-Subscription-Token"):
        if headers.get(h):
            return str(headers.get(h))
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        return str(auth[7:].strip())
    return None


class FakeProvider:
    """A scripted HTTP API on a free port of 127.0.0.1 (see the module docstring)."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.requests: list[Request] = []
        self._scripts: dict[str | None, list[Reply]] = {}
        self._served: dict[str | None, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        if self._server is None:
            raise RuntimeError("FakeProvider is not started (use `with FakeProvider() as api:`)")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply, key: str | None = None) -> FakeProvider:
        """Answer requests with ``key`` (None: any key without a script) by ``replies`` in turn."""
        with self._lock:
            self._scripts[key] = list(replies) or [Reply()]
            self._served[key] = 0
        return self

    def count(self, key: str | None = None, *, any_key: bool = True) -> int:
        """Requests received (with ``key``, or all when ``key`` is None and ``any_key``)."""
        with self._lock:
            if key is None and any_key:
                return len(self.requests)
            return sum(1 for r in self.requests if r.key == key)

    def start(self) -> FakeProvider:
        """Start serving in a daemon thread."""
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                req = Request(self.command, parts.path, query, _key_of(self.headers, query), body)
                reply = provider._next(req)
                if reply.hang:
                    provider._stop.wait(300)
                    self.close_connection = True
                    return
                if reply.drop:
                    self.close_connection = True
                    return
                if reply.delay:
                    provider._stop.wait(reply.delay)
                payload, ctype = provider._payload(reply, req)
                self.send_response(reply.status)
                headers = {"Content-Type": ctype, **reply.headers}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self._stop.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"fake-{self.name}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (hanging requests are released)."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------
    def _next(self, req: Request) -> Reply:
        with self._lock:
            self.requests.append(req)
            k: str | None = req.key if req.key in self._scripts else None
            script = self._scripts.get(k)
            if not script:
                return Reply(200, json={"provider": self.name, "results": [{"title": "ok"}]})
            i = self._served.get(k, 0)
            self._served[k] = i + 1
            return script[min(i, len(script) - 1)]

    def _payload(self, reply: Reply, req: Request) -> tuple[bytes, str]:
        if reply.json is not None or (reply.body is None and reply.status < 300):
            data = (
                reply.json
                if reply.json is not None
                else {"provider": self.name, "results": [{"title": "ok"}]}
            )
            if reply.echo_key and isinstance(data, dict):
                data = {**data, "echo": req.key}
            return json.dumps(data).encode(), "application/json"
        body = reply.body if reply.body is not None else b""
        raw = body.encode() if isinstance(body, str) else body
        if reply.echo_key and req.key:
            raw += b" key=" + req.key.encode()
        return raw, "text/plain; charset=utf-8"
