"""Text helpers: HTML decoration stripping, domain matching, and the BM25 tokenizer."""

from __future__ import annotations

import functools
import html
import re
from typing import Final

__all__ = ["domain_matches", "host_of", "strip_html", "tokenize"]

# A tag is ``<name ...>`` / ``</name>`` / ``<name/>``: "a < b > c" is left alone.
_TAG: Final = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>")
_SPACE: Final = re.compile(r"\s+")


def strip_html(text: object) -> str:
    """``text`` without HTML tags (``<strong>``, ``<b>``, ``<span class=...>``) and entities.

    Providers decorate matches (Brave's ``<strong>``, SearXNG's highlight
    spans) and escape quotes (``&#39;``); an agent wants the plain text.
    Whitespace runs collapse to one space. ``None`` and non-strings give ``""``.
    """
    if not isinstance(text, str) or not text:
        return ""
    out = _TAG.sub("", text) if "<" in text else text
    if "&" in out:
        out = html.unescape(out)
    return _SPACE.sub(" ", out).strip()


def host_of(url: str) -> str:
    """The lower-case host of ``url`` ("" when there is none)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    host = host.rsplit("@", 1)[-1]
    if host.startswith("["):  # IPv6 literal
        return host.split("]", 1)[0].lstrip("[").lower()
    return host.split(":", 1)[0].lower().rstrip(".")


def domain_matches(url: str, domain: str) -> bool:
    """Whether ``url``'s host is ``domain`` or one of its subdomains."""
    host = host_of(url)
    return host == domain or host.endswith("." + domain)


# ---------------------------------------------------------------- tokenizer
_STOPWORD_TEXT: Final = """
    a about all also am an and any are as at be been being but by can could did do does
    for from had has have he her here him his how i if in into is it its just me might
    must my no nor of on or our ours please she should so some such than that the their
    them then there these they this those to too us very was we were what when where
    which while who whom why will with would you your yours
"""
_STOPWORDS: Final = frozenset(_STOPWORD_TEXT.split())
_WORD: Final = re.compile(r"\w+")
_CAMEL: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """A light suffix stemmer: plurals, ``-ing``, ``-ed`` ("queries" -> "queri" <- "query")."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies"):
        word = word[:-3] + "i"
    elif word.endswith(("sses", "ches", "shes", "xes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing") and len(word) >= 6:
        word = word[:-3]
    elif word.endswith("ed") and len(word) >= 5:
        word = word[:-2]
    if len(word) > 2 and word[-1] == "y" and word[-2] not in "aeiou":
        word = word[:-1] + "i"
    elif len(word) > 3 and word[-1] == "e":
        word = word[:-1]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeioulsz":
        word = word[:-1]
    return word


@functools.lru_cache(maxsize=65536)
def _analyze(raw: str) -> tuple[str, ...]:
    """Terms of one ``\\w+`` run: the stemmed word, or for ``snake_case`` /
    ``camelCase`` identifiers their stemmed parts plus the joined compound."""
    if raw.isascii():
        parts = [p.lower() for piece in raw.split("_") if piece for p in _CAMEL.findall(piece)]
    else:  # camelCase splitting is ASCII-only; other scripts keep whole words
        parts = [piece.lower() for piece in raw.split("_") if piece]
    terms = [_stem(p) for p in parts if p not in _STOPWORDS and (len(p) > 1 or p.isdigit())]
    if len(parts) > 1:
        terms.append(_stem("".join(parts)))
    return tuple(terms)


def tokenize(text: str) -> list[str]:
    """Index terms of ``text`` in order: lower-cased words, stopwords and one-letter
    words dropped, identifiers split, each term lightly stemmed. Documents and
    queries go through the same function."""
    return [t for raw in _WORD.findall(text) for t in _analyze(raw)]
