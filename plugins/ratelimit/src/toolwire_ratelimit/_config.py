"""``[plugins.ratelimit]``: providers, keys, patterns, cooldowns, outbound rates.

The structure follows what operators know from search/LLM aggregation servers:
a ``chain_order``, per-backend ``rate_limit_patterns``, ``cooldown_seconds``,
``suspend_on_monthly_exhausted``, ``request_timeout_seconds``,
``max_provider_attempts``, ``fallback_on_empty``. It may be written inline in
``toolwire.toml`` or in an included YAML/TOML/JSON file (``config_file``);
inline keys override the file's. ``backends`` is accepted for ``providers``
and ``api_keys`` for ``keys``.

Every regular expression is compiled at load (case-insensitive), by ``re`` and by
the ``regex`` package that searches it; an invalid one, or one with nested
repetition that could backtrack catastrophically, is a configuration error naming
it. One search of a configured pattern is bounded by ``pattern_timeout_seconds``.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import pydantic
import regex  # type: ignore[import-untyped]  # no type information
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)

from toolwire import ConfigError, looked_for
from toolwire.cli import unknown_key
from toolwire.state import MAX_TTL_S

if TYPE_CHECKING:
    from toolwire import Kernel

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "KeySpec",
    "PatternKeys",
    "PatternSpec",
    "ProviderConfig",
    "RateLimitConfig",
    "RateSpec",
    "ToolConfig",
    "deep_merge",
    "load_config_file",
    "nested_repetition",
    "with_config_file",
]

Kind = Literal["rate_limit", "quota", "auth", "unavailable", "timeout"]
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$"
#: The longest duration a key accepts (about 31 years). Durations must be finite: they
#: become state-store TTLs and timestamps (infinity failed every call of the provider).
MAX_SECONDS = MAX_TTL_S


#: First characters of the ``\\d``, ``\\s`` and ``\\w`` classes (ASCII; wider text only
#: widens an overlap that is already there).
_CATEGORY_CHARS = {
    "CATEGORY_DIGIT": frozenset("0123456789"),
    "CATEGORY_SPACE": frozenset(" \t\n\r\f\v"),
    "CATEGORY_WORD": frozenset("abcdefghijklmnopqrstuvwxyz0123456789_"),
}


def nested_repetition(pattern: str) -> str | None:
    """Why ``pattern`` may backtrack catastrophically, or None.

    A heuristic on the parsed pattern, for a repetition that may repeat more than
    once (``+``, ``*``, ``{2,}``, ``{12}``):

    - one that contains an unbounded repetition: ``(a+)+``, ``(\\w+\\s?)*``,
      ``(.*,){12}`` (a bounded one too: ``n`` nested steps cost ``len(text) ** n``);
    - one whose body may match nothing: ``(a?a?)+``, ``(x|)*``, ``(?:\\b)+``;
    - one that contains an alternation whose branches may start with the same
      character, or may match nothing: ``(a|a)*``, ``(a|ab)+``.

    Not caught, on purpose (ordinary patterns have this shape): an unbounded
    repetition followed by what must match after it (``rate.*limit``, ``a+b``) costs
    time quadratic in the text on hostile input; ``pattern_timeout_seconds`` bounds
    one search, and docs/ratelimit.md says to bound such repetitions
    (``rate.{0,40}limit``).

    Returns None when the regex engine's parser is not available.
    """
    try:
        from re import _parser  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - other Python implementations
        return None
    try:
        tree = _parser.parse(pattern, re.IGNORECASE)
    except Exception:
        return None
    maxrepeat = _parser.MAXREPEAT
    repeats = {_parser.MAX_REPEAT, _parser.MIN_REPEAT}
    possessive = getattr(_parser, "POSSESSIVE_REPEAT", None)

    def children(op: Any, av: Any) -> list[Any]:
        if op in repeats or op == possessive:
            return [av[2]]
        if op == _parser.SUBPATTERN:
            return [av[3]]
        if op == _parser.BRANCH:
            return list(av[1])
        if op in (_parser.ASSERT, _parser.ASSERT_NOT):
            return [av[1]]
        if op == getattr(_parser, "ATOMIC_GROUP", None):
            return [av]
        return []

    def has_unbounded(sub: Any) -> bool:
        for op, av in sub:
            if op in repeats and av[1] == maxrepeat:
                return True
            if any(has_unbounded(c) for c in children(op, av)):
                return True
        return False

    def chars(op: Any, av: Any) -> frozenset[str] | None:
        """The characters one item matches (lower-case), None for "any, or unknown"."""
        if op == _parser.LITERAL:
            return frozenset(chr(av).lower())
        if op == _parser.IN:
            out: set[str] = set()
            for iop, iav in av:
                if iop == _parser.LITERAL:
                    out.add(chr(iav).lower())
                elif iop == _parser.RANGE and iav[1] - iav[0] <= 256:
                    out.update(chr(c).lower() for c in range(iav[0], iav[1] + 1))
                elif iop == _parser.CATEGORY and str(iav) in _CATEGORY_CHARS:
                    out |= _CATEGORY_CHARS[str(iav)]
                else:
                    return None  # a negated set, a wide range, \\W...
            return frozenset(out)
        return None

    def first(sub: Any) -> tuple[frozenset[str] | None, bool]:
        """(characters a match of ``sub`` may start with, None: any; whether it may be empty)."""
        found: set[str] = set()
        for op, av in sub:
            if op == _parser.AT:  # an anchor: zero width
                continue
            if op in repeats or op == possessive:
                got, empty = first(av[2])
                empty = empty or av[0] == 0
            elif op == _parser.SUBPATTERN:
                got, empty = first(av[3])
            elif op == getattr(_parser, "ATOMIC_GROUP", None):
                got, empty = first(av)
            elif op == _parser.BRANCH:
                got, empty = frozenset(), False
                for b in av[1]:
                    g, e = first(b)
                    got = None if got is None or g is None else got | g
                    empty = empty or e
            elif op in (_parser.ASSERT, _parser.ASSERT_NOT):
                continue
            else:
                got, empty = chars(op, av), False
            if got is None:
                return None, False
            found |= got
            if not empty:
                return frozenset(found), False
        return frozenset(found), True

    def overlapping(branches: Any) -> bool:
        seen: set[str] = set()
        for b in branches:
            got, empty = first(b)
            if got is None or empty or not seen.isdisjoint(got):
                return True
            seen |= got
        return False

    def ambiguous_branch(sub: Any) -> bool:
        for op, av in sub:
            if op == _parser.BRANCH and overlapping(av[1]):
                return True
            if op in repeats or op == possessive:
                continue  # judged on its own by walk()
            if any(ambiguous_branch(c) for c in children(op, av)):
                return True
        return False

    def may_be_empty(sub: Any) -> bool:
        """Whether ``sub`` may match the empty string."""
        for op, av in sub:
            if op in (_parser.AT, _parser.ASSERT, _parser.ASSERT_NOT):
                continue  # zero width
            if op in repeats or op == possessive:
                if av[0] == 0 or may_be_empty(av[2]):
                    continue
                return False
            if op == _parser.SUBPATTERN:
                if may_be_empty(av[3]):
                    continue
                return False
            if op == getattr(_parser, "ATOMIC_GROUP", None):
                if may_be_empty(av):
                    continue
                return False
            if op == _parser.BRANCH:
                if any(may_be_empty(b) for b in av[1]):
                    continue
                return False
            return False
        return True

    def walk(sub: Any) -> str | None:
        for op, av in sub:
            if op in repeats and av[1] > 1:
                if has_unbounded(av[2]):
                    return "nested repetition such as (a+)+ or (.*,){12}"
                if may_be_empty(av[2]):
                    return (
                        "a repetition of something that may match nothing, such as (a?a?)+ or (x|)*"
                    )
                if ambiguous_branch(av[2]):
                    return (
                        "a repeated alternation whose branches may match the same text, "
                        "such as (a|ab)+"
                    )
            for c in children(op, av):
                found = walk(c)
                if found:
                    return found
        return None

    return walk(tree)


def _check_regex(value: str) -> str:
    if "[[:" in value:
        raise ValueError(
            f"regular expression {value!r} holds '[[:', which Python's re reads as a set of "
            "characters and the regex package that searches patterns as a POSIX class "
            "([[:digit:]]); write the characters you mean, such as [0-9] or [a-z]"
        )
    try:
        compiled = re.compile(value, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
    if compiled.search("") is not None:
        # "" (an unset ${VAR}, say), ".*", "x?" ...: such a pattern would make every error
        # retryable, defeating the rule that an unmatched error is terminal.
        raise ValueError(
            f"regular expression {value!r} matches every message (it matches the empty "
            "string), so every error would count as matched; remove it or make it specific"
        )
    try:  # the engine that searches it (version 0: the syntax of re)
        regex.compile(value, regex.IGNORECASE | regex.VERSION0)
    except regex.error as exc:
        raise ValueError(
            f"regular expression {value!r} is not accepted by the regex package that "
            f"searches it: {exc}; write it in the syntax of Python's re that both accept"
        ) from None
    problem = nested_repetition(value)
    if problem:
        raise ValueError(
            f"regular expression {value!r} may backtrack catastrophically on hostile input "
            f"({problem}); rewrite it without a repetition inside a repetition"
        )
    return value


Regex = Annotated[str, AfterValidator(_check_regex)]


def _as_list(v: Any) -> Any:
    return [v] if isinstance(v, (int, str)) and not isinstance(v, bool) else v


class PatternSpec(BaseModel):
    """One pattern with an explicit id and conditions (all that are given must hold)."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(pattern=NAME_RE)] | None = None
    regex: Regex | None = Field(
        None, description="searched in the error message and the body (case-insensitive)"
    )
    status: Annotated[list[Annotated[int, Field(ge=100, le=599)]], BeforeValidator(_as_list)] = (
        Field(default_factory=list, description="HTTP statuses (any of)")
    )
    exception: Regex | None = Field(
        None, description="must fully match an exception class name in the cause chain"
    )

    @model_validator(mode="after")
    def _some_condition(self) -> PatternSpec:
        if self.regex is None and not self.status and self.exception is None:
            raise ValueError("a pattern needs at least one of regex, status, exception")
        return self


def _entry_kind(v: Any) -> str:
    return "regex" if isinstance(v, str) else "pattern"


#: A pattern entry: a regex string, or a table with conditions (errors name the entry).
PatternEntry = Annotated[
    Annotated[Regex, Tag("regex")] | Annotated[PatternSpec, Tag("pattern")],
    Discriminator(_entry_kind),
]
PatternList = list[PatternEntry]


def _statuses(v: Any) -> Any:
    if isinstance(v, list):
        return {s: ("rate_limit" if s == 429 else "unavailable") for s in v}
    return v


class PatternKeys(BaseModel):
    """The pattern keys every scope (global, provider, tool) accepts."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    rate_limit_patterns: PatternList = Field(default_factory=list)
    quota_patterns: PatternList = Field(default_factory=list)
    auth_patterns: PatternList = Field(default_factory=list)
    unavailable_patterns: PatternList = Field(default_factory=list)
    timeout_patterns: PatternList = Field(default_factory=list)
    deny_patterns: PatternList = Field(
        default_factory=list,
        description="a match makes the failure terminal, whatever else matches",
    )
    retryable_statuses: Annotated[
        dict[Annotated[int, Field(ge=100, le=599)], Kind], BeforeValidator(_statuses)
    ] = Field(
        default_factory=dict,
        description="status -> kind; a list means 429 -> rate_limit, others -> unavailable",
    )

    def pattern_items(self) -> list[tuple[str, int, str | PatternSpec]]:
        """(kind, index, entry) for every configured pattern; kind 'deny' for deny patterns."""
        out: list[tuple[str, int, str | PatternSpec]] = []
        for kind in ("quota", "auth", "rate_limit", "unavailable", "timeout", "deny"):
            for i, entry in enumerate(getattr(self, f"{kind}_patterns")):
                out.append((kind, i, entry))
        return out


class KeySpec(BaseModel):
    """An API key with an alias (the only name it appears under) and a weight."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    alias: Annotated[str, Field(pattern=NAME_RE)]
    secret: SecretStr = Field(validation_alias=AliasChoices("secret", "key", "api_key", "value"))
    weight: int = Field(1, ge=1, le=1000)


def _key_kind(v: Any) -> str:
    return "key" if isinstance(v, (dict, KeySpec)) else "secret"


#: A key entry: a secret string, or ``{alias, secret, weight}`` (errors name the entry's
#: field, not pydantic's union of the two).
KeyEntry = Annotated[
    Annotated[SecretStr, Tag("secret")] | Annotated[KeySpec, Tag("key")],
    Discriminator(_key_kind),
]


def _rate(v: Any) -> Any:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"requests": v}
    return v


class RateSpec(BaseModel):
    """Outbound rate: ``requests`` per ``per_seconds``, bursts of ``burst``."""

    model_config = ConfigDict(extra="forbid")

    requests: float = Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    per_seconds: float = Field(1.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    burst: int | None = Field(None, ge=1, le=100_000)
    mode: Literal["wait", "fail_fast"] = "wait"
    max_wait_seconds: float = Field(10.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)

    @model_validator(mode="after")
    def _sane_interval(self) -> RateSpec:
        if self.interval > MAX_SECONDS:
            raise ValueError(
                f"{self.requests:g} requests per {self.per_seconds:g}s is one request every "
                f"{self.interval:.3g}s (at most one every {MAX_SECONDS:g}s); raise requests"
            )
        return self

    @property
    def interval(self) -> float:
        """Seconds between two requests at the sustained rate."""
        return self.per_seconds / self.requests

    @property
    def capacity(self) -> int:
        """Requests allowed at once."""
        return self.burst if self.burst is not None else max(1, int(self.requests))


Rate = Annotated[RateSpec, BeforeValidator(_rate)]


class ProviderConfig(PatternKeys):
    """``[plugins.ratelimit.providers.<name>]`` (or ``backends.<name>``)."""

    tools: list[str] = Field(
        default_factory=list,
        description="tools served by this provider (the first is its fallback target)",
    )
    keys: list[KeyEntry] = Field(
        default_factory=list, validation_alias=AliasChoices("keys", "api_keys")
    )
    api_key: SecretStr | None = None
    cooldown_seconds: float = Field(
        1.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False, description="first cooldown step"
    )
    max_cooldown_seconds: float = Field(3600.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    suspend_on_monthly_exhausted: bool = Field(
        True, description="quota/budget exhausted: suspend the whole pool (else only that key)"
    )
    suspend_seconds: float = Field(
        3600.0,
        gt=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="suspension when the provider names no reset time",
    )
    probe_timeout_seconds: float = Field(60.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    removed_key_grace_seconds: float = Field(
        7 * 86400.0,
        ge=0,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description=(
            "how long the stored state of a key alias no process configures any more "
            "(quarantine included) is kept before it is forgotten"
        ),
    )
    rate: Rate | None = None
    # read by toolwire-retry
    max_provider_attempts: int | None = Field(None, ge=1, le=100)
    request_timeout_seconds: float | None = Field(None, gt=0)
    fallback_on_empty: bool | None = None

    @model_validator(mode="after")
    def _unique_aliases(self) -> ProviderConfig:
        aliases = [k.alias for k in self.keys if isinstance(k, KeySpec)]
        dup = sorted({a for a in aliases if aliases.count(a) > 1})
        if dup:
            raise ValueError(f"duplicate key aliases {dup}")
        return self


class ToolConfig(PatternKeys):
    """``[plugins.ratelimit.tools.<tool>]``: patterns, provider and rate for one tool."""

    provider: Annotated[str, Field(pattern=NAME_RE)] | None = None
    rate: Rate | None = None


class RateLimitConfig(PatternKeys):
    """``[plugins.ratelimit]``. See docs/ratelimit.md."""

    config_file: str | None = Field(
        None, description="a YAML, TOML or JSON file with these keys (relative to toolwire.toml)"
    )
    state_prefix: str = Field("ratelimit", pattern=r"^[A-Za-z0-9_.:{}-]{1,64}$")
    use_default_patterns: bool = True
    trust_tool_kinds: bool = Field(
        True, description="a ToolError raised with kind rate_limit/quota/... counts as a match"
    )
    max_body_bytes: int = Field(8192, ge=256, le=1 << 20)
    pattern_timeout_seconds: float = Field(
        0.05,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description=(
            "time limit of one search of a configured pattern; past it, no match "
            "(a deny pattern: a match)"
        ),
    )
    pattern_budget_seconds: float | None = Field(
        None,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description=(
            "time limit of all configured patterns' searches on one failure (default: 4 x "
            "pattern_timeout_seconds); once spent, the patterns not yet searched count as no "
            "match (a deny pattern: a match)"
        ),
    )
    max_retry_after_seconds: float = Field(31 * 86400.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    providers: dict[Annotated[str, Field(pattern=NAME_RE)], ProviderConfig] = Field(
        default_factory=dict, validation_alias=AliasChoices("providers", "backends")
    )
    tools: dict[str, ToolConfig] = Field(default_factory=dict)
    # read by toolwire-retry (the aggregation-server keys)
    chain_order: list[str] = Field(default_factory=list)
    max_provider_attempts: int | None = Field(None, ge=1, le=100)
    request_timeout_seconds: float | None = Field(None, gt=0)
    fallback_on_empty: bool | None = None

    def pattern_budget(self) -> float:
        """``pattern_budget_seconds``, or its default: 4 x ``pattern_timeout_seconds``."""
        if self.pattern_budget_seconds is not None:
            return self.pattern_budget_seconds
        return 4 * self.pattern_timeout_seconds

    @model_validator(mode="after")
    def _budget_holds_one_search(self) -> RateLimitConfig:
        b = self.pattern_budget_seconds
        if b is not None and b < self.pattern_timeout_seconds:
            raise ValueError(
                f"pattern_budget_seconds ({b:g}) is less than pattern_timeout_seconds "
                f"({self.pattern_timeout_seconds:g}): the budget of one failure's patterns "
                "must hold at least one whole search; raise it or lower the time limit"
            )
        return self

    @field_validator("chain_order")
    @classmethod
    def _no_duplicates(cls, v: list[str]) -> list[str]:
        dup = sorted({x for x in v if v.count(x) > 1})
        if dup:
            raise ValueError(f"listed more than once: {dup}")
        return v

    @model_validator(mode="after")
    def _one_provider_per_tool(self) -> RateLimitConfig:
        owner: dict[str, str] = {}
        for pname, p in self.providers.items():
            for t in p.tools:
                if t in owner:
                    raise ValueError(
                        f"tool {t!r} is listed by providers {owner[t]!r} and {pname!r}; "
                        "a tool belongs to one provider"
                    )
                owner[t] = pname
        for tname, tc in self.tools.items():
            if tc.provider and tname in owner and owner[tname] != tc.provider:
                raise ValueError(
                    f"tools.{tname}.provider is {tc.provider!r} but providers.{owner[tname]}.tools "
                    "lists it"
                )
        return self


# ----------------------------------------------------------- included files
def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top; tables merge, anything else is replaced."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]{0,127})\}$")


def _resolve(
    value: Any, env: Mapping[str, str], secrets: Mapping[str, str], file: str, key: str
) -> Any:
    """``{"$secretRef": NAME}`` and whole-string ``${NAME}`` from the environment/secrets file."""
    if isinstance(value, Mapping):
        if "$secretRef" in value:
            name = value["$secretRef"]
            if set(value) != {"$secretRef"} or not isinstance(name, str):
                raise ConfigError(
                    'a secret reference must be exactly {"$secretRef": "NAME"}', file=file, key=key
                )
            return _lookup(name, env, secrets, file, key)
        return {
            str(k): _resolve(v, env, secrets, file, f"{key}.{k}" if key else str(k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_resolve(v, env, secrets, file, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        m = _ENV_REF.match(value)
        if m:
            return _lookup(m.group(1), env, secrets, file, key)
    return value


def _lookup(
    name: str, env: Mapping[str, str], secrets: Mapping[str, str], file: str, key: str
) -> str:
    if name in env:
        return env[name]
    if name in secrets:
        return secrets[name]
    raise ConfigError(
        f"secret {name!r} is not set; export {name}=... or add it to the secrets file",
        file=file,
        key=key,
    )


def _unreadable(path: str, p: Path, base_dir: Any, key: str, exc: Exception) -> str:
    """Why the included file ``path`` (read as ``p``) cannot be used, and what to do."""
    looked = looked_for(path, p, base_dir)
    section, _, _ = key.rpartition(".")
    keys = f"the keys of [{section}]" if section else "the keys of this table"
    if isinstance(exc, FileNotFoundError):
        what = f"does not exist; create it (YAML, TOML or JSON with {keys}) or fix the path"
    elif isinstance(exc, IsADirectoryError) or p.is_dir():
        what = "is a directory; name a YAML, TOML or JSON file"
    elif isinstance(exc, UnicodeDecodeError):
        what = f"is not UTF-8 text ({exc}); save it as UTF-8"
    else:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        what = f"cannot be read ({reason}); make it readable by this process or fix the path"
    return f"the included config file {path!r}{looked} {what}"


def load_config_file(
    path: str,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    key: str = "config_file",
    written_in: str | None = None,
    named_by: str | None = None,
) -> tuple[dict[str, Any], str]:
    """Read an included config file (YAML, TOML or JSON by suffix): (data, resolved path).

    Relative paths are taken from ``base_dir`` (the directory of toolwire.toml),
    else from the working directory. Secrets are resolved (``$secretRef`` and
    ``${NAME}``); ``backends`` is renamed ``providers``. Errors are
    ``ConfigError`` naming the file; a file that cannot be read is named by the
    key that points at it (``key``, written in the file ``written_in``), with
    the path as written and as resolved. ``named_by``: where the path came from
    when it is not ``written_in`` (``ToolwireConfig.source_of(key)``, e.g. "the
    environment variable ..."): that error then names it, and no file.
    """
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    file = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problem = _unreadable(path, p, base_dir, key, exc)
        if named_by is not None:
            problem += f" (the value comes from {named_by})"
        raise ConfigError(
            problem, file=None if named_by is not None else written_in, key=key
        ) from exc
    suffix = p.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:  # pragma: no cover - pyyaml is a dependency
                raise ConfigError(
                    "reading YAML needs PyYAML: pip install pyyaml", file=file
                ) from exc
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"invalid YAML: {exc}", file=file) from exc
        elif suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError("unknown file type; use .yaml, .yml, .toml or .json", file=file)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot parse: {exc}", file=file) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("the file must hold a mapping (a table) at the top level", file=file)
    if "config_file" in data:
        raise ConfigError(
            "an included file cannot include another (config_file)", file=file, key="config_file"
        )
    if "backends" in data:
        if "providers" in data:
            raise ConfigError(
                "give either 'backends' or 'providers', not both", file=file, key="backends"
            )
        data["providers"] = data.pop("backends")
    for pdata in (data.get("providers") or {}).values():
        if isinstance(pdata, dict) and "api_keys" in pdata and "keys" not in pdata:
            pdata["keys"] = pdata.pop("api_keys")
    data = _resolve(data, os.environ if env is None else env, secrets or {}, file, "")
    return data, file


def validation_error(
    exc: pydantic.ValidationError, *, file: str, prefix: str = "", model: Any = None
) -> ConfigError:
    """A ConfigError naming the file and each failing key (``model``: the model validated,
    for the key an unknown one was meant to be)."""
    msgs = []
    for e in exc.errors(include_url=False):
        where = tuple(e.get("loc", ()))
        loc = ".".join(str(p) for p in where)
        if e.get("type") == "extra_forbidden":
            msg = unknown_key(model, where) if model is not None else "unknown key"
        else:
            msg = e.get("msg", "invalid")
        msgs.append(f"{prefix}{loc}: {msg}")
    return ConfigError("; ".join(msgs), file=file)


def inline_data(config: BaseModel) -> dict[str, Any]:
    """The keys the operator set inline (for merging over an included file)."""
    return config.model_dump(exclude_unset=True, by_alias=False)


def with_config_file(config: M, kernel: Kernel, section: str) -> M:
    """``config`` on top of the file its ``config_file`` names, validated again.

    The file is found next to the kernel's toolwire.toml (or in the working
    directory); ``$secretRef``s resolve from the environment, then the
    kernel's ``secrets_file``. Errors are ``ConfigError`` naming the file and key;
    a file that cannot be read is blamed on the environment variable that named
    it (``TOOLWIRE_PLUGINS__RATELIMIT__CONFIG_FILE``), when one did.
    """
    path = getattr(config, "config_file", None)
    if not path:
        return config
    kcfg = kernel.config
    key = f"{section}.config_file"
    # a path from an environment variable: the error blames the variable, not the file
    named_by = kcfg.source_of(key) if kcfg is not None and kcfg.env_var_of(key) else None
    base = Path(kcfg.path).parent if kcfg is not None and kcfg.path else None
    secrets: dict[str, str] = {}
    if kcfg is not None and kcfg.secrets_file:
        from toolwire import read_secrets_file  # the kernel's own parser

        sp = Path(kcfg.secrets_file)
        if base is not None and not sp.is_absolute():
            sp = base / sp
        if sp.exists():
            secrets = read_secrets_file(sp)
    data, file = load_config_file(
        path,
        base_dir=base,
        secrets=secrets,
        key=key,
        written_in=kcfg.path if kcfg is not None else None,
        named_by=named_by,
    )
    merged = deep_merge(data, inline_data(config))
    merged.pop("config_file", None)
    try:
        return type(config).model_validate(merged)
    except pydantic.ValidationError as exc:
        raise validation_error(
            exc, file=file, prefix=f"{section} (included): ", model=type(config)
        ) from exc
