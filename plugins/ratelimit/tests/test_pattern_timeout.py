"""A configured pattern's search is bounded in time: one that runs past
``pattern_timeout_seconds`` is given up, counted as no match (a deny pattern: as a
match), and logged at most once a minute per pattern.

Before, configured patterns were searched with ``re`` with no bound: ``[^b]+b`` took
6.6 s on one hostile error at the default caps, on the event loop."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from toolwire import ConfigError, Kernel, ToolError, load_config
from toolwire.testing import FakeClock
from toolwire_ratelimit import RateLimitConfig, RateLimitPlugin

pytestmark = pytest.mark.anyio

LOGGER = "toolwire.ratelimit"


def hostile(first: str = "", char: str = "a", max_body: int = 8192, status: int = 500) -> ToolError:
    """An error whose searched text is as long as the default caps allow: 17 messages of
    2 KiB (this error's and 16 causes') and ``max_body`` of body, all ``char``;
    ``first`` starts the first message."""
    exc: BaseException = RuntimeError(char * 5000)
    for _ in range(15):
        try:
            raise RuntimeError(char * 5000) from exc
        except RuntimeError as e:
            exc = e
    top = ToolError(first + char * 5000, status=status, details={"body": char * (max_body + 100)})
    top.__cause__ = exc
    return top


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "gave up" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("pattern", "first"),
    [
        ("[^b]+b", ""),  # re: 6.6 s (it crosses the newlines between messages)
        ("(?:a|A)+b", ""),  # re: 1.1 s
        ("a+b", "b"),  # a "b" the engine finds first, then 41k of "a": regex times out
    ],
)
def test_a_quadratic_pattern_on_hostile_text_ends_soon_and_does_not_match(
    pattern: str, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    timeout = RateLimitConfig().pattern_timeout_seconds
    plugin = RateLimitPlugin(RateLimitConfig(rate_limit_patterns=[pattern]))
    exc = hostile(first)
    t0 = time.perf_counter()
    c = plugin.classify(exc)
    elapsed = time.perf_counter() - t0
    # no tight timing: the bound only separates "given up" from the seconds it took before
    assert elapsed < 5 * timeout + 1.0, f"{pattern!r} took {elapsed:.2f} s"
    assert (c.kind, c.pattern, c.retryable) == ("tool_error", None, False)


def test_a_pattern_that_runs_past_the_limit_is_no_match_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``a+b`` on "b" then 41k of "a" takes about 0.5 s unbounded (re or regex): far past
    the 10 ms limit set here on any machine."""
    cfg = RateLimitConfig(
        pattern_timeout_seconds=0.01,
        providers={"acme": {"rate_limit_patterns": [{"id": "acme-slow", "regex": "a+b"}]}},
    )
    plugin = RateLimitPlugin(cfg)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c = plugin.classify(hostile("b"), provider="acme")
    assert (c.kind, c.pattern, c.retryable) == ("tool_error", None, False)
    (msg,) = warnings_of(caplog)
    assert "'acme-slow'" in msg and "0.01 s" in msg and "no match" in msg
    assert "pattern_timeout_seconds" in msg  # what to do
    # the same text with a match early on is found as before
    assert plugin.classify(ToolError("aab" + "a" * 40_000), provider="acme").pattern == "acme-slow"


def test_a_timed_out_pattern_leaves_the_other_patterns_to_decide(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = RateLimitConfig(pattern_timeout_seconds=0.01, quota_patterns=["a+b"])
    exc = hostile("b", status=429)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c = RateLimitPlugin(cfg).classify(exc)
    assert (c.kind, c.pattern) == ("rate_limit", "default.status.429")
    assert len(warnings_of(caplog)) == 1


def test_a_timed_out_deny_pattern_counts_as_a_match(caplog: pytest.LogCaptureFixture) -> None:
    """The safe side of a deny pattern is terminal: a hostile text that makes it run out of
    time must not let an allow pattern make the error retryable."""
    cfg = RateLimitConfig(pattern_timeout_seconds=0.01, deny_patterns=["a+b"])
    exc = hostile("b", status=429)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c = RateLimitPlugin(cfg).classify(exc)
    assert (c.kind, c.pattern, c.denied, c.retryable) == (
        "tool_error",
        "config.deny_patterns[0]",
        True,
        False,
    )
    (msg,) = warnings_of(caplog)
    assert "'config.deny_patterns[0]'" in msg and "counted as a match" in msg


async def test_the_warning_is_logged_once_a_minute_per_pattern(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    cfg = RateLimitConfig(
        pattern_timeout_seconds=0.001,
        pattern_budget_seconds=60,  # each pattern's own limit, not the budget, stops it
        rate_limit_patterns=[{"id": "slow-1", "regex": "a+b"}],
        tools={"t": {"rate_limit_patterns": [{"id": "slow-2", "regex": "(?:a|A)+b"}]}},
    )
    plugin = RateLimitPlugin(cfg)
    # both patterns take 0.1 s or more on it unbounded
    slow = ToolError("x", details={"body": "a" * 8000 + "\nb"})

    def warned() -> list[str]:
        out = [m.split()[1] for m in warnings_of(caplog)]
        caplog.clear()
        return out

    async with Kernel(plugins=[plugin], clock=clock):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for _ in range(5):
                assert plugin.classify(slow).pattern is None
            assert warned() == ["'slow-1'"]
            clock.advance(59)
            assert plugin.classify(slow).pattern is None
            assert warned() == []
            # slow-2 has a minute of its own; slow-1, searched after it, is still quiet
            assert plugin.classify(slow, tool="t").pattern is None
            assert warned() == ["'slow-2'"]
            clock.advance(1)
            assert plugin.classify(slow).pattern is None
            (msg,) = warnings_of(caplog)
            assert msg.split()[1] == "'slow-1'"
            assert "6 more times since the last warning" in msg


@pytest.mark.parametrize("value", ["0", "-1", "61", "inf", "nan"])
def test_the_time_limit_must_be_a_positive_number_of_at_most_60_s(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(f"[plugins.ratelimit]\npattern_timeout_seconds = {value}\n")
    with pytest.raises(ConfigError, match=r"plugins\.ratelimit\.pattern_timeout_seconds"):
        Kernel.from_config(load_config(path, env={"TOOLWIRE_LOAD_PLUGINS": "ratelimit"}))


# Pattern syntax accepted before (Python's re) still compiles, and finds what re finds.
SYNTAX = [
    r"(?i)Hold\s+Your\s+Horses",
    r"(?x) rate \s* limit  # verbose",
    r"(?s)rate.{0,5}limit",
    r"(?m)^limit$",
    r"(?a)\w+_exceeded",
    r"\bquota\b",
    r"\d{3} too many",
    r"(?P<n>\d+) requests",
    r"(?P<w>slow) (?P=w)",
    r"(?<=x-)rate",
    r"(?<!no )limit",
    r"limit(?= reached)",
    r"(?:ab)++c",
    r"(?>a|ab)c",
    r"\N{LATIN SMALL LETTER E WITH ACUTE}puis[eé]",
    r"[^\W\d_]{3}x",
    r"\u00e9t\xe9",
    r"\x41\101",
    r"(a)?(?(1)b|c)",
    r"\Aerror",
    r"[]x]y",
    r"a{,3}b",
    r"STRASSE",
    r"\$\d+\.\d\d",
]
TEXTS = [
    "hold   your horses",
    "rate   limit",
    "rate\nlimit",
    "x\nlimit\ny",
    "QUOTA_EXCEEDED",
    "the quota was hit",
    "429 too many",
    "12 requests",
    "slow slow",
    "x-rate",
    "no limit",
    "limit reached",
    "ababc",
    "abc",
    "épuisé",
    "Épuisé",
    "abcx",
    "été",
    "AA",
    "ab",
    "c",
    "]y",
    "error: end",
    "aab",
    "straße strasse",
    "$12.50",
    "",
]


@pytest.mark.parametrize("pattern", SYNTAX)
def test_pattern_syntax_accepted_before_still_finds_what_re_finds(pattern: str) -> None:
    cfg = RateLimitConfig(use_default_patterns=False, rate_limit_patterns=[pattern])
    plugin = RateLimitPlugin(cfg)
    rx = re.compile(pattern, re.IGNORECASE)
    assert any(rx.search(t) for t in TEXTS), f"{pattern!r} matches none of the texts"
    for text in TEXTS:
        expected = "config.rate_limit_patterns[0]" if rx.search(text) else None
        assert plugin.classify(ToolError(text)).pattern == expected, (pattern, text)


# ---------------------------------------------------------------- the budget of one failure
# ``pattern_timeout_seconds`` bounds one search; ``pattern_budget_seconds`` bounds them all,
# for one failure. Before it, an error hostile to 20 configured patterns held the event loop
# for 20 searches given up: about 1 s at the defaults.


def budget_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "spent their" in r.getMessage()
    ]


def slow_patterns(n: int) -> list[dict[str, str]]:
    # distinct patterns, each quadratic on "b" then 41k of "a" (about 0.5 s unbounded)
    return [{"id": f"slow-{i}", "regex": "a+" + "(?:)" * i + "b"} for i in range(n)]


def test_one_failure_stops_searching_configured_patterns_once_their_budget_is_spent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """20 slow patterns, 0.05 s each, a budget of 0.12 s: a search given up lasts at least
    its limit, so at most 3 are searched (the third cut short) and at least 17 are not."""
    cfg = RateLimitConfig(
        pattern_timeout_seconds=0.05,
        pattern_budget_seconds=0.12,
        rate_limit_patterns=slow_patterns(20),
    )
    plugin = RateLimitPlugin(cfg)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c = plugin.classify(hostile("b", status=429))
    # nothing configured matched: the defaults decide, as for a search given up
    assert (c.kind, c.pattern) == ("rate_limit", "default.status.429")
    searched = len(warnings_of(caplog))
    (msg,) = budget_warnings(caplog)
    m = re.search(r"(\d+) search\(es\) cut short and (\d+) pattern\(s\) not searched", msg)
    assert m is not None, msg
    cut, skipped = int(m[1]), int(m[2])
    assert 1 <= searched + cut <= 3 and searched + cut + skipped == 20, msg
    assert "0.12 s" in msg and "pattern_budget_seconds" in msg and "no match" in msg


def test_a_pattern_past_a_spent_budget_is_not_searched_and_misses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The price of the bound: a pattern listed after slow ones that spend the budget
    misses an error it would match. Within the budget, it matches as before."""
    patterns = [*slow_patterns(3), {"id": "found", "regex": "please slow down"}]
    exc = hostile("please slow down b", status=500)

    def classify(budget: float) -> str | None:
        cfg = RateLimitConfig(
            use_default_patterns=False,
            pattern_timeout_seconds=0.02,
            pattern_budget_seconds=budget,
            rate_limit_patterns=patterns,
        )
        return RateLimitPlugin(cfg).classify(exc).pattern

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert classify(0.03) is None
        assert len(budget_warnings(caplog)) == 1
        caplog.clear()
        assert classify(30.0) == "found"
        assert budget_warnings(caplog) == []


def test_the_budget_defaults_to_four_searches_and_must_hold_one() -> None:
    assert RateLimitConfig().pattern_budget() == pytest.approx(0.2)
    assert RateLimitConfig(pattern_timeout_seconds=1).pattern_budget() == pytest.approx(4)
    assert RateLimitConfig(pattern_budget_seconds=0.07).pattern_budget() == pytest.approx(0.07)
    with pytest.raises(ValueError, match=r"pattern_budget_seconds \(0\.01\) is less than"):
        RateLimitConfig(pattern_budget_seconds=0.01)


@pytest.mark.parametrize("value", ["0", "-1", "601", "inf", "nan"])
def test_the_budget_must_be_a_positive_number_of_at_most_600_s(tmp_path: Path, value: str) -> None:
    path = tmp_path / "toolwire.toml"
    path.write_text(f"[plugins.ratelimit]\npattern_budget_seconds = {value}\n")
    with pytest.raises(ConfigError, match=r"plugins\.ratelimit\.pattern_budget_seconds"):
        Kernel.from_config(load_config(path, env={"TOOLWIRE_LOAD_PLUGINS": "ratelimit"}))


async def test_the_budget_warning_is_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    cfg = RateLimitConfig(
        pattern_timeout_seconds=0.01,
        pattern_budget_seconds=0.01,
        rate_limit_patterns=slow_patterns(3),
    )
    plugin = RateLimitPlugin(cfg)
    exc = hostile("b")
    async with Kernel(plugins=[plugin], clock=clock):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for _ in range(3):
                plugin.classify(exc)
            assert len(budget_warnings(caplog)) == 1
            clock.advance(60)
            plugin.classify(exc)
            msgs = budget_warnings(caplog)
    assert len(msgs) == 2 and "2 more times since the last warning" in msgs[1]


@pytest.mark.parametrize("how", ["async-with", "failure"])
async def test_a_failure_inside_a_lease_spends_one_budget_not_two(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A tool with patterns of its own fails inside its provider's lease: the lease
    classifies the failure, with the tool's patterns (``async with lease_key``, or
    ``lease.failure(exc)`` then ``raise exc``). Before, ``on_error`` searched the same
    patterns again on the same evidence, a second budget for the one failure (5
    searches given up where the 0.12 s budget allows 3)."""
    from toolwire import CallContext, Tool
    from toolwire_ratelimit import _classify, key_pool, lease_key

    started: list[str] = []
    search = _classify.TextRegex.matches

    def counting(self: Any, text: str, budget: Any = None) -> bool:
        if self.timeout_s is not None and (budget is None or budget.left > 0):
            started.append(self.pattern_id)
        return search(self, text, budget)

    monkeypatch.setattr(_classify.TextRegex, "matches", counting)
    cfg = RateLimitConfig(
        pattern_timeout_seconds=0.05,
        pattern_budget_seconds=0.12,
        providers={"acme": {}},
        tools={"search": {"provider": "acme", "rate_limit_patterns": slow_patterns(20)}},
    )

    async def executor(args: dict[str, Any], ctx: CallContext) -> Any:
        if how == "async-with":
            async with lease_key(ctx, "acme"):
                raise hostile("b", status=500)
        lease = await key_pool(ctx, "acme").acquire(ctx)
        error = hostile("b", status=500)
        await lease.failure(error)
        raise error

    tool = Tool(name="search", description="d", input_schema={"type": "object"}, executor=executor)
    async with Kernel(tools=[tool], plugins=[RateLimitPlugin(cfg)]) as kernel:
        result = await kernel.call("search", {})
    assert result.error is not None and result.error.kind == "tool_error"
    # each pattern searched once for the one failure; and a search given up lasts at
    # least its 0.05 s, so one budget of 0.12 s starts at most 3
    assert len(started) == len(set(started)), started
    assert 1 <= len(started) <= 3, started
