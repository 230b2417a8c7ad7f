"""search_<collection>: BM25 over the passages of a local folder (no network)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from toolwire_search_testkit import make_kernel

from toolwire import Kernel, load_config
from toolwire_search import ChunkIndex, SearchPlugin, chunk_document, tokenize

pytestmark = pytest.mark.anyio

GUIDE = """\
---
title: ignored front matter
---
# Operations guide

Intro paragraph about the gateway.

## Rotating keys

The key pool rotates API keys with smooth weighted round-robin.
A key that hits a rate limit cools down.

```python
# this comment is not a heading
pool.register_keys("brave", keys)
```

## Backups

Snapshots of the SQLite state file are taken nightly.
"""

FAQ = """\
Frequently asked questions
==========================

Why is my search slow?
----------------------

Check the provider latency first. Network latency dominates.
"""


def no_network() -> httpx.MockTransport:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"a collection search made a request: {request.url}")

    return httpx.MockTransport(refuse)


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")


def docs_kernel(root: Path, **collection: Any) -> Kernel:
    return make_kernel(
        search={"collections": {"docs": {"path": str(root), **collection}}},
        transport=no_network(),
    )


# ------------------------------------------------------------------ chunking
def test_markdown_sections_lines_and_code_fences() -> None:
    chunks = chunk_document("ops/guide.md", GUIDE, chunk_words=200, overlap_words=0)
    lines = GUIDE.splitlines()
    assert [c.headings for c in chunks] == [
        ("Operations guide",),
        ("Operations guide", "Rotating keys"),
        ("Operations guide", "Backups"),
    ]
    assert all(c.title == "Operations guide" for c in chunks)
    rotating = chunks[1]
    assert rotating.heading_path == "Operations guide > Rotating keys"
    # line numbers point at the file's real lines
    assert lines[rotating.line_start - 1].startswith("The key pool rotates")
    assert lines[rotating.line_end - 1] == "```"
    assert "# this comment is not a heading" in rotating.text
    assert "front matter" not in " ".join(c.text for c in chunks)


def test_rst_style_and_plain_text_titles() -> None:
    chunks = chunk_document("faq.rst", FAQ)
    assert chunks[0].title == "Frequently asked questions"
    assert chunks[0].headings == ("Frequently asked questions", "Why is my search slow?")
    plain = chunk_document("notes/release_notes-2026.txt", "just text\n")
    assert plain[0].title == "release notes 2026"


def test_long_sections_are_cut_with_overlap() -> None:
    body = "\n\n".join(
        f"Paragraph {i} " + " ".join(f"w{i}x{j}" for j in range(30)) for i in range(20)
    )
    chunks = chunk_document("long.md", "# Long\n\n" + body, chunk_words=100, overlap_words=35)
    assert len(chunks) > 5
    for c in chunks:
        assert len(c.text.split()) <= 100 + 35
    for prev, nxt in itertools.pairwise(chunks):
        last_para = prev.text.split("\n")[-1]
        assert nxt.text.startswith(last_para)  # the overlap repeats the previous paragraph
        assert nxt.line_start <= prev.line_end


def test_a_single_huge_line_is_cut_at_words() -> None:
    text = " ".join(f"word{i}" for i in range(1000))
    chunks = chunk_document("blob.txt", text, chunk_words=100, overlap_words=0)
    assert len(chunks) == 10 and all(len(c.text.split()) == 100 for c in chunks)


# --------------------------------------------------------------------- BM25
def test_bm25_ranks_rare_terms_headings_and_stems() -> None:
    docs = {
        "a.md": "# Caching\n\nThe cache stores results. The cache is fast. Results results results.",
        "b.md": "# Batteries\n\nA solid-state battery uses a solid electrolyte.",
        "c.md": "# Misc\n\nResults are returned as JSON; the battery of tests passes.",
    }
    chunks = [c for p, t in docs.items() for c in chunk_document(p, t)]
    index = ChunkIndex(chunks)
    top = index.search("batteries electrolyte", 3)
    assert [c.path for c, _, _ in top][:2] == ["b.md", "c.md"]  # stemming: batteries ~ battery
    assert top[0][1] > top[1][1] > 0
    assert set(top[0][2]) == set(tokenize("batteries electrolyte"))
    # the same word once in a heading outranks it once in a body of the same length
    boost = ChunkIndex(
        chunk_document("x.md", "# Zebra\n\nanimals live in the savanna")
        + chunk_document("y.md", "# Savanna\n\nthe zebra lives with animals")
    )
    assert [c.path for c, _, _ in boost.search("zebra", 2)] == ["x.md", "y.md"]
    assert index.search("the of and", 5) == []  # stopwords only: nothing


# --------------------------------------------------------------------- tool
async def test_collection_tool_finds_the_right_passage(tmp_path: Path) -> None:
    write(tmp_path, {"ops/guide.md": GUIDE, "faq.rst": FAQ, "README.txt": "Unrelated words."})
    kernel = docs_kernel(tmp_path, url_prefix="https://git.example/docs/")
    async with kernel:
        tool = kernel.get_tool("search_docs")
        res = await kernel.call("search_docs", {"query": "how are API keys rotated?"})
        latency = await kernel.call("search_docs", {"query": "latency", "max_results": 1})
    assert tool is not None and tool.annotations.readOnlyHint and "3 documents" in tool.description
    assert not res.is_error, res.error
    best = res.content["results"][0]
    assert best["title"] == "Operations guide > Rotating keys"
    meta = best["provider_metadata"]["collection"]
    assert meta["path"] == "ops/guide.md"
    assert (
        best["url"]
        == f"https://git.example/docs/ops/guide.md#L{meta['line_start']}-L{meta['line_end']}"
    )
    assert "rotates API keys" in best["snippet"]
    assert res.content["served_by"] == "collection:docs"
    assert [r["provider_metadata"]["collection"]["path"] for r in latency.content["results"]] == [
        "faq.rst"
    ]
    assert "Network latency dominates." in latency.content["results"][0]["highlights"]


async def test_include_exclude_hidden_binary_and_large_files(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "keep.md": "# Zebra\n\nzebra facts",
            "drafts/skip.md": "# Zebra draft\n\nzebra draft",
            ".hidden/secret.md": "zebra hidden",
            "image.md": b"\x89PNG\x00\x00zebra",
            "big.md": "zebra " * 600,
            "code.py": "zebra = 1",
        },
    )
    kernel = docs_kernel(tmp_path, exclude=["drafts/*"], max_file_bytes=2000)
    async with kernel:
        res = await kernel.call("search_docs", {"query": "zebra", "max_results": 10})
        status = SearchPlugin.of(kernel).status()["collections"]["docs"]
    paths = [r["provider_metadata"]["collection"]["path"] for r in res.content["results"]]
    assert paths == ["keep.md"]
    assert status["files"] == 1
    joined = " ".join(res.content["warnings"])
    assert "image.md: binary file" in joined and "big.md" in joined
    assert ".hidden" not in joined  # left out without a word, as docs/search.md says


async def test_links_out_of_the_folder_are_skipped_files_and_folders_alike(
    tmp_path: Path,
) -> None:
    """Before: only a link to a file was checked; a linked folder on the way (a cloned
    repository's ``docs/shared -> /home/me``) was indexed, and searched by any caller."""
    root, outside = tmp_path / "docs", tmp_path / "private"
    write(root, {"keep.md": "# Zebra\n\nzebra facts", "sub/in.md": "zebra inside"})
    write(outside, {"secret.md": "zebra secret"})
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "file.md").symlink_to(outside / "secret.md")
    (root / "sub" / "same.md").symlink_to(root / "keep.md")  # a link within: indexed
    kernel = docs_kernel(root, include=["*.md", "*/*.md"])
    async with kernel:
        res = await kernel.call("search_docs", {"query": "zebra", "max_results": 10})
    paths = sorted(r["provider_metadata"]["collection"]["path"] for r in res.content["results"])
    assert paths == ["keep.md", "sub/in.md", "sub/same.md"]
    assert "secret" not in json.dumps(res.content["results"])
    joined = " ".join(res.content["warnings"])
    assert "linked/secret.md: a link out of the folder" in joined
    assert "file.md: a link out of the folder" in joined


async def test_changed_files_are_reindexed_on_refresh(tmp_path: Path) -> None:
    write(tmp_path, {"a.md": "# A\n\nalpha"})
    kernel = docs_kernel(tmp_path)
    async with kernel:
        before = await kernel.call("search_docs", {"query": "omega"})
        write(tmp_path, {"b.md": "# B\n\nomega"})
        stale = await kernel.call("search_docs", {"query": "omega"})
        await kernel.refresh_tools()
        after = await kernel.call("search_docs", {"query": "omega"})
    assert before.content["results"] == [] and stale.content["results"] == []
    assert [r["provider_metadata"]["collection"]["path"] for r in after.content["results"]] == [
        "b.md"
    ]


async def test_reload_interval_reindexes_in_the_background(tmp_path: Path) -> None:
    write(tmp_path, {"a.md": "# A\n\nalpha"})
    kernel = docs_kernel(tmp_path, reload_interval_s=0.02)
    async with kernel:
        write(tmp_path, {"b.md": "# B\n\nomega"})
        found: list[Any] = []
        for _ in range(500):  # a bound (10 s), not a speed assertion
            res = await kernel.call("search_docs", {"query": "omega"})
            found = res.content["results"]
            if found:
                break
            await anyio.sleep(0.02)
    assert [r["provider_metadata"]["collection"]["path"] for r in found] == ["b.md"]


async def test_missing_folder_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    kernel = docs_kernel(tmp_path / "nope")
    async with kernel:
        res = await kernel.call("search_docs", {"query": "x"})
    assert res.error is not None and res.error.kind == "config_error"
    assert "does not exist" in res.error.message
    assert "[plugins.search.collections.docs] path" in res.error.message


async def test_a_missing_folder_is_named_as_written_and_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "collection 'docs': '<resolved path>' does not exist; fix [...] path (relative
    to toolwire.toml)": not the path as written, and "relative to toolwire.toml" even for a
    kernel configured in code, which reads a relative path from the working directory."""
    site, cwd = tmp_path / "site", tmp_path / "cwd"
    site.mkdir()
    cwd.mkdir()
    (cwd / "docs").mkdir()  # beside the process, not beside toolwire.toml
    monkeypatch.chdir(cwd)
    (site / "toolwire.toml").write_text(
        'enabled_plugins = ["ratelimit", "retry", "search"]\n'
        '[plugins.search.collections.docs]\npath = "docs"\n',
        encoding="utf-8",
    )

    async def message(kernel: Kernel) -> str:
        async with kernel:
            res = await kernel.call("search_docs", {"query": "x"})
        assert res.error is not None and res.error.kind == "config_error"
        return res.error.message

    assert await message(Kernel.from_config(load_config(str(site / "toolwire.toml")))) == (
        f"collection 'docs': path 'docs' (looked for {site / 'docs'}: a relative path "
        "is read from the directory of toolwire.toml) does not exist; fix "
        "[plugins.search.collections.docs] path"
    )
    assert await message(docs_kernel(Path("nope"))) == (
        f"collection 'docs': path 'nope' (looked for {cwd / 'nope'}: with no "
        "toolwire.toml, a relative path is read from the working directory) does not exist; "
        "fix [plugins.search.collections.docs] path"
    )
    (cwd / "file.md").write_text("# A\n")
    assert await message(docs_kernel(cwd / "file.md")) == (
        f"collection 'docs': path '{cwd / 'file.md'}' is not a folder; fix "
        "[plugins.search.collections.docs] path"
    )
    # a path from the environment: the variable is what to fix, not the file
    monkeypatch.setenv("TOOLWIRE_PLUGINS__SEARCH__COLLECTIONS__DOCS__PATH", "elsewhere")
    assert await message(Kernel.from_config(load_config(str(site / "toolwire.toml")))) == (
        f"collection 'docs': path 'elsewhere' (looked for {site / 'elsewhere'}: a relative "
        "path is read from the directory of toolwire.toml) does not exist; fix the "
        "environment variable TOOLWIRE_PLUGINS__SEARCH__COLLECTIONS__DOCS__PATH"
    )
    monkeypatch.delenv("TOOLWIRE_PLUGINS__SEARCH__COLLECTIONS__DOCS__PATH")
    monkeypatch.setenv("HOME", str(tmp_path))
    home = make_kernel(
        search={"collections": {"docs": {"path": "~/gone/"}}}, transport=no_network()
    )
    assert await message(home) == (
        f"collection 'docs': path '~/gone/' (read as {tmp_path / 'gone'}) does not exist; "
        "fix [plugins.search.collections.docs] path"
    )


async def test_stopword_query_warns(tmp_path: Path) -> None:
    write(tmp_path, {"a.md": "# A\n\nalpha"})
    kernel = docs_kernel(tmp_path)
    async with kernel:
        res = await kernel.call("search_docs", {"query": "what is the"})
    assert res.content["results"] == []
    assert res.content["warnings"] == [
        "the query has no searchable words (only stopwords or symbols)"
    ]


async def test_path_is_relative_to_toolwire_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "site", {"docs/setup.md": "# Setup\n\nInstall the widget."})
    (tmp_path / "site" / "toolwire.toml").write_text(
        'enabled_plugins = ["ratelimit", "retry", "search"]\n'
        "[plugins.search.collections.handbook]\n"
        'path = "docs"\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)  # elsewhere: the path must not depend on the cwd
    cfg = load_config(os.path.join("site", "toolwire.toml"), env={})
    async with Kernel.from_config(cfg) as kernel:
        res = await kernel.call("search_handbook", {"query": "widget"})
    assert res.content["results"][0]["provider_metadata"]["collection"]["path"] == "setup.md"


async def test_invalid_collection_arguments(tmp_path: Path) -> None:
    write(tmp_path, {"a.md": "alpha"})
    kernel = docs_kernel(tmp_path)
    async with kernel:
        res = await kernel.call("search_docs", {"query": "alpha", "max_results": 500})
        extra = await kernel.call("search_docs", {"query": "alpha", "backend": "brave"})
    for r in (res, extra):
        assert r.error is not None and r.error.kind == "invalid_args"


async def test_a_byte_order_mark_is_not_text(tmp_path: Path) -> None:
    """Windows editors start UTF-8 files with a BOM. Before, it stuck to the first line:
    the title heading and the front matter were not recognised (the title became the file
    name, the heading line and the front matter went into the text)."""
    bom = b"\xef\xbb\xbf"
    write(
        tmp_path,
        {
            "keys.md": bom + b"# Rotating keys\n\nThe pool rotates keys by weight.\n",
            "notes.md": bom + b"---\nowner: platform team\n---\nBackups run nightly.\n",
        },
    )
    kernel = docs_kernel(tmp_path)
    async with kernel:
        res = await kernel.call("search_docs", {"query": "pool weight"})
        front = await kernel.call("search_docs", {"query": "platform team"})
    assert not res.is_error, res.error
    (hit,) = res.content["results"]
    assert hit["title"] == "Rotating keys"
    assert hit["snippet"] == "The pool rotates keys by weight."
    assert front.content["results"] == []


async def test_url_prefix_links_percent_encode_the_path(tmp_path: Path) -> None:
    """Before: the relative path was pasted into the URL as it is: "c#.md" linked to
    ".../c" (the rest a fragment), "q?.md" to a query, spaces made no URL at all."""
    write(
        tmp_path,
        {
            "langs/c#.md": "# C sharp\n\nDelegates and events.\n",
            "how to/rotate keys?.md": "# Rotation\n\nRotate the signing keys yearly.\n",
        },
    )
    kernel = docs_kernel(tmp_path, url_prefix="https://git.example/blob/main/docs/")
    async with kernel:
        csharp = await kernel.call("search_docs", {"query": "delegates"})
        rotate = await kernel.call("search_docs", {"query": "signing keys"})
    urls = [res.content["results"][0]["url"] for res in (csharp, rotate)]
    assert urls == [
        "https://git.example/blob/main/docs/langs/c%23.md#L3-L3",
        "https://git.example/blob/main/docs/how%20to/rotate%20keys%3F.md#L3-L3",
    ]
    for url in urls:
        parsed = httpx.URL(url)
        assert parsed.path.startswith("/blob/main/docs/") and parsed.path.endswith(".md")
        assert parsed.fragment == "L3-L3" and not parsed.query
    # the path itself stays as it is in the metadata
    meta = rotate.content["results"][0]["provider_metadata"]["collection"]
    assert meta["path"] == "how to/rotate keys?.md"


def test_atx_headings_keep_a_hash_that_closes_no_sequence() -> None:
    """CommonMark: a closing run of '#' needs a space before it. Before, "# C#" was titled
    "C" and "## What is new in F#" "What is new in F"."""
    titles = {
        text.splitlines()[0]: chunk_document("lang.md", text)[0].heading_path
        for text in (
            "# C#\n\nDelegates.\n",
            "# Guide\n\n## What is new in F#\n\nPipelines.\n",
            "# Closed ##\n\nBody.\n",
            "# Spaced   #   \n\nBody.\n",
            "# #hashtag\n\nBody.\n",
        )
    }
    assert titles == {
        "# C#": "C#",
        "# Guide": "Guide > What is new in F#",
        "# Closed ##": "Closed",
        "# Spaced   #   ": "Spaced",
        "# #hashtag": "#hashtag",
    }


def test_a_heading_with_a_long_run_of_spaces_does_not_hang_indexing() -> None:
    """Before, the heading pattern backtracked cubically: "# a", 5,000 spaces and a letter
    took some 4 minutes, 20,000 spaces hours — the catalog (and the kernel's start) waited.
    Run in a child process so a regression fails (after a generous bound) instead of
    hanging the suite; the bound is a hang detector, not a speed target."""
    code = (
        "from toolwire_search import chunk_document\n"
        "chunks = chunk_document('x.md', '# a' + ' ' * 20000 + 'b\\n\\nbody\\n')\n"
        "print(chunks[0].title)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("indexing one heading line did not end within 60 s")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["a", "b"]
