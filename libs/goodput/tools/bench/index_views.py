"""What a replicator's poll costs in step views (issue 36): ``safe_steps`` over a simulated
fleet's index (``index_fleet``'s records: each node's address and its copies of the kept
steps on every tier), timed as the follower serves it:

- cold: the first snapshot, every step's view built;
- unchanged: the next poll's snapshot, nothing changed (the views reused whole);
- address refreshed: a node's address rewritten (the records' list rebuilt, no copy changed);
- checkpoint changed: one node's new step on every tier and its oldest withdrawn (only the
  steps whose copies changed rebuilt).

In-process and CPU-bound: no bus; each figure is the min / median / max of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import TypedDict

from goodput.checkpoint.index.index import IndexSnapshot, ViewCache
from goodput.checkpoint.index.records import CopyRecord, NodeAddressRecord
from goodput.checkpoint.index.retention import safe_steps
from goodput.schemas.tiers import PEER
from goodput.tools.bench.arguments import add_fleet_nodes, positive_int
from goodput.tools.bench.index_fleet import STEPS_KEPT, address, copies

FIRST_STEP = 100


class Spread(TypedDict):
    min: float
    median: float
    max: float


class Measured(TypedDict):
    """One fleet size's figures (an entry of ``--json``): seconds and views built by case."""

    nodes: int
    copies: int
    steps: int
    seconds: dict[str, Spread]
    views_built: dict[str, int]


def fleet(n: int, ranks: int) -> tuple[dict[str, NodeAddressRecord], list[CopyRecord]]:
    """The index of ``n`` simulated nodes, each with its kept steps on every tier."""
    names = [f"sim-{i}" for i in range(n)]
    nodes = {names[i]: address(names, i) for i in range(n)}
    records = [
        c
        for i in range(n)
        for s in range(STEPS_KEPT)
        for c in copies(names, i, FIRST_STEP + s, ranks)
    ]
    return nodes, records


def timed_poll(snapshot: IndexSnapshot) -> float:
    """Seconds one poll's ``safe_steps`` takes (what the replicator publishes each poll)."""
    began = time.perf_counter()
    safe_steps(snapshot, (PEER,))
    return time.perf_counter() - began


def measure(n: int, ranks: int, repeats: int) -> Measured:
    """Seconds of one poll's ``safe_steps`` in each case, and the views each one built."""
    nodes, records = fleet(n, ranks)
    names = sorted(nodes)
    cases: dict[str, list[float]] = {}
    built: dict[str, int] = {}

    def case(name: str, make: Callable[[ViewCache], IndexSnapshot]) -> None:
        samples = []
        for _ in range(repeats):
            cache = ViewCache()
            safe_steps(IndexSnapshot(dict(nodes), records, view_cache=cache), (PEER,))
            snapshot = make(cache)
            before = snapshot.view_cache.built
            samples.append(timed_poll(snapshot))
            built[name] = snapshot.view_cache.built - before
        cases[name] = samples

    case("cold", lambda _: IndexSnapshot(dict(nodes), records, view_cache=ViewCache()))
    case("unchanged", lambda c: IndexSnapshot(dict(nodes), records, view_cache=c))
    refreshed = {**nodes, names[0]: address(names, 0)}
    case("address refreshed", lambda c: IndexSnapshot(refreshed, list(records), view_cache=c))
    step = FIRST_STEP + STEPS_KEPT
    changed = [r for r in records if not (r.owner == names[0] and r.step == FIRST_STEP)]
    changed += copies(names, 0, step, ranks)
    case("checkpoint changed", lambda c: IndexSnapshot(dict(nodes), changed, view_cache=c))
    return {
        "nodes": n,
        "copies": len(records),
        "steps": STEPS_KEPT,
        "seconds": {
            name: {
                "min": round(min(s), 6),
                "median": round(statistics.median(s), 6),
                "max": round(max(s), 6),
            }
            for name, s in cases.items()
        },
        "views_built": built,
    }


def run(args: argparse.Namespace) -> int:
    results = [measure(n, args.ranks_per_node, args.repeats) for n in args.nodes]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for result in results:
        print(f"{result['nodes']} nodes, {result['copies']} copies, {result['steps']} steps")
        for name, s in result["seconds"].items():
            views = result["views_built"][name]
            print(
                f"  {name:20s} {s['min'] * 1e3:9.2f} / {s['median'] * 1e3:9.2f} /"
                f" {s['max'] * 1e3:9.2f} ms  views built: {views}"
            )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index-views",
        help="a replicator poll's safe_steps over a simulated fleet's index: built vs reused",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_fleet_nodes(parser)
    parser.add_argument(
        "--ranks-per-node", type=positive_int, default=8, help="files per copy - 2 (default 8)"
    )
    parser.add_argument("--repeats", type=positive_int, default=5, help="samples (default 5)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
