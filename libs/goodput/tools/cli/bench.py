"""`goodput bench <name>`: the project's benchmarks, each a module in `goodput.tools.bench`."""

from __future__ import annotations

import argparse
import importlib

# Each module exposes ``register(subparsers)`` for `goodput bench <name>`.
BENCH_MODULES: list[str] = [
    "goodput.tools.bench.ckpt",
    "goodput.tools.bench.bus",
    "goodput.tools.bench.restore",
    "goodput.tools.bench.recovery",
    "goodput.tools.bench.detect",
    "goodput.tools.bench.control_plane",
    "goodput.tools.bench.report",
    "goodput.tools.bench.store",
    "goodput.tools.bench.shim",
    "goodput.tools.bench.index_reads",
    "goodput.tools.bench.index_views",
    "goodput.tools.bench.command_links",
    "goodput.tools.bench.gpu",
    "goodput.tools.bench.step_send",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark (ratios against a baseline measured in the same run)",
        description="Benchmarks print a table, or JSON with --json. Figures are recorded in docs/BENCHMARKS.md.",
    )
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    for module_name in BENCH_MODULES:
        importlib.import_module(module_name).register(bench_sub)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
