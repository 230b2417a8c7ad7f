"""Tool discovery: a lexical index over the catalog, ``find_tools`` and exports.

- ``ToolIndex`` is a BM25F index (one BM25 saturation over field-weighted,
  per-field length-normalized term frequencies) over a tool's name, description,
  tags and input-schema parameters. It implements the ``Ranker`` protocol so a
  stronger ranker (embeddings, a remote search service) can replace it.
- ``find_tools`` selects tools from a catalog by name, glob, tag or source
  (``explicit``), by ranking (``semantic``) or both (``hybrid``), within an
  ``allowed`` list.
- ``to_openai`` / ``to_anthropic`` / ``to_mcp`` turn a ``Tool`` into the tool
  definition each API expects.

Pure stdlib: the index is a dict of postings; the per-term scores are computed
lazily and cached until the next ``add``/``remove``/``rebuild``.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import hashlib
import heapq
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, get_args, runtime_checkable

from ._types import Tool

__all__ = [
    "FIELDS",
    "ExportFormat",
    "FindMode",
    "Ranker",
    "ToolIndex",
    "export_tool",
    "field_terms",
    "find_tools",
    "split_identifier",
    "to_anthropic",
    "to_mcp",
    "to_openai",
    "tokenize",
]

JSON = dict[str, Any]
FindMode = Literal["explicit", "semantic", "hybrid"]
ExportFormat = Literal["openai", "anthropic", "mcp"]
_MODES: Final[tuple[str, ...]] = get_args(FindMode)

# ----------------------------------------------------------------- tokenizer
_STOPWORD_TEXT: Final = """
    a about all also am an and any are as at be been being but by can could did do does
    for from had has have he her here him his how i if in into is it its just me might
    must my no nor of on or our ours please she should so some such than that the their
    them then there these they this those to too us very was we were what when where
    which while who whom why will with would you your yours
"""
_STOPWORDS: Final[frozenset[str]] = frozenset(_STOPWORD_TEXT.split())
_VOWELS: Final[frozenset[str]] = frozenset("aeiou")
_KEEP_DOUBLE: Final[frozenset[str]] = frozenset("aeioulsz")
_WORD_RE: Final[re.Pattern[str]] = re.compile(r"\w+")


def _stem(word: str) -> str:
    """A light, deterministic suffix stemmer (plurals, -ing, -ed).

    Every form of a word goes through the same steps, so "queries"/"query",
    "creating"/"created"/"create"/"creates" and "running"/"run" meet:

    1. Plurals: ``-ies`` -> ``-i``; ``-sses``/``-ches``/``-shes``/``-xes``/
       ``-zes`` drop ``-es``; otherwise a final ``-s`` is dropped (not after
       s, u or i: "class", "status", "analysis").
    2. Then ``-ing`` / ``-ed`` is dropped when at least three letters remain
       ("settings" -> "sett", then "set" by step 3).
    3. The result is normalized: a final consonant + ``y`` becomes ``i``, a
       final ``e`` is dropped, and a final double consonant (except l, s, z) is
       undoubled.

    Words of three letters or fewer and words with digits are left alone.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies"):
        word = word[:-3] + "i"
    elif word.endswith(("sses", "ches", "shes", "xes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing"):
        if len(word) >= 6:
            word = word[:-3]
    elif word.endswith("ed") and len(word) >= 5:
        word = word[:-2]
    n = len(word)
    if n > 2 and word[-1] == "y" and word[-2] not in _VOWELS:
        word = word[:-1] + "i"
    elif n > 3 and word[-1] == "e":
        word = word[:-1]
    n = len(word)
    if n > 3 and word[-1] == word[-2] and word[-1] not in _KEEP_DOUBLE:
        word = word[:-1]
    return word


def _camel_split(word: str) -> list[str]:
    """Split one underscore-free word at camelCase boundaries (unicode-aware).

    ``getHTTPResponse`` -> ``get``, ``HTTP``, ``Response``; ``v2Api`` -> ``v2``,
    ``Api``. Digits stay attached to the preceding letters.
    """
    parts: list[str] = []
    start = 0
    n = len(word)
    for i in range(1, n):
        cur = word[i]
        if not cur.isupper():
            continue
        prev = word[i - 1]
        if (prev.islower() or prev.isdigit()) or (
            prev.isupper() and i + 1 < n and word[i + 1].islower()
        ):
            parts.append(word[start:i])
            start = i
    parts.append(word[start:])
    return parts


def split_identifier(identifier: str) -> list[str]:
    """The lowercase words of an identifier, without stemming or stopwords.

    Splits snake_case, camelCase, PascalCase, kebab-case, dotted and slashed
    names: ``github.createPullRequest`` -> ``["github", "create", "pull",
    "request"]``.
    """
    out: list[str] = []
    for raw in _WORD_RE.findall(identifier):
        for piece in raw.split("_"):
            if piece:
                out.extend(p.lower() for p in _camel_split(piece))
    return out


@functools.lru_cache(maxsize=65536)
def _analyze_word(raw: str) -> tuple[str, ...]:
    """The terms of one ``\\w+`` run: its stemmed parts, plus the joined
    compound when the run has several parts (``JavaScript`` -> ``java``,
    ``script``, ``javascript``), so compounds match either spelling.
    """
    if "_" not in raw and (raw[1:] == raw[1:].lower() or raw.isupper()):
        low = raw.lower()
        if low in _STOPWORDS or (len(low) == 1 and not low.isdigit()):
            return ()
        return (_stem(low),)
    parts = [p.lower() for piece in raw.split("_") if piece for p in _camel_split(piece)]
    terms = [_stem(p) for p in parts if p not in _STOPWORDS and (len(p) > 1 or p.isdigit())]
    if len(parts) > 1:
        terms.append(_stem("".join(parts)))
    return tuple(terms)


def tokenize(text: str) -> list[str]:
    """The index terms of ``text``, in order (duplicates kept).

    Lowercased unicode word runs (``\\w+``), identifiers split into words (with
    their joined compound also kept), English stopwords and one-letter words
    dropped, each term stemmed by a light suffix stemmer. Queries and documents
    go through the same function.
    """
    analyze = _analyze_word
    return [term for raw in _WORD_RE.findall(text) for term in analyze(raw)]


# ------------------------------------------------------------------- fields
FIELDS: Final[tuple[str, ...]] = ("name", "description", "tags", "params")
_DEFAULT_WEIGHTS: Final[Mapping[str, float]] = {
    "name": 3.0,
    "description": 1.0,
    "tags": 2.0,
    "params": 0.5,
}
_DEFAULT_B: Final[Mapping[str, float]] = {
    "name": 0.3,
    "description": 0.75,
    "tags": 0.3,
    "params": 0.75,
}
_MAX_SCHEMA_DEPTH: Final = 12


def _schema_texts(node: Any, out: list[str], depth: int) -> None:
    """Collect property names, property/definition descriptions and string
    enum values of a JSON schema (the root description is the tool's own)."""
    if depth > _MAX_SCHEMA_DEPTH:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for prop, sub in value.items():
                    out.append(str(prop))
                    _schema_texts(sub, out, depth + 1)
            elif key == "description":
                if depth > 0 and isinstance(value, str):
                    out.append(value)
            elif key == "enum" and isinstance(value, list):
                out.extend(v for v in value if isinstance(v, str))
            elif isinstance(value, dict | list):
                _schema_texts(value, out, depth + 1)
    elif isinstance(node, list):
        for item in node:
            _schema_texts(item, out, depth + 1)


def field_terms(tool: Tool) -> dict[str, list[str]]:
    """The analyzed terms of each indexed field of ``tool`` (see ``FIELDS``).

    ``name`` holds the split tool name and the annotation title;
    ``params`` the input-schema property names, their descriptions and string
    enum values.
    """
    name_text = tool.name
    if tool.annotations.title:
        name_text = f"{name_text} {tool.annotations.title}"
    pieces: list[str] = []
    _schema_texts(tool.input_schema, pieces, 0)
    short = _short_text_terms
    return {
        "name": tokenize(name_text),
        "description": tokenize(tool.description or ""),
        "tags": [t for tag in sorted(tool.tags) for t in short(tag)],
        "params": [t for piece in pieces for t in short(piece)],
    }


@functools.lru_cache(maxsize=16384)
def _short_text_terms(text: str) -> tuple[str, ...]:
    """``tokenize`` for the short, often repeated texts of tags and parameters
    (``limit``, "Maximum number of results")."""
    return tuple(tokenize(text))


# -------------------------------------------------------------------- ranker
@runtime_checkable
class Ranker(Protocol):
    """What ``find_tools`` needs from a ranker (``ToolIndex`` is the default).

    A ranker mirrors the catalog (``rebuild``/``add``/``remove``, keyed by tool
    name) and returns ``(tool, score)`` pairs for a text query, best first,
    positive scores only, at most ``limit``, restricted to names for which
    ``allowed(name)`` is true when given.
    """

    def rebuild(self, tools: Iterable[Tool]) -> None:
        """Replace the whole content with ``tools``."""
        ...

    def add(self, tool: Tool) -> None:
        """Add ``tool`` (replacing a tool of the same name)."""
        ...

    def remove(self, name: str) -> None:
        """Remove the tool called ``name`` (no-op when absent)."""
        ...

    def search(
        self,
        query: str,
        *,
        limit: int = 10,
        allowed: Callable[[str], bool] | None = None,
    ) -> list[tuple[Tool, float]]:
        """The best tools for ``query``, best first."""
        ...


class _Doc:
    """One indexed tool: the tool, its field lengths and per-field term counts."""

    __slots__ = ("counts", "lengths", "tool")

    def __init__(
        self, tool: Tool, lengths: tuple[int, ...], counts: tuple[dict[str, int], ...]
    ) -> None:
        self.tool = tool
        self.lengths = lengths
        self.counts = counts


class ToolIndex:
    """A BM25F lexical index over tools (implements ``Ranker``).

    Fields (see ``FIELDS``) and their default weights: name 3.0 (split into
    words, plus the annotation title), tags 2.0, description 1.0, input-schema
    params 0.5. Scoring is BM25F::

        tf~(t, d) = sum_f w_f * tf_f(t, d) / (1 - b_f + b_f * len_f(d) / avglen_f)
        score(q, d) = sum_{t in q} idf(t) * tf~ * (k1 + 1) / (tf~ + k1)
        idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))          (always > 0)

    Query terms are deduplicated. A field of weight 0 is ignored.

    ``add``/``remove`` cost O(terms of the tool); the statistics they change
    (N, df, average field lengths) are applied lazily: the per-term scores are
    cached and the cache is dropped on every change, so the first search after
    a change recomputes the terms it uses. Incremental updates give exactly the
    scores a rebuild gives. Ties are broken by tool name. Not thread-safe:
    serialize writers (reads between writes are fine).
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        k1: float = 1.2,
        weights: Mapping[str, float] | None = None,
        b: Mapping[str, float] | None = None,
    ) -> None:
        """Index ``tools``; ``weights``/``b`` override the per-field defaults."""
        w = {**_DEFAULT_WEIGHTS, **(weights or {})}
        bb = {**_DEFAULT_B, **(b or {})}
        unknown = (set(w) | set(bb)) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}; fields are {list(FIELDS)}")
        if not k1 > 0:
            raise ValueError(f"k1 must be > 0, got {k1}")
        for f in FIELDS:
            if not (w[f] >= 0 and 0.0 <= bb[f] <= 1.0):
                raise ValueError(f"field {f!r}: need weight >= 0 and 0 <= b <= 1")
        self._k1 = float(k1)
        self._w: tuple[float, ...] = tuple(float(w[f]) for f in FIELDS)
        self._b: tuple[float, ...] = tuple(float(bb[f]) for f in FIELDS)
        self._docs: dict[str, _Doc] = {}
        # per field: term -> {tool name: term count in that field}
        self._postings: tuple[dict[str, dict[str, int]], ...] = tuple({} for _ in FIELDS)
        self._total_len: list[int] = [0] * len(FIELDS)
        # term -> (df, {tool name: saturated tf}); dropped on every change
        self._cache: dict[str, tuple[int, dict[str, float]]] = {}
        self.rebuild(tools)

    # --------------------------------------------------------- parameters
    @property
    def k1(self) -> float:
        """The BM25 term-frequency saturation parameter."""
        return self._k1

    @property
    def weights(self) -> dict[str, float]:
        """The field weights, by field name."""
        return dict(zip(FIELDS, self._w, strict=True))

    @property
    def b(self) -> dict[str, float]:
        """The per-field length-normalization parameters, by field name."""
        return dict(zip(FIELDS, self._b, strict=True))

    def stats(self) -> dict[str, int]:
        """Sizes: ``tools``, ``terms`` (distinct) and ``postings`` (per field, summed)."""
        return {
            "tools": len(self._docs),
            "terms": len(set().union(*self._postings)),
            "postings": sum(len(p) for field in self._postings for p in field.values()),
        }

    # ------------------------------------------------------------ content
    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, name: object) -> bool:
        return name in self._docs

    def get(self, name: str) -> Tool | None:
        """The indexed tool called ``name``, if any."""
        doc = self._docs.get(name)
        return doc.tool if doc is not None else None

    def rebuild(self, tools: Iterable[Tool]) -> None:
        """Replace the index content with ``tools`` (a later duplicate name wins)."""
        self._docs = {}
        self._postings = tuple({} for _ in FIELDS)
        self._total_len = [0] * len(FIELDS)
        self._cache = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        """Index ``tool``; a tool already indexed under that name is replaced."""
        name = tool.name
        if name in self._docs:
            self.remove(name)
        per = field_terms(tool)
        counts = []
        lengths = []
        for i, field in enumerate(FIELDS):
            terms = per[field]
            lengths.append(len(terms))
            self._total_len[i] += len(terms)
            c = Counter(terms)
            counts.append(c)
            postings = self._postings[i]
            for term, n in c.items():
                post = postings.get(term)
                if post is None:
                    postings[term] = {name: n}
                else:
                    post[name] = n
        self._docs[name] = _Doc(tool, tuple(lengths), tuple(counts))
        if self._cache:
            self._cache = {}

    def remove(self, name: str) -> None:
        """Drop the tool called ``name`` from the index (no-op when absent)."""
        doc = self._docs.pop(name, None)
        if doc is None:
            return
        for i, counts in enumerate(doc.counts):
            self._total_len[i] -= doc.lengths[i]
            postings = self._postings[i]
            for term in counts:
                post = postings[term]
                del post[name]
                if not post:
                    del postings[term]
        if self._cache:
            self._cache = {}

    # ------------------------------------------------------------- search
    def _term_scores(self, term: str) -> tuple[int, dict[str, float]]:
        """``(df, {name: saturated BM25F tf})`` of ``term`` (idf not applied); cached."""
        cached = self._cache.get(term)
        if cached is not None:
            return cached
        n_docs = len(self._docs)
        docs = self._docs
        tf: dict[str, float] = {}
        for i, postings in enumerate(self._postings):
            post = postings.get(term)
            w = self._w[i]
            if not post or w == 0.0:
                continue
            bi = self._b[i]
            avg = self._total_len[i] / n_docs
            # 1 - b + b * len / avg == base + slope * len (avg > 0: the term occurs)
            base = 1.0 - bi
            slope = bi / avg
            get = tf.get
            for name, c in post.items():
                tf[name] = get(name, 0.0) + w * c / (base + slope * docs[name].lengths[i])
        k1 = self._k1
        k1p1 = k1 + 1.0
        sats = {name: x * k1p1 / (x + k1) for name, x in tf.items()}
        out = (len(sats), sats)
        if sats:  # unknown query words are not cached: the cache stays index-sized
            self._cache[term] = out
        return out

    def scores(self, query: str) -> dict[str, float]:
        """Every matching tool's score for ``query`` (unordered, all > 0)."""
        n_docs = len(self._docs)
        acc: dict[str, float] = {}
        if not n_docs:
            return acc
        for term in dict.fromkeys(tokenize(query)):
            df, sats = self._term_scores(term)
            if not df:
                continue
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            if not acc:
                acc = {name: idf * s for name, s in sats.items()}
                continue
            get = acc.get
            for name, s in sats.items():
                acc[name] = get(name, 0.0) + idf * s
        return acc

    def search(
        self,
        query: str,
        *,
        limit: int = 10,
        allowed: Callable[[str], bool] | None = None,
    ) -> list[tuple[Tool, float]]:
        """The best ``limit`` tools for ``query`` as ``(tool, score)``.

        Best first, ties by name; scores are > 0 (tools sharing no term with
        the query are never returned). ``allowed(name)`` restricts the result;
        it is called on candidates best-first, in growing batches, so usually
        on a few dozen names only.

        :raises ValueError: ``limit`` < 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        acc = self.scores(query)
        if not acc:
            return []
        if allowed is None:
            best = _best(acc, limit)
        else:
            m = max(4 * limit, 32)
            while True:
                ranked = _best(acc, m)
                best = [(n, s) for n, s in ranked if allowed(n)]
                if len(best) >= limit or len(ranked) == len(acc):
                    best = best[:limit]
                    break
                m *= 4
        docs = self._docs
        return [(docs[n].tool, s) for n, s in best]


def _order(item: tuple[str, float]) -> tuple[float, str]:
    return (-item[1], item[0])


def _best(acc: dict[str, float], k: int) -> list[tuple[str, float]]:
    """The top ``k`` of ``acc`` by score desc then name, exactly."""
    if k >= len(acc):
        return sorted(acc.items(), key=_order)
    threshold = heapq.nlargest(k, acc.values())[-1]
    pool = [(n, s) for n, s in acc.items() if s >= threshold]
    pool.sort(key=_order)
    return pool[:k]


# ---------------------------------------------------------------- selection
_GLOB_CHARS: Final = frozenset("*?[")


def _pattern(text: str) -> Callable[[str], bool]:
    """A case-sensitive matcher: fnmatch glob when ``text`` has glob chars."""
    if _GLOB_CHARS.isdisjoint(text):
        return text.__eq__
    match = re.compile(fnmatch.translate(text)).match
    return lambda s: match(s) is not None


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


class _Selector:
    """Compiled ``allowed``/explicit entries: names, globs, tag:, source:."""

    __slots__ = ("exact", "name_pats", "source_pats", "tag_pats")

    def __init__(self, entries: Iterable[str]) -> None:
        self.exact: dict[str, None] = {}
        self.name_pats: list[Callable[[str], bool]] = []
        self.tag_pats: list[Callable[[str], bool]] = []
        self.source_pats: list[Callable[[str], bool]] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            if entry.startswith("tag:"):
                value = entry[4:].strip()
                if value:
                    self.tag_pats.append(_pattern(value))
            elif entry.startswith("source:"):
                value = entry[7:].strip()
                if value:
                    self.source_pats.append(_pattern(value))
            elif _GLOB_CHARS.isdisjoint(entry) or _has_space(entry):
                # free text ("what is the weather?") is never a name glob
                self.exact[entry] = None
            else:
                self.name_pats.append(_pattern(entry))

    @property
    def exact_only(self) -> bool:
        return not (self.name_pats or self.tag_pats or self.source_pats)

    def matches(self, tool: Tool) -> bool:
        if tool.name in self.exact:
            return True
        if any(p(tool.name) for p in self.name_pats):
            return True
        if self.tag_pats and any(p(t) for t in tool.tags for p in self.tag_pats):
            return True
        return any(p(tool.source) for p in self.source_pats)


def _entries(query: str | Sequence[str] | None) -> list[str]:
    if query is None:
        return []
    items = [query] if isinstance(query, str) else list(query)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"query entries must be str, got {type(item).__name__}")
        item = item.strip()
        if item:
            out.append(item)
    return out


def _query_text(entries: Sequence[str]) -> str:
    """Free text for the ranker: selector prefixes dropped (``tag:db`` -> ``db``)."""
    parts = []
    for e in entries:
        if e.startswith("tag:"):
            e = e[4:]
        elif e.startswith("source:"):
            e = e[7:]
        parts.append(e)
    return " ".join(parts)


def _explicit(
    catalog: Mapping[str, Tool],
    entries: Sequence[str],
    eligible: Callable[[Tool], bool],
) -> list[Tool]:
    """Catalog-order tools matching any entry (name, glob, tag:, source:)."""
    sel = _Selector(entries)
    if sel.exact_only and len(sel.exact) == 1:
        tool = catalog.get(next(iter(sel.exact)))
        return [tool] if tool is not None and eligible(tool) else []
    return [t for t in catalog.values() if sel.matches(t) and eligible(t)]


def find_tools(
    catalog: Mapping[str, Tool],
    index: Ranker,
    query: str | Sequence[str] | None,
    *,
    mode: FindMode = "hybrid",
    allowed: Sequence[str] | None = None,
    limit: int = 10,
) -> list[Tool]:
    """Select up to ``limit`` tools of ``catalog`` for ``query``.

    :param catalog: the tools by name (its order is "catalog order").
    :param index: the ranker mirroring the catalog (a ``ToolIndex``); names it
        returns that are not in ``catalog`` are skipped.
    :param query: a tool name, an fnmatch glob, ``tag:<tag>``,
        ``source:<source>`` (tag/source values may be globs), free text, or a
        list of those. None/empty: the eligible tools in catalog order.
    :param mode: ``explicit``: the tools the entries select, catalog order, no
        ranking. ``semantic``: the ranker's best matches for the query text
        (``tag:``/``source:`` prefixes are dropped). ``hybrid`` (default):
        exact-name matches first (in query order), then the other explicit
        matches (catalog order), then ranked results, without duplicates.
    :param allowed: names, globs, ``tag:``/``source:`` entries; only tools
        matching at least one are eligible. None: every tool; ``[]``: none; a
        single string is one entry.
    :param limit: maximum number of tools (>= 1).
    :raises ValueError: unknown ``mode`` or ``limit`` < 1.
    """
    if mode not in _MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(_MODES)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    if isinstance(allowed, str):
        allowed = [allowed]
    gate = _Selector(allowed) if allowed is not None else None

    def eligible(tool: Tool) -> bool:
        return gate is None or gate.matches(tool)

    entries = _entries(query)
    if not entries:
        out: list[Tool] = []
        for tool in catalog.values():
            if eligible(tool):
                out.append(tool)
                if len(out) >= limit:
                    break
        return out

    picked: dict[str, Tool] = {}
    if mode != "semantic":
        if mode == "hybrid":
            for e in entries:
                exact = catalog.get(e)
                if exact is not None and eligible(exact):
                    picked.setdefault(e, exact)
        for match in _explicit(catalog, entries, eligible):
            picked.setdefault(match.name, match)
        if mode == "explicit" or len(picked) >= limit:
            return list(picked.values())[:limit]

    text = _query_text(entries)

    def rank_ok(name: str) -> bool:
        if name in picked:
            return False
        candidate = catalog.get(name)
        return candidate is not None and eligible(candidate)

    for found, _score in index.search(text, limit=limit - len(picked), allowed=rank_ok):
        picked.setdefault(found.name, catalog[found.name])
    return list(picked.values())[:limit]


# ------------------------------------------------------------------- export
_OPENAI_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_MCP_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_OPENAI_RULE: Final = "1 to 64 ASCII letters, digits, '_' or '-'"
_MCP_RULE: Final = "1 to 128 ASCII letters, digits, '_', '-' or '.'"


def _check_name(tool: Tool, pattern: re.Pattern[str], api: str, rule: str) -> None:
    if pattern.fullmatch(tool.name) is None:
        fix = (
            "rename the tool"
            if api == "MCP"
            else f"pass name=kernel.export_name({tool.name!r}) (an alias kernel.call accepts), "
            f"or use kernel.list_tools(format={api.lower()!r}), which does"
        )
        raise ValueError(
            f"tool name {tool.name!r} cannot be exported to {api}: names must match "
            f"^{pattern.pattern}$ ({rule}); {fix}"
        )


def _object_schema(schema: JSON | None) -> JSON:
    """A deep copy of an input schema as an object schema (every API wants ``type: object``).

    An empty schema becomes an empty object schema; one without ``type`` (only
    ``properties``, say, or a top-level ``anyOf`` of object schemas), or with a
    list of types, gets ``"type": "object"``: a tool's arguments are always one
    object (the kernel refuses tools whose schema says otherwise).
    """
    if not schema:
        return {"type": "object", "properties": {}}
    out = copy.deepcopy(schema)
    if out.get("type") != "object":
        out["type"] = "object"
    return out


def export_alias(name: str) -> str | None:
    """The OpenAI/Anthropic-safe name for ``name``, or None when ``name`` is safe already.

    Characters those APIs refuse become ``_``, cut to 55 characters, plus ``_``
    and 8 hex digits of the name's SHA-256: ``fs_files.read`` ->
    ``fs_files_read_3f1c...``. It depends on the name alone, so it never changes
    with the catalog and never takes a name a tool holds (``fs_files_read``).
    ``kernel.call`` accepts the alias for the tool.
    """
    if _OPENAI_NAME.fullmatch(name):
        return None
    safe = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:55]
    return f"{safe}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def to_openai(tool: Tool, *, name: str | None = None) -> JSON:
    """The OpenAI function-tool definition of ``tool``.

    ``{"type": "function", "function": {"name", "description", "parameters"}}``;
    ``parameters`` is (a copy of) the input schema, ``$defs`` included; ``strict``
    is not set. ``name`` replaces the tool's name (the kernel passes its alias
    for names OpenAI refuses, see ``export_alias``).

    :raises ValueError: the name does not match ``^[a-zA-Z0-9_-]{1,64}$``.
    """
    if name is None:
        _check_name(tool, _OPENAI_NAME, "OpenAI", _OPENAI_RULE)
    return {
        "type": "function",
        "function": {
            "name": name or tool.name,
            "description": tool.description,
            "parameters": _object_schema(tool.input_schema),
        },
    }


def to_anthropic(tool: Tool, *, name: str | None = None) -> JSON:
    """The Anthropic Messages API tool definition: ``{"name", "description",
    "input_schema"}``. ``name`` replaces the tool's name (as for ``to_openai``).

    :raises ValueError: the name does not match ``^[a-zA-Z0-9_-]{1,64}$``.
    """
    if name is None:
        _check_name(tool, _OPENAI_NAME, "Anthropic", _OPENAI_RULE)
    return {
        "name": name or tool.name,
        "description": tool.description,
        "input_schema": _object_schema(tool.input_schema),
    }


def to_mcp(tool: Tool) -> JSON:
    """The MCP ``tools/list`` entry of ``tool``.

    ``{"name", "title"?, "description", "inputSchema", "outputSchema"?,
    "annotations"?}``: ``title`` comes from ``annotations.title``; absent
    optional keys are omitted. An output schema that is not an object schema is
    wrapped as ``{"result": ...}``, the shape the kernel gives such results.

    :raises ValueError: the name does not match the MCP tool-name format
        ``^[A-Za-z0-9_.-]{1,128}$``.
    """
    _check_name(tool, _MCP_NAME, "MCP", _MCP_RULE)
    out: JSON = {"name": tool.name}
    if tool.annotations.title:
        out["title"] = tool.annotations.title
    out["description"] = tool.description
    out["inputSchema"] = _object_schema(tool.input_schema)
    if tool.output_schema is not None:
        schema = copy.deepcopy(tool.output_schema)
        if schema.get("type") != "object":
            schema = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
        out["outputSchema"] = schema
    annotations = tool.annotations.to_dict()
    if annotations:
        out["annotations"] = annotations
    return out


_EXPORTERS: Final[Mapping[str, Callable[[Tool], JSON]]] = {
    "openai": to_openai,
    "anthropic": to_anthropic,
    "mcp": to_mcp,
}


def export_tool(tool: Tool, format: ExportFormat, *, name: str | None = None) -> JSON:
    """``tool`` as the definition of ``format`` (``openai``, ``anthropic``, ``mcp``).

    ``name`` (openai, anthropic) replaces the tool's name: the kernel's alias.

    :raises ValueError: unknown format, or a name the format cannot carry.
    """
    exporter = _EXPORTERS.get(format)
    if exporter is None:
        raise ValueError(
            f"unknown export format {format!r}; expected one of {', '.join(_EXPORTERS)}"
        )
    if name is not None and format != "mcp":
        return exporter(tool, name=name)  # type: ignore[call-arg]
    return exporter(tool)
