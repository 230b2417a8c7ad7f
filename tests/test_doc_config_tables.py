"""Each plugin's config tables keep up with its config models.

For every plugin's README (contrib/audit and contrib/_template included):

- every key of its config model, nested tables included (per tool, per server,
  per agent...), is documented: a row of a config table names it, or, for a small
  nested table written inline (``{alias, secret, weight}``), the row of the key
  that holds it names its keys;
- every key a table names exists (a renamed key leaves a stale row);
- where a row states a literal default (``30``, ``"wait"``, ``[]``, ``none``,
  ``required``), it is the model's default; descriptive defaults ("the global
  value") are not checked. ``30``, ``30.0`` and ``"30"`` are the same number;
  ``true`` and ``True`` the same boolean.

A table is found by a line before it (its heading, or the sentence introducing
it) and says where its keys live: ``scope`` is the dotted path of the table in
the model (``servers.<name>``); a row's key may itself be dotted
(``adaptive_timeouts.factor``). Several keys in one row (``host`` / ``port``)
take the defaults in the same order.

The guides in docs/ that repeat a table are held to the same rules (those that
document some keys in prose only to the last two).
"""

from __future__ import annotations

import enum
import inspect
import re
import tomllib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from toolwire_stamp import StampConfig, StampPlugin

from toolwire._config import ToolwireConfig, installed_plugins
from toolwire_a2a import A2AConfig
from toolwire_approval import ApprovalConfig
from toolwire_audit import AuditConfig
from toolwire_idempotency import IdempotencyConfig
from toolwire_mcp import MCPConfig, ServeConfig
from toolwire_profiling import ProfilingConfig
from toolwire_ratelimit import RateLimitConfig
from toolwire_retry import RetryConfig
from toolwire_retry._config import DEFAULTS as RETRY_DEFAULTS
from toolwire_search import SearchConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Table:
    """A config table: the line it follows, and where its keys live."""

    after: str  # a line before the table contains this text (its first table follows)
    model: type[BaseModel]  # the model the scope starts from
    scopes: tuple[str, ...] = ("",)  # dotted paths in ``model``; a row may fit any


@dataclass(frozen=True)
class Doc:
    """A page's config tables."""

    path: str
    plugin: str | None  # its entry-point name (the `order` row is checked against the plugin)
    tables: tuple[Table, ...]  # the first one documents the plugin's Config
    #: defaults of keys whose model default (None) means "inherit": (model, key) -> value
    effective: dict[tuple[type[BaseModel], str], Any] = field(default_factory=dict)
    #: every key of the models must be in the tables (a guide may document some in prose)
    complete: bool = True


_RETRY_DEFAULTS = {(RetryConfig, k): v for k, v in RETRY_DEFAULTS.items()}


READMES = (
    Doc(
        "contrib/audit/README.md",
        "audit",
        (Table("## Configuration — `[plugins.audit]`", AuditConfig),),
    ),
    Doc(
        "contrib/_template/README.md",
        "stamp",
        (Table("## `[plugins.stamp]`", StampConfig),),
    ),
    Doc(
        "plugins/a2a/README.md",
        "a2a",
        (
            Table("## Configuration — `[plugins.a2a]`", A2AConfig),
            Table("### `agents`", A2AConfig, ("agents.<nickname>",)),
            Table("### `registry`", A2AConfig, ("registry",)),
        ),
    ),
    Doc(
        "plugins/approval/README.md",
        "approval",
        (Table("## Configuration", ApprovalConfig),),
    ),
    Doc(
        "plugins/idempotency/README.md",
        "idempotency",
        (Table("## `[plugins.idempotency]`", IdempotencyConfig),),
    ),
    Doc(
        "plugins/mcp/README.md",
        "mcp",
        (
            Table("## `[plugins.mcp]`", MCPConfig),
            Table("### `[plugins.mcp.servers.<name>]`", MCPConfig, ("servers.<name>",)),
            Table("## `[server]`", ServeConfig),
        ),
    ),
    Doc(
        "plugins/profiling/README.md",
        "profiling",
        (Table("## `[plugins.profiling]`", ProfilingConfig),),
    ),
    Doc(
        "plugins/ratelimit/README.md",
        "ratelimit",
        (
            Table("## `[plugins.ratelimit]`", RateLimitConfig),
            Table(
                "Provider keys (`[plugins.ratelimit.providers.<name>]`)",
                RateLimitConfig,
                ("providers.<name>",),
            ),
        ),
    ),
    Doc(
        "plugins/retry/README.md",
        "retry",
        (Table("## `[plugins.retry]`", RetryConfig),),
        effective=_RETRY_DEFAULTS,
    ),
    Doc(
        "plugins/search/README.md",
        "search",
        (
            Table("`[plugins.search]` — every key is optional.", SearchConfig),
            Table("Backend keys (", SearchConfig, ("brave", "searxng")),
            Table("Collection keys (", SearchConfig, ("collections.<name>",)),
        ),
    ),
)
#: The guides in docs/ repeat some of these tables.
GUIDES = (
    Doc(
        "docs/config.md",
        None,
        (
            Table("## Top-level keys", ToolwireConfig),
            Table("## `[tools]`", ToolwireConfig, ("tools",)),
        ),
        complete=False,  # `plugins` has its own section; tests/test_docs.py checks the names
    ),
    Doc(
        "docs/idempotency.md",
        "idempotency",
        (Table("`[plugins.idempotency]` in `toolwire.toml`", IdempotencyConfig),),
    ),
    Doc(
        "docs/mcp.md",
        "mcp",
        (
            Table("### `[plugins.mcp]`", MCPConfig),
            Table(
                "### A server entry (`[plugins.mcp.servers.<name>]`)",
                MCPConfig,
                ("servers.<name>",),
            ),
            Table("### `[server]` — settings of `toolwire serve`", ServeConfig),
        ),
    ),
    Doc(
        "docs/profiling.md",
        "profiling",
        (Table("`[plugins.profiling]` in `toolwire.toml`", ProfilingConfig),),
    ),
    Doc(
        "docs/ratelimit.md",
        "ratelimit",
        (Table("### Keys", RateLimitConfig),),
        complete=False,  # the provider keys are a paragraph
    ),
    Doc(
        "docs/retry.md",
        "retry",
        (Table("## Configuration", RetryConfig),),
        effective=_RETRY_DEFAULTS,
    ),
)
DOCS = READMES + GUIDES


# ------------------------------------------------------------------ the models
def models_in(tp: Any) -> list[type[BaseModel]]:
    """The models a field annotation holds: itself, or in an Optional, union, list, dict."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return models_in(typing.get_args(tp)[0])
    if origin is dict:
        return models_in(typing.get_args(tp)[1])
    if origin in (list, tuple, set, typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in models_in(a)]
    return []


def owner(model: type[BaseModel], name: str) -> type[BaseModel]:
    """The class that declares field ``name`` (fields shared through a base are one key)."""
    for cls in model.__mro__:
        if name in inspect.get_annotations(cls):
            return typing.cast(type[BaseModel], cls)
    return model


def names_of(info: FieldInfo, name: str) -> set[str]:
    """A field's name and the aliases it is accepted under."""
    out = {name}
    alias = info.validation_alias
    if isinstance(alias, str):
        out.add(alias)
    elif isinstance(alias, AliasChoices):
        out |= {c for c in alias.choices if isinstance(c, str)}
    return out


def reachable(model: type[BaseModel], path: str = "") -> Iterator[tuple[type[BaseModel], str, str]]:
    """(model, field, dotted path) of every key of ``model`` and of the tables it holds."""
    seen: set[type[BaseModel]] = set()
    todo = [(model, path)]
    while todo:
        m, p = todo.pop(0)
        if m in seen:
            continue
        seen.add(m)
        for name, info in m.model_fields.items():
            here = f"{p}.{name}" if p else name
            yield m, name, here
            inner = f"{here}.<name>" if _container(info.annotation) else here
            todo += [(n, inner) for n in models_in(info.annotation)]


def _container(tp: Any) -> bool:
    """Whether an annotation is a list or table of values (not one model, maybe None)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _container(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_container(a) for a in typing.get_args(tp))
    return origin in (list, dict, tuple, set)


def _placeholder(seg: str) -> bool:
    return seg.startswith("<") and seg.endswith(">")


def resolve(model: type[BaseModel], path: str) -> list[tuple[type[BaseModel], str]]:
    """The (model, field) of each step of a dotted key, ``<x>`` standing for any name or
    item ([] when it names no key). The last one is the key the path names:
    ``servers.<name>`` names the field ``servers`` (the row documents the table).
    """
    segs = [s for s in path.split(".") if s]
    while segs and _placeholder(segs[-1]):
        segs.pop()
    chain: list[tuple[type[BaseModel], str]] = []
    current = [model]
    for seg in segs:
        if _placeholder(seg):
            continue
        m = next((m for m in current if seg in m.model_fields), None)
        if m is None:
            return []
        chain.append((m, seg))
        current = models_in(m.model_fields[seg].annotation)
    return chain


# --------------------------------------------------------------------- the page
@dataclass
class Row:
    line: int
    keys: list[str]  # the keys the row documents, in order (dotted prefixes filled in)
    aside: set[str]  # names in the key cell's parentheses (aliases, alternatives)
    mentioned: set[str]  # names in code spans of the other cells
    default: str | None  # the default cell, None when the table has no such column


def _cells(line: str) -> list[str]:
    """A table row's cells (``\\|`` inside a cell is a literal bar)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _outside_parens(text: str) -> tuple[str, str]:
    """``text`` without its parenthesised parts, and those parts."""
    out, inside, depth = [], [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth:
            inside.append(ch)
        else:
            out.append(ch)
    return "".join(out), " ".join("".join(inside).split())


def _identifiers(text: str) -> set[str]:
    return {w for span in re.findall(r"`([^`]*)`", text) for w in re.findall(r"\w+", span)}


def _row_keys(cell: str) -> tuple[list[str], set[str]]:
    main, aside = _outside_parens(cell)
    keys = re.findall(r"`([^`]+)`", main)
    # `adaptive_timeouts.min_s` / `max_s`: the second key has the first one's prefix
    prefix = keys[0].rpartition(".")[0] if keys else ""
    keys = [k if "." in k or not prefix else f"{prefix}.{k}" for k in keys]
    return keys, _identifiers(aside)


def table_rows(text: str, after: str) -> list[Row]:
    """The rows of the first table after the line containing ``after``."""
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines) if after in x), None)
    assert start is not None, f"no line contains {after!r}"
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), None)
    assert first is not None, f"no table after the line containing {after!r}"
    header = [c.lower() for c in _cells(lines[first])]
    col = header.index("default") if "default" in header else None
    rows = []
    for i in range(first + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = _cells(lines[i])
        keys, aside = _row_keys(cells[0])
        rows.append(
            Row(
                line=i + 1,
                keys=keys,
                aside=aside,
                mentioned=_identifiers(" ".join(cells[1:])),
                default=cells[col] if col is not None else None,
            )
        )
    return rows


# ------------------------------------------------------------------ the defaults
class Unstated:
    """A default the page describes in words (not checked)."""


REQUIRED = object()


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside code spans, brackets and braces."""
    parts, depth, code, cur = [], 0, False, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            code = not code
        elif not code and ch in "[{":
            depth += 1
        elif not code and ch in "]}":
            depth -= 1
        if not code and depth == 0 and text.startswith(sep, i):
            parts.append(cur)
            cur = ""
            i += len(sep)
            continue
        cur += ch
        i += 1
    return [*parts, cur]


def parse_default(text: str) -> Any:
    """The literal a default cell states, or an ``Unstated`` instance."""
    text, _ = _outside_parens(text)  # "604800 (7 days)"
    text = text.strip()
    if text in ("", "—", "-"):
        return Unstated()
    spans = re.fullmatch(r"`([^`]*)`", text)
    if spans is None:
        if "`" in text:
            return Unstated()  # words around code: "`[plugins.ratelimit]`'s"
        word = text.lower()
        if word == "none":
            return None
        if word == "required":
            return REQUIRED
        if word in ("true", "false"):
            return word == "true"
        if re.fullmatch(r"-?\d+(\.\d+)?(e\d+)?", word):
            return float(word)
        return Unstated()  # "the global value", "generated"
    literal = spans.group(1)
    try:
        return tomllib.loads(f"v = {literal}")["v"]
    except tomllib.TOMLDecodeError:
        return literal  # `ratelimit`, `127.0.0.1`, `/mcp`: a bare string


def defaults_for(row: Row) -> list[Any]:
    """The row's stated default for each of its keys."""
    if row.default is None:
        return [Unstated()] * len(row.keys)
    if len(row.keys) == 1:
        return [parse_default(row.default)]
    for sep in (" / ", ", "):
        parts = _split_top(row.default, sep)
        if len(parts) == len(row.keys):
            return [parse_default(p) for p in parts]
    return [parse_default(row.default)] * len(row.keys)


def same(stated: Any, value: Any) -> bool:
    """Whether a literal of the page states ``value`` (the model's default)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(stated, bool) or isinstance(value, bool):
        return type(stated) is type(value) and stated == value
    if isinstance(value, int | float) and isinstance(stated, int | float | str):
        try:
            return float(stated) == float(value)
        except ValueError:
            return False
    if isinstance(value, dict) and isinstance(stated, dict):
        return set(value) == set(stated) and all(same(stated[k], value[k]) for k in value)
    if isinstance(value, list) and isinstance(stated, list):
        return len(stated) == len(value) and all(
            same(d, v) for d, v in zip(stated, value, strict=True)
        )
    return bool(stated == value)


def model_default(doc: Doc, model: type[BaseModel], name: str) -> Any:
    if (model, name) in doc.effective:
        return doc.effective[(model, name)]
    info = model.model_fields[name]
    if info.is_required():
        return REQUIRED
    return info.get_default(call_default_factory=True)


# --------------------------------------------------------------------- the check
@dataclass
class Findings:
    documented: set[tuple[type[BaseModel], str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def check_tables(doc: Doc, text: str, plugin_order: int | None) -> list[str]:
    """What is wrong between ``text`` (the page) and the models: [] when nothing."""
    found = Findings()
    roots = list(dict.fromkeys(t.model for t in doc.tables))
    for table in doc.tables:
        for row in table_rows(text, table.after):
            where = f"{doc.path}:{row.line}"
            for key, stated in zip(row.keys, defaults_for(row), strict=True):
                if key == "order" and not any(s for s in table.scopes):
                    if not isinstance(stated, Unstated) and not same(stated, plugin_order):
                        found.problems.append(
                            f"{where}: `order` default {row.default} but the plugin's "
                            f"order is {plugin_order}"
                        )
                    continue
                chains = [
                    c
                    for scope in table.scopes
                    if (c := resolve(table.model, f"{scope}.{key}" if scope else key))
                ]
                # `selector.tags` documents `selector` too
                found.documented |= {(owner(m, n), n) for c in chains for m, n in c}
                hits = [c[-1] for c in chains]
                if not hits:
                    found.problems.append(
                        f"{where}: `{key}` is not a key of {table.model.__name__}"
                        f"{' at ' + ', '.join(table.scopes) if any(table.scopes) else ''}"
                    )
                    continue
                for m, name in hits:
                    found.documented.add((owner(m, name), name))
                    _mentions(m, name, row, found)
                    if isinstance(stated, Unstated):
                        continue
                    want = model_default(doc, m, name)
                    required = stated is REQUIRED or want is REQUIRED
                    if not (stated is want if required else same(stated, want)):
                        shown = "required" if want is REQUIRED else repr(want)
                        found.problems.append(
                            f"{where}: `{key}` default {row.default} but "
                            f"{m.__name__}.{name} defaults to {shown}"
                        )
    for root in roots if doc.complete else []:
        for m, name, path in reachable(root):
            if (owner(m, name), name) not in found.documented:
                found.problems.append(
                    f"{doc.path}: `{path}` ({m.__name__}.{name}) is in no config table"
                )
    return found.problems


def _mentions(model: type[BaseModel], name: str, row: Row, found: Findings) -> None:
    """Keys a row names in passing: aliases and alternatives in its key cell (for
    ``model``'s own keys and the tables ``name`` holds), the keys of an inline table
    in its other cells (for the tables ``name`` holds)."""
    info = model.model_fields[name]
    for m, names in [(model, row.aside)] + [
        (n, row.aside | row.mentioned) for n in models_in(info.annotation)
    ]:
        for fname, finfo in m.model_fields.items():
            if names & names_of(finfo, fname):
                found.documented.add((owner(m, fname), fname))


def _plugin_order(name: str | None) -> int | None:
    if name is None:
        return None
    if name == "stamp":  # contrib/_template: tested from its sources, not installed
        return StampPlugin.order
    order = getattr(installed_plugins()[name].load(), "order", None)
    return order if isinstance(order, int) else None


@pytest.mark.parametrize("doc", DOCS, ids=[d.path for d in DOCS])
def test_config_tables_match_the_models(doc: Doc) -> None:
    if doc.plugin is not None:
        factory = StampPlugin if doc.plugin == "stamp" else installed_plugins()[doc.plugin].load()
        assert factory.Config is doc.tables[0].model, "the first table is the plugin's own"
    text = (ROOT / doc.path).read_text(encoding="utf-8")
    problems = check_tables(doc, text, _plugin_order(doc.plugin))
    assert not problems, "\n".join(problems)


def test_every_installed_plugin_with_a_config_is_covered() -> None:
    covered = {r.plugin for r in READMES}
    configured = {n for n, ep in installed_plugins().items() if getattr(ep.load(), "Config", None)}
    assert configured <= covered, sorted(configured - covered)


# ------------------------------------------------------------- the check itself
class _Inner(BaseModel):
    ratio: float = 0.5
    mode: str = "wait"


class _Toy(BaseModel):
    timeout_s: float = 30.0
    enabled: bool = True
    name: str | None = None
    url: str
    items: dict[str, _Inner] = {}


_TOY = Doc("toy.md", "toy", (Table("## toy", _Toy),))


def _toy(rows: str) -> list[str]:
    text = "## toy\n\n| key | default | meaning |\n|---|---|---|\n" + rows
    return check_tables(_TOY, text, plugin_order=7)


_GOOD = (
    "| `timeout_s` / `enabled` | `30` / true | x |\n"
    "| `name` | none | x |\n"
    "| `url` | required | x |\n"
    "| `items.<n>` | `{}` | `{ratio, mode}` |\n"
    "| `order` | `7` | x |\n"
)


def test_a_table_that_matches_has_no_problems() -> None:
    assert _toy(_GOOD) == []
    assert _toy(_GOOD.replace("`30` / true", '`"30.0"` / true')) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("`30` / true", "`60` / true"), "`timeout_s` default `60` / true but _Toy.timeout_s"),
        (("`30` / true", "`30` / false"), "`enabled` default `30` / false"),
        (("| `name` | none", '| `name` | `"x"`'), "`name` default"),
        (("| `url` | required", '| `url` | `"u"`'), "defaults to required"),
        (("| `name` |", "| `nam` |"), "`nam` is not a key of _Toy"),
        (("| `name` |", "| `nam` |"), "`name` (_Toy.name) is in no config table"),
        (("{ratio, mode}", "{ratio}"), "`items.<name>.mode` (_Inner.mode) is in no config table"),
        (("| `order` | `7`", "| `order` | `8`"), "`order` default `8`"),
    ],
)
def test_a_table_that_drifted_names_the_problem(change: tuple[str, str], problem: str) -> None:
    old, new = change
    assert old in _GOOD
    problems = _toy(_GOOD.replace(old, new))
    assert any(problem in p for p in problems), problems


def test_defaults_are_read_as_literals_or_skipped() -> None:
    assert parse_default("`10485760`") == 10485760
    assert parse_default("`604800` (7 days)") == 604800
    assert parse_default("2678400 (31 d)") == 2678400.0
    assert parse_default("`ratelimit`") == "ratelimit"
    assert parse_default('`["a", "b"]`') == ["a", "b"]
    assert parse_default("none") is None
    for words in ("the global value", "`[plugins.ratelimit]`'s", "", "—"):
        assert isinstance(parse_default(words), Unstated)
    assert same(30, 30.0) and same("30", 30) and not same(1, True) and same(True, True)
    assert not same(1, 2)
