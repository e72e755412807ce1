"""The `goodput` command: one entry point, one module per subcommand.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `goodput --help` lists them.
SUBCOMMAND_MODULES = [
    "goodput.cli.demo",
    "goodput.cli.run",
    "goodput.cli.stack",
    "goodput.cli.status",
    "goodput.cli.bench",
    "goodput.cli.report",
    "goodput.cli.ckpt",
    "goodput.cli.chaos",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodput",
        description=(
            "Keep large PyTorch training jobs productive: detect crashes, hangs and "
            "stragglers, remediate by policy, checkpoint asynchronously across tiers, "
            "and measure the goodput gained."
        ),
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
