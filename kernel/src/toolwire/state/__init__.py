"""Pluggable state stores: the one place plugins keep shared state.

Pick a backend with a URL (``state = "..."`` in ``toolwire.toml``)::

    memory://                         this process only (tests, one worker)
    sqlite:///relative/path.db        one file for the processes of one host
    sqlite:////absolute/path.db
    redis://[:password@]host:port/db  shared by hosts (asyncio only)
    rediss://...                      Redis over TLS
    unix:///path/redis.sock?db=0      Redis over a Unix socket
    redis+cluster://host:port         a Redis Cluster (one seed node; rediss+cluster:// for TLS)

``open_store(url)`` builds the store; it connects on first use (or call
``await store.open()`` / use ``async with``). The Redis backend needs the
optional dependency: ``pip install 'toolwire[redis]'``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from ._base import (
    ANY,
    MAX_TTL_S,
    Entry,
    StateDataError,
    StateNotAppliedError,
    StateStore,
    StateStoreError,
)
from ._memory import MemoryStore
from ._redis import RedisStore, redact_url
from ._sqlite import SQLiteStore

__all__ = [
    "ACCEPTED_SCHEMES",
    "ANY",
    "MAX_TTL_S",
    "Entry",
    "MemoryStore",
    "RedisStore",
    "STORE_SCHEMES",
    "SQLiteStore",
    "StateDataError",
    "StateNotAppliedError",
    "StateStore",
    "StateStoreError",
    "open_store",
    "redact_url",
]

#: What :func:`open_store` accepts, as shown in its error messages.
ACCEPTED_SCHEMES = (
    "memory://",
    "sqlite:///relative/path.db",
    "sqlite:////absolute/path.db",
    "redis://host:port/db",
    "rediss://host:port/db",
    "unix:///path/to/redis.sock",
    "redis+cluster://host:port",
    "rediss+cluster://host:port",
)

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
#: The URL schemes :func:`open_store` knows.
STORE_SCHEMES = frozenset({"memory", "sqlite", *_REDIS_SCHEMES})


def open_store(url: str, *, clock: Callable[[], float] | None = None) -> StateStore:
    """The state store for ``url`` (see the module docstring); not connected yet.

    ``clock`` (wall-clock seconds, default ``time.time``) drives expiry for the
    memory and SQLite backends; Redis always uses the server's clock, so any
    clock other than ``None`` / ``time.time`` with a Redis URL is a
    ``ValueError`` (a fake test clock would silently not apply). An unknown scheme or a
    malformed URL is a ``ValueError`` naming the URL and the accepted forms;
    a Redis URL without redis-py installed is a :class:`StateStoreError`.
    """
    if not isinstance(url, str):
        raise TypeError(f"state store URL must be a str, not {type(url).__name__}")
    shown = redact_url(url)
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise ValueError(f"malformed state store URL {shown!r}: {exc}") from exc
    scheme = parts.scheme.lower()

    if scheme == "memory":
        if parts.netloc or parts.path or parts.query:
            raise ValueError(f"state store URL {shown!r}: memory:// takes no host, path or query")
        return MemoryStore(clock=clock)

    if scheme == "sqlite":
        if not url.strip().lower().startswith("sqlite:///") or parts.netloc:
            raise ValueError(
                f"state store URL {shown!r}: write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (three slashes, then the path)"
            )
        path = os.path.expanduser(unquote(parts.path[1:]))
        if not path:
            raise ValueError(f"state store URL {shown!r} has no database path")
        options: dict[str, float] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name != "busy_timeout":
                raise ValueError(
                    f"state store URL {shown!r}: unknown option {name!r} "
                    "(sqlite:// accepts ?busy_timeout=<seconds>)"
                )
            try:
                options[name] = float(value)
            except ValueError:
                raise ValueError(
                    f"state store URL {shown!r}: busy_timeout must be a number of seconds"
                ) from None
        try:
            return SQLiteStore(path, clock=clock, **options)
        except ValueError as exc:  # busy_timeout out of range
            raise ValueError(f"state store URL {shown!r}: {exc}") from None

    if scheme in _REDIS_SCHEMES:
        if clock is not None and clock is not time.time:
            raise ValueError(
                f"state store URL {shown!r}: the redis backend uses the Redis server's clock; "
                "clock= only applies to memory:// and sqlite://"
            )
        db = parts.path.strip("/")
        if scheme != "unix" and db and not db.isdigit():
            # redis-py ignores a database it cannot parse and uses 0: say so instead
            raise ValueError(
                f"state store URL {shown!r}: the path must be a database number "
                f"(redis://host:6379/0), not {parts.path!r}"
            )
        return RedisStore(url.strip())

    raise ValueError(f"unknown state store URL {shown!r}: use one of {', '.join(ACCEPTED_SCHEMES)}")
