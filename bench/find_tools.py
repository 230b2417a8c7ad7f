"""Latency of ``find_tools(mode="semantic")`` over a 10,000-tool catalog.

Builds 10,000 synthetic but varied tools (services x verbs x objects, four
naming styles, templated descriptions, tags, 1-5 documented parameters) and
~200 queries (keywords, natural language, identifiers) from a seeded RNG, then
reports:

- the index build time (``ToolIndex(tools)``) and the cost of incremental
  ``remove`` + ``add``;
- p50/p90/p99 of ``find_tools(..., mode="semantic", limit=10)``, cold (first
  pass: per-term score cache empty) and warm (second pass), and of the first
  search after a catalog change;
- a brute-force baseline in the same process: the same BM25F formula computed
  naively for every tool (documents pre-tokenized, so only scoring is timed),
  its p50 and the speed-up ratio, and whether its top 10 equals the index's.

    uv run python bench/find_tools.py [--tools N] [--queries N] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from toolwire._discovery import FIELDS, ToolIndex, field_terms, find_tools, tokenize
from toolwire._types import CallContext, Tool


def _words(text: str) -> list[str]:
    return text.split()


SERVICES = _words(
    """
    github gitlab bitbucket slack discord teams zoom jira linear asana trello notion
    confluence gmail outlook sendgrid mailchimp twilio stripe paypal shopify quickbooks xero
    salesforce hubspot zendesk intercom freshdesk s3 gcs azure_blob dropbox box gdrive
    onedrive postgres mysql sqlite redis mongodb elasticsearch kafka rabbitmq kubernetes
    docker terraform datadog sentry pagerduty grafana figma miro airtable sheets calendar
    weather maps spotify youtube twitter reddit arxiv wikipedia openweather yelp uber
    expedia
    """
)

VERBS = _words(
    """
    create list get update delete search send archive export import sync upload download
    approve assign merge close reopen schedule cancel summarize translate analyze monitor
    restart scale rollback tag share
    """
)

OBJECTS = _words(
    """
    issue pull_request commit branch repository message channel thread file folder document
    user team member invoice payment refund customer order product subscription ticket event
    meeting record table row query bucket object cluster pod deployment service alert
    incident dashboard metric playlist track video comment post paper article forecast route
    restaurant flight hotel contact campaign report
    """
)

CATEGORIES = _words(
    """
    devops communication storage finance crm database analytics media productivity travel
    research support marketing security
    """
)

ADJECTIVES = _words(
    """
    new existing archived pending recent public private shared draft scheduled failed active
    large
    """
)

EXTRAS = [
    "Supports pagination with a cursor.",
    "Requires an API token with write scope.",
    "Returns the created resource as JSON.",
    "Results can be filtered by date range and status.",
    "Rate limited to 100 requests per minute.",
    "Idempotent when an idempotency key is provided.",
    "Useful for automation workflows and reporting.",
    "The operation is asynchronous and returns a job id.",
    "Only administrators may perform this action.",
    "Includes metadata such as author, timestamps and labels.",
    "Sorted by relevance unless another order is requested.",
    "Large payloads are streamed in chunks.",
    "Works with both personal and organization accounts.",
    "Emits a webhook notification on completion.",
]

PARAMS: list[tuple[str, str, str]] = [
    ("id", "string", "Identifier of the {obj}."),
    ("query", "string", "Free-text search query."),
    ("limit", "integer", "Maximum number of results to return."),
    ("cursor", "string", "Pagination cursor from a previous call."),
    ("title", "string", "Title of the {obj}."),
    ("body", "string", "Body text or content."),
    ("recipient", "string", "Email address or handle of the recipient."),
    ("start_date", "string", "Start of the date range (ISO 8601)."),
    ("end_date", "string", "End of the date range (ISO 8601)."),
    ("status", "string", "Filter by status, e.g. open or closed."),
    ("amount", "number", "Amount in the account currency."),
    ("currency", "string", "Three-letter ISO currency code."),
    ("location", "string", "City name or coordinates."),
    ("labels", "array", "Labels to attach to the {obj}."),
    ("owner", "string", "Owner account or organization."),
    ("region", "string", "Cloud region, e.g. eu-west-1."),
    ("dry_run", "boolean", "Validate without applying changes."),
    ("language", "string", "Target language code."),
]


async def _noop(args: dict[str, Any], ctx: CallContext) -> Any:
    return None


def _style(parts: Sequence[str], style: int) -> str:
    words = [w for p in parts for w in p.split("_")]
    if style == 0:
        return "_".join(words)
    if style == 1:
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if style == 2:
        return f"{parts[0]}.{'_'.join(w for p in parts[1:] for w in p.split('_'))}"
    return "-".join(words)


def make_tools(n: int, rng: random.Random) -> list[Tool]:
    """``n`` distinct synthetic tools."""
    tools: list[Tool] = []
    seen: set[str] = set()
    while len(tools) < n:
        svc, verb, obj = rng.choice(SERVICES), rng.choice(VERBS), rng.choice(OBJECTS)
        name = _style((svc, verb, obj), rng.randrange(4))
        if name in seen:
            name = f"{name}_v{rng.randrange(2, 9)}"
            if name in seen:
                continue
        seen.add(name)
        obj_words = obj.replace("_", " ")
        svc_title = svc.replace("_", " ").title()
        adj = rng.choice(ADJECTIVES)
        sentences = [
            rng.choice(
                [
                    f"{verb.capitalize()} a {adj} {obj_words} in {svc_title}.",
                    f"{verb.capitalize()} {obj_words}s using the {svc_title} API.",
                    f"Use this tool to {verb} {adj} {obj_words}s on {svc_title}.",
                    f"{svc_title}: {verb} one or more {obj_words}s.",
                ]
            )
        ]
        sentences += rng.sample(EXTRAS, rng.randrange(1, 4))
        props: dict[str, Any] = {}
        for pname, ptype, pdesc in rng.sample(PARAMS, rng.randrange(1, 6)):
            prop: dict[str, Any] = {"type": ptype, "description": pdesc.format(obj=obj_words)}
            if ptype == "array":
                prop["items"] = {"type": "string"}
            props[pname] = prop
        tools.append(
            Tool(
                name=name,
                description=" ".join(sentences),
                input_schema={"type": "object", "properties": props, "required": list(props)[:1]},
                executor=_noop,
                tags=frozenset({svc, rng.choice(CATEGORIES)}),
                source=rng.choice(["local", "mcp:remote", "openapi"]),
            )
        )
    return tools


def make_queries(n: int, rng: random.Random) -> list[str]:
    """``n`` varied queries: keywords, questions, identifiers."""
    out: list[str] = []
    for _ in range(n):
        svc, verb, obj = rng.choice(SERVICES), rng.choice(VERBS), rng.choice(OBJECTS)
        o = obj.replace("_", " ")
        kind = rng.randrange(5)
        if kind == 0:
            q = f"{svc} {o}"
        elif kind == 1:
            q = f"how do I {verb} a {rng.choice(ADJECTIVES)} {o} on {svc}?"
        elif kind == 2:
            q = f"{verb}_{obj}"
        elif kind == 3:
            q = f"I need to {verb} the {o}s for {rng.choice(CATEGORIES)} and {rng.choice(VERBS)} them"
        else:
            q = f"{verb} {o} with {rng.choice(PARAMS)[0].replace('_', ' ')} filter"
        out.append(q)
    return out


class BruteForce:
    """The same BM25F score computed for every tool, no inverted index."""

    def __init__(self, index: ToolIndex, tools: Sequence[Tool]) -> None:
        self.k1 = index.k1
        self.w = [index.weights[f] for f in FIELDS]
        self.b = [index.b[f] for f in FIELDS]
        self.docs = []
        for tool in tools:
            per = field_terms(tool)
            self.docs.append(
                (tool.name, [Counter(per[f]) for f in FIELDS], [len(per[f]) for f in FIELDS])
            )
        n = len(self.docs)
        self.avg = [sum(d[2][i] for d in self.docs) / n for i in range(len(FIELDS))]
        df: Counter[str] = Counter()
        for _, counters, _ in self.docs:
            df.update(set().union(*counters))
        self.idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def search(self, query: str, limit: int) -> list[str]:
        terms = [t for t in dict.fromkeys(tokenize(query)) if t in self.idf]
        scored: list[tuple[float, str]] = []
        nf = len(FIELDS)
        for name, counters, lengths in self.docs:
            score = 0.0
            for t in terms:
                tf = 0.0
                for i in range(nf):
                    c = counters[i].get(t, 0)
                    if c:
                        norm = 1 - self.b[i] + self.b[i] * lengths[i] / self.avg[i]
                        tf += self.w[i] * c / norm
                if tf:
                    score += self.idf[t] * tf * (self.k1 + 1) / (tf + self.k1)
            if score > 0:
                scored.append((-score, name))
        scored.sort()
        return [name for _, name in scored[:limit]]


def _pct(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49], q[89], q[98]


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    tools = make_tools(args.tools, rng)
    queries = make_queries(args.queries, rng)
    catalog = {t.name: t for t in tools}

    index = ToolIndex()
    build_ms = _timed(lambda: index.rebuild(tools))
    rebuilds = [_timed(lambda: ToolIndex(tools)) for _ in range(3)]

    def run_pass() -> tuple[list[float], list[list[str]]]:
        lat: list[float] = []
        res: list[list[str]] = []
        for q in queries:
            t = time.perf_counter()
            found = find_tools(catalog, index, q, mode="semantic", limit=10)
            lat.append((time.perf_counter() - t) * 1000)
            res.append([tool.name for tool in found])
        return lat, res

    cold, results = run_pass()
    warm, _ = run_pass()

    # incremental updates: remove + re-add 1,000 tools
    sample = rng.sample(tools, 1000)
    t = time.perf_counter()
    for tool in sample:
        index.remove(tool.name)
        index.add(tool)
    churn_us = (time.perf_counter() - t) * 1e6 / len(sample)
    after_change: list[float] = []
    for q in queries[:50]:
        tool = rng.choice(tools)
        index.remove(tool.name)
        index.add(tool)
        t = time.perf_counter()
        find_tools(catalog, index, q, mode="semantic", limit=10)
        after_change.append((time.perf_counter() - t) * 1000)

    brute = BruteForce(index, tools)
    base: list[float] = []
    agree = 0
    for q, expected in zip(queries, results, strict=True):
        t = time.perf_counter()
        got = brute.search(q, 10)
        base.append((time.perf_counter() - t) * 1000)
        agree += got == expected

    st = index.stats()
    print(f"catalog: {st['tools']} tools, {st['terms']} terms, {st['postings']} postings")
    print(f"queries: {len(queries)} (seed {args.seed}); find_tools(mode='semantic', limit=10)")
    print(f"index build           {build_ms:8.1f} ms  (rebuilds: {min(rebuilds):.1f} ms best of 3)")
    print(f"remove+add            {churn_us:8.1f} us per tool (1,000 tools)")
    for label, lat in (("cold pass", cold), ("warm pass", warm), ("after a change", after_change)):
        p50, p90, p99 = _pct(lat)
        print(f"{label:<20}  p50 {p50:7.3f} ms  p90 {p90:7.3f} ms  p99 {p99:7.3f} ms")
    b50, b90, b99 = _pct(base)
    c50 = _pct(cold)[0]
    print(f"{'brute force':<20}  p50 {b50:7.3f} ms  p90 {b90:7.3f} ms  p99 {b99:7.3f} ms")
    print(f"speed-up (p50 brute / p50 cold): {b50 / c50:.1f}x")
    print(f"top-10 identical to brute force: {agree}/{len(queries)}")
    return 0 if agree == len(queries) else 1


if __name__ == "__main__":
    sys.exit(main())
