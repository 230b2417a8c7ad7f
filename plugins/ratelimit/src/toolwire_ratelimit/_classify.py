"""Classification: which kind of failure is this, may it be retried, and when.

The safety gate: only a matching *allow* pattern makes a failure retryable (or
eligible for fail-over); an unmatched failure is terminal. *Deny* patterns are
checked first and override everything (``context_length_exceeded`` is never
retried, whatever the status says).

Patterns come in two tiers. Specific evidence — a regular expression over the
message/body, a structural hint (Brave's ``quota_current >= quota_limit``, an
exhausted monthly window in ``X-RateLimit-*``), a kind the tool declared, or
any pattern the operator configured — beats generic evidence: a bare default
status code (429, 503...) or exception class (``TimeoutError``). Within a
tier, kinds rank ``quota > auth > rate_limit > unavailable > timeout``: a 429
whose body says ``insufficient_quota`` is ``quota``; a 403 that says "rate
limit exceeded" is ``rate_limit``, not ``auth``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import regex  # type: ignore[import-untyped]  # no type information; used via TextRegex only

from . import _hints
from ._evidence import Evidence

__all__ = [
    "CLASSIFIABLE",
    "KIND_RULES",
    "PRECEDENCE",
    "Classification",
    "Classifier",
    "Pattern",
    "PatternBudget",
    "PatternSet",
    "TextRegex",
    "default_patterns",
    "request_not_sent",
    "request_went_out",
]

#: Kinds in precedence order (first wins within a tier).
PRECEDENCE = ("quota", "auth", "rate_limit", "unavailable", "timeout")
#: Error kinds this plugin (re)classifies. Any other kind a tool raised on
#: purpose (``invalid_args``, ``config_error``, ``denied``...) is left alone.
CLASSIFIABLE = frozenset({"tool_error", *PRECEDENCE})
#: kind -> (retryable on the same provider, eligible for fail-over)
KIND_RULES: dict[str, tuple[bool, bool]] = {
    "rate_limit": (True, True),
    "unavailable": (True, True),
    "timeout": (True, True),
    "quota": (False, True),
    "auth": (False, True),
}

StatusFilter = Callable[[int | None], bool]

log = logging.getLogger("toolwire.ratelimit")

#: A pattern that keeps running out of time is logged at most once in this many seconds.
WARN_EVERY_S = 60.0


class _QuietLog:
    """A WARNING logged at most once per ``WARN_EVERY_S`` seconds of ``clock``; the next
    one says how many were left out."""

    __slots__ = ("_last", "_quiet", "clock")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._last: float | None = None
        self._quiet = 0

    def warning(self, msg: str, *args: object) -> None:
        """Log ``msg % args`` plus ``%s`` (the count left out, or nothing), or count it."""
        now = self.clock()
        if self._last is not None and now - self._last < WARN_EVERY_S:
            self._quiet += 1
            return
        quiet, self._quiet, self._last = self._quiet, 0, now
        log.warning(msg, *args, f" ({quiet} more times since the last warning)" if quiet else "")


class PatternBudget:
    """The time the configured patterns may spend together on one failure.

    Started by ``Classifier.classify``; each bounded search (``TextRegex`` with a
    ``timeout_s``) is cut at what is left, and once nothing is left the remaining
    configured patterns are not searched: each counts as given up (no match; a deny
    pattern: a match). Only the time of those searches is spent (the default patterns,
    linear in the text, are not counted), measured on ``time.monotonic`` (real time: the
    kernel's clock may be a fake one in tests).
    """

    __slots__ = ("cut", "left", "seconds", "skipped")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        #: seconds left (0 or less: spent); only the bounded searches spend it
        self.left = seconds
        #: searches cut short by the budget, and patterns not searched for want of it
        self.cut = 0
        self.skipped = 0


class TextRegex:
    """A regular expression searched in the evidence text, case-insensitive.

    Compiled with the ``regex`` package (its version 0 syntax is that of ``re``; the
    configuration checks that both accept a pattern), which searches the default patterns
    faster than ``re`` and can stop a search. ``timeout_s`` (configured patterns) bounds
    one search: a search that runs past it is given up and counts as no match, or as a
    match when ``timed_out_matches`` (a deny pattern: its safe side is terminal), and is
    logged as a WARNING naming ``pattern_id``, at most once per ``WARN_EVERY_S`` seconds
    of ``clock`` for this pattern. ``None`` (the default patterns, which take time linear
    in the text): no bound.
    """

    __slots__ = (
        "_compiled",
        "_warn",
        "pattern",
        "pattern_id",
        "timed_out_matches",
        "timeout_s",
    )

    def __init__(
        self,
        pattern: str,
        *,
        pattern_id: str = "",
        timeout_s: float | None = None,
        timed_out_matches: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pattern = pattern
        self.pattern_id = pattern_id
        self.timeout_s = timeout_s
        self.timed_out_matches = timed_out_matches
        self._compiled: Any = regex.compile(pattern, regex.IGNORECASE | regex.VERSION0)
        self._warn = _QuietLog(clock)

    def __repr__(self) -> str:
        return f"TextRegex({self.pattern!r}, timeout_s={self.timeout_s!r})"

    def matches(self, text: str, budget: PatternBudget | None = None) -> bool:
        """Whether the pattern is found in ``text`` (see the class for a search given up).

        ``budget``: what the failure's configured patterns have left; a bounded search
        is cut at it, and not made once it is spent (see ``PatternBudget``)."""
        if self.timeout_s is None:
            return self._compiled.search(text) is not None
        if budget is None:
            try:
                return self._compiled.search(text, timeout=self.timeout_s) is not None
            except TimeoutError:
                self._timed_out(len(text))
                return self.timed_out_matches
        if budget.left <= 0:
            budget.skipped += 1
            return self.timed_out_matches
        limit = min(self.timeout_s, budget.left)
        t0 = time.monotonic()
        try:
            return self._compiled.search(text, timeout=limit) is not None
        except TimeoutError:
            if limit < self.timeout_s:
                budget.cut += 1  # the budget ran out, not this pattern's own limit
            else:
                self._timed_out(len(text))
            return self.timed_out_matches
        finally:
            budget.left -= time.monotonic() - t0

    def _timed_out(self, length: int) -> None:
        self._warn.warning(
            "pattern %r gave up after %g s searching %d characters of error text, counted "
            "as %s; bound its repetitions (rate.{0,40}limit, not rate.*limit) or raise "
            "[plugins.ratelimit] pattern_timeout_seconds%s",
            self.pattern_id,
            self.timeout_s,
            length,
            "a match (a deny pattern: the failure is terminal)"
            if self.timed_out_matches
            else "no match (the failure is terminal unless another pattern matches)",
        )


def _none_or_4xx(status: int | None) -> bool:
    return status is None or 400 <= status < 500


def _none_or_error(status: int | None) -> bool:
    return status is None or status >= 400


def _none_or_5xx(status: int | None) -> bool:
    return status is None or status >= 500


@dataclass(slots=True, frozen=True)
class Pattern:
    """One allow or deny rule. Every condition that is set must hold.

    ``regex`` searches the messages and the body excerpt (case-insensitive; a
    configured one within its time limit, see ``TextRegex``);
    ``statuses`` is a set of HTTP statuses; ``exception`` must fully match the
    name of one of the exception classes in the chain (bases included; ``re`` with no
    time limit: class names come from code, not from the upstream, and are short);
    ``probe`` is a structural test on the evidence; ``status_filter`` restricts
    a default text pattern to plausible statuses. ``specific`` puts the
    pattern in the first tier (see the module docstring).
    """

    id: str
    kind: str
    regex: TextRegex | None = None
    statuses: frozenset[int] | None = None
    exception: re.Pattern[str] | None = None
    probe: Callable[[Evidence], bool] | None = None
    status_filter: StatusFilter | None = None
    specific: bool = True

    def matches(self, ev: Evidence, budget: PatternBudget | None = None) -> bool:
        """Whether every condition of the pattern holds for ``ev`` (``budget``: see
        ``TextRegex.matches``)."""
        if self.statuses is not None and ev.status not in self.statuses:
            return False
        if self.status_filter is not None and not self.status_filter(ev.status):
            return False
        if self.exception is not None and not any(
            self.exception.fullmatch(n) for n in ev.exc_names
        ):
            return False
        if self.probe is not None and not self.probe(ev):
            return False
        return self.regex is None or self.regex.matches(ev.text, budget)


@dataclass(slots=True)
class PatternSet:
    """Patterns of one scope (a tool, a provider, the global section, the defaults)."""

    deny: list[Pattern] = field(default_factory=list)
    allow: dict[str, list[Pattern]] = field(default_factory=dict)

    def add(self, p: Pattern) -> None:
        """Add an allow pattern (kind in PRECEDENCE) or a deny pattern (kind 'deny')."""
        if p.kind == "deny":
            self.deny.append(p)
        else:
            self.allow.setdefault(p.kind, []).append(p)

    def __bool__(self) -> bool:
        return bool(self.deny or self.allow)


def _quota_window(ev: Evidence) -> bool:
    return ev.status in (403, 429) and _hints.reset_hints(ev.headers, 0.0).quota_exhausted


def _quota_fields(ev: Evidence) -> bool:
    return ev.status in (None, 402, 403, 429) and _hints.quota_fields_exhausted(ev.body_json)


def default_patterns() -> PatternSet:
    """The built-in patterns (ids start with ``default.``); see docs/ratelimit.md."""
    ps = PatternSet()
    text: list[tuple[str, str, str, StatusFilter]] = [
        # deny: the same request fails everywhere; never retry, never fail over
        (
            "deny",
            "default.deny.context_length",
            r"context[_ ]length[_ ]exceeded|maximum context length|prompt is too long"
            r"|string[_ ]above[_ ]max[_ ]length",
            _none_or_error,
        ),
        (
            "deny",
            "default.deny.content_policy",
            r"content[_ ]policy[_ ]violation|content[_ ]filter(?:ed|ing)?\b",
            _none_or_error,
        ),
        # quota: credits, budgets, monthly allowances
        ("quota", "default.quota.insufficient_quota", r"insufficient[_ ]quota", _none_or_4xx),
        (
            "quota",
            "default.quota.exceeded",
            r"quota[_ -]?(?:exceeded|exhausted)|exceeded (?:your|the) (?:current )?quota"
            r"|out of quota|monthly (?:quota|limit|usage limit) (?:reached|exceeded|exhausted)",
            _none_or_4xx,
        ),
        (
            "quota",
            "default.quota.credits",
            r"no[_ ]more[_ ]credits|(?:run|ran) out of credits|credit balance is too low"
            r"|insufficient (?:credits|balance|funds)",
            _none_or_4xx,
        ),
        (
            "quota",
            "default.quota.budget",
            r"budget[_ ]exceeded|exceeded (?:its|your|the) (?:spending )?budget"
            r"|billing[_ ]hard[_ ]limit",
            _none_or_4xx,
        ),
        # auth: the key is wrong, expired or revoked
        (
            "auth",
            "default.auth.invalid_key",
            r"invalid[_ ]?api[_ ]?key|incorrect api key|api[_ ]key (?:is )?(?:invalid|expired|revoked|not valid)"
            r"|subscription[_ ]token[_ ]invalid|invalid[_ ](?:subscription[_ ])?token"
            r"|invalid (?:bearer|access|auth(?:entication)?) token|token (?:has )?expired"
            r"|authentication[_ ](?:error|failed)|unauthori[sz]ed",
            _none_or_4xx,
        ),
        # rate limits
        (
            "rate_limit",
            "default.rate_limit.text",
            r"rate[_ -]?limit(?:ed|ing)?|too many requests|throttl(?:ed|ing)"
            r"|resource[_ ]exhausted|slow down",
            _none_or_error,
        ),
        # transient unavailability
        (
            "unavailable",
            "default.unavailable.text",
            r"service (?:temporarily )?unavailable|temporarily unavailable|overloaded"
            r"|bad gateway|gateway time-?out|upstream connect error|server is busy"
            r"|connection (?:refused|reset)",
            _none_or_5xx,
        ),
    ]
    for kind, pid, rx, flt in text:
        ps.add(Pattern(pid, kind, regex=TextRegex(rx, pattern_id=pid), status_filter=flt))
    ps.add(Pattern("default.headers.quota_window", "quota", probe=_quota_window))
    ps.add(Pattern("default.body.quota_exhausted", "quota", probe=_quota_fields))
    statuses = {
        402: "quota",
        401: "auth",
        403: "auth",
        429: "rate_limit",
        408: "timeout",
        502: "unavailable",
        503: "unavailable",
        504: "unavailable",
        520: "unavailable",
        521: "unavailable",
        522: "unavailable",
        523: "unavailable",
        524: "unavailable",
        529: "unavailable",
    }
    for status, kind in statuses.items():
        ps.add(
            Pattern(f"default.status.{status}", kind, statuses=frozenset({status}), specific=False)
        )
    ps.add(
        Pattern(
            "default.exception.timeout",
            "timeout",
            exception=re.compile(
                r"TimeoutError|TimeoutException|ReadTimeout|ConnectTimeout|WriteTimeout"
                r"|PoolTimeout|ServerTimeoutError|Timeout"
            ),
            specific=False,
        )
    )
    ps.add(
        Pattern(
            "default.exception.connection",
            "unavailable",
            exception=re.compile(
                r"ConnectionError|ConnectError|NetworkError|RemoteProtocolError|ReadError"
                r"|WriteError|ServerDisconnectedError|ClientConnectorError|ClientConnectionError"
            ),
            specific=False,
        )
    )
    return ps


#: Exception classes raised once the request was (or may have been) sent: the connection
#: broke while it was written or before the whole answer came (httpx, httpcore, aiohttp,
#: http.client, the socket itself). The upstream may have done the work.
_SENT = frozenset(
    {
        "ReadError",
        "WriteError",
        "RemoteProtocolError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "RemoteDisconnected",
        "IncompleteRead",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
    }
)
#: ... and classes that say it was not: no connection was made.
_NOT_SENT = frozenset(
    {
        "ConnectError",
        "ConnectTimeout",
        "ConnectionRefusedError",
        "ClientConnectorError",
        "PoolTimeout",
        "gaierror",
    }
)


#: Timeouts that say no connection was made, so nothing was sent: httpx's connect and
#: pool timeouts, aiohttp's connection timeout.
_NOT_SENT_TIMEOUTS = frozenset({"ConnectTimeout", "PoolTimeout", "ConnectionTimeoutError"})


def request_not_sent(ev: Evidence) -> bool:
    """Whether the exception chain says the attempt timed out before a connection was
    made (so the request never went out), and nothing in it says it was sent."""
    names = ev.exc_names
    return not names.isdisjoint(_NOT_SENT_TIMEOUTS) and names.isdisjoint(_SENT)


def request_went_out(ev: Evidence) -> bool:
    """Whether the exception chain says the connection broke after the request went out
    (so its outcome is unknown), and nothing in it says no connection was made."""
    names = ev.exc_names
    return not names.isdisjoint(_SENT) and names.isdisjoint(_NOT_SENT)


@dataclass(slots=True)
class Classification:
    """The verdict on one failure.

    ``pattern`` is the id of the rule that decided (None: nothing matched, the
    failure is terminal). ``retryable``: the same provider may succeed later;
    ``failover``: another provider/key may succeed now. ``denied``: a deny
    pattern matched.
    """

    kind: str
    retryable: bool = False
    failover: bool = False
    retry_after_s: float | None = None
    pattern: str | None = None
    status: int | None = None
    denied: bool = False

    def to_details(self) -> dict[str, Any]:
        """The facts that go to ``ErrorInfo.details``."""
        out: dict[str, Any] = {"pattern": self.pattern, "failover": self.failover}
        if self.denied:
            out["denied"] = True
        return out


class Classifier:
    """Applies pattern scopes (most specific first) and the defaults to evidence."""

    def __init__(
        self,
        *,
        defaults: PatternSet | None,
        trust_declared_kinds: bool = True,
        max_retry_after_s: float = 31 * 86400.0,
        budget_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.defaults = defaults
        self.trust_declared_kinds = trust_declared_kinds
        self.max_retry_after_s = max_retry_after_s
        #: time the configured patterns may spend on one failure (None: no budget)
        self.budget_s = budget_s
        self._warn = _QuietLog(clock)

    def classify(self, ev: Evidence, scopes: Sequence[PatternSet], *, now: float) -> Classification:
        """Classify ``ev``. ``scopes``: tool, provider and global pattern sets, in that order."""
        all_scopes: list[PatternSet] = [s for s in scopes if s]
        budget = PatternBudget(self.budget_s) if self.budget_s is not None and all_scopes else None
        if self.defaults is not None:
            all_scopes.append(self.defaults)
        try:
            return self._classify(ev, all_scopes, now, budget)
        finally:
            if budget is not None and (budget.cut or budget.skipped):
                self._budget_spent(budget, len(ev.text))

    def _classify(
        self, ev: Evidence, all_scopes: list[PatternSet], now: float, budget: PatternBudget | None
    ) -> Classification:
        for scope in all_scopes:
            for p in scope.deny:
                if p.matches(ev, budget):
                    return Classification("tool_error", pattern=p.id, status=ev.status, denied=True)
        declared = ev.declared_kind if self.trust_declared_kinds else None
        found = self._find(ev, all_scopes, declared, budget, specific=True) or self._find(
            ev, all_scopes, None, budget, specific=False
        )
        if found is None:
            kind = ev.declared_kind if ev.declared_kind in CLASSIFIABLE else "tool_error"
            return Classification(kind or "tool_error", status=ev.status)
        kind, pid = found
        retryable, failover = KIND_RULES[kind]
        return Classification(
            kind,
            retryable,
            failover,
            self.retry_after(ev, kind, now),
            pid,
            ev.status,
        )

    def _budget_spent(self, budget: PatternBudget, length: int) -> None:
        self._warn.warning(
            "the configured patterns spent their %g s on one failure (%d characters of error "
            "text): %d search(es) cut short and %d pattern(s) not searched, each counted as no "
            "match (a deny pattern: as a match); bound their repetitions (rate.{0,40}limit, "
            "not rate.*limit) or raise [plugins.ratelimit] pattern_budget_seconds%s",
            budget.seconds,
            length,
            budget.cut,
            budget.skipped,
        )

    @staticmethod
    def _find(
        ev: Evidence,
        scopes: Iterable[PatternSet],
        declared: str | None,
        budget: PatternBudget | None,
        *,
        specific: bool,
    ) -> tuple[str, str] | None:
        scopes = list(scopes)
        for kind in PRECEDENCE:
            for scope in scopes:
                for p in scope.allow.get(kind, ()):
                    if p.specific == specific and p.matches(ev, budget):
                        return kind, p.id
            if declared == kind:
                return kind, f"declared.{kind}"
        return None

    def retry_after(self, ev: Evidence, kind: str, now: float) -> float | None:
        """The bounded delay the evidence asks for (see ``_hints``)."""
        cap = self.max_retry_after_s
        v = _hints.bound(ev.declared_retry_after, cap)
        if v is not None:
            return v
        v = _hints.bound(_hints.header_retry_after(ev.headers, now), cap)
        if v is not None:
            return v
        reset = _hints.reset_hints(ev.headers, now)
        if kind == "quota" and reset.quota_reset_s is not None:
            return _hints.bound(reset.quota_reset_s, cap)
        if kind in ("rate_limit", "unavailable") and reset.rate_reset_s is not None:
            return _hints.bound(reset.rate_reset_s, cap)
        if kind == "quota":
            return None
        return _hints.bound(_hints.body_retry_after(ev.body_json, ev.text), cap)
