"""Redis state store: shared by every process and host that reaches one Redis.

Layout: one Redis *hash* per logical record, at exactly the key the caller
gave (no prefix), so every operation touches a single key and a Redis
Cluster shards records freely (``redis+cluster://`` URLs: one seed node, the
rest discovered; see :class:`RedisStore`)::

    v    the value, as JSON text
    ver  the version (decimal int)
    o    the owner (field absent: no owner)
    x    the expiry, ms since the epoch (field absent: no expiry); the key
         also carries the same PEXPIREAT, so Redis itself hides and evicts it

Every write is one Lua script (atomic), which also PUBLISHes on
``toolwire:changed:<key>`` so ``wait_for_change`` wakes at once. Versions of a
new key start at the server time in nanoseconds (microseconds * 1000) and go up
by one per write, so a key deleted or expired and created again never gets an
old version back (that would take 1000 writes per microsecond to one key, or
the server clock stepping back). All arithmetic on versions is done by Redis
(HINCRBY) on 64-bit integers, never in Lua doubles. TTLs use the Redis
server's clock. Needs Redis >= 5 (scripts read TIME before writing).

On a cluster, PUBLISH from a script reaches every node, so the store's one
pub/sub connection (to whichever node owns the first channel's slot) hears
the changes of every shard.

``redis.asyncio`` only runs under asyncio: so does this backend (a clear
:class:`StateStoreError` is raised under trio).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import anyio

from ._base import (
    ANY,
    CLOSED_HINT,
    Entry,
    StateDataError,
    StateNotAppliedError,
    StateStore,
    StateStoreError,
    _changed,
    _check_amount,
    _check_expected,
    _check_key,
    _check_timeout,
    _check_ttl,
    _decode,
    _encode,
    _not_int_error,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.client import PubSub
    from redis.commands.core import AsyncScript

__all__ = ["CLUSTER_SCHEMES", "RedisStore", "redact_url"]

#: URL schemes of a Redis Cluster (the scheme without ``+cluster`` is the connection's).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

_log = logging.getLogger(__name__)
_running_loop = asyncio._get_running_loop

#: Channel a write publishes on; the key follows the prefix verbatim.
CHANNEL_PREFIX = "toolwire:changed:"

_INSTALL_HINT = "pip install 'toolwire[redis]'"

# Fallback poll of waiters: fast while pub/sub is not confirmed, slow once it is.
_POLL_MIN, _POLL_MAX = 0.05, 0.25
_POLL_SUBSCRIBED = 1.0
_CONFIRM_TIMEOUT = 1.0  # max wait for a SUBSCRIBE confirmation before polling
_LISTEN_TIMEOUT = 0.5  # the listener's read timeout (also its housekeeping period)
_SCAN_BATCH = 500
#: A ``rediss://`` store whose first PING is still in its TLS handshake after this many
#: seconds asks the port, on a second connection, whether it speaks Redis without TLS.
TLS_PROBE_AFTER_S = 1.0


def redact_url(url: str) -> str:
    """``url`` with any password (user-info or ``?password=``) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _QUERY_PASSWORD.sub(r"\1***", url)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        elif userinfo:
            userinfo = "***"  # redis://secret@host: a bare password
        netloc = f"{userinfo}@{hostport}"
    return scheme + sep + netloc + _QUERY_PASSWORD.sub(r"\1***", tail)


_QUERY_PASSWORD = re.compile(r"(?i)([?&;]password=)[^&;#]*")


# -- Lua ---------------------------------------------------------------------
# Return convention of the write scripts: false (nil) when the condition
# failed, else one string "<ver>:<expires_ms>:<o>" where <o> is "-" (no owner)
# or "=" .. owner (one bulk string: each RESP element costs the client ~4 µs).
_LUA_PRELUDE = """
local k = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function bump(existed)
  if existed then
    redis.call('HINCRBY', k, 'ver', 1)
  else
    local t = redis.call('TIME')
    redis.call('HSET', k, 'ver', t[1] .. string.format('%06d', tonumber(t[2])) .. '000')
  end
end
local function apply_owner(mode, owner)
  if mode == 'set' then
    redis.call('HSET', k, 'o', owner)
  elseif mode == 'clear' then
    redis.call('HDEL', k, 'o')
  end
end
local function apply_ttl(ttl_ms)
  if ttl_ms == '' then
    redis.call('HDEL', k, 'x')
    redis.call('PERSIST', k)
  else
    local at = string.format('%.0f', now_ms() + tonumber(ttl_ms))
    redis.call('HSET', k, 'x', at)
    redis.call('PEXPIREAT', k, at)
  end
end
local function matches(existed, ev_mode, ev, eo_mode, eo)
  if ev_mode == 'absent' then
    if existed then return false end
  elseif ev_mode == 'eq' then
    if not existed or redis.call('HGET', k, 'ver') ~= ev then return false end
  end
  if eo_mode ~= 'any' then
    if not existed then return false end
    local o = redis.call('HGET', k, 'o')
    if eo_mode == 'none' then
      if o then return false end
    elseif o ~= eo then
      return false
    end
  end
  return true
end
local function done(chan)
  local r = redis.call('HMGET', k, 'ver', 'o', 'x')
  redis.call('PUBLISH', chan, r[1])
  return r[1] .. ':' .. (r[3] or '') .. ':' .. (r[2] and ('=' .. r[2]) or '-')
end
"""

# ARGV: chan, value, owner_mode, owner, ttl_ms
_LUA_SET = """
bump(redis.call('EXISTS', k) == 1)
redis.call('HSET', k, 'v', ARGV[2])
apply_owner(ARGV[3], ARGV[4])
apply_ttl(ARGV[5])
return done(ARGV[1])
"""

# ARGV: chan, value, owner_mode, owner, ttl_ms
_LUA_SET_IF_ABSENT = """
if redis.call('EXISTS', k) == 1 then return false end
bump(false)
redis.call('HSET', k, 'v', ARGV[2])
apply_owner(ARGV[3], ARGV[4])
apply_ttl(ARGV[5])
return done(ARGV[1])
"""

# ARGV: chan, value, owner_mode, owner, ttl_ms
# One bulk-string reply (each extra RESP element costs the client ~4 µs to parse,
# and this is the idempotency replay path):
#   created:          "1<ver>:<expires_ms>:<o>"            (the caller knows the value)
#   live entry there: "0<ver>:<expires_ms>:<value>\0<o>"  <o> = "-" (no owner) or "=" .. owner
#   not our hash:     "-"
# <value> is JSON text, which never holds a raw NUL (json.dumps escapes it), so
# the first NUL after it is the separator even when the owner holds NULs.
_LUA_SET_IF_ABSENT_OR_GET = """
if redis.call('EXISTS', k) == 1 then
  local r = redis.call('HMGET', k, 'v', 'ver', 'o', 'x')
  if not r[1] or not r[2] then return '-' end
  return '0' .. r[2] .. ':' .. (r[4] or '') .. ':' .. r[1] .. '\\0' .. (r[3] and ('=' .. r[3]) or '-')
end
bump(false)
redis.call('HSET', k, 'v', ARGV[2])
apply_owner(ARGV[3], ARGV[4])
apply_ttl(ARGV[5])
return '1' .. done(ARGV[1])
"""

# ARGV: chan, value, ev_mode, ev, eo_mode, eo, owner_mode, owner, ttl_ms
_LUA_CAS = """
local existed = redis.call('EXISTS', k) == 1
if not matches(existed, ARGV[3], ARGV[4], ARGV[5], ARGV[6]) then return false end
bump(existed)
redis.call('HSET', k, 'v', ARGV[2])
apply_owner(ARGV[7], ARGV[8])
apply_ttl(ARGV[9])
return done(ARGV[1])
"""

# ARGV: chan, ev_mode, ev, eo_mode, eo
_LUA_CAD = """
local existed = redis.call('EXISTS', k) == 1
if not existed or not matches(existed, ARGV[2], ARGV[3], ARGV[4], ARGV[5]) then return 0 end
redis.call('DEL', k)
redis.call('PUBLISH', ARGV[1], '')
return 1
"""

# ARGV: chan
_LUA_DELETE = """
local n = redis.call('DEL', k)
if n > 0 then redis.call('PUBLISH', ARGV[1], '') end
return n
"""

# ARGV: chan, amount, ttl_ms -> {'ok', value} | {'notint', value} | {'overflow', value}
_LUA_INCR = """
if redis.call('EXISTS', k) == 1 then
  local v = redis.call('HGET', k, 'v')
  if not v or not string.match(v, '^%-?%d+$') then return {'notint', v} end
  local r = redis.pcall('HINCRBY', k, 'v', ARGV[2])
  if type(r) == 'table' and r.err then return {'overflow', v} end
  bump(true)
else
  bump(false)
  redis.call('HSET', k, 'v', ARGV[2])
  if ARGV[3] ~= '' then apply_ttl(ARGV[3]) end
end
local v = redis.call('HGET', k, 'v')
redis.call('PUBLISH', ARGV[1], redis.call('HGET', k, 'ver'))
return {'ok', v}
"""


def _ttl_ms(ttl: float | None) -> str:
    return "" if ttl is None else str(max(1, math.ceil(ttl * 1000)))


def _owner_args(owner: object) -> list[str]:
    if owner is ANY:
        return ["keep", ""]
    if owner is None:
        return ["clear", ""]
    return ["set", str(owner)]


def _expect_args(expected_version: object, expected_owner: object) -> list[str]:
    if expected_version is ANY:
        ev = ["any", ""]
    elif expected_version is None:
        ev = ["absent", ""]
    else:
        ev = ["eq", str(expected_version)]
    if expected_owner is ANY:
        eo = ["any", ""]
    elif expected_owner is None:
        eo = ["none", ""]
    else:
        eo = ["eq", str(expected_owner)]
    return ev + eo


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "\\*?[]" else c for c in text)


def _channel(key: str) -> str:
    return CHANNEL_PREFIX + key


def _fast_pool(url: str, options: dict[str, Any]) -> Any:
    """A redis-py ``BlockingConnectionPool`` without its per-command overhead.

    Same bounds and queueing (at most ``max_connections``; past that callers
    wait up to ``timeout`` s, in order), but:

    - checking out an idle connection, or giving one back, while nobody waits
      and nothing holds the pool's locks is a few list operations instead of a
      Condition + timeout + lock round (the original path still runs whenever
      somebody does wait, so queued callers are served first and notified);
    - writes are bounded by ``socket_timeout`` with ``asyncio.timeout`` instead
      of ``asyncio.wait_for`` (which, before Python 3.12, starts a task per
      command), and only when the socket did not take the whole command at once.

    Reads, health checks, the dirty-connection check on checkout, reconnects and
    errors are redis-py's own.
    """
    import redis.asyncio
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    class Pool(redis.asyncio.BlockingConnectionPool):
        def _quiet(self) -> bool:
            cond = self._condition
            return not (
                self._in_maintenance
                or cond.locked()
                or getattr(cond, "_waiters", True)  # anybody queued: the fair path
                or self._lock.locked()
            )

        async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
            if args or kwargs or not self._available_connections or not self._quiet():
                return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
            conn = self._available_connections.pop()
            self._in_use_connections.add(conn)
            try:
                try:
                    dirty = (
                        not conn.is_connected
                        or await conn.can_read()
                        or self.maint_notifications_enabled()  # type: ignore[no-untyped-call]
                    )
                except (RedisConnectionError, RedisTimeoutError, OSError):
                    dirty = True
                if dirty:
                    await self.ensure_connection(conn)  # redis-py's full check (reconnects)
            except BaseException:
                await self.release(conn)
                raise
            return conn

        async def release(self, connection: Any) -> None:
            if not self._quiet() or connection.should_reconnect():
                await super().release(connection)
                return
            self._in_use_connections.remove(connection)
            self._available_connections.append(connection)

    def fast_send(base: type) -> type:
        class FastSend(base):  # type: ignore[misc]
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                timeout = self.socket_timeout
                if not timeout:
                    await super().send_packed_command(command, check_health)
                    return
                if not self.is_connected:
                    await self.connect_check_health(check_health=False)
                if check_health:
                    await self.check_health()
                try:
                    if isinstance(command, str):
                        command = command.encode()
                    if isinstance(command, bytes):
                        command = [command]
                    writer = self._writer
                    writer.writelines(command)
                    if writer.transport.get_write_buffer_size():
                        # only a full socket buffer can make drain() block
                        async with asyncio.timeout(timeout):
                            await writer.drain()
                    else:
                        await writer.drain()
                except TimeoutError:
                    await self.disconnect(nowait=True)
                    raise RedisTimeoutError("Timeout writing to socket") from None
                except OSError as e:
                    await self.disconnect(nowait=True)
                    if len(e.args) == 1:
                        err_no, errmsg = "UNKNOWN", e.args[0]
                    else:
                        err_no, errmsg = e.args[0], e.args[1]
                    raise RedisConnectionError(
                        f"Error {err_no} while writing to socket. {errmsg}."
                    ) from e
                except BaseException:
                    await self.disconnect(nowait=True)
                    raise

        FastSend.__name__ = FastSend.__qualname__ = base.__name__
        return FastSend

    pool = Pool.from_url(url, **options)
    if not _fast_path_supported(pool):
        # Another redis-py than the one this was written against: its own pool, unchanged.
        return redis.asyncio.BlockingConnectionPool.from_url(url, **options)
    pool.connection_class = fast_send(pool.connection_class)
    return pool


#: The commands of the write scripts: never sent again once they may have reached the server.
_SCRIPT_COMMANDS = frozenset({"EVALSHA", "EVAL"})


def _reply_lost_error() -> type[Exception]:
    """The error for a script whose connection broke after it was sent (see ``_client``)."""
    from redis.exceptions import RedisError

    class ReplyLostError(RedisError):
        """The connection broke after a script was sent: it may or may not have run."""

    return ReplyLostError


def _client(pool: Any) -> Any:
    """A ``redis.asyncio.Redis`` on ``pool`` that never sends a write script twice.

    redis-py sends a command again when its connection fails (the ``retry`` option),
    also when the failure comes while the reply is read: the script then ran already,
    and the second run would apply an ``incr`` twice or tell the one caller that
    created a key that it did not. Here a failure after a script was sent ends the
    command with an error saying so; a connection that fails before (refused, found
    broken when the command is written) is still retried, as are reads, and a pooled
    connection already closed by the server is replaced before a script is sent.
    """
    import redis.asyncio
    from redis.exceptions import ConnectionError as RedisConnectionError

    lost = _reply_lost_error()

    class Client(redis.asyncio.Redis):
        async def _send_command_parse_response(
            self, conn: Any, command_name: Any, *args: Any, **options: Any
        ) -> Any:
            if command_name not in _SCRIPT_COMMANDS:
                return await super()._send_command_parse_response(  # type: ignore[no-untyped-call]
                    conn, command_name, *args, **options
                )
            if conn.is_connected:
                # A pooled connection the server closed (a restart) reads as EOF: connect
                # afresh before sending (redis-py's own check skips this while its
                # maintenance notifications are on, their default).
                try:
                    stale = await conn.can_read()
                except RedisConnectionError:
                    stale = True  # can_read disconnected it
                if stale:
                    await conn.disconnect()
            await conn.send_command(*args)
            try:
                return await self.parse_response(conn, command_name, **options)
            except RedisConnectionError as exc:  # (a timeout is never retried anyway)
                raise lost(str(exc)) from exc

    return Client.from_pool(pool)


#: redis-py internals the fast pool relies on (checked, not assumed: redis>=5.2 is allowed).
_POOL_ATTRS = (
    "_in_maintenance",
    "_condition",
    "_available_connections",
    "_in_use_connections",
    "_lock",
    "maint_notifications_enabled",
    "ensure_connection",
)
_CONN_ATTRS = (
    "connect_check_health",
    "check_health",
    "send_packed_command",
    "disconnect",
    "should_reconnect",
    "can_read",
    "is_connected",
    "socket_timeout",
    "_writer",
)


def _fast_path_supported(pool: Any) -> bool:
    """Whether this redis-py has every internal the fast pool uses."""
    if not all(hasattr(pool, a) for a in _POOL_ATTRS):
        return False
    if not hasattr(pool._condition, "_waiters"):
        return False
    try:
        conn = pool.connection_class(**pool.connection_kwargs)
    except Exception:
        return False
    return all(hasattr(conn, a) for a in _CONN_ATTRS)


async def _answers_plain_redis(host: str, port: int) -> bool:
    """Whether ``host:port`` answers a plain-text PING as Redis does (``+PONG``, ``-NOAUTH``...).

    Only a RESP reply line counts: a TLS server answers these bytes with an alert or
    closes the connection, and a failure of the probe itself is a "no" too.
    """
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except Exception:
        return False
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        line = await reader.readline()
    except Exception:  # OSError, or ValueError: a long line without a newline
        return False
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return line[:1] in (b"+", b"-") and line.endswith(b"\r\n")


class _Notifier:
    """One pub/sub connection per store, shared by all its waiters (asyncio only).

    A waiter subscribes to its key's channel (reference-counted) and waits for
    the server's confirmation before reading the key, so no change published
    after that read is missed. A listener task dispatches messages; when the
    connection breaks it wakes every waiter (they re-read and keep polling).
    """

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._pubsub: PubSub = client.pubsub()
        self._lock = asyncio.Lock()
        self._refs: dict[str, int] = {}
        self._events: dict[str, set[asyncio.Event]] = {}
        self._ready: dict[str, asyncio.Event] = {}  # set once SUBSCRIBE is confirmed
        self._pending: dict[str, deque[asyncio.Event]] = {}  # confirmations in order
        self._unsubscribe: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: False while the pub/sub connection is failing (waiters then poll fast).
        self.healthy = True

    async def watch(self, channel: str, event: asyncio.Event) -> asyncio.Event:
        """Start delivering ``channel`` to ``event``; returns the 'subscribed' event.

        Always pair with :meth:`unwatch` (synchronous, so safe in ``finally``).
        """
        self._events.setdefault(channel, set()).add(event)
        self._refs[channel] = self._refs.get(channel, 0) + 1
        self._unsubscribe.discard(channel)
        ready = self._ready.get(channel)
        if ready is not None:
            return ready
        ready = self._ready[channel] = asyncio.Event()
        self._pending.setdefault(channel, deque()).append(ready)
        async with self._lock:
            try:
                await self._pubsub.subscribe(channel)
            except BaseException:
                if self._ready.get(channel) is ready:
                    del self._ready[channel]
                pending = self._pending.get(channel)
                if pending is not None and ready in pending:
                    pending.remove(ready)
                raise
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(
                    self._listen(), name="toolwire-redis-state-listener"
                )
        return ready

    def unwatch(self, channel: str, event: asyncio.Event) -> None:
        """Stop delivering to ``event``; the listener unsubscribes unused channels."""
        events = self._events.get(channel)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[channel]
        refs = self._refs.get(channel, 0) - 1
        if refs > 0:
            self._refs[channel] = refs
        else:
            self._refs.pop(channel, None)
            self._ready.pop(channel, None)
            self._unsubscribe.add(channel)

    def _wake_all(self) -> None:
        for events in self._events.values():
            for event in events:
                event.set()

    async def _listen(self) -> None:
        backoff = 0.1
        while not self._closed:
            try:
                msg = await self._pubsub.get_message(timeout=_LISTEN_TIMEOUT)
                backoff = 0.1
                self.healthy = True
                if msg is not None:
                    self._dispatch(msg)
                if self._unsubscribe:
                    async with self._lock:
                        stale = [c for c in self._unsubscribe if c not in self._refs]
                        self._unsubscribe.clear()
                        if stale:
                            await self._pubsub.unsubscribe(*stale)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Connection lost (or worse): waiters fall back to polling;
                # redis-py resubscribes when it reconnects.
                _log.debug("redis state store: pub/sub listener error: %r", exc)
                self.healthy = False
                self._wake_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        channel = msg.get("channel")
        if not isinstance(channel, str):
            return
        if kind == "message":
            for event in self._events.get(channel, ()):
                event.set()
        elif kind == "subscribe":
            pending = self._pending.get(channel)
            if pending:
                pending.popleft().set()
                if not pending:
                    del self._pending[channel]

    async def aclose(self) -> None:
        """Stop the listener and drop the connection; wakes waiters."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # never raises the task's CancelledError
        self._wake_all()
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]


class RedisStore(StateStore):
    """State in Redis (``redis://``, ``rediss://`` or ``unix://`` URL); asyncio only.

    Safe across tasks, processes and hosts: conditional operations are Lua
    scripts, one key per record. ``wait_for_change`` uses pub/sub with a
    polling fallback (one extra connection per store while anybody waits).

    Connections come from a bounded pool (50 by default) that makes callers
    queue for up to 20 s rather than fail. redis-py's URL query parameters
    override the defaults, e.g. ``?max_connections=100&timeout=5&socket_timeout=5``.

    Redis Cluster: ``redis+cluster://[:password@]host:port`` (or
    ``rediss+cluster://``) names one node; redis-py's ``RedisCluster`` finds the
    others and follows slot moves. Every record is one key, so each operation
    goes to the shard that owns it; ``scan`` visits every primary. A cluster
    has database 0 only, and its pools (``max_connections``, 50 by default, per
    node) fail at once when exhausted instead of queueing (no ``timeout``).
    """

    backend = "redis"

    def __init__(self, url: str, **client_options: Any) -> None:
        try:
            import redis.asyncio  # noqa: F401  (fail early, not at first use)
        except ImportError as exc:
            raise StateNotAppliedError(
                f"state store {redact_url(url)} needs the redis client library, which is "
                f"not installed: {_INSTALL_HINT}"
            ) from exc
        self.url = url
        self.safe_url = redact_url(url)
        scheme, sep, rest = url.partition("://")
        #: Whether the URL names a Redis Cluster (``redis+cluster://``).
        self.cluster = scheme.lower() in CLUSTER_SCHEMES
        self._connect_url = scheme.lower().removesuffix("+cluster") + sep + rest
        self._client_options = client_options
        self._client: Redis | RedisCluster | None = None
        self._notifier: _Notifier | None = None
        self._state: Literal["new", "open", "closed"] = "new"
        self._open_lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the client lives on
        self._scripts: dict[str, AsyncScript] = {}

    def __repr__(self) -> str:
        return f"RedisStore({self.safe_url!r})"

    # -- lifecycle ---------------------------------------------------------
    def _require_asyncio(self) -> asyncio.AbstractEventLoop:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            raise StateNotAppliedError(
                f"redis state store at {self.safe_url} needs asyncio (redis.asyncio does not "
                "run under trio or without an event loop); use the sqlite:// or memory:// "
                "state store under trio"
            ) from None

    async def open(self) -> None:
        """Connect and check the server answers (PING). Idempotent."""
        loop = self._require_asyncio()
        if self._loop is not loop:
            # First use, or a new event loop (another asyncio.run): connections
            # of the old loop cannot be used from this one, so start afresh.
            self._loop = loop
            self._open_lock = asyncio.Lock()
            if self._state == "open":
                self._state = "new"
                self._client = self._notifier = None
        assert self._open_lock is not None
        async with self._open_lock:
            if self._state == "open":
                return
            from redis import exceptions as rx
            from redis.asyncio.retry import Retry
            from redis.backoff import EqualJitterBackoff
            from redis.exceptions import ConnectionError as RedisConnectionError

            options: dict[str, Any] = {
                "decode_responses": True,
                # keys written by others may not be UTF-8: keep them round-trippable
                "encoding_errors": "surrogateescape",
                "socket_connect_timeout": 5.0,
                "socket_timeout": 10.0,
                # Retried: a connection that failed (a restarted server's stale socket),
                # except once a write script was sent (see _client). Not retried: a
                # timeout, after which a script may have run already — running it again
                # would apply an incr or a claim twice.
                "retry": Retry(
                    EqualJitterBackoff(cap=0.25, base=0.01),
                    3,
                    supported_errors=(RedisConnectionError,),
                ),
                # a bounded pool that queues callers instead of failing at once
                "max_connections": 50,
                "timeout": 20.0,
                **self._client_options,
            }
            client: Redis | RedisCluster
            try:
                if self.cluster:
                    client = self._cluster_client(options)
                else:
                    client = _client(_fast_pool(self.url, options))
            except (ValueError, TypeError) as exc:
                raise StateNotAppliedError(
                    f"redis state store URL {self.safe_url} is invalid: {exc}; "
                    "fix the state URL (`state` in toolwire.toml, or TOOLWIRE_STATE / REDIS_URL)"
                ) from exc
            try:
                with self._errors(None):
                    try:
                        await self._ping(client)
                    except TypeError as exc:
                        # redis-py hands unknown ?options= to the connection as keywords
                        if "unexpected keyword argument" not in str(exc):
                            raise
                        raise StateNotAppliedError(
                            f"redis state store URL {self.safe_url} is invalid: an option in "
                            f"its query is not a Redis connection option ({exc}); fix the "
                            "state URL (`state` in toolwire.toml, or TOOLWIRE_STATE / REDIS_URL)"
                        ) from exc
                    except rx.ResponseError as exc:
                        if "DB index is out of range" not in str(exc):
                            raise
                        raise StateNotAppliedError(
                            f"redis state store at {self.safe_url}: the server has no such "
                            f"database ({exc}); use a database number below the server's "
                            "`databases` setting (16 by default: /0 to /15) in the state URL"
                        ) from exc
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await client.aclose()
                raise
            self._client = client
            self._scripts = {
                name: client.register_script(_LUA_PRELUDE + body)
                for name, body in (
                    ("set", _LUA_SET),
                    ("set_if_absent", _LUA_SET_IF_ABSENT),
                    ("set_if_absent_or_get", _LUA_SET_IF_ABSENT_OR_GET),
                    ("cas", _LUA_CAS),
                    ("cad", _LUA_CAD),
                    ("delete", _LUA_DELETE),
                    ("incr", _LUA_INCR),
                )
            }
            self._notifier = _Notifier(client)
            self._state = "open"

    async def _ping(self, client: Redis | RedisCluster) -> None:
        """PING the server; for ``rediss://``, fail at once when the port has no TLS.

        A redis-server without TLS takes the TLS ClientHello for an inline command
        and waits for its end (it looks for a newline with ``strchr``, which stops at
        the NUL bytes of the record's header), so the handshake would only end with
        ``socket_connect_timeout``. redis-py has no separate handshake timeout, and a
        shorter deadline would fail TLS servers that are merely slow. Instead, a
        PING still waiting after ``TLS_PROBE_AFTER_S`` sends ``PING`` in plain text
        on a second connection: a Redis reply proves the port speaks no TLS. Any
        other outcome (an alert, a close, silence) leaves the PING to finish or time
        out as before.
        """
        address = self._tls_address()
        if address is None:
            await client.ping()
            return
        ping = asyncio.ensure_future(client.ping())
        probe: asyncio.Future[bool] | None = None
        try:
            await asyncio.wait({ping}, timeout=TLS_PROBE_AFTER_S)
            if not ping.done():
                probe = asyncio.ensure_future(_answers_plain_redis(*address))
                await asyncio.wait({ping, probe}, return_when=asyncio.FIRST_COMPLETED)
                if not ping.done() and probe.result():
                    scheme = self.url.partition("://")[0]
                    raise StateNotAppliedError(
                        f"redis state store at {self.safe_url}: the server does not speak "
                        f"TLS (the URL says {scheme}://): its port answers Redis in plain "
                        f"text and left the TLS handshake unanswered; use "
                        f"{scheme.replace('rediss', 'redis', 1)}:// for a server without "
                        "TLS, or point the URL at the server's tls-port"
                    )
            await ping
        finally:
            pending = [f for f in (ping, probe) if f is not None and not f.done()]
            for f in pending:
                f.cancel()
            if pending:
                with anyio.CancelScope(shield=True):
                    await asyncio.gather(*pending, return_exceptions=True)

    def _tls_address(self) -> tuple[str, int] | None:
        """The (host, port) of a ``rediss://`` URL (cluster: the seed node), else None."""
        if not self._connect_url.lower().startswith("rediss://"):
            return None
        try:
            parts = urllib.parse.urlsplit(self._connect_url)
            return parts.hostname or "localhost", parts.port or 6379
        except ValueError:
            return None

    def _cluster_client(self, options: dict[str, Any]) -> RedisCluster:
        """A ``RedisCluster`` seeded by the URL's node (a cluster has no queueing pool)."""
        import redis.asyncio
        from redis.exceptions import RedisClusterException

        if not hasattr(redis.asyncio.RedisCluster, "pubsub"):
            # asyncio cluster pub/sub (which wait_for_change uses) came with redis-py 8
            raise StateNotAppliedError(
                f"redis state store at {self.safe_url}: Redis Cluster needs redis-py >= 8.0 "
                f"(installed: {getattr(redis, '__version__', 'unknown')}); "
                "pip install -U 'redis>=8'"
            )
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        options = {k: v for k, v in options.items() if k != "timeout"}
        options.update(
            # No command is sent again after a failure: the cluster client resends
            # on a dropped connection, and during a slot migration it drops the
            # connections of commands that already ran (a script resent would
            # apply twice). MOVED / ASK redirects are still followed.
            retry=Retry(NoBackoff(), 0),
            # A MOVED reply updates that slot's owner; it never closes every
            # connection (which cut the other calls in flight).
            reinitialize_steps=0,
        )
        # ?timeout= (the single-server pool's queueing) has no meaning here: ignored
        parts = urllib.parse.urlsplit(self._connect_url)
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "timeout"]
        url = parts._replace(query=urllib.parse.urlencode(query)).geturl()
        try:
            return redis.asyncio.RedisCluster.from_url(url, **options)
        except RedisClusterException as exc:  # e.g. a database other than 0, a Unix socket
            raise ValueError(str(exc)) from exc

    async def close(self) -> None:
        """Close the connections; wakes waiters. Idempotent."""
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        notifier, self._notifier = self._notifier, None
        client, self._client = self._client, None
        with anyio.CancelScope(shield=True):
            if notifier is not None:
                await notifier.aclose()
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _ready(self) -> Redis | RedisCluster:
        loop = self._require_asyncio()
        if self._state == "new" or (self._state == "open" and self._loop is not loop):
            await self.open()
        if self._state != "open" or self._client is None:
            raise StateNotAppliedError(
                f"redis state store at {self.safe_url} is closed; {CLOSED_HINT}"
            )
        return self._client

    def _lacks_password(self) -> bool:
        """Whether neither the URL nor the client options give a password."""
        if self._client_options.get("password"):
            return False
        try:
            return not urllib.parse.urlsplit(self._connect_url).password
        except ValueError:
            return False

    def _missing_password(self, exc: BaseException) -> StateStoreError:
        # the server refused the connection's commands: nothing was applied
        return StateNotAppliedError(
            f"redis state store at {self.safe_url}: the server requires a password and the "
            f"state URL gives none ({exc}); put it in the URL: redis://:PASSWORD@host:6379/0, "
            "or redis://USER:PASSWORD@host:6379/0 for an ACL user"
        )

    def _unreachable(self, exc: BaseException, *, sent: bool = True) -> StateStoreError:
        """``exc`` (no connection, a timeout) as an error naming the server and what to do;
        a ``StateNotAppliedError`` when ``sent`` is false (the request never went out)."""
        text = str(exc)
        if self.url.lower().startswith("rediss") and (
            isinstance(exc, TimeoutError) or "Timeout" in text or "SSL" in text
        ):
            # a TLS client waits for the server's handshake, which a server without TLS
            # never sends (it waits for a command): a timeout, not a refusal
            hint = (
                "the server may not speak TLS (the URL says rediss://): use redis:// for a "
                "server without TLS, or point the URL at the server's tls-port"
            )
        else:
            hint = (
                "start redis-server or fix the state URL "
                "(`state` in toolwire.toml, or TOOLWIRE_STATE / REDIS_URL)"
            )
        error = StateStoreError if sent else StateNotAppliedError
        return error(f"redis state store at {self.safe_url} is unreachable: {exc}; {hint}")

    @contextlib.contextmanager
    def _errors(self, key: str | None, *, write: bool = False) -> Iterator[None]:
        """Turn redis-py / socket errors into StateStoreError naming the server
        (``write``: the command is a write script)."""
        from redis import exceptions as rx

        try:
            yield
        except rx.TimeoutError as exc:
            if (
                key is None
                or "Timeout reading" not in str(exc)
                or self.url.lower().startswith("rediss")
            ):
                raise self._unreachable(exc) from exc
            # The server took the command and did not answer in time: it is up, but busy
            # (a long script or command, a save) or overloaded. A write may run after.
            applied = (
                "; it may or may not have been applied (it is not sent again): read the key "
                "before retrying"
                if write
                else ""
            )
            raise StateStoreError(
                f"redis state store at {self.safe_url}: no answer within the socket timeout "
                f"after the command on key {key!r} was sent ({exc}){applied}. The server is "
                "reachable but slow (a long script or command, a save, overload): check it, "
                "or raise ?socket_timeout= in the state URL"
            ) from exc
        except rx.AuthenticationError as exc:
            # a server with requirepass answers a client without a password "NOAUTH
            # Authentication required" or (RESP3) "HELLO must be called with the client
            # already authenticated..."; a user without a password: "invalid username-password"
            if self._lacks_password():
                raise self._missing_password(exc) from exc
            raise StateNotAppliedError(
                f"redis state store at {self.safe_url} refused the credentials: {exc}; check "
                "the user and password in the state URL (redis://user:password@host:6379/0)"
            ) from exc
        except rx.ConnectionError as exc:
            # pool exhausted: MaxConnectionsError (a ConnectionError, redis-py >= 6)
            # or, from the blocking pool, ConnectionError("No connection available.")
            if type(exc).__name__ == "MaxConnectionsError" or "No connection available" in str(exc):
                raise StateNotAppliedError(
                    f"redis state store at {self.safe_url}: every pooled connection stayed "
                    f"busy ({exc}); "
                    + (
                        "raise ?max_connections= (per cluster node; a cluster's pool does not "
                        "queue) in the URL or lower the concurrency"
                        if self.cluster
                        else "raise ?max_connections= / ?timeout= in the URL or lower the "
                        "concurrency"
                    )
                ) from exc
            # A single server's client fails a write script that was sent with ReplyLost
            # (see _client): a ConnectionError here came before the request went out. The
            # cluster client has no such guard: its error may come after.
            raise self._unreachable(exc, sent=self.cluster) from exc
        except OSError as exc:
            raise self._unreachable(exc) from exc
        except (rx.ClusterDownError, rx.RedisClusterException) as exc:
            text = str(exc)
            if (
                "NOAUTH" in text or "Authentication required" in text or "HELLO must" in text
            ) and self._lacks_password():
                raise self._missing_password(exc) from exc
            if self.cluster and "Timeout" in text and self.url.lower().startswith("rediss"):
                raise self._unreachable(exc) from exc
            hint = (
                "check the cluster (redis-cli --cluster check) or fix the state URL"
                if self.cluster
                else "this URL names a cluster node: use redis+cluster:// in `state`"
            )
            raise StateStoreError(
                f"redis state store at {self.safe_url}: the cluster cannot serve: {exc}; {hint}"
            ) from exc
        except rx.RedisError as exc:
            what = "" if key is None else f" on key {key!r}"
            if type(exc).__name__ == "ReplyLostError":
                raise StateStoreError(
                    f"redis state store at {self.safe_url}: the connection broke after the "
                    f"command{what} was sent ({exc}); it may or may not have been applied "
                    "(it is not sent again): read the key before retrying"
                ) from exc
            hint = ""
            if "NOAUTH" in str(exc) and self._lacks_password():
                raise self._missing_password(exc) from exc
            if "WRONGTYPE" in str(exc):
                raise StateDataError(
                    f"redis state store at {self.safe_url}: command{what} failed: {exc} (the "
                    "key holds data that is not a toolwire state entry; delete it or choose "
                    "another key prefix)"
                ) from exc
            if isinstance(exc, (rx.MovedError, rx.AskError)) and not self.cluster:
                hint = " (the server is a Redis Cluster node: use a redis+cluster:// URL)"
            raise StateStoreError(
                f"redis state store at {self.safe_url}: command{what} failed: {exc}{hint}"
            ) from exc
        except StateStoreError:
            raise
        except Exception as exc:  # a client-library fault (seen in a cluster mid-migration)
            what = "" if key is None else f" on key {key!r}"
            raise StateStoreError(
                f"redis state store at {self.safe_url}: command{what} failed in the Redis "
                f"client ({type(exc).__name__}: {exc}); a write may or may not have been "
                "applied: read the key before retrying"
            ) from exc

    async def _script(self, name: str, key: str, args: list[str]) -> Any:
        client = self._client
        if self._state != "open" or client is None or self._loop is not _running_loop():
            client = await self._ready()
        script = self._scripts[name]
        try:  # EVALSHA straight on the client, no context manager: the hot path
            try:
                return await client.evalsha(script.sha, 1, key, _channel(key), *args)
            except Exception as exc:
                if type(exc).__name__ != "NoScriptError":
                    raise
                # the server lost its script cache (restart, SCRIPT FLUSH): load it again
                return await script(keys=[key], args=[_channel(key), *args])
        except Exception:
            with self._errors(key, write=True):
                raise

    @staticmethod
    def _entry(key: str, text: str, reply: str) -> Entry:
        """The entry a write script reported as ``"<ver>:<expires_ms>:<o>"``."""
        ver, expires, who = reply.split(":", 2)
        return Entry(
            key,
            _decode(text, key),
            int(ver),
            None if who == "-" else who[1:],
            int(expires) / 1000 if expires else None,
        )

    # -- reads -------------------------------------------------------------
    async def get_entry(self, key: str) -> Entry | None:
        """The live entry at ``key``, or None when absent or expired."""
        _check_key(key)
        client = await self._ready()
        with self._errors(key):
            fields = await client.hmget(key, ["v", "ver", "o", "x"])
        return _from_fields(key, fields)

    async def scan(self, prefix: str, *, limit: int | None = None) -> list[Entry]:
        """Live entries whose key starts with ``prefix``, sorted by key.

        Uses SCAN over the whole database, so it costs O(number of keys). A key
        under ``prefix`` that holds another Redis type (a string, a list...) or a
        corrupt toolwire hash is a ``StateDataError`` naming it, as ``get`` raises.
        """
        _check_key(prefix)
        if limit is not None and limit < 0:
            raise ValueError(f"scan limit must be >= 0 or None, not {limit}")
        client = await self._ready()
        out: list[Entry] = []
        if limit == 0:
            return out
        with self._errors(None):
            keys: set[str] = set()
            async for k in client.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
                if k.startswith(prefix):
                    keys.add(k)
            ordered = sorted(keys)
            for start in range(0, len(ordered), _SCAN_BATCH):
                batch = ordered[start : start + _SCAN_BATCH]
                async with client.pipeline(transaction=False) as pipe:
                    for k in batch:
                        pipe.hmget(k, ["v", "ver", "o", "x"])
                    replies = await pipe.execute(raise_on_error=False)
                for k, fields in zip(batch, replies, strict=True):
                    if isinstance(fields, Exception):  # e.g. WRONGTYPE: named as get does
                        with self._errors(k):
                            raise fields
                    entry = _from_fields(k, fields)
                    if entry is not None:
                        out.append(entry)
                        if limit is not None and len(out) >= limit:
                            return out
        return out

    # -- writes ------------------------------------------------------------
    async def set(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry:
        """Write unconditionally; returns the new entry (with its new version)."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)
        reply = await self._script("set", key, [text, *_owner_args(owner), _ttl_ms(ttl)])
        return self._entry(key, text, reply)

    async def set_if_absent(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> Entry | None:
        """Create ``key`` only if it is absent (or expired); None when it exists."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)
        reply = await self._script("set_if_absent", key, [text, *_owner_args(owner), _ttl_ms(ttl)])
        return None if reply is None else self._entry(key, text, reply)

    async def set_if_absent_or_get(
        self, key: str, value: Any, *, ttl: float | None = None, owner: str | None = None
    ) -> tuple[Entry, bool]:
        """Create ``key`` if absent (or expired), else return the live entry.

        One Lua script: a single round trip either way.
        """
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(ANY, ANY, owner)
        text = _encode(key, value)
        reply = await self._script(
            "set_if_absent_or_get", key, [text, *_owner_args(owner), _ttl_ms(ttl)]
        )
        status = reply[:1]
        if status == "0":
            ver, expires, rest = reply[1:].split(":", 2)
            text, _, who = rest.partition("\0")
            return Entry(
                key,
                _decode(text, key),
                int(ver),
                None if who == "-" else who[1:],
                int(expires) / 1000 if expires else None,
            ), False
        if status == "1":
            return self._entry(key, text, reply[1:]), True
        raise StateDataError(  # no retry helps: someone must delete the key
            f"redis state store at {self.safe_url}: key {key!r} holds a hash that is not a "
            "toolwire state entry; delete it or use another key"
        )

    async def compare_and_set(
        self,
        key: str,
        value: Any,
        *,
        expected_version: int | None = ANY,
        expected_owner: str | None = ANY,
        ttl: float | None = None,
        owner: str | None = ANY,
    ) -> Entry | None:
        """Replace the entry only if it matches; returns the new entry or None."""
        _check_key(key)
        ttl = _check_ttl(ttl)
        _check_expected(expected_version, expected_owner, owner)
        text = _encode(key, value)
        args = [
            text,
            *_expect_args(expected_version, expected_owner),
            *_owner_args(owner),
            _ttl_ms(ttl),
        ]
        reply = await self._script("cas", key, args)
        return None if reply is None else self._entry(key, text, reply)

    async def compare_and_delete(
        self, key: str, *, expected_version: int | None = ANY, expected_owner: str | None = ANY
    ) -> bool:
        """Delete only if the live entry matches; True when it was deleted."""
        _check_key(key)
        _check_expected(expected_version, expected_owner, ANY)
        reply = await self._script("cad", key, _expect_args(expected_version, expected_owner))
        return bool(reply)

    async def delete(self, key: str) -> bool:
        """Delete unconditionally; True when a live entry was there."""
        _check_key(key)
        reply = await self._script("delete", key, [])
        return bool(reply)

    async def incr(self, key: str, amount: int = 1, *, ttl: float | None = None) -> int:
        """Add ``amount`` to an integer value (absent counts as 0); returns the new value.

        The result must fit in a signed 64-bit integer (Redis HINCRBY).
        """
        _check_key(key)
        _check_amount(amount)
        ttl = _check_ttl(ttl)
        if not -(2**63) <= amount < 2**63:  # else a new key would store it and fail later
            raise StateNotAppliedError(
                f"cannot incr state key {key!r} by {amount}: the amount does not fit in the "
                "64-bit integers Redis counts with"
            )
        status, text = await self._script("incr", key, [str(amount), _ttl_ms(ttl)])
        if status == "notint":
            if text is None:  # Lua's false: a hash without toolwire's value field
                raise StateDataError(
                    f"redis state store at {self.safe_url}: key {key!r} is a hash without "
                    "a toolwire value field: something other than toolwire wrote it. Delete "
                    "the key (or choose another key prefix)"
                )
            raise _not_int_error(key, _decode(text, key))
        if status == "overflow":
            raise StateNotAppliedError(
                f"cannot incr state key {key!r} by {amount}: the result does not fit in the "
                "64-bit integers Redis counts with"
            )
        return int(text)

    # -- waiting -----------------------------------------------------------
    async def wait_for_change(
        self,
        key: str,
        *,
        version: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> Entry | None:
        """Wait until the key's version is no longer ``version``, at most ``timeout`` s.

        Subscribes to the key's change channel (one shared pub/sub connection
        per store), then re-reads the key on every notification; polls as a
        fallback (expiry publishes nothing, and pub/sub may drop).
        """
        _check_key(key)
        timeout = _check_timeout(timeout)
        await self._ready()
        deadline = anyio.current_time() + timeout
        notifier = self._notifier
        assert notifier is not None
        channel = _channel(key)
        event = asyncio.Event()
        subscribed = False
        try:
            try:
                with self._errors(key):
                    ready = await notifier.watch(channel, event)
                with anyio.move_on_after(min(_CONFIRM_TIMEOUT, timeout)):
                    await ready.wait()
                subscribed = ready.is_set()
            except StateStoreError:
                pass  # no pub/sub: poll
            poll = _POLL_MIN
            while True:
                event.clear()
                entry = await self.get_entry(key)
                if _changed(entry, version):
                    return entry
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return entry
                fast = not (subscribed and notifier.healthy)
                delay = min(remaining, poll if fast else _POLL_SUBSCRIBED)
                if entry is not None and entry.expires_at is not None:
                    # Server clock vs ours: the poll above bounds any skew.
                    delay = min(delay, max(entry.expires_at - time.time(), 0.0) + 0.002)
                with anyio.move_on_after(delay):
                    await event.wait()
                poll = min(poll * 1.5, _POLL_MAX)
        finally:
            notifier.unwatch(channel, event)


def _from_fields(key: str, fields: list[Any]) -> Entry | None:
    text, ver, owner, expires = fields
    if text is None or ver is None:
        return None
    try:
        version = int(ver)
        expires_at = int(expires) / 1000 if expires else None
    except ValueError:
        raise StateDataError(
            f"state key {key!r} is a hash whose version {ver!r} or expiry {expires!r} is not "
            "an integer; something other than toolwire wrote it. Delete the key (or choose "
            "another key prefix)"
        ) from None
    return Entry(key, _decode(text, key), version, owner, expires_at)
