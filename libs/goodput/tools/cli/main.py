"""The `goodput` command: one entry point, one module per subcommand, imported only when run.

Each subcommand module exposes ``register(subparsers)``, which adds its parser(s) and sets
``func`` (a callable taking the parsed namespace and returning an exit code). Only the module
of the command given is imported: ``goodput --help`` or ``goodput report`` must not pay for
torch or matplotlib, which other subcommands pull in. ``goodput --help`` lists the commands
from :data:`SUBCOMMANDS` without importing any of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

#: command -> (the module registering it, its line in `goodput --help`), in listing order
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "goodput.tools.cli.demo",
        "the main job: the whole system on embedded defaults, with a fault scenario",
    ),
    "run": (
        "goodput.tools.cli.run",
        "launch a training script under supervision (local, or --backend kubernetes)",
    ),
    "agent": (
        "goodput.tools.cli.agent",
        "the node agent of this host (one per host, e.g. under Slurm): runs its ranks for "
        "the actuator's agent backend",
    ),
    "up": (
        "goodput.tools.cli.stack",
        "start the supervisor stack (embedded NATS + every service as its own process)",
    ),
    "down": ("goodput.tools.cli.stack", "stop the stack started by `goodput up`"),
    "status": (
        "goodput.tools.cli.status",
        "live view of the job (nodes, ranks, step rate, checkpoints, signals, goodput) "
        "and the health of the stack's services",
    ),
    "bench": (
        "goodput.tools.cli.bench",
        "run a benchmark (ratios against a baseline measured in the same run)",
    ),
    "report": (
        "goodput.tools.cli.report",
        "goodput of a job: productive time, badput by cause, ETTR, MTBF/MTTR",
    ),
    "ckpt": (
        "goodput.tools.cli.ckpt",
        "inspect, verify, restore, garbage-collect and export checkpoints across tiers",
    ),
    "chaos": (
        "goodput.tools.cli.chaos",
        "inject faults into the running job (kill ranks, fail nodes, fill disks…)",
    ),
    "simulate": (
        "goodput.tools.cli.simulate",
        "simulate a fleet: goodput per strategy, decided by goodput's real sensor and policy",
    ),
}


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one line (``goodput up: error: …``); ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the full parser(s) of ``command``'s module and one-line entries for
    the rest (enough for ``goodput --help`` and for naming an unknown command)."""
    parser = OneLineErrorParser(
        prog="goodput",
        description=(
            "Keep large PyTorch training jobs productive: detect crashes, hangs and "
            "stragglers, remediate by policy, checkpoint asynchronously across tiers, "
            "and measure the goodput gained."
        ),
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = SUBCOMMANDS[command][0] if command in SUBCOMMANDS else None
    for name, (module_name, help_line) in SUBCOMMANDS.items():
        if module_name != chosen:
            subparsers.add_parser(name, help=help_line)
        elif name == _first_command_of(module_name):
            # the module registers all its commands (`up` and `down`) at its first one's place
            importlib.import_module(module_name).register(subparsers)
    return parser


def _first_command_of(module_name: str) -> str:
    return next(name for name, (module, _) in SUBCOMMANDS.items() if module == module_name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        if _is_bus_refusal(exc):
            print(f"goodput {args.command}: {exc}", file=sys.stderr)
            return 1
        raise


def _is_bus_refusal(exc: Exception) -> bool:
    """Bus settings that cannot work (an unauthenticated remote bus, credentials missing,
    unusable or refused) or a bus that stayed away: one line for any command, whichever
    step met it. Only a command that got as far as the bus has imported ``goodput.bus``."""
    bus = sys.modules.get("goodput.bus")
    return bus is not None and isinstance(exc, bus.BusSettingsError | bus.BusUnavailableError)


if __name__ == "__main__":
    sys.exit(main())
