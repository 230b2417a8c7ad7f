"""Local knowledge bases: a folder of documents, cut into passages, ranked by BM25.

No network and no dependency: files are read once (and re-read when they
change), split at headings and paragraphs into passages of about
``chunk_words`` words, and indexed with BM25F over two fields — the passage's
heading path (document title and section headings, weight 2) and its text
(weight 1)::

    tf~(t, c) = sum_f w_f * tf_f(t, c) / (1 - b_f + b_f * len_f(c) / avglen_f)
    score(q, c) = sum_{t in q} idf(t) * tf~ * (k1 + 1) / (tf~ + k1)
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))
"""

from __future__ import annotations

import fnmatch
import heapq
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from toolwire import looked_for

from ._text import tokenize

__all__ = ["Chunk", "ChunkIndex", "Collection", "chunk_document", "load_collection"]

#: ``# Heading``; the optional closing ``#``s are removed by ``_atx_text`` (a pattern doing it,
#: ``(.*?)\s*#*\s*$``, took minutes on a line with a few thousand spaces, and cut "C#" to "C")
_ATX = re.compile(r"^\s{0,3}(#{1,6})\s+(.*)$")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_UNDERLINE = re.compile(r"^\s{0,3}([=\-~^*+#\"'`:.])\1{2,}\s*$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass(slots=True)
class Chunk:
    """One passage: where it comes from and its text."""

    path: str  # relative, with '/'
    title: str  # the document's title
    headings: tuple[str, ...]  # section headings above the passage
    text: str
    line_start: int  # 1-based, inclusive
    line_end: int

    @property
    def heading_path(self) -> str:
        """``Title > Section > Subsection`` (the title alone if there is no section)."""
        parts = [self.title, *[h for h in self.headings if h != self.title]]
        return " > ".join(p for p in parts if p)


# ------------------------------------------------------------------ chunking
@dataclass(slots=True)
class _Section:
    headings: tuple[str, ...]
    lines: list[tuple[int, str]] = field(default_factory=list)


def _atx_text(rest: str) -> str:
    """The text of an ATX heading after its opening ``#``s: without the closing sequence,
    which is ``#``s preceded by a space (CommonMark), so ``# C#`` stays "C#"."""
    text = rest.strip()
    bare = text.rstrip("#")
    if bare != text and (not bare or bare[-1].isspace()):
        text = bare.rstrip()
    return text


def _sections(text: str, markdown: bool, rst: bool) -> tuple[str | None, list[_Section]]:
    """(document title, sections in order) — headings are ATX/setext (Markdown) or
    underlined (reStructuredText); code fences are never headings."""
    lines = text.splitlines()
    start = 0
    if markdown and lines and lines[0].strip() == "---":  # YAML front matter
        for i in range(1, min(len(lines), 200)):
            if lines[i].strip() in ("---", "..."):
                start = i + 1
                break
    title: str | None = None
    stack: list[tuple[int, str]] = []
    sections = [_Section(())]
    in_fence = False
    underline_levels: dict[str, int] = {}
    i = start
    while i < len(lines):
        line = lines[i]
        heading: tuple[int, str] | None = None
        skip = 0
        if markdown and _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.strip():
            m = _ATX.match(line) if markdown else None
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            u = _UNDERLINE.match(nxt) if (markdown or rst) else None
            if m:
                heading = (len(m.group(1)), _atx_text(m.group(2)))
            elif u and not _UNDERLINE.match(line):
                ch = u.group(1)
                if markdown and ch in "=-":
                    heading = (1 if ch == "=" else 2, line.strip())
                    skip = 1
                elif rst and len(nxt.strip()) >= len(line.strip()):
                    level = underline_levels.setdefault(ch, len(underline_levels) + 1)
                    heading = (level, line.strip())
                    skip = 1
        if heading is not None:
            level, name = heading
            name = name.strip("*_` ")
            if title is None and level == 1:
                title = name
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, name))
            sections.append(_Section(tuple(h for _, h in stack)))
            i += 1 + skip  # the heading goes to the heading path, not to the text
            continue
        sections[-1].lines.append((i + 1, line))
        i += 1
    return title, sections


def _paragraphs(lines: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    out: list[list[tuple[int, str]]] = []
    cur: list[tuple[int, str]] = []
    for n, line in lines:
        if line.strip():
            cur.append((n, line))
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _words(lines: Iterable[tuple[int, str]]) -> int:
    return sum(len(line.split()) for _, line in lines)


def chunk_document(
    path: str, text: str, *, chunk_words: int = 200, overlap_words: int = 40
) -> list[Chunk]:
    """Cut one document into passages.

    A passage never spans two sections; it grows paragraph by paragraph up to
    about ``chunk_words`` words (a longer paragraph is cut at lines, then at
    words), and starts with up to ``overlap_words`` words (whole lines) of the
    previous passage of its section.
    """
    lower = path.lower()
    markdown = lower.endswith((".md", ".markdown", ".mdx"))
    rst = lower.endswith(".rst")
    title, sections = _sections(text, markdown, rst)
    if title is None:
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        title = re.sub(r"[-_]+", " ", stem).strip() or path
    chunks: list[Chunk] = []
    for sec in sections:
        pieces: list[list[tuple[int, str]]] = []
        for para in _paragraphs(sec.lines):
            if _words(para) <= chunk_words * 3 // 2:
                pieces.append(para)
                continue
            cur: list[tuple[int, str]] = []
            for n, line in para:  # a long paragraph: cut at lines, then at words
                words = line.split()
                while len(words) > chunk_words:
                    if cur:
                        pieces.append(cur)
                        cur = []
                    pieces.append([(n, " ".join(words[:chunk_words]))])
                    words = words[chunk_words:]
                if cur and _words(cur) + len(words) > chunk_words:
                    pieces.append(cur)
                    cur = []
                if words:
                    cur.append((n, " ".join(words)))
            if cur:
                pieces.append(cur)
        body: list[tuple[int, str]] = []
        carried = 0  # lines at the start of body repeated from the previous passage
        for piece in [*pieces, None]:
            if piece is not None and not (
                len(body) > carried and _words(body) + _words(piece) > chunk_words
            ):
                body.extend(piece)
                continue
            if len(body) > carried:  # emit the passage
                text = "\n".join(line for _, line in body)
                chunks.append(Chunk(path, title, sec.headings, text, body[0][0], body[-1][0]))
            tail: list[tuple[int, str]] = []
            for item in reversed(body if overlap_words else []):
                if _words([*tail, item]) > overlap_words:
                    break
                tail.insert(0, item)
            body, carried = tail, len(tail)
            if piece is not None:
                body.extend(piece)
    return chunks


# ------------------------------------------------------------------- index
class ChunkIndex:
    """BM25F over passages: heading path (weight 2, b 0.3) and text (weight 1, b 0.75)."""

    def __init__(
        self,
        chunks: Sequence[Chunk],
        *,
        k1: float = 1.2,
        heading_weight: float = 2.0,
        heading_b: float = 0.3,
        text_b: float = 0.75,
    ) -> None:
        self.chunks = list(chunks)
        self.k1 = k1
        self._w = (heading_weight, 1.0)
        self._b = (heading_b, text_b)
        self._postings: dict[str, list[tuple[int, int, int]]] = {}
        self._len: list[tuple[int, int]] = []
        totals = [0, 0]
        for i, c in enumerate(self.chunks):
            head = Counter(tokenize(c.heading_path))
            body = Counter(tokenize(c.text))
            lh, lb = sum(head.values()), sum(body.values())
            self._len.append((lh, lb))
            totals[0] += lh
            totals[1] += lb
            for term in head.keys() | body.keys():
                self._postings.setdefault(term, []).append((i, head[term], body[term]))
        n = max(1, len(self.chunks))
        self._avg = (max(totals[0] / n, 1e-9), max(totals[1] / n, 1e-9))

    def __len__(self) -> int:
        return len(self.chunks)

    def search(self, query: str, limit: int = 5) -> list[tuple[Chunk, float, list[str]]]:
        """The best ``limit`` passages: ``(chunk, score, matched query terms)``, best first.

        Ties are broken by path and position, so the order is deterministic.
        """
        n = len(self.chunks)
        acc: dict[int, float] = {}
        matched: dict[int, list[str]] = {}
        (wh, wb), (bh, bb), (ah, ab) = self._w, self._b, self._avg
        k1 = self.k1
        for term in dict.fromkeys(tokenize(query)):
            post = self._postings.get(term)
            if not post:
                continue
            idf = math.log(1.0 + (n - len(post) + 0.5) / (len(post) + 0.5))
            for i, th, tb in post:
                lh, lb = self._len[i]
                tf = wh * th / (1 - bh + bh * lh / ah) + wb * tb / (1 - bb + bb * lb / ab)
                acc[i] = acc.get(i, 0.0) + idf * tf * (k1 + 1) / (tf + k1)
                matched.setdefault(i, []).append(term)
        best = heapq.nsmallest(
            limit,
            acc.items(),
            key=lambda kv: (-kv[1], self.chunks[kv[0]].path, self.chunks[kv[0]].line_start),
        )
        return [(self.chunks[i], s, matched[i]) for i, s in best]


def excerpt(chunk: Chunk, terms: Sequence[str], max_chars: int = 320) -> tuple[str, list[str]]:
    """(snippet, highlights): the sentences of ``chunk`` with the most query terms."""
    wanted = set(terms)
    sentences = [
        s.strip()
        for line in chunk.text.splitlines()
        for s in _SENTENCE.split(line)
        if s.strip() and not _UNDERLINE.match(s) and not _FENCE.match(s)
    ]
    scored = []
    for pos, s in enumerate(sentences):
        hits = len(wanted & set(tokenize(s)))
        if hits:
            scored.append((-hits, pos, s))
    scored.sort()
    highlights = [s[:240] for _, _, s in scored[:3]]
    if not scored:
        text = " ".join(sentences)
        return (text[: max_chars - 1] + "…" if len(text) > max_chars else text), []
    first = scored[0][1]
    snippet = ""
    for s in sentences[first:]:
        if snippet and len(snippet) + len(s) + 1 > max_chars:
            break
        snippet = f"{snippet} {s}".strip()
    if len(snippet) > max_chars:
        snippet = snippet[: max_chars - 1] + "…"
    return snippet, highlights


# -------------------------------------------------------------- collection
@dataclass(slots=True)
class Collection:
    """An indexed folder: the index, what was skipped, and the files' signature."""

    name: str
    root: Path
    index: ChunkIndex
    files: int
    skipped: list[str]
    signature: tuple[tuple[str, int, int], ...]


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    return any(
        fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.rsplit("/", 1)[-1], p) for p in patterns
    )


def scan(
    root: Path, include: Sequence[str], exclude: Sequence[str], max_files: int
) -> tuple[list[tuple[str, Path, int, int]], list[str]]:
    """Files to index: ``(relative path, path, mtime_ns, size)`` sorted, and problems.

    Hidden files and folders are skipped; so are files a symbolic link leads out of
    ``root`` to: a link to a file, or a link to a folder on the way (``docs/shared``
    linked to ``/etc`` and a pattern like ``*/*.md``).
    """
    found: dict[str, tuple[str, Path, int, int]] = {}
    problems: list[str] = []
    real_root = root.resolve()
    inside: dict[Path, bool] = {}  # folder -> whether it really lies in root (links resolved)
    for pattern in include:
        for p in root.glob(pattern):
            rel = p.relative_to(root).as_posix()
            if rel in found or any(part.startswith(".") for part in rel.split("/")):
                continue
            if _excluded(rel, exclude):
                continue
            try:
                if not p.is_file():
                    continue
                folder_inside = inside.get(p.parent)
                if folder_inside is None:
                    folder_inside = p.parent.resolve().is_relative_to(real_root)
                    inside[p.parent] = folder_inside
                if not folder_inside or (
                    p.is_symlink() and not p.resolve().is_relative_to(real_root)
                ):
                    problems.append(f"{rel}: a link out of the folder (skipped)")
                    continue
                st = p.stat()
            except OSError as exc:
                problems.append(f"{rel}: {exc.strerror or exc}")
                continue
            found[rel] = (rel, p, st.st_mtime_ns, st.st_size)
    files = [found[k] for k in sorted(found)]
    if len(files) > max_files:
        problems.append(f"{len(files) - max_files} files over max_files ({max_files}) skipped")
        files = files[:max_files]
    return files, problems


def load_collection(
    name: str,
    root: Path,
    *,
    include: Sequence[str],
    exclude: Sequence[str],
    chunk_words: int,
    overlap_words: int,
    max_file_bytes: int,
    max_files: int,
) -> Collection:
    """Read and index the folder (blocking: run it in a worker thread)."""
    files, skipped = scan(root, include, exclude, max_files)
    chunks: list[Chunk] = []
    indexed = 0
    for rel, p, _, size in files:
        if size > max_file_bytes:
            skipped.append(f"{rel}: {size} bytes, over max_file_bytes ({max_file_bytes})")
            continue
        try:
            with p.open("rb") as f:
                raw = f.read(max_file_bytes + 1)  # bounded: the file may have grown since
        except OSError as exc:
            skipped.append(f"{rel}: {exc.strerror or exc}")
            continue
        if len(raw) > max_file_bytes:
            skipped.append(f"{rel}: over max_file_bytes ({max_file_bytes}) when read")
            continue
        if b"\x00" in raw[:8192]:
            skipped.append(f"{rel}: binary file")
            continue
        # utf-8-sig: a byte order mark (Windows editors write one) is not text; left in, it
        # hid the first heading and the front matter
        text = raw.decode("utf-8-sig", "replace")
        chunks.extend(
            chunk_document(rel, text, chunk_words=chunk_words, overlap_words=overlap_words)
        )
        indexed += 1
    signature = tuple((rel, mtime, size) for rel, _, mtime, size in files)
    return Collection(name, root, ChunkIndex(chunks), indexed, skipped, signature)


def signature(
    root: Path, include: Sequence[str], exclude: Sequence[str], max_files: int
) -> tuple[tuple[str, int, int], ...]:
    """The (path, mtime, size) of every file that would be indexed (cheap change detection)."""
    files, _ = scan(root, include, exclude, max_files)
    return tuple((rel, mtime, size) for rel, _, mtime, size in files)


def resolve_root(path: str, base: str | None) -> Path:
    """``path`` relative to ``base`` (the directory of toolwire.toml), else to the cwd."""
    p = Path(os.path.expanduser(path))
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    return p


def root_problem(path: str, root: Path, base: str | None) -> str | None:
    """Why the folder ``root`` (``path`` as written, resolved by ``resolve_root`` against
    ``base``) cannot be indexed, with where it was looked for; None when it is a folder."""
    if root.is_dir():
        return None
    what = "does not exist" if not root.exists() else "is not a folder"
    looked = looked_for(path, root, base)
    return f"path {path!r}{looked} {what}"


def result_of(
    collection: str, chunk: Chunk, score: float, terms: Sequence[str], url_prefix: str | None
) -> dict[str, Any]:
    """A SearchResult dict for one passage."""
    snippet, highlights = excerpt(chunk, terms)
    anchor = f"#L{chunk.line_start}-L{chunk.line_end}"
    # under url_prefix the path is part of a URL: a space, '#' or '?' in a file name
    # made a link to another page ("c#.md" -> ".../c" with a fragment)
    path = quote(chunk.path, safe="/") if url_prefix else chunk.path
    url = (url_prefix or "") + path + anchor
    return {
        "title": chunk.heading_path,
        "url": url,
        "snippet": snippet,
        "published_date": None,
        "author": None,
        "score": round(score, 6),
        "highlights": highlights,
        "engine": "collection",
        "provider_metadata": {
            "collection": {
                "name": collection,
                "path": chunk.path,
                "headings": list(chunk.headings),
                "line_start": chunk.line_start,
                "line_end": chunk.line_end,
                "matched_terms": list(terms),
            }
        },
    }
