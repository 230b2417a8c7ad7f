"""Test kit for toolwire and its plugins (a pytest plugin, entry point ``pytest11``).

Fixtures (available in any project that installs toolwire):

- ``fake_clock``: a ``FakeClock``; ``await clock.sleep(s)`` advances time at once.
- ``kernel``: a fresh ``Kernel`` on ``memory://`` state using ``fake_clock``.
- ``register_plugin``: ``register_plugin(plugin, name=None, order=None)`` adds a
  plugin to ``kernel`` for the current test only.
- ``redis_url``: the URL of a reachable test Redis (``$TOOLWIRE_REDIS_URL``,
  default ``redis://127.0.0.1:6379/15``); the test is skipped without one, or
  fails when ``TOOLWIRE_REQUIRE_REDIS=1`` (CI). Nothing is flushed: use unique
  key prefixes.
- ``redis_cluster_url``: the same for a Redis Cluster
  (``$TOOLWIRE_REDIS_CLUSTER_URL``, a ``redis+cluster://host:port`` URL; no
  default: skipped when unset, failed when unset under ``TOOLWIRE_REQUIRE_REDIS=1``).

Helpers: ``FakeClock``, ``FakeTool`` (a scripted tool that records its calls),
``RecordingPlugin`` (records every hook call, for ordering assertions).

pytest is not a dependency of toolwire: the helpers import and work without it
(a demo or a benchmark may use ``FakeTool``); only the fixtures need it, and
without pytest they are left plain functions.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar, cast

import anyio
import anyio.lowlevel

from ._clock import Clock
from ._kernel import Kernel
from ._types import CallContext, ErrorInfo, Tool, ToolAnnotations, ToolCall, ToolResult
from .hookspecs import hookimpl

__all__ = [
    "DEFAULT_TEST_REDIS_URL",
    "FakeClock",
    "FakeTool",
    "RecordingPlugin",
    "fake_clock",
    "kernel",
    "redis_cluster_url",
    "redis_url",
    "register_plugin",
    "require_redis",
    "require_redis_cluster",
]

DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"

_F = TypeVar("_F", bound=Callable[..., Any])


def _fixture(fn: _F) -> _F:
    """``pytest.fixture(fn)``; ``fn`` itself when pytest cannot be imported.

    pytest is imported here, not at the top: ``FakeTool`` and ``FakeClock`` must
    import in a program without pytest (toolwire does not depend on it). Under
    pytest (which loads this module through the ``pytest11`` entry point) every
    fixture is registered as before.
    """
    try:
        import pytest
    except ImportError:
        return fn
    return cast(_F, pytest.fixture(fn))


class FakeClock(Clock):
    """A clock that only moves when told to (or when something sleeps on it).

    ``sleep(s)`` advances the clock by ``s`` and yields once, so retry
    back-offs and deadlines are tested without waiting. Per-attempt timeouts
    still use real time (they are enforced by the event loop).
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._mono = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        """Fake monotonic seconds."""
        return self._mono

    def time(self) -> float:
        """Fake wall-clock seconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move both clocks forward."""
        self._now += seconds
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        """Record the sleep, advance the clock, and yield to the event loop once."""
        self.sleeps.append(seconds)
        self.advance(seconds)
        await anyio.lowlevel.checkpoint()


@dataclass
class FakeTool:
    """A scripted tool. ``script`` items are returned in turn (exceptions raised).

    The last item repeats. ``calls`` records the args of every execution.
    ``delay`` (real seconds) makes each execution sleep first.
    """

    name: str = "fake"
    script: list[Any] = field(default_factory=lambda: [{"ok": True}])
    description: str = "A scripted test tool."
    input_schema: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": True}
    )
    delay: float = 0.0
    read_only: bool | None = None
    timeout_s: float | None = None
    source: str = "test"
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tool(self) -> Tool:
        """The ``Tool`` to add to a kernel."""

        async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
            self.calls.append(dict(args))
            if self.delay:
                await anyio.sleep(self.delay)
            item = self.script[min(len(self.calls), len(self.script)) - 1]
            if isinstance(item, BaseException):
                raise item
            if callable(item):
                return item(args)
            return item

        return Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            executor=executor,
            source=self.source,
            annotations=ToolAnnotations(readOnlyHint=self.read_only),
            timeout_s=self.timeout_s,
        )


class RecordingPlugin:
    """Records each call hook (``before_call``, ``on_error``, ``after_call``) in ``log``.

    Entries are (plugin name, hook, tool name); ``startup``, ``shutdown`` and
    ``discover`` are not recorded, so it registers on a running kernel too.

    Pass ``log`` to share one list between several instances (ordering tests).
    """

    def __init__(
        self, name: str, order: int = 1000, log: list[tuple[str, str, str]] | None = None
    ) -> None:
        self.name = name
        self.order = order
        self.log: list[tuple[str, str, str]] = log if log is not None else []

    @hookimpl
    def before_call(self, call: ToolCall) -> None:
        self.log.append((self.name, "before_call", call.name))

    @hookimpl
    async def on_error(self, call: ToolCall, error: ErrorInfo) -> None:
        self.log.append((self.name, "on_error", call.name))

    @hookimpl
    def after_call(self, call: ToolCall, result: ToolResult) -> None:
        self.log.append((self.name, "after_call", call.name))


@_fixture
def fake_clock() -> FakeClock:
    """A fresh ``FakeClock``."""
    return FakeClock()


@_fixture
async def kernel(fake_clock: FakeClock) -> AsyncIterator[Kernel]:
    """A fresh kernel on in-memory state with the fake clock (it starts on first call).

    Closed after the test: plugins' ``shutdown`` hooks run and tasks started
    with ``kernel.spawn`` are cancelled, as in production. An async fixture:
    use it from tests run by anyio (``pytest.mark.anyio``).
    """
    k = Kernel(state="memory://", clock=fake_clock)
    try:
        yield k
    finally:
        await k.close()


@_fixture
def register_plugin(kernel: Kernel) -> Callable[..., Any]:
    """Register a plugin on the ``kernel`` fixture (a fresh kernel per test).

    The plugin stays registered until the kernel fixture closes the kernel
    after the test, so its ``shutdown`` hook runs then. Register before the
    test's first call (which starts the kernel): on a started kernel a plugin
    with ``startup``/``shutdown``/``discover`` hooks is refused; use
    ``await kernel.add_plugin(plugin)`` there.
    """

    def register(plugin: object, name: str | None = None, order: int | None = None) -> object:
        kernel.register(plugin, name=name, order=order)
        return plugin

    return register


@functools.cache
def _redis_problem(url: str) -> str | None:
    try:
        import redis
        import redis.cluster
    except ImportError:
        return "redis-py is not installed (pip install 'toolwire[redis]')"
    scheme, sep, rest = url.partition("://")
    client: Any
    try:
        if scheme.lower().endswith("+cluster"):
            plain = scheme.lower().removesuffix("+cluster") + sep + rest
            client = redis.cluster.RedisCluster.from_url(
                plain, socket_connect_timeout=1, socket_timeout=2
            )
        else:
            client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    except Exception as exc:
        return f"no Redis answers at {url} ({exc})"
    try:
        client.ping()
    except Exception as exc:
        return f"no Redis answers at {url} ({exc})"
    finally:
        client.close()
    return None


def _skip_or_fail(problem: str, advice: str) -> NoReturn:
    try:
        import pytest
    except ImportError:  # not in a test: there is nothing to skip
        raise RuntimeError(f"{problem}. {advice}") from None
    if os.environ.get("TOOLWIRE_REQUIRE_REDIS", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"TOOLWIRE_REQUIRE_REDIS=1 but {problem}. {advice}", pytrace=False)
    pytest.skip(f"{problem}; {advice}")


def require_redis(url: str | None = None) -> str:
    """The test Redis URL, or skip the test (fail it under ``TOOLWIRE_REQUIRE_REDIS=1``).

    ``url`` defaults to ``$TOOLWIRE_REDIS_URL``, else ``redis://127.0.0.1:6379/15``.
    """
    url = url or os.environ.get("TOOLWIRE_REDIS_URL") or DEFAULT_TEST_REDIS_URL
    problem = _redis_problem(url)
    if problem is not None:
        _skip_or_fail(
            problem,
            "Start one with `redis-server --port 6379 --save '' --appendonly no --daemonize "
            "yes` or point TOOLWIRE_REDIS_URL at one",
        )
    return url


def require_redis_cluster(url: str | None = None) -> str:
    """The test Redis Cluster URL (``redis+cluster://...``), or skip / fail as ``require_redis``.

    ``url`` defaults to ``$TOOLWIRE_REDIS_CLUSTER_URL`` (``./dev test`` starts a
    private three-node cluster and sets it).
    """
    url = url or os.environ.get("TOOLWIRE_REDIS_CLUSTER_URL")
    advice = (
        "Run the tests with ./dev test (it starts a private cluster) or point "
        "TOOLWIRE_REDIS_CLUSTER_URL at one (redis+cluster://host:port)"
    )
    if not url:
        _skip_or_fail("TOOLWIRE_REDIS_CLUSTER_URL is not set", advice)
    problem = _redis_problem(url)
    if problem is not None:
        _skip_or_fail(problem, advice)
    return url


@_fixture
def redis_url() -> str:
    """A reachable test Redis URL (see ``require_redis``); nothing is flushed."""
    return require_redis()


@_fixture
def redis_cluster_url() -> str:
    """A reachable test Redis Cluster URL (see ``require_redis_cluster``); nothing is flushed."""
    return require_redis_cluster()
