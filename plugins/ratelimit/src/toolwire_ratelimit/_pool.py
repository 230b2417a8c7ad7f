"""KeyPool: several API keys per provider, rotated fairly, cooled, quarantined, suspended.

One record per provider in the kernel's StateStore (``<prefix>:pool:<provider>``)
holds everything replicas must agree on; keys appear in it by alias only::

    {"rr": {alias: current_weight},             # smooth weighted round-robin
     "picks": {alias: n},                       # leases handed out (monotonic)
     "keys": {alias: {"fp": fingerprint,        # the key (alias + secret) this state is of
                      "strikes": n,             # rate limits in a row
                      "cool_until": t,          # cooling down until (epoch s)
                      "probe_until": t,         # a half-open probe is in flight
                      "probe_id": id,           # which lease holds that probe
                      "others": {fp: {...}},    # the same four of other secrets sent under
                                                # this alias (a rolling secret change): the
                                                # last writer's are above, the others' here
                      "q": {...}}},             # the earlier versions' form of a quarantine
                                                # (see below)
     "quarantines": {sfp: {"since": t,          # sticky quarantines (auth failures), one per
                           "reason": str,       # secret (fingerprint of the secret alone):
                           "pattern": str,      # replicas sending different secrets under
                           "alias": alias,      # one alias keep theirs apart; recorded
                           "gone": t}},         # under alias; no process configured the
                                                # secret since t (only then; only when any)
     "suspended": {"until": t, ...} | null,     # whole pool (quota/budget)
     "gone": {alias: t},                        # stored aliases the last writer did not
                                                # configure, since when (only when any)
     "grace": s,                                # the last writer's removed_key_grace_s
                                                # (only when not the default)
     "removed": t}                              # written by a process that does not know
                                                # the provider: since when (see
                                                # removed_provider; any pool write drops it)

Earlier versions kept one quarantine per alias, in ``keys[alias]["q"]`` (with "fp", the
key's fingerprint, and "sfp", the secret's, since quarantines followed their secret), and
rewrite the record without ``quarantines`` (they do not know it). So a quarantine is also
written in that form (the alias's last one), for replicas still on an earlier version
during a rolling upgrade; ``KeyPool._read`` adds every one ``quarantines`` lacks, and a
quarantine cleared or forgotten is removed in both forms (``_drop_earlier_form``).

Every change is a compare-and-set, so concurrent picks in one process or many
never lose an update. Every write also forgets aliases and quarantined secrets no
process configures any more, ``removed_key_grace_s`` after they went (see
``KeyPool._forget_removed``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from toolwire import CallContext, ToolError
from toolwire.state import StateStoreError

from ._classify import Classification
from ._store import NOCHANGE, LoopLock, Throttle, Throttled, cas_update

if TYPE_CHECKING:
    from ._plugin import RateLimitPlugin

__all__ = [
    "IMPLICIT",
    "ApiKey",
    "Availability",
    "KeyLease",
    "KeyPool",
    "PoolSettings",
    "PoolUnavailable",
]

log = logging.getLogger("toolwire.ratelimit")

#: The alias of the single implicit "key" of a provider without keys.
IMPLICIT = "-"
_MAX_STRIKES = 30


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key. ``secret`` never appears in ``repr``, logs, errors or stored state."""

    alias: str
    secret: str = field(repr=False)
    weight: int = 1

    @property
    def fingerprint(self) -> str:
        """A one-way fingerprint of (alias, secret): a changed secret lifts a quarantine."""
        h = hashlib.sha256(
            b"toolwire-ratelimit\0" + self.alias.encode() + b"\0" + self.secret.encode()
        )
        return h.hexdigest()[:16]

    @property
    def secret_fingerprint(self) -> str:
        """A one-way fingerprint of the secret alone: a quarantine follows its key to a new
        alias (a rename, unnamed keys renumbered)."""
        h = hashlib.sha256(b"toolwire-ratelimit-secret\0" + self.secret.encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Cooldown and suspension settings of one pool (from ``ProviderConfig``)."""

    cooldown_s: float = 1.0
    max_cooldown_s: float = 3600.0
    suspend_on_monthly_exhausted: bool = True
    suspend_s: float = 3600.0
    probe_timeout_s: float = 60.0
    max_retry_after_s: float = 31 * 86400.0
    removed_key_grace_s: float = 7 * 86400.0  # DEFAULT_GRACE_S


#: ``removed_key_grace_seconds`` when not configured (7 days).
DEFAULT_GRACE_S = 7 * 86400.0


def removed_provider(value: Any, now: float) -> tuple[str, Any]:
    """What to do with the stored pool of a provider this process does not know.

    ``("note", new_value)``: write since when it is unknown (``removed``; every write of
    the pool by a process that knows the provider drops the note again, as for removed
    aliases); ``("forget", None)``: delete it, the note being older than the grace the
    last process configuring the provider used (``grace``, else the default) and nothing
    in it still running (a cooldown, a probe, a suspension); ``("keep", None)``: not yet,
    or not a pool record.
    """
    if not isinstance(value, dict):
        return "keep", None
    since = _num(value, "removed")
    if not 0 < since <= now:  # new, or a bad or future value: count from now
        return "note", {**value, "removed": now}
    grace = _stored_grace(value)
    if grace is None:
        grace = DEFAULT_GRACE_S
    if now - since < grace:
        return "keep", None
    rec = _norm(value)
    susp = rec["suspended"]
    if isinstance(susp, dict) and _num(susp, "until") > now:
        return "keep", None
    for ks in rec["keys"].values():
        if isinstance(ks, dict) and _slot_busy(ks, now):
            return "keep", None
    return "forget", None


def _stored_grace(value: Any) -> float | None:
    """The ``removed_key_grace_s`` the last process configuring the provider wrote with
    its pool (``grace``; None: the default, or not a pool record)."""
    g = value.get("grace") if isinstance(value, dict) else None
    if isinstance(g, int | float) and not isinstance(g, bool) and 0 <= g < float("inf"):
        return float(g)
    return None


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a provider's pool can serve now, and if not, why and until when.

    ``kind``: the error kind a caller should see (``rate_limit`` while keys cool
    down, ``quota`` while suspended, ``auth`` when every key is quarantined).
    ``retry_at`` is wall-clock (epoch seconds), None when only an operator can
    help. ``keys`` maps each alias to ``ok``, ``half_open``, ``probing``,
    ``cooling`` or ``quarantined``.
    """

    provider: str
    available: bool
    state: str
    kind: str | None = None
    reason: str = "ok"
    retry_at: float | None = None
    retry_after_s: float | None = None
    keys: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form."""
        return {
            "provider": self.provider,
            "available": self.available,
            "state": self.state,
            "kind": self.kind,
            "reason": self.reason,
            "retry_at": self.retry_at,
            "retry_after_s": self.retry_after_s,
            "keys": dict(self.keys),
        }


class PoolUnavailable(ToolError):
    """Raised by ``KeyPool.acquire`` when no key can be used now (already classified)."""

    def __init__(self, availability: Availability, pattern: str | None = None) -> None:
        super().__init__(
            f"provider {availability.provider!r}: {availability.reason}",
            kind=availability.kind or "unavailable",
            retry_after_s=availability.retry_after_s,
            details={
                "provider": availability.provider,
                "pattern": pattern or f"pool.{availability.state}",
                "classified_by": "ratelimit",
                "failover": True,
                "pool": availability.to_dict(),
            },
        )
        self.availability = availability


def _norm(value: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "rr": {},
        "picks": {},
        "keys": {},
        "quarantines": {},
        "suspended": None,
        "gone": {},
    }
    if isinstance(value, dict):
        for k in ("rr", "picks", "keys", "quarantines", "gone"):
            if isinstance(value.get(k), dict):
                rec[k] = dict(value[k])
        if isinstance(value.get("suspended"), dict):
            rec["suspended"] = value["suspended"]
        if "removed" in value:  # kept to be seen (``KeyPool._renewal_due``), never written
            rec["removed"] = value["removed"]
    return rec


def _shown(q: dict[str, Any]) -> dict[str, Any]:
    """A stored quarantine as ``status()`` shows it: since, reason, pattern and the alias
    it was recorded under."""
    return {k: v for k, v in q.items() if k not in ("fp", "sfp", "gone")}


def _drop_earlier_form(rec: dict[str, Any], sfps: set[str]) -> None:
    """Remove the earlier versions' form (``keys[alias]["q"]``) of the quarantines of the
    secrets ``sfps`` (lifted or forgotten): else ``KeyPool._read`` would add them again."""
    if not sfps:
        return
    for alias, ks in list(rec["keys"].items()):
        q = ks.get("q") if isinstance(ks, dict) else None
        if isinstance(q, dict) and q.get("sfp") in sfps:
            rest = {k: v for k, v in ks.items() if k != "q"}
            if set(rest) <= {"fp"}:
                del rec["keys"][alias]
            else:
                rec["keys"][alias] = rest


#: A key's own health state (per secret): what ``KeyPool._state_of`` returns.
_OWN = ("strikes", "cool_until", "probe_until", "probe_id")


def _busy(ks: Mapping[str, Any], now: float) -> bool:
    """Whether a cooldown or a probe in ``ks`` still runs."""
    return max(_num(ks, "cool_until"), _num(ks, "probe_until")) > now


def _slot_busy(ks: Mapping[str, Any], now: float) -> bool:
    """Whether a cooldown or a probe of any secret in an alias's stored state still runs."""
    others = ks.get("others")
    return _busy(ks, now) or (
        isinstance(others, dict)
        and any(isinstance(o, dict) and _busy(o, now) for o in others.values())
    )


def _end_probe(ks: dict[str, Any]) -> None:
    ks.pop("probe_until", None)
    ks.pop("probe_id", None)


def _num(d: Mapping[str, Any], k: str) -> float:
    v = d.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


class KeyPool:
    """The keys of one provider. Get it with ``RateLimitPlugin.of(kernel).pool(name)``
    or ``toolwire_ratelimit.key_pool(ctx, name)``.

    A provider without keys still has a pool (one implicit key): it tracks the
    provider's cooldowns and suspension, and ``lease()`` gates on them.
    """

    def __init__(
        self,
        provider: str,
        keys: list[ApiKey],
        settings: PoolSettings,
        plugin: RateLimitPlugin,
        throttle: Throttle | None = None,
        *,
        configured: bool = True,
    ) -> None:
        self.provider = provider
        self.settings = settings
        # False: a stand-in for a provider this process does not configure (its stored
        # pool, shown or cleared by `toolwire keys`): the grace is the stored one.
        self._configured = configured
        self._plugin = plugin
        self._keys: dict[str, ApiKey] = {k.alias: k for k in keys}
        self._implicit = not keys
        if self._implicit:
            self._keys = {IMPLICIT: ApiKey(IMPLICIT, "", 1)}
        self._order = list(self._keys)
        self._total = sum(k.weight for k in self._keys.values())
        self._throttle = throttle
        self._lock = LoopLock()

    def __repr__(self) -> str:
        return f"KeyPool({self.provider!r}, aliases={self.aliases})"

    # ------------------------------------------------------------ basics
    @property
    def aliases(self) -> list[str]:
        """The key aliases, in configuration order (empty for a keyless provider)."""
        return [] if self._implicit else list(self._order)

    @property
    def has_keys(self) -> bool:
        """Whether the provider has real keys (False: only health tracking)."""
        return not self._implicit

    @property
    def _key(self) -> str:
        return self._plugin.state_key("pool", self.provider)

    async def _update(self, fn: Callable[[dict[str, Any], float], tuple[Any, Any]]) -> Any:
        kernel = self._plugin.bound_kernel()

        def wrapped(value: Any, now: float) -> tuple[Any, Any]:
            result, new = fn(self._read(value), now)
            if isinstance(new, dict):
                self._forget_removed(new, now, self._grace(value))
            return result, new

        result = await cas_update(
            kernel.state, self._key, wrapped, lock=self._lock, now=kernel.clock.time
        )
        self._plugin._sweep_soon()
        return result

    def _grace(self, value: Any) -> float:
        """``removed_key_grace_s``: this process's, unless it does not configure the
        provider; then the one stored with the pool by the last process that did (else the
        default), which a write here keeps."""
        if self._configured:
            return self.settings.removed_key_grace_s
        stored = _stored_grace(value)
        return DEFAULT_GRACE_S if stored is None else stored

    def _forget_removed(self, rec: dict[str, Any], now: float, grace: float) -> None:
        """Drop from ``rec`` the aliases no process configures any more (on every write).

        A stored alias this process does not configure is noted in ``rec["gone"]`` with
        the time; a write by a process that configures it removes the note again. So
        during a rolling configuration change the replicas still listing the alias keep
        renewing it, and the grace counts from the first write without it after the last
        write with it: once the note is ``removed_key_grace_s`` old, the alias is
        forgotten (rotation weight, picks, strikes), unless its cooldown or probe is still
        running. A quarantine is kept per secret, not per alias, and forgotten the same way
        once no process has configured its secret (under any alias) for the grace: its
        note is the entry's own ``gone``.
        """
        rec.pop("removed", None)  # a process that uses the provider writes: not removed
        gone: dict[str, Any] = rec.setdefault("gone", {})
        stored = set(rec["keys"]) | set(rec["picks"]) | set(rec["rr"])
        for a in list(gone):
            if a in self._keys or a not in stored:
                del gone[a]
        for a in sorted(stored.difference(self._keys)):
            since = _num(gone, a) if a in gone else 0.0
            if not 0 < since <= now:  # new, or a bad or future value: count from now
                since = gone[a] = now
            ks = rec["keys"].get(a)
            if isinstance(ks, dict) and _slot_busy(ks, now):
                continue
            if now - since >= grace:
                for table in ("keys", "picks", "rr"):
                    rec[table].pop(a, None)
                del gone[a]
        if not gone:
            del rec["gone"]
        quarantines: dict[str, Any] = rec.setdefault("quarantines", {})
        mine = self._secret_fingerprints()
        dropped: set[str] = set()
        for sfp, q in list(quarantines.items()):
            if not isinstance(q, dict):
                del quarantines[sfp]
            elif sfp in mine:
                if "gone" in q:  # configured here: renewed
                    quarantines[sfp] = {k: v for k, v in q.items() if k != "gone"}
            else:
                since = _num(q, "gone")
                if not 0 < since <= now:  # new, or a bad or future value: count from now
                    since = now
                    quarantines[sfp] = {**q, "gone": now}
                if now - since >= grace:
                    del quarantines[sfp]
                    dropped.add(sfp)
        _drop_earlier_form(rec, dropped)
        if not quarantines:
            del rec["quarantines"]
        if grace != DEFAULT_GRACE_S:  # for a process that no longer configures the provider
            rec["grace"] = grace

    def _renewal_due(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` holds a note that a write by this process erases: the provider
        noted as removed, an alias it configures or the quarantine of a secret it sends
        noted as gone. A lease refused (every key quarantined or cooling, the pool
        suspended) writes nothing else; without this, a replica whose every key is
        quarantined renewed nothing, and other processes forgot those quarantines (or the
        whole pool) after the grace, though it configured them all along."""
        if "removed" in rec or any(a in self._keys for a in rec["gone"]):
            return True
        mine = self._secret_fingerprints()
        return any(
            sfp in mine and isinstance(q, dict) and "gone" in q
            for sfp, q in rec["quarantines"].items()
        )

    async def _renew(self) -> None:
        """Erase the notes ``_renewal_due`` finds (a write, only when one is there)."""
        await self._update(lambda rec, now: (None, rec if self._renewal_due(rec) else NOCHANGE))

    def _secret_fingerprints(self) -> set[str]:
        """The fingerprints of the secrets this process configures (none when keyless)."""
        return set() if self._implicit else {k.secret_fingerprint for k in self._keys.values()}

    def _stored_aliases(self, rec: dict[str, Any]) -> set[str]:
        """Every alias the record holds state of (or a quarantine was recorded under)."""
        found = set(rec["keys"]) | set(rec["picks"]) | set(rec["rr"]) | set(rec["gone"])
        for q in rec["quarantines"].values():
            if isinstance(q, dict) and isinstance(q.get("alias"), str):
                found.add(q["alias"])
        return found

    def _read(self, value: Any) -> dict[str, Any]:
        """The stored record, normalised, with every quarantine in the earlier versions'
        form (one per alias, in ``keys[alias]["q"]``) that ``quarantines`` lacks added
        there under its secret's fingerprint: those recorded before the upgrade, and those
        an earlier version's replica wrote back without ``quarantines`` during a rolling
        upgrade. The earlier form stays, for those replicas. One without the secret's
        fingerprint (from before quarantines followed their secret) is added only by a
        process that sends its secret under that alias (its ``fp`` says so)."""
        rec = _norm(value)
        keys, quarantines = rec["keys"], rec["quarantines"]
        by_fp = {} if self._implicit else {k.fingerprint: k for k in self._keys.values()}
        for alias, ks in keys.items():
            q = ks.get("q") if isinstance(ks, dict) else None
            if not isinstance(q, dict):
                continue
            sfp = q.get("sfp")
            if not isinstance(sfp, str):
                fp = q.get("fp")
                key = by_fp.get(fp) if isinstance(fp, str) else None
                if key is None or key.alias != alias:
                    continue
                sfp = key.secret_fingerprint
            if not isinstance(quarantines.get(sfp), dict):
                moved = {k: v for k, v in q.items() if k not in ("fp", "sfp", "alias")}
                quarantines[sfp] = {**moved, "alias": alias}
        return rec

    # ------------------------------------------------------------ health
    def _state_of(self, rec: dict[str, Any], alias: str) -> dict[str, Any]:
        """The health state (strikes, cooldown, probe) of the key ``alias`` sends here: of
        its secret only. The alias's stored state holds the last writer's secret's, and
        under ``others`` those of other secrets sent under that alias (a rolling change of
        its secret: each replica keeps its own); state recorded for a secret no longer
        sent (the key was replaced, unnamed keys renumbered) is another key's."""
        ks = rec["keys"].get(alias)
        if not isinstance(ks, dict):
            return {}
        mine = self._keys[alias].fingerprint
        fp = ks.get("fp")
        if fp is not None and fp != mine:
            others = ks.get("others")
            ks = others.get(mine) if isinstance(others, dict) else None
            if not isinstance(ks, dict):
                return {}
        return {k: ks[k] for k in _OWN if k in ks}

    def _put_state(
        self,
        rec: dict[str, Any],
        alias: str,
        state: dict[str, Any],
        now: float,
        *,
        q: dict[str, Any] | None = None,
    ) -> None:
        """Store ``state`` as the health state of the key ``alias`` sends here (see
        ``_state_of``), and ``q`` (if given) as the alias's quarantine in the earlier
        versions' form. A non-empty state takes the alias's slot; the state of the secret
        that held it moves to ``others``, where it is kept until ``removed_key_grace_s``
        after its cooldown or probe ended."""
        mine = self._keys[alias].fingerprint
        slot = rec["keys"].get(alias)
        slot = slot if isinstance(slot, dict) else {}
        stored = slot.get("others")
        others = {
            f: o
            for f, o in (stored.items() if isinstance(stored, dict) else ())
            if f != mine and isinstance(o, dict)
        }
        owner = slot.get("fp")
        if owner is not None and owner != mine and not state:
            new = {k: v for k, v in slot.items() if k != "others"}  # the slot stays theirs
        else:
            if owner is not None and owner != mine:
                theirs = {k: slot[k] for k in _OWN if k in slot}
                if theirs:
                    others[str(owner)] = theirs
            new = {k: v for k, v in slot.items() if k not in _OWN and k not in ("fp", "others")}
            new.update(state)
            new["fp"] = mine
        if q is not None:
            new["q"] = q
        grace = self.settings.removed_key_grace_s
        others = {
            f: o
            for f, o in others.items()
            if now - max(_num(o, "cool_until"), _num(o, "probe_until")) < grace
        }
        if others:
            new["others"] = others
        if set(new) <= {"fp"}:
            rec["keys"].pop(alias, None)
        else:
            rec["keys"][alias] = new

    def _quarantine_of(self, rec: dict[str, Any], alias: str) -> dict[str, Any] | None:
        """The quarantine of the secret ``alias`` sends, whatever alias it was recorded under."""
        if self._implicit:
            return None
        q = rec["quarantines"].get(self._keys[alias].secret_fingerprint)
        return q if isinstance(q, dict) else None

    def _key_state(self, rec: dict[str, Any], alias: str, now: float) -> str:
        if self._quarantine_of(rec, alias) is not None:
            return "quarantined"
        ks = self._state_of(rec, alias)
        if not ks:
            return "ok"
        if _num(ks, "cool_until") > now:
            return "cooling"
        if _num(ks, "probe_until") > now:
            return "probing"
        if _num(ks, "strikes") > 0:
            return "half_open"
        return "ok"

    def _describe(self, rec: dict[str, Any], now: float) -> Availability:
        states = {a: self._key_state(rec, a, now) for a in self._order}
        shown = {} if self._implicit else dict(states)
        susp = rec["suspended"]
        if isinstance(susp, dict) and _num(susp, "until") > now:
            until = _num(susp, "until")
            why = susp.get("reason") or "quota or budget exhausted"
            pattern = f", pattern {susp['pattern']}" if susp.get("pattern") else ""
            return Availability(
                self.provider,
                False,
                "suspended",
                "quota",
                f"{why}{pattern}; the whole pool is suspended until {_iso(until)}",
                until,
                until - now,
                shown,
            )
        if any(s in ("ok", "half_open") for s in states.values()):
            return Availability(self.provider, True, "ok", keys=shown)
        quarantined = [a for a, s in states.items() if s == "quarantined"]
        if len(quarantined) == len(states):
            return Availability(
                self.provider,
                False,
                "quarantined",
                "auth",
                f"every key ({', '.join(quarantined)}) is quarantined after an authentication "
                f"failure; replace the keys in the configuration, or clear them once they "
                f"work again: `toolwire keys clear {self.provider}` (in code: `await "
                "pool.clear()`)",
                None,
                None,
                shown,
            )
        waits = []
        for a, s in states.items():
            ks = self._state_of(rec, a)
            if s == "cooling":
                waits.append(_num(ks, "cool_until"))
            elif s == "probing":
                waits.append(_num(ks, "probe_until"))
        retry_at = min(waits)
        if self._implicit:
            reason = f"cooling down after a rate limit until {_iso(retry_at)}"
        else:
            busy = [a for a, s in states.items() if s != "quarantined"]
            reason = (
                f"all usable keys ({', '.join(busy)}) are cooling down after rate limits "
                f"or being probed; next one at {_iso(retry_at)}"
            )
            if quarantined:
                reason += f"; quarantined: {', '.join(quarantined)}"
        return Availability(
            self.provider, False, "cooling", "rate_limit", reason, retry_at, retry_at - now, shown
        )

    async def availability(self) -> Availability:
        """Whether a lease would get a key now (no state is changed)."""
        kernel = self._plugin.bound_kernel()
        value = await kernel.state.get(self._key)
        return self._describe(self._read(value), kernel.clock.time())

    async def status(self) -> dict[str, Any]:
        """Availability plus per-key facts (strikes, cooldown, quarantine, picks); no secrets."""
        kernel = self._plugin.bound_kernel()
        value = await kernel.state.get(self._key)
        rec = self._read(value)
        now = kernel.clock.time()
        av = self._describe(rec, now)
        keys = {}
        for a in self.aliases:
            ks = self._state_of(rec, a)
            q = self._quarantine_of(rec, a)
            keys[a] = {
                "state": av.keys.get(a, "ok"),
                "weight": self._keys[a].weight,
                "picks": int(_num(rec["picks"], a)),
                "strikes": int(_num(ks, "strikes")),
                "cool_until": ks.get("cool_until"),
                "quarantine": _shown(q) if q is not None else None,
            }
        return {
            **av.to_dict(),
            "keys": keys,
            "suspended": rec["suspended"],
            "unconfigured": self._unconfigured(rec, now, self._grace(value)),
        }

    def _unconfigured(self, rec: dict[str, Any], now: float, grace: float) -> list[dict[str, Any]]:
        """The stored state of what this process does not configure: aliases other replicas
        (or an earlier configuration) list, and quarantines of secrets it does not send
        (``configured``: the alias they were recorded under is configured here, with
        another secret: a rolling secret change). ``gone_since``: since when the last
        writers did not configure it (None: the last writer did); ``forget_at``: when it
        is forgotten if no process configures it again (a cooldown still running is kept
        until it ends)."""
        out: dict[str, dict[str, Any]] = {}
        stored = set(rec["keys"]) | set(rec["picks"]) | set(rec["rr"])
        for a in sorted(stored.difference(self._keys)):
            ks = rec["keys"].get(a)
            ks = ks if isinstance(ks, dict) else {}
            since = _num(rec["gone"], a) or None
            state = "ok"
            if _num(ks, "cool_until") > now:
                state = "cooling"
            elif _num(ks, "probe_until") > now:
                state = "probing"
            out[a] = {
                "alias": a,
                "configured": False,
                "state": state,
                "picks": int(_num(rec["picks"], a)),
                "strikes": int(_num(ks, "strikes")),
                "cool_until": ks.get("cool_until"),
                "quarantine": None,
                "gone_since": since,
                "forget_at": None if since is None else since + grace,
            }
            q = ks.get("q")  # the oldest form (no "sfp"): in ``quarantines`` only once moved
            if isinstance(q, dict) and not isinstance(q.get("sfp"), str):
                out[a].update(state="quarantined", quarantine={**_shown(q), "alias": a})
        extra: list[dict[str, Any]] = []
        mine = self._secret_fingerprints()
        for sfp, q in sorted(rec["quarantines"].items(), key=lambda kv: str(kv[0])):
            if sfp in mine or not isinstance(q, dict):
                continue
            recorded = q.get("alias")
            alias = recorded if isinstance(recorded, str) else "?"
            since = _num(q, "gone") or None
            forget = None if since is None else since + grace
            entry = out.get(alias)
            if entry is not None and entry["quarantine"] is None:
                entry.update(state="quarantined", quarantine=_shown(q))
                if since is not None and (
                    entry["gone_since"] is None or since < entry["gone_since"]
                ):
                    entry["gone_since"] = since
                if entry["forget_at"] is None or (forget or 0) > entry["forget_at"]:
                    entry["forget_at"] = forget
                continue
            extra.append(
                {
                    "alias": alias,
                    "configured": alias in self._keys and not self._implicit,
                    "state": "quarantined",
                    "picks": 0,
                    "strikes": 0,
                    "cool_until": None,
                    "quarantine": _shown(q),
                    "gone_since": since,
                    "forget_at": forget,
                }
            )
        return [*out.values(), *extra]

    # ------------------------------------------------------------ leasing
    def lease(self, ctx: CallContext | None = None) -> LeaseContext:
        """``async with pool.lease(ctx) as key:`` — the usual way to use a key.

        On a normal exit the key is reported healthy; on an exception the
        failure is classified and reported (cooldown, quarantine, suspension).
        An exception whose text holds a key is replaced by a redacted
        ``ToolError`` (the original chain is dropped so no traceback shows it).
        """
        return LeaseContext(self, ctx)

    async def acquire(self, ctx: CallContext | None = None, *, throttle: bool = True) -> KeyLease:
        """Take a key now (the explicit form of ``lease``); report with
        ``lease.success()`` / ``lease.failure(exc)`` / ``lease.release()``.

        Raises ``PoolUnavailable`` (a classified ``ToolError``) when every key is
        cooling, quarantined or the pool is suspended, or when the outbound
        rate limit is in ``fail_fast`` mode (or would wait too long). A pool that
        cannot serve raises before the outbound rate is waited for: it takes no slot.
        """
        waited = 0.0
        if throttle and self._throttle is not None:
            # A pool that cannot serve says so now: waiting for (and spending) an outbound
            # slot first made calls during a suspension queue for slots only to fail, took
            # the slots of the first requests once it served again, and in fail_fast mode
            # reported an hour's suspension as the outbound rate's few seconds.
            kernel = self._plugin.bound_kernel()
            rec = self._read(await kernel.state.get(self._key))
            av = self._describe(rec, kernel.clock.time())
            if not av.available:
                if self._renewal_due(rec):
                    await self._renew()
                raise PoolUnavailable(av)
            left = ctx.time_left() if ctx is not None else None
            try:
                waited = await self._throttle.take(left)
            except Throttled as exc:
                now = self._plugin.bound_kernel().clock.time()
                av = Availability(
                    self.provider,
                    False,
                    "throttled",
                    "rate_limit",
                    f"outbound rate limit reached; next slot in {exc.wait_s:.3f}s",
                    now + exc.wait_s,
                    exc.wait_s,
                )
                raise PoolUnavailable(av, f"outbound.providers.{self.provider}") from None
        probe_ttl = self.settings.probe_timeout_s

        def pick(
            rec: dict[str, Any], now: float
        ) -> tuple[tuple[str, str | None] | Availability, Any]:
            av = self._describe(rec, now)
            if not av.available:
                if self._renewal_due(rec):
                    return av, rec  # renewed (see _renewal_due), then refused
                raise PoolUnavailable(av)
            healthy = [a for a in self._order if av.keys.get(a, "ok") in ("ok", "half_open")]
            if self._implicit:
                healthy = (
                    [IMPLICIT] if self._key_state(rec, IMPLICIT, now) in ("ok", "half_open") else []
                )
            rr = rec["rr"]
            total = sum(self._keys[a].weight for a in healthy)
            best = healthy[0]
            best_w = None
            for a in healthy:
                cw = int(_num(rr, a)) + self._keys[a].weight
                rr[a] = cw
                if best_w is None or cw > best_w:
                    best, best_w = a, cw
            rr[best] = int(rr[best]) - total
            for a in list(rr):
                if a not in self._keys:
                    del rr[a]
            rec["picks"][best] = int(_num(rec["picks"], best)) + 1
            probe_id = None
            if self._key_state(rec, best, now) == "half_open":
                # A fresh id per probe: a probe whose holder outlived probe_timeout_s must not
                # end (or settle) the probe that took over from it.
                probe_id = secrets.token_hex(8)
                st = dict(self._state_of(rec, best))
                st["probe_until"] = now + probe_ttl
                st["probe_id"] = probe_id
                self._put_state(rec, best, st, now)
            return (best, probe_id), rec

        picked = await self._update(pick)
        if isinstance(picked, Availability):
            raise PoolUnavailable(picked)
        alias, probe_id = picked
        key = self._keys[alias]
        lease = KeyLease(
            self,
            None if self._implicit else alias,
            key.secret,
            probe_id is not None,
            ctx,
            probe_id=probe_id,
        )
        if ctx is not None:
            self._plugin._note_lease(ctx, lease, waited)
        return lease

    # ------------------------------------------------------------ outcomes
    async def report(
        self,
        alias: str | None,
        outcome: str,
        *,
        retry_after_s: float | None = None,
        pattern: str | None = None,
        reason: str | None = None,
        probe: bool | None = None,
        probe_id: str | None = None,
    ) -> float | None:
        """Record what happened with a key (``alias=None``: the provider as a whole).

        ``outcome``: ``success`` (clears cooldown strikes), ``rate_limit``
        (cooldown: the larger of retry-after and an exponential step, capped),
        ``quota`` (suspend the whole pool, or cool only this key when
        ``suspend_on_monthly_exhausted`` is off), ``auth`` (sticky quarantine of
        the key), anything else (``release``) only ends a half-open probe.
        ``probe``: whether the lease reporting was the key's half-open probe
        (``KeyLease`` passes it); a ``success`` of a lease that was not, while
        the key has strikes, changes nothing: only probes are handed out once a
        key was rate-limited, so that lease was taken before. ``probe_id``: which
        probe (``KeyLease`` passes it); a ``success`` or ``release`` of a probe that
        is no longer the key's current one (its holder outlived
        ``probe_timeout_s`` and another lease took over) is treated the same way.

        Returns the seconds the whole pool is now suspended for when this report
        suspended it (a ``quota``), else None.
        """
        s = self.settings
        if alias is None:
            if not self._implicit and outcome not in ("quota",):
                return None  # a failure not tied to a key of a keyed pool: only suspension applies
            a = IMPLICIT if self._implicit else None
        else:
            if alias not in self._keys:
                raise KeyError(f"provider {self.provider!r} has no key {alias!r}")
            a = alias
        ra = retry_after_s if retry_after_s is not None and retry_after_s >= 0 else None
        logged: list[str] = []
        suspended: list[float] = []

        def fn(rec: dict[str, Any], now: float) -> tuple[None, Any]:
            logged.clear()  # fn runs again when a concurrent writer won the update
            suspended.clear()
            ks = dict(self._state_of(rec, a)) if a is not None else {}
            before = dict(ks)
            mirror: dict[str, Any] | None = None
            # a probe that is not the key's current one is no better than a lease from before
            stale = probe is False or (probe_id is not None and ks.get("probe_id") != probe_id)
            if outcome == "success":
                if _num(ks, "cool_until") > now or (stale and _num(ks, "strikes") > 0):
                    # No lease is handed out while a key cools, and only the probe once it
                    # is half-open: this one was taken before the rate limit and says
                    # nothing about the key now (it must not end the probe in flight).
                    return None, NOCHANGE
                # A quarantine stays: it is its secret's (``quarantines``), and its
                # earlier form (``q``, whichever secret it is of) is kept for replicas on
                # an earlier version.
                ks = {}
            elif outcome == "rate_limit":
                until = _num(ks, "cool_until")
                strikes = int(_num(ks, "strikes"))
                if until <= now or strikes == 0:
                    strikes = min(strikes + 1, _MAX_STRIKES)
                # else: the key already cools; this rate limit comes from a request that
                # was in flight with the one that started it: the same strike (only a
                # longer retry-after extends the cooldown).
                step = s.cooldown_s * (2 ** (strikes - 1))
                cool = min(s.max_cooldown_s, max(ra or 0.0, step))
                ks.update(strikes=strikes, cool_until=max(until, now + cool))
                _end_probe(ks)
                logged.append(f"cooling down for {cool:.3f}s (strike {strikes})")
            elif outcome == "quota":
                dur = min(s.max_retry_after_s, ra if ra is not None else s.suspend_s)
                _end_probe(ks)
                if s.suspend_on_monthly_exhausted or a is None:
                    rec["suspended"] = {
                        "until": now + dur,
                        "since": now,
                        "reason": reason or "quota or budget exhausted",
                        "pattern": pattern,
                        "key": None if self._implicit else a,
                    }
                    logged.append(f"whole pool suspended for {dur:.0f}s")
                    suspended.append(dur)
                else:
                    ks.update(cool_until=now + dur, strikes=int(_num(ks, "strikes")) + 1)
                    logged.append(f"key exhausted, cooling for {dur:.0f}s")
            elif outcome == "auth" and not self._implicit and a is not None:
                _end_probe(ks)
                # One quarantine per secret: during a rolling change of the key's secret,
                # replicas sending the old and the new one each keep their own.
                key = self._keys[a]
                q = {"since": now, "reason": reason or "authentication failed", "pattern": pattern}
                rec["quarantines"][key.secret_fingerprint] = {**q, "alias": a}
                # and in the earlier versions' form, for their replicas (a rolling upgrade),
                # unless the alias holds one in the oldest form (no "sfp") of another
                # secret: only a replica sending that secret can add it to ``quarantines``
                slot = rec["keys"].get(a)
                held = slot.get("q") if isinstance(slot, dict) else None
                if not (
                    isinstance(held, dict)
                    and not isinstance(held.get("sfp"), str)
                    and held.get("fp") != key.fingerprint
                ):
                    mirror = {**q, "fp": key.fingerprint, "sfp": key.secret_fingerprint}
                logged.append(
                    "quarantined until the key changes in the configuration or is cleared"
                )
            elif not stale:
                _end_probe(ks)
            if a is not None:
                if ks != before or mirror is not None:
                    self._put_state(rec, a, ks, now, q=mirror)
                elif outcome not in ("quota", "auth"):
                    return None, NOCHANGE
            # Records of aliases this process does not know stay for now: another replica
            # (a rolling configuration change) may still use them, and a quarantine is
            # sticky; _forget_removed drops them once removed_key_grace_s has passed.
            return None, rec

        await self._update(fn)
        for msg in logged:
            who = (
                f"provider {self.provider!r}"
                if a in (None, IMPLICIT)
                else f"provider {self.provider!r} key {a!r}"
            )
            lvl = logging.WARNING if outcome in ("auth", "quota") else logging.INFO
            log.log(lvl, "%s: %s: %s (pattern %s)", who, outcome, msg, pattern)
        return suspended[-1] if suspended else None

    async def clear(self, alias: str | None = None, *, suspension: bool = True) -> None:
        """Lift cooldowns and quarantine of ``alias`` (None: every key and every quarantine
        stored for the provider), and the suspension.

        For a configured alias: the quarantine of its secret, under whatever alias it was
        recorded, and every quarantine recorded under ``alias`` (another secret's, during
        a rolling change of its secret). ``alias`` may also be one this process does not
        configure whose state is still stored (a key renamed or removed, kept for
        ``removed_key_grace_s``; another replica's): its cooldown and the quarantines
        recorded under it are lifted. Raises ``KeyError`` when ``alias`` is neither
        configured nor stored.
        """
        configured = alias is not None and alias in self._keys

        def fn(rec: dict[str, Any], now: float) -> tuple[None, Any]:
            quarantines = rec["quarantines"]
            if alias is None:
                rec["keys"] = {}
                quarantines.clear()
            else:
                if not configured and alias not in self._stored_aliases(rec):
                    raise KeyError(f"provider {self.provider!r} has no key {alias!r}")
                rec["keys"].pop(alias, None)
                sfp = self._keys[alias].secret_fingerprint if configured else None
                lifted = {sfp} if sfp is not None else set()
                for other, q in list(quarantines.items()):
                    if other == sfp or (isinstance(q, dict) and q.get("alias") == alias):
                        del quarantines[other]
                        lifted.add(other)
                _drop_earlier_form(rec, lifted)
            if suspension:
                rec["suspended"] = None
            return None, rec

        await self._update(fn)
        log.warning(
            "provider %r: cleared %s%s",
            self.provider,
            f"key {alias!r}" if alias else "every key",
            " and the suspension" if suspension else "",
        )


class KeyLease:
    """One use of one key. ``secret`` is the key to send; ``alias`` its public name.

    ``alias`` and ``secret`` are None for a provider without keys.
    """

    __slots__ = (
        "_done",
        "_probe_id",
        "_secret",
        "alias",
        "attempt",
        "ctx",
        "pool",
        "probe",
        "provider",
    )

    def __init__(
        self,
        pool: KeyPool,
        alias: str | None,
        secret: str,
        probe: bool,
        ctx: CallContext | None,
        *,
        probe_id: str | None = None,
    ) -> None:
        self.pool = pool
        self.provider = pool.provider
        self.alias = alias
        self._secret = secret
        self.probe = probe
        self._probe_id = probe_id
        self.ctx = ctx
        self.attempt = ctx.attempt if ctx is not None else None
        self._done = False

    @property
    def secret(self) -> str | None:
        """The key itself (send it; never log it)."""
        return self._secret if self.alias is not None else None

    def __repr__(self) -> str:
        return f"KeyLease(provider={self.provider!r}, alias={self.alias!r}, probe={self.probe})"

    async def success(self) -> None:
        """The key worked."""
        if self._done:
            return
        self._done = True
        await self.pool.report(self.alias, "success", probe=self.probe, probe_id=self._probe_id)

    async def release(self) -> None:
        """Neither success nor a key failure (cancelled, provider-side error): end a probe.

        Only this lease's own probe: a lease taken before the key cooled must not end
        the half-open probe another request holds now (a second one would start).
        """
        if self._done:
            return
        self._done = True
        if self.probe:
            await self.pool.report(self.alias, "release", probe_id=self._probe_id)

    async def failure(
        self,
        error: BaseException | None = None,
        *,
        kind: str | None = None,
        retry_after_s: float | None = None,
        pattern: str | None = None,
    ) -> Classification:
        """Report a failure: classify ``error`` (or take ``kind``) and update the key's health."""
        plugin = self.pool._plugin
        ev = None
        if kind is not None:
            c = Classification(kind, retry_after_s=retry_after_s, pattern=pattern)
        elif error is not None:
            c, ev = plugin.classify_exception(error, provider=self.provider, lease=self)
        else:
            c = Classification("tool_error")
        suspended_s = await self._report(c)
        if ev is not None and error is not None:
            plugin._remember(self, c, ev, suspended_s, exc=error)
        return c

    async def _report(self, c: Classification) -> float | None:
        """Report ``c``; the seconds the whole pool is suspended for, if it now is."""
        if self._done:
            return None
        self._done = True
        if c.kind in ("rate_limit", "quota", "auth"):
            return await self.pool.report(
                self.alias, c.kind, retry_after_s=c.retry_after_s, pattern=c.pattern
            )
        if c.kind in ("unavailable", "timeout"):
            if self.probe:  # only this lease's own probe ends (see release)
                await self.pool.report(self.alias, "release", probe_id=self._probe_id)
        else:  # the key worked; the request itself failed (bad query, denied...)
            await self.pool.report(self.alias, "success", probe=self.probe, probe_id=self._probe_id)
        return None


#: How long the bookkeeping after an answer (a key's success), or after a cancellation or
#: KeyboardInterrupt (ending a probe), may hold the caller, even one cancelled meanwhile:
#: the outcome is settled, a slow store must not keep it.
BOOKKEEPING_S = 2.0


async def _bookkeeping(
    lease: KeyLease, record: Callable[[], Awaitable[None]], what: str, then: str
) -> None:
    """Run ``record`` shielded from cancellation and bounded by ``BOOKKEEPING_S``.

    A store failure, or no answer within the bound, is logged (naming the key, what was
    not recorded and the bound) and not raised: the caller's outcome stands.
    """
    try:
        with anyio.CancelScope(shield=True), anyio.move_on_after(BOOKKEEPING_S) as slow:
            await record()
        if slow.cancelled_caught:
            raise StateStoreError(f"the state store did not answer within {BOOKKEEPING_S:g}s")
    except StateStoreError as err:
        log.warning(
            "provider %r key %r: could not %s (%s); %s",
            lease.provider,
            lease.alias,
            what,
            err,
            then,
        )


class LeaseContext:
    """The async context manager ``KeyPool.lease()`` returns."""

    __slots__ = ("ctx", "lease", "pool")

    def __init__(self, pool: KeyPool, ctx: CallContext | None) -> None:
        self.pool = pool
        self.ctx = ctx
        self.lease: KeyLease | None = None

    async def __aenter__(self) -> KeyLease:
        self.lease = await self.pool.acquire(self.ctx)
        return self.lease

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        lease = self.lease
        assert lease is not None
        if exc is None:
            # The request worked: its answer is in hand. Recording the key's success is
            # bookkeeping; a cancellation or a store outage during it must not cost the
            # answer.
            await _bookkeeping(
                lease, lease.success, "record the key's success", "the request's answer is kept"
            )
            return False
        if not isinstance(exc, Exception):  # cancellation, KeyboardInterrupt...
            await _bookkeeping(
                lease,
                lease.release,
                "end the key's half-open probe",
                f"the {type(exc).__name__} goes on; no other probe of the key starts until "
                f"probe_timeout_seconds ({lease.pool.settings.probe_timeout_s:g}s) after this "
                "one began",
            )
            return False
        replacement = await self.pool._plugin._lease_failed(lease, exc)
        if replacement is not None:
            raise replacement from None
        return False
