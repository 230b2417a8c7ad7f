"""Retrieval quality of ``find_tools(mode="semantic")`` on the MetaTool dataset.

The dataset (MIT, Huang et al. 2023, "MetaTool Benchmark") has ``tools.json``
(``{tool name: description}``, 199 tools) and ``queries_dev.csv`` (columns
``Query``, ``Tool``: one relevant tool per query). Each tool is indexed with
its name and description only (the dataset has no schemas); every query is
ranked against all tools and we report recall@1, recall@5, MRR (over the full
ranking; a tool not retrieved at all counts 0) and the per-query latency.

    uv run python bench/metatool_eval.py [--dataset DIR] [--misses N]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from toolwire._discovery import ToolIndex, find_tools
from toolwire._types import CallContext, Tool

DEFAULT_DATASET = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "metatool"


async def _noop(args: dict[str, Any], ctx: CallContext) -> Any:
    return None


def load(dataset: Path) -> tuple[dict[str, Tool], list[tuple[str, str]]]:
    """The catalog and the ``(query, expected tool)`` pairs of ``dataset``."""
    with (dataset / "tools.json").open(encoding="utf-8") as fh:
        raw: dict[str, str] = json.load(fh)
    catalog = {
        name: Tool(
            name=name,
            description=desc,
            input_schema={"type": "object", "properties": {}},
            executor=_noop,
        )
        for name, desc in raw.items()
    }
    with (dataset / "queries_dev.csv").open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"Query", "Tool"} - set(reader.fieldnames or ())
        if missing:
            raise SystemExit(f"queries_dev.csv lacks column(s) {sorted(missing)}")
        pairs = [(row["Query"], row["Tool"]) for row in reader]
    unknown = {t for _, t in pairs if t not in catalog}
    if unknown:
        raise SystemExit(f"queries reference unknown tools: {sorted(unknown)[:5]}")
    return catalog, pairs


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="MetaTool dir")
    parser.add_argument("--misses", type=int, default=0, help="print N misses at rank 1")
    args = parser.parse_args(argv)
    dataset: Path = args.dataset
    if not (dataset / "tools.json").is_file() or not (dataset / "queries_dev.csv").is_file():
        print(
            f"error: MetaTool dataset not found in {dataset} (expected tools.json and "
            f"queries_dev.csv); pass --dataset DIR",
            file=sys.stderr,
        )
        return 2

    catalog, pairs = load(dataset)
    t0 = time.perf_counter()
    index = ToolIndex(catalog.values())
    build_ms = (time.perf_counter() - t0) * 1000

    hits1 = hits5 = 0
    rr_sum = 0.0
    latencies: list[float] = []
    misses: list[tuple[str, str, str]] = []
    for query, expected in pairs:
        t = time.perf_counter()
        ranked = find_tools(catalog, index, query, mode="semantic", limit=len(catalog))
        latencies.append((time.perf_counter() - t) * 1000)
        names = [tool.name for tool in ranked]
        if expected in names:
            rank = names.index(expected) + 1
            rr_sum += 1.0 / rank
            hits1 += rank == 1
            hits5 += rank <= 5
        if (not names or names[0] != expected) and len(misses) < args.misses:
            misses.append((query, expected, names[0] if names else "-"))

    n = len(pairs)
    q = statistics.quantiles(latencies, n=100)
    print(f"MetaTool: {len(catalog)} tools, {n} queries ({dataset})")
    print(f"index build       {build_ms:8.2f} ms")
    print(f"recall@1          {hits1 / n:8.4f}")
    print(f"recall@5          {hits5 / n:8.4f}")
    print(f"MRR               {rr_sum / n:8.4f}")
    print(f"latency p50/p99   {q[49]:8.3f} / {q[98]:.3f} ms per query (full ranking)")
    for query, expected, got in misses:
        print(f"  miss: {query!r}: expected {expected}, got {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
