from __future__ import annotations

import copy
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire._discovery import (
    FIELDS,
    Ranker,
    ToolIndex,
    _stem,
    export_tool,
    field_terms,
    find_tools,
    split_identifier,
    to_anthropic,
    to_mcp,
    to_openai,
    tokenize,
)
from toolwire._types import CallContext, Tool, ToolAnnotations


async def _noop(args: dict[str, Any], ctx: CallContext) -> Any:
    return None


def mk(
    name: str,
    description: str = "",
    *,
    tags: Iterable[str] = (),
    source: str = "local",
    params: dict[str, str] | None = None,
    schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    annotations: ToolAnnotations | None = None,
) -> Tool:
    """A tool; ``params`` maps property names to descriptions."""
    if schema is None:
        props = {k: {"type": "string", "description": v} for k, v in (params or {}).items()}
        schema = {"type": "object", "properties": props}
    return Tool(
        name=name,
        description=description,
        input_schema=schema,
        executor=_noop,
        output_schema=output_schema,
        tags=frozenset(tags),
        source=source,
        annotations=annotations or ToolAnnotations(),
    )


def names(tools: Iterable[Tool]) -> list[str]:
    return [t.name for t in tools]


def ranked(index: ToolIndex, query: str, **kw: Any) -> list[str]:
    return [t.name for t, _ in index.search(query, **kw)]


# ------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize(
    "forms",
    [
        ["query", "queries"],
        ["create", "creates", "created", "creating"],
        ["run", "runs", "running"],
        ["search", "searches", "searched", "searching"],
        ["box", "boxes"],
        ["class", "classes"],
        ["company", "companies"],
        ["setting", "settings"],
        ["message", "messages"],
        ["address", "addresses"],
        ["stop", "stopped", "stopping", "stops"],
        ["call", "calls", "called", "calling"],
    ],
)
def test_stemmer_conflates_inflections(forms: list[str]) -> None:
    stems = {_stem(f) for f in forms}
    assert len(stems) == 1, dict(zip(forms, map(_stem, forms), strict=True))


@pytest.mark.parametrize(
    ("word", "stem"),
    [
        ("status", "status"),  # -us is not a plural
        ("analysis", "analysis"),  # nor -is
        ("class", "class"),
        ("bus", "bus"),  # short words untouched
        ("s3", "s3"),  # words with digits untouched
        ("v2api", "v2api"),
        ("queries", "queri"),
        ("weather", "weather"),
    ],
)
def test_stemmer_leaves_non_inflected_words(word: str, stem: str) -> None:
    assert _stem(word) == stem


def test_stemmer_distinguishes_unrelated_words() -> None:
    assert _stem("email") != _stem("emit")
    assert _stem("forecast") != _stem("fore")


def test_tokenize_lowercases_drops_stopwords_and_single_letters() -> None:
    assert tokenize("What is THE Weather in a City?") == ["weather", "citi"]
    assert tokenize("") == []
    assert tokenize("the of and to") == []
    assert tokenize("x y 7") == ["7"]  # one letter dropped, digits kept


def test_tokenize_is_unicode_aware() -> None:
    assert tokenize("Größe der Straße: café") == ["größ", "der", "straß", "café"]
    assert tokenize("naïve—résumé") == ["naïv", "résumé"]


def test_tokenize_splits_identifiers_and_keeps_the_compound() -> None:
    assert tokenize("sendEmail") == ["send", "email", "sendemail"]
    assert tokenize("send_email") == ["send", "email", "sendemail"]
    assert tokenize("JavaScript files") == ["java", "script", "javascript", "fil"]
    # the compound makes "javascript" (one word) meet "JavaScript" (camelCase)
    assert "javascript" in tokenize("javascript")


@pytest.mark.parametrize(
    ("identifier", "words"),
    [
        ("send_email", ["send", "email"]),
        ("sendEmail", ["send", "email"]),
        ("SendEmail", ["send", "email"]),
        ("send-email", ["send", "email"]),
        ("mail.send", ["mail", "send"]),
        ("github/create_issue", ["github", "create", "issue"]),
        ("getHTTPResponse", ["get", "http", "response"]),
        ("HTTPServer", ["http", "server"]),
        ("v2Api", ["v2", "api"]),
        ("__private__name", ["private", "name"]),
        ("SEOTool", ["seo", "tool"]),
        ("ÄrgerMelden", ["ärger", "melden"]),
    ],
)
def test_split_identifier(identifier: str, words: list[str]) -> None:
    assert split_identifier(identifier) == words


def test_field_terms_cover_name_title_description_tags_and_params() -> None:
    tool = mk(
        "crm.findContact",
        "Look up people.",
        tags={"sales"},
        schema={
            "type": "object",
            "description": "root description is the tool's own: ignored",
            "properties": {
                "email_address": {"type": "string", "description": "Primary mailbox"},
                "kind": {"enum": ["lead", "customer"]},
                "filters": {"$ref": "#/$defs/Filter"},
            },
            "$defs": {"Filter": {"type": "object", "properties": {"since": {"type": "string"}}}},
        },
        annotations=ToolAnnotations(title="Contact finder"),
    )
    terms = field_terms(tool)
    assert list(terms) == list(FIELDS)
    assert terms["name"] == ["crm", "find", "contact", "findcontact", "contact", "finder"]
    assert terms["description"] == ["look", "up", "peopl"]
    assert terms["tags"] == ["sal"]
    params = terms["params"]
    for expected in ("email", "address", "primari", "mailbox", "kind", "lead", "customer"):
        assert expected in params, expected
    assert "filter" in params
    assert "sinc" in params  # nested $defs properties ("since", stemmed)
    assert "root" not in params


# --------------------------------------------------------------------- index
def test_name_weight_pulls_the_named_tool_first() -> None:
    forecast = mk("weather_forecast", "Returns data for a city.")
    city = mk("city_info", "General facts about a city, including the weather and weather history.")
    index = ToolIndex([city, forecast])
    assert ranked(index, "weather") == ["weather_forecast", "city_info"]
    # without the name field, the description match wins
    flat = ToolIndex([city, forecast], weights={"name": 0.0})
    assert ranked(flat, "weather") == ["city_info"]


def test_description_outweighs_params() -> None:
    # mirror-image tools: same field lengths, "email" in a different field;
    # names chosen so that a tie would put the params tool first
    in_desc = mk("b_desc", "alpha email", params={"beta": "gamma"})
    in_params = mk("a_params", "alpha beta", params={"email": "gamma"})
    index = ToolIndex([in_params, in_desc])
    hits = index.search("email")
    assert [t.name for t, _ in hits] == ["b_desc", "a_params"]
    assert hits[0][1] > hits[1][1]
    assert ranked(ToolIndex([in_params, in_desc], weights={"params": 1.0}), "email") == [
        "a_params",  # equal weights: a tie, broken by name
        "b_desc",
    ]


def test_tags_outweigh_description() -> None:
    in_tags = mk("b_tags", "alpha beta", tags={"email"})
    in_desc = mk("a_desc", "alpha email", tags={"beta"})
    index = ToolIndex([in_desc, in_tags])
    assert ranked(index, "email") == ["b_tags", "a_desc"]
    assert ranked(ToolIndex([in_desc, in_tags], weights={"tags": 0.5}), "email") == [
        "a_desc",
        "b_tags",
    ]


def test_length_normalization_prefers_focused_descriptions() -> None:
    long = mk("a_long", "email " + " ".join(f"word{i}" for i in range(30)))
    short = mk("b_short", "email inbox")
    assert ranked(ToolIndex([long, short]), "email") == ["b_short", "a_long"]
    # without length normalization they tie (broken by name)
    flat = ToolIndex([long, short], b={"description": 0.0})
    assert ranked(flat, "email") == ["a_long", "b_short"]


def test_default_parameters() -> None:
    index = ToolIndex()
    assert index.k1 == 1.2
    assert index.weights == {"name": 3.0, "description": 1.0, "tags": 2.0, "params": 0.5}
    assert index.b == {"name": 0.3, "description": 0.75, "tags": 0.3, "params": 0.75}


def test_params_names_are_searchable() -> None:
    index = ToolIndex(
        [
            mk("geo", "Resolve places.", params={"postal_code": "Code."}),
            mk("other", "Something else."),
        ]
    )
    assert ranked(index, "postal code") == ["geo"]
    assert ranked(index, "postalCode") == ["geo"]


def test_stemming_and_identifier_splitting_meet_in_ranking() -> None:
    index = ToolIndex(
        [
            mk("searchRepositories", "Find repositories by keyword."),
            mk("list_branches", "List the branches of a repository."),
            mk("send_email", "Send an email."),
        ]
    )
    assert ranked(index, "searching repository")[0] == "searchRepositories"
    assert ranked(index, "branch") == ["list_branches"]
    assert ranked(index, "emails sent") == ["send_email"]


def test_rarer_terms_weigh_more() -> None:
    tools = [mk(f"tool{i}", "Manage files.") for i in range(10)]
    tools.append(mk("archiver", "Compress files."))
    tools.append(mk("compressor", "Compress data."))
    index = ToolIndex(tools)
    top = ranked(index, "compress files", limit=20)
    assert top[:2] == ["archiver", "compressor"]  # both terms; then the rare term
    assert top[2:] == sorted(f"tool{i}" for i in range(10))  # the common term, ties by name


def test_search_scores_positive_descending_and_limited() -> None:
    tools = [mk(f"t{i:02d}", "alpha " * (i % 5 + 1) + "beta " * i) for i in range(30)]
    index = ToolIndex(tools)
    hits = index.search("alpha beta", limit=7)
    assert len(hits) == 7
    scores = [s for _, s in hits]
    assert all(s > 0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    assert index.search("zebra") == []
    assert index.search("") == []
    assert index.search("the and of") == []
    assert ToolIndex().search("alpha") == []


def test_ties_are_broken_by_name_whatever_the_insertion_order() -> None:
    tools = [mk(n, "convert currency") for n in ("zeta", "alpha", "mid")]
    for order in (tools, tools[::-1]):
        index = ToolIndex(order)
        assert ranked(index, "currency") == ["alpha", "mid", "zeta"]
        assert ranked(index, "currency", limit=2) == ["alpha", "mid"]


def test_search_limit_must_be_positive() -> None:
    index = ToolIndex([mk("a_tool", "x")])
    with pytest.raises(ValueError, match="limit"):
        index.search("tool", limit=0)


def test_search_allowed_filters_and_reaches_deep_candidates() -> None:
    tools = [mk(f"t{i:03d}", "report " * (100 - i) + "filler") for i in range(100)]
    index = ToolIndex(tools)
    calls: list[str] = []

    def only_last(name: str) -> bool:
        calls.append(name)
        return name == "t099"

    assert ranked(index, "report", limit=3, allowed=only_last) == ["t099"]
    assert ranked(index, "report", limit=2, allowed=lambda n: n.endswith("5")) == ["t005", "t015"]
    # the predicate is called best-first on a prefix, not on every candidate
    assert calls[:3] == ["t000", "t001", "t002"]
    seen: list[str] = []

    def record(name: str) -> bool:
        seen.append(name)
        return True

    assert ranked(index, "report", limit=1, allowed=record) == ["t000"]
    assert 0 < len(seen) < 100


def _bm25f_reference(
    tools: list[Tool], query: str, weights: dict[str, float], b: dict[str, float], k1: float
) -> dict[str, float]:
    """Textbook BM25F, computed naively from field_terms."""
    per = {t.name: field_terms(t) for t in tools}
    n = len(tools)
    avg = {f: sum(len(p[f]) for p in per.values()) / n for f in FIELDS}
    out: dict[str, float] = {}
    for term in dict.fromkeys(tokenize(query)):
        df = sum(1 for p in per.values() if any(term in p[f] for f in FIELDS))
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for name, p in per.items():
            tf = sum(
                weights[f] * p[f].count(term) / (1 - b[f] + b[f] * len(p[f]) / avg[f])
                for f in FIELDS
                if p[f].count(term)
            )
            if tf:
                out[name] = out.get(name, 0.0) + idf * tf * (k1 + 1) / (tf + k1)
    return out


def _corpus(seed: int, n: int) -> list[Tool]:
    rng = random.Random(seed)
    words = [
        "file",
        "user",
        "email",
        "issue",
        "report",
        "invoice",
        "search",
        "create",
        "list",
        "delete",
        "cloud",
        "chat",
    ]
    tools = []
    for i in range(n):
        desc = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))
        params = {rng.choice(words) + "_id": " ".join(rng.sample(words, 2))}
        tags = rng.sample(words, rng.randrange(0, 3))
        name = f"{rng.choice(words)}_{rng.choice(words)}_{i}"
        tools.append(mk(name, desc, tags=tags, params=params))
    return tools


@pytest.mark.parametrize("query", ["email", "search user files", "create issue report", "chat"])
def test_scores_match_the_bm25f_reference(query: str) -> None:
    tools = _corpus(1, 60)
    weights = {"name": 3.0, "description": 1.0, "tags": 2.0, "params": 0.5}
    b = {"name": 0.3, "description": 0.75, "tags": 0.3, "params": 0.75}
    index = ToolIndex(tools, k1=1.2, weights=weights, b=b)
    assert index.weights == weights
    assert index.b == b
    expected = _bm25f_reference(tools, query, weights, b, 1.2)
    got = index.scores(query)
    assert got.keys() == expected.keys()
    for name, score in expected.items():
        assert got[name] == pytest.approx(score, rel=1e-12)
    top = sorted(expected.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    hits = index.search(query)
    assert [t.name for t, _ in hits] == [n for n, _ in top]
    assert [s for _, s in hits] == pytest.approx([s for _, s in top], rel=1e-12)


def test_incremental_updates_equal_a_rebuild() -> None:
    tools = _corpus(2, 120)
    rng = random.Random(3)
    inc = ToolIndex()
    for tool in tools[:80]:
        inc.add(tool)
    inc.search("email user")  # warm the cache, so invalidation is exercised
    for tool in tools[80:]:
        inc.add(tool)
    removed = rng.sample(tools, 30)
    for tool in removed:
        inc.remove(tool.name)
    inc.search("create file")
    # replace some tools in place with new content
    replaced = [mk(t.name, "brand new chat invoice text") for t in rng.sample(tools, 10)]
    for tool in replaced:
        inc.add(tool)
    final = {t.name: t for t in tools if t not in removed}
    final.update({t.name: t for t in replaced})
    full = ToolIndex(final.values())

    assert len(inc) == len(full) == len(final)
    assert inc.stats() == full.stats()
    for q in ["email", "search user files", "chat invoice", "create issue report", "cloud"]:
        assert inc.scores(q) == full.scores(q)  # exactly, not approximately
        assert [(t.name, s) for t, s in inc.search(q, limit=25)] == [
            (t.name, s) for t, s in full.search(q, limit=25)
        ]


_WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "alphas", "Beta", "epsilon"])
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "search"]),
        st.sampled_from(["t1", "t2", "t3", "t4", "t5"]),
        st.lists(_WORDS, max_size=6),
        st.lists(_WORDS, max_size=2),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_any_sequence_of_updates_equals_a_rebuild(
    ops: list[tuple[str, str, list[str], list[str]]],
) -> None:
    inc = ToolIndex()
    live: dict[str, Tool] = {}
    for op, name, words, tags in ops:
        if op == "add":
            live[name] = mk(
                name, " ".join(words), tags=tags, params={words[0]: ""} if words else {}
            )
            inc.add(live[name])
        elif op == "remove":
            live.pop(name, None)
            inc.remove(name)
        else:
            inc.search(" ".join(words) or "alpha")
    full = ToolIndex(live.values())
    assert inc.stats() == full.stats()
    for q in ["alpha", "beta gamma", "alphas epsilon delta", "t1"]:
        assert inc.scores(q) == full.scores(q)
        assert [(t.name, s) for t, s in inc.search(q)] == [(t.name, s) for t, s in full.search(q)]


def test_add_replaces_and_remove_forgets() -> None:
    index = ToolIndex([mk("calc", "add numbers")])
    assert ranked(index, "numbers") == ["calc"]
    index.add(mk("calc", "evaluate formulas"))
    assert ranked(index, "numbers") == []
    assert ranked(index, "formula") == ["calc"]
    assert len(index) == 1
    assert "calc" in index
    assert index.get("calc") is not None
    index.remove("calc")
    index.remove("calc")  # absent: no-op
    index.remove("never-there")
    assert len(index) == 0
    assert "calc" not in index
    assert ranked(index, "formula") == []
    assert index.stats() == {"tools": 0, "terms": 0, "postings": 0}


def test_changes_are_visible_to_the_next_search() -> None:
    index = ToolIndex([mk("a_tool", "translate text"), mk("b_tool", "unrelated")])
    before = index.scores("translate")["a_tool"]
    index.add(mk("c_tool", "translate documents"))
    after = index.scores("translate")
    assert set(after) == {"a_tool", "c_tool"}
    assert after["a_tool"] < before  # idf fell: the term got more common
    index.rebuild([mk("d_tool", "translate")])
    assert ranked(index, "translate") == ["d_tool"]


def test_index_parameters_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        ToolIndex(weights={"title": 1.0})
    with pytest.raises(ValueError, match="k1"):
        ToolIndex(k1=0)
    with pytest.raises(ValueError, match="'name'"):
        ToolIndex(b={"name": 1.5})
    with pytest.raises(ValueError, match="'tags'"):
        ToolIndex(weights={"tags": -1})


def test_tool_index_is_a_ranker() -> None:
    assert isinstance(ToolIndex(), Ranker)


# ---------------------------------------------------------------- find_tools
@pytest.fixture
def catalog() -> dict[str, Tool]:
    tools = [
        mk("github_create_issue", "Open a new issue in a GitHub repository.", tags={"git", "dev"}),
        mk("github_list_issues", "List the issues of a repository.", tags={"git"}),
        mk("slack_post_message", "Post a message to a Slack channel.", tags={"chat"}),
        mk("slack_list_channels", "List Slack channels.", tags={"chat"}, source="mcp:slack"),
        mk("send_email", "Send an email message to a recipient.", tags={"mail"}),
        mk("weather", "Current weather and forecast for a city.", source="http"),
        mk("notes", "Personal notebook."),
        mk("note_search", "Search notes: find notes by title, notes by tag, notes by date."),
    ]
    return {t.name: t for t in tools}


@pytest.fixture
def index(catalog: dict[str, Tool]) -> ToolIndex:
    return ToolIndex(catalog.values())


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_must_be_at_least_one(catalog: dict[str, Tool], index: ToolIndex, limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        find_tools(catalog, index, "email", limit=limit)


def test_unknown_mode_names_the_allowed_modes(catalog: dict[str, Tool], index: ToolIndex) -> None:
    with pytest.raises(ValueError, match="explicit, semantic, hybrid"):
        find_tools(catalog, index, "email", mode="fuzzy")  # type: ignore[arg-type]


@pytest.mark.parametrize("query", [None, "", "   ", [], ["", " "]])
@pytest.mark.parametrize("mode", ["explicit", "semantic", "hybrid"])
def test_empty_query_lists_eligible_tools_in_catalog_order(
    catalog: dict[str, Tool], index: ToolIndex, query: Any, mode: Any
) -> None:
    assert names(find_tools(catalog, index, query, mode=mode, limit=3)) == [
        "github_create_issue",
        "github_list_issues",
        "slack_post_message",
    ]
    assert names(find_tools(catalog, index, query, mode=mode, allowed=["tag:chat"])) == [
        "slack_post_message",
        "slack_list_channels",
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("weather", ["weather"]),
        ("github_*", ["github_create_issue", "github_list_issues"]),
        ("*_list_*", ["github_list_issues", "slack_list_channels"]),
        ("tag:chat", ["slack_post_message", "slack_list_channels"]),
        ("tag:g?t", ["github_create_issue", "github_list_issues"]),
        ("source:mcp:*", ["slack_list_channels"]),
        ("source:http", ["weather"]),
        # lists: union, catalog order whatever the query order
        (
            ["weather", "tag:mail", "github_list_issues"],
            ["github_list_issues", "send_email", "weather"],
        ),
        (["nope", "tag:nope"], []),
        ("send an email", []),  # free text selects nothing explicitly
        ("WEATHER", []),  # names are case-sensitive
    ],
)
def test_explicit_mode_selects_exactly_in_catalog_order(
    catalog: dict[str, Tool], index: ToolIndex, query: Any, expected: list[str]
) -> None:
    assert names(find_tools(catalog, index, query, mode="explicit")) == expected


def test_explicit_mode_respects_limit_and_allowed(
    catalog: dict[str, Tool], index: ToolIndex
) -> None:
    assert names(find_tools(catalog, index, "*", mode="explicit", limit=2)) == [
        "github_create_issue",
        "github_list_issues",
    ]
    got = find_tools(catalog, index, "*", mode="explicit", allowed=["slack_*", "weather"])
    assert names(got) == ["slack_post_message", "slack_list_channels", "weather"]


@pytest.mark.parametrize(
    ("allowed", "expected"),
    [
        (["send_email"], ["send_email"]),
        (["slack_*"], ["slack_post_message", "slack_list_channels"]),
        (["tag:chat", "tag:mail"], ["slack_post_message", "slack_list_channels", "send_email"]),
        (["source:mcp:slack"], ["slack_list_channels"]),
        (["tag:c*"], ["slack_post_message", "slack_list_channels"]),
        ("send_email", ["send_email"]),  # a single string is one entry
        ([], []),
    ],
)
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_allowed_restricts_ranked_results(
    catalog: dict[str, Tool], index: ToolIndex, allowed: Any, expected: list[str], mode: Any
) -> None:
    got = names(find_tools(catalog, index, "message", mode=mode, allowed=allowed))
    # message appears in slack_post_message and send_email only
    assert got == [n for n in ranked(index, "message", limit=50) if n in expected]


def test_allowed_gates_explicit_and_exact_matches(
    catalog: dict[str, Tool], index: ToolIndex
) -> None:
    assert find_tools(catalog, index, "weather", allowed=["tag:chat"]) == []
    assert find_tools(catalog, index, "weather", mode="explicit", allowed=["github_*"]) == []


def test_semantic_mode_ranks(catalog: dict[str, Tool], index: ToolIndex) -> None:
    assert names(find_tools(catalog, index, "post a message to slack", mode="semantic"))[:1] == [
        "slack_post_message"
    ]
    assert names(find_tools(catalog, index, "open issue github", mode="semantic"))[0] == (
        "github_create_issue"
    )
    assert names(find_tools(catalog, index, "city forecast", mode="semantic")) == ["weather"]
    assert find_tools(catalog, index, "quantum chromodynamics", mode="semantic") == []
    # globs are not selectors here: "github_*" is just the text "github"
    assert set(names(find_tools(catalog, index, "github_*", mode="semantic"))) == {
        "github_create_issue",
        "github_list_issues",
    }
    # tag:/source: prefixes are dropped: the value is ranked as text
    assert names(find_tools(catalog, index, "tag:chat", mode="semantic")) == [
        "slack_list_channels",
        "slack_post_message",
    ]


def test_hybrid_puts_the_exact_name_first(catalog: dict[str, Tool], index: ToolIndex) -> None:
    semantic = names(find_tools(catalog, index, "notes", mode="semantic"))
    assert semantic[0] == "note_search"  # more (and longer-field) occurrences
    hybrid = names(find_tools(catalog, index, "notes", mode="hybrid"))
    assert hybrid == ["notes", "note_search"]
    assert names(find_tools(catalog, index, "notes")) == hybrid  # hybrid is the default


def test_hybrid_orders_exact_then_explicit_then_ranked(
    catalog: dict[str, Tool], index: ToolIndex
) -> None:
    got = names(find_tools(catalog, index, ["tag:git", "send_email", "channels"]))
    assert got[:3] == ["send_email", "github_create_issue", "github_list_issues"]
    assert got[3] == "slack_list_channels"  # ranked for the text "git send_email channels"
    assert len(got) == len(set(got))  # no duplicates
    # several exact names come in query order
    got = names(find_tools(catalog, index, ["weather", "notes", "tag:mail"], limit=3))
    assert got == ["weather", "notes", "send_email"]


def test_hybrid_respects_limit(catalog: dict[str, Tool], index: ToolIndex) -> None:
    assert names(find_tools(catalog, index, "*", limit=3)) == [
        "github_create_issue",
        "github_list_issues",
        "slack_post_message",
    ]
    got = names(find_tools(catalog, index, ["weather", "message"], limit=2))
    assert got[0] == "weather"
    assert len(got) == 2


def test_find_tools_skips_stale_index_entries(catalog: dict[str, Tool], index: ToolIndex) -> None:
    smaller = {n: t for n, t in catalog.items() if n != "send_email"}
    assert "send_email" not in names(find_tools(smaller, index, "email message", mode="semantic"))
    newer = dict(catalog)
    newer["send_email"] = mk("send_email", "changed")
    got = find_tools(newer, index, "email recipient", mode="semantic")
    assert got[0] is newer["send_email"]  # the catalog's tool object is returned


def test_find_tools_uses_any_ranker(catalog: dict[str, Tool]) -> None:
    class Reverse:
        """Ranks every tool, in reverse name order."""

        def __init__(self) -> None:
            self.tools: dict[str, Tool] = {}
            self.queries: list[str] = []

        def rebuild(self, tools: Iterable[Tool]) -> None:
            self.tools = {t.name: t for t in tools}

        def add(self, tool: Tool) -> None:
            self.tools[tool.name] = tool

        def remove(self, name: str) -> None:
            self.tools.pop(name, None)

        def search(
            self, query: str, *, limit: int = 10, allowed: Callable[[str], bool] | None = None
        ) -> list[tuple[Tool, float]]:
            self.queries.append(query)
            order = sorted(self.tools, reverse=True)
            return [(self.tools[n], 1.0) for n in order if allowed is None or allowed(n)][:limit]

    ranker = Reverse()
    ranker.rebuild(catalog.values())
    assert isinstance(ranker, Ranker)
    got = names(find_tools(catalog, ranker, "anything", mode="semantic", limit=3))
    assert got == ["weather", "slack_post_message", "slack_list_channels"]
    got = names(find_tools(catalog, ranker, ["notes", "tag:mail"], limit=3))
    assert got == ["notes", "send_email", "weather"]
    assert ranker.queries[-1] == "notes mail"


def test_query_entries_must_be_strings(catalog: dict[str, Tool], index: ToolIndex) -> None:
    with pytest.raises(TypeError):
        find_tools(catalog, index, ["weather", 3])  # type: ignore[list-item]


# ------------------------------------------------------------------- exports
class Address(pydantic.BaseModel):
    """A postal address."""

    street: str
    city: str


class ShipArgs(pydantic.BaseModel):
    to: Address
    express: bool = False


@pytest.fixture
def ship() -> Tool:
    schema = ShipArgs.model_json_schema()
    assert "$defs" in schema
    return mk(
        "ship_parcel",
        "Ship a parcel.",
        schema=schema,
        output_schema={"type": "object", "properties": {"tracking": {"type": "string"}}},
        annotations=ToolAnnotations(title="Ship", destructiveHint=True, openWorldHint=True),
    )


def test_to_openai_shape_keeps_defs(ship: Tool) -> None:
    out = to_openai(ship)
    assert out == {
        "type": "function",
        "function": {
            "name": "ship_parcel",
            "description": "Ship a parcel.",
            "parameters": ShipArgs.model_json_schema(),
        },
    }
    params = out["function"]["parameters"]
    assert params["properties"]["to"] == {"$ref": "#/$defs/Address"}
    assert params["$defs"]["Address"]["properties"]["city"] == {"title": "City", "type": "string"}
    assert "strict" not in out["function"]
    assert "strict" not in out


def test_to_anthropic_shape(ship: Tool) -> None:
    assert to_anthropic(ship) == {
        "name": "ship_parcel",
        "description": "Ship a parcel.",
        "input_schema": ShipArgs.model_json_schema(),
    }


def test_to_mcp_full_shape(ship: Tool) -> None:
    assert to_mcp(ship) == {
        "name": "ship_parcel",
        "title": "Ship",
        "description": "Ship a parcel.",
        "inputSchema": ShipArgs.model_json_schema(),
        "outputSchema": {"type": "object", "properties": {"tracking": {"type": "string"}}},
        "annotations": {"title": "Ship", "destructiveHint": True, "openWorldHint": True},
    }


def test_to_mcp_omits_absent_optional_keys() -> None:
    out = to_mcp(mk("plain", "Plain tool.", params={"q": "query"}))
    assert out == {
        "name": "plain",
        "description": "Plain tool.",
        "inputSchema": {
            "type": "object",
            "properties": {"q": {"type": "string", "description": "query"}},
        },
    }


def test_to_mcp_wraps_a_non_object_output_schema() -> None:
    out = to_mcp(mk("count", "Count.", output_schema={"type": "integer"}))
    assert out["outputSchema"] == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }


def test_exports_copy_schemas(ship: Tool) -> None:
    before = copy.deepcopy(ship.input_schema)
    for out in (to_openai(ship)["function"]["parameters"], to_anthropic(ship)["input_schema"]):
        out["properties"].clear()
    to_mcp(ship)["inputSchema"]["$defs"].clear()
    assert ship.input_schema == before


def test_empty_input_schema_exports_as_an_empty_object_schema() -> None:
    tool = mk("ping", "Ping.", schema={})
    empty = {"type": "object", "properties": {}}
    assert to_openai(tool)["function"]["parameters"] == empty
    assert to_anthropic(tool)["input_schema"] == empty
    assert to_mcp(tool)["inputSchema"] == empty


@pytest.mark.parametrize(
    "schema",
    [
        {"anyOf": [{"properties": {"a": {"type": "string"}}}, {"required": ["b"]}]},
        {"type": ["object", "null"], "properties": {}},
        {"$ref": "#/$defs/Args", "$defs": {"Args": {"type": "object"}}},
    ],
)
def test_every_export_is_an_object_schema(schema: dict[str, Any]) -> None:
    """Before: a schema with a top-level anyOf or $ref, or a list of types, went out without
    "type": "object", which MCP clients and the OpenAI and Anthropic APIs refuse."""
    tool = mk("odd", "d", schema=schema)
    for out in (
        to_openai(tool)["function"]["parameters"],
        to_anthropic(tool)["input_schema"],
        to_mcp(tool)["inputSchema"],
    ):
        assert out["type"] == "object"
        assert {k: v for k, v in out.items() if k != "type"} == {
            k: v for k, v in schema.items() if k != "type"
        }


@pytest.mark.parametrize(
    "name", ["github.create_issue", "a b", "weird/name", "x" * 65, "", "émoji", "tab\t"]
)
@pytest.mark.parametrize("exporter", [to_openai, to_anthropic])
def test_openai_and_anthropic_reject_names_they_cannot_carry(
    name: str, exporter: Callable[[Tool], dict[str, Any]]
) -> None:
    with pytest.raises(ValueError, match="cannot be exported") as err:
        exporter(mk(name, "d"))
    assert repr(name) in str(err.value)
    assert "a-zA-Z0-9_-" in str(err.value)


@pytest.mark.parametrize("name", ["a", "A-b_c9", "x" * 64])
def test_valid_names_export_everywhere(name: str) -> None:
    tool = mk(name, "d")
    assert to_openai(tool)["function"]["name"] == name
    assert to_anthropic(tool)["name"] == name
    assert to_mcp(tool)["name"] == name


def test_mcp_name_rules() -> None:
    assert to_mcp(mk("github.create_issue", "d"))["name"] == "github.create_issue"
    assert to_mcp(mk("x" * 128, "d"))["name"] == "x" * 128
    for bad in ("x" * 129, "a b", "weird/name", ""):
        with pytest.raises(ValueError, match="MCP"):
            to_mcp(mk(bad, "d"))


def test_export_tool_dispatches_and_rejects_unknown_formats(ship: Tool) -> None:
    assert export_tool(ship, "openai") == to_openai(ship)
    assert export_tool(ship, "anthropic") == to_anthropic(ship)
    assert export_tool(ship, "mcp") == to_mcp(ship)
    with pytest.raises(ValueError, match="openai, anthropic, mcp"):
        export_tool(ship, "gemini")  # type: ignore[arg-type]


def test_field_terms_counts_feed_the_index() -> None:
    tool = mk("report_report", "report", tags={"report"}, params={"report": "report"})
    counts = {f: Counter(ts)["report"] for f, ts in field_terms(tool).items()}
    assert counts == {"name": 2, "description": 1, "tags": 1, "params": 2}


def test_unknown_query_words_do_not_grow_the_cache() -> None:
    index = ToolIndex([mk("a_tool", "alpha")])
    for i in range(100):
        assert index.search(f"zzz{i} unknown{i}") == []
    assert index.search("alpha")
    assert len(index._cache) == 1


def test_free_text_with_glob_characters_is_not_a_name_glob(
    catalog: dict[str, Tool], index: ToolIndex
) -> None:
    assert find_tools(catalog, index, "what is the weather?", mode="explicit") == []
    assert find_tools(catalog, index, "weathe?", mode="explicit") == [catalog["weather"]]
    assert names(find_tools(catalog, index, "what is the weather?"))[0] == "weather"


@pytest.mark.anyio
async def test_names_openai_refuses_are_exported_under_an_alias_that_call_accepts() -> None:
    """Before: one `fs_files.read` (valid in MCP) made every OpenAI/Anthropic export of the
    catalog raise ValueError."""
    from toolwire import Kernel
    from toolwire.testing import FakeTool

    long = "srv_" + "x" * 70
    tools = [
        FakeTool("fs_files.read", script=[{"read": 1}]).tool,
        FakeTool("ok_name", script=[{"ok": 1}]).tool,
        FakeTool(long, script=[{"long": 1}]).tool,
    ]
    async with Kernel(tools=tools) as k:
        dotted = k.export_name("fs_files.read")
        assert dotted.startswith("fs_files_read_") and len(dotted) == len("fs_files_read") + 9
        # a tool holding the sanitized name later does not re-point the alias
        k.add_tool(FakeTool("fs_files_read", script=[{"plain": 1}]).tool)
        assert k.export_name("fs_files.read") == dotted
        names = [t["function"]["name"] for t in k.list_tools(format="openai")]
        assert [t["name"] for t in k.list_tools(format="anthropic")] == names
        assert all(len(n) <= 64 and "." not in n for n in names), names
        assert len(set(names)) == 4 and "ok_name" in names and "fs_files_read" in names
        assert k.list_tools(format="mcp")[0]["name"] == "fs_files.read"
        assert (await k.call(dotted, {})).content == {"read": 1}  # the model's call lands
        assert (await k.call("fs_files_read", {})).content == {"plain": 1}
        assert (await k.call(k.export_name(long), {})).content == {"long": 1}
        assert k.export_name("ok_name") == "ok_name"


def test_an_input_schema_with_properties_but_no_type_exports_as_an_object() -> None:
    tool = mk("t", "d", schema={"properties": {"a": {"type": "string"}}})
    for schema in (
        to_openai(tool)["function"]["parameters"],
        to_anthropic(tool)["input_schema"],
        to_mcp(tool)["inputSchema"],
    ):
        assert schema["type"] == "object" and "a" in schema["properties"]


def test_adding_many_tools_one_by_one_computes_no_export_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: every rebuild recomputed every export alias (3,000 dotted tools: 6.4 s).

    Counted, not timed: aliases are made once, when first needed, and again only after
    the catalog changed."""
    import toolwire._discovery as discovery_mod
    from toolwire import Kernel

    real = discovery_mod.export_alias
    computed: list[str] = []

    def counting(name: str) -> str | None:
        computed.append(name)
        return real(name)

    monkeypatch.setattr(discovery_mod, "export_alias", counting)
    k = Kernel()
    for i in range(300):
        k.add_tool(mk(f"srv.tool_{i}", "d"))
    assert computed == []
    assert k.export_name("srv.tool_7") == real("srv.tool_7") != "srv.tool_7"
    assert len(computed) == 300
    assert k.export_name("srv.tool_8") == real("srv.tool_8")  # cached
    assert len(computed) == 300
    k.add_tool(mk("srv.more", "d"))
    assert len(computed) == 300
    assert k.export_name("srv.more") == real("srv.more")
    assert len(computed) == 601
