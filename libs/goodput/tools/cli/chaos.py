"""`goodput chaos`: inject one fault into the running job, or run a scenario of them."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    bus_settings_from_args,
    job_name,
    node_name,
)
from goodput.gpu_faults import xids_with
from goodput.tools.chaos import scenario as scenario_format
from goodput.tools.chaos import spec as faults

#: per fault kind: (flag, keyword, argparse options) beyond the common ones
_NODE = (
    "--node",
    "node",
    {"type": node_name, "default": "node-0", "help": "node (default: node-0)"},
)
_RANK = ("--rank", "rank", {"type": int, "default": 0, "help": "global rank (default: 0)"})
_CLEAR = ("--clear", "clear", {"action": "store_true", "help": "undo the fault"})
FAULT_ARGUMENTS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "kill-rank": [_RANK],
    "fail-node": [_NODE, _CLEAR],
    "gpu-xid": [
        _NODE,
        (
            "--xid",
            "xid",
            {
                "type": int,
                "default": 79,
                "help": "XID code (default: 79, fell off the bus: the node is replaced); "
                f"{', '.join(map(str, xids_with('reset_gpu')))} are reset-correctable: "
                "the supervisor resets the node's GPUs first; "
                f"{', '.join(map(str, xids_with('restart')))} are the application's: "
                "the job restarts on the same nodes",
            },
        ),
        _CLEAR,
    ],
    "host-fault": [
        (
            "fault",
            "fault",
            {
                "help": "disk_full, memory_pressure, thermal, ecc_uncorrected, gpu_lost, node_down, gpu_xid"
            },
        ),
        _NODE,
        ("--detail", "detail", {"default": "", "help": "fault detail (gpu_xid: the XID code)"}),
        _CLEAR,
    ],
    "slow-rank": [
        _RANK,
        (
            "--factor",
            "factor",
            {"type": float, "default": 2.0, "help": "slow-down factor > 1 (default: 2)"},
        ),
        (
            "--duration",
            "duration_s",
            {"type": float, "default": 60.0, "help": "seconds (default: 60)"},
        ),
        (
            "--period",
            "period_s",
            {"type": float, "default": 0.2, "help": "duty-cycle period, s (default: 0.2)"},
        ),
        (
            "--method",
            "method",
            {
                "choices": ["auto", "compute", "sigstop"],
                "default": "auto",
                "help": "compute: the trainer shim makes the rank's compute factor× as long "
                "(needs fault injection); sigstop: a SIGSTOP/SIGCONT duty cycle on any process "
                "(also stops it while it waits for peers: less than factor× compute); "
                "auto (default): compute where the rank allows it",
            },
        ),
    ],
    "hang-rank": [_RANK, _CLEAR],
    "nan": [_RANK],
    "sdc": [_NODE],
    "loss-spike": [
        _RANK,
        (
            "--factor",
            "factor",
            {"type": float, "default": 10.0, "help": "the loss × this, > 1 (default: 10)"},
        ),
    ],
    "fill-disk": [
        _NODE,
        (
            "--free-mib",
            "free_mib",
            {"type": float, "default": 1.0, "help": "leave less than this free (default: 1 MiB)"},
        ),
        _CLEAR,
    ],
    "corrupt-checkpoint": [
        _NODE,
        (
            "--step",
            "step",
            {
                "type": int,
                "default": None,
                "help": "checkpoint step (default: the newest complete one)",
            },
        ),
    ],
    "kill-service": [
        ("service", "service", {"help": "sensor, controller, actuator, hostmon, replicator"}),
        ("--node", "node", {"default": "", "help": "node of a per-node service"}),
    ],
    "restart-nats": [
        (
            "--down-s",
            "down_s",
            {"type": float, "default": 0.0, "help": "seconds the server stays down (default: 0)"},
        ),
        (
            "--member",
            "member",
            {"type": int, "default": 0, "help": "which server of an embedded cluster (default 0)"},
        ),
    ],
}

EPILOG = (
    "faults:\n"
    + "\n".join(f"  {kind:<19} {faults.describe(kind)}" for kind in faults.FAULTS_BY_KIND)
    + (
        "\n  run                 run a scenario file (TOML): timed and Poisson faults, seeded"
        "\n\nTargets are resolved from the state directory (stack.json, nats.json, node volumes) and"
        "\nthe job status the actuator keeps in KV; a rank pid is signalled only after its own"
        "\nenvironment confirms it is that rank of that job. Host faults need the host monitor"
        "\nstarted with --set enable_fault_injection=true; hang-rank, nan, sdc and loss-spike a"
        "\ntrainer started with GOODPUT_ENABLE_FAULT_INJECTION=1, whose shim applies them at"
        "\nits next step boundary. nan and loss-spike change the loss its numerics monitor"
        "\nsees (the detectors and the rollback are what is tested, the training is not"
        "\nchanged); sdc flips a bit of the node's replica of the model, which trains on until"
        "\nthe next fingerprint (GOODPUT_FINGERPRINT_EVERY steps) finds it."
    )
)


def register(subparsers: argparse._SubParsersAction) -> None:
    chaos = subparsers.add_parser(
        "chaos",
        help="inject faults into the running job (kill ranks, fail nodes, fill disks…)",
        description="Inject a fault into the job of a running stack, or run a scenario of faults.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = chaos.add_subparsers(dest="fault", metavar="FAULT")
    for kind, arguments in FAULT_ARGUMENTS.items():
        parser = kinds.add_parser(
            kind, help=faults.describe(kind), description=faults.describe(kind)
        )
        for flag, dest, options in arguments:
            if flag.startswith("--"):
                parser.add_argument(flag, dest=dest, **options)
            else:
                parser.add_argument(dest, **options)
        if kind == "slow-rank":
            parser.add_argument(
                "--detach",
                action="store_true",
                help="run in the background (recorded in <state-dir>/chaos/) and return at once",
            )
            parser.add_argument(
                "--clear", action="store_true", help="stop a detached slow-rank of --rank"
            )
        _add_common(parser)
        parser.set_defaults(func=cmd_fault, kind=kind)
    run = kinds.add_parser(
        "run",
        help="run a scenario file: timed and Poisson faults, seeded",
        description=(
            "Run a TOML scenario: [[faults]] entries with kind, target fields and either at_s "
            "(once) or rate_per_day (Poisson, scaled by time_compression); duration_s, seed. "
            "The whole file is checked before anything fires."
        ),
        epilog=scenario_format.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("scenario", type=Path, help="scenario file (TOML)")
    run.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    run.add_argument(
        "--dry-run", action="store_true", help="check the file and print the plan; fire nothing"
    )
    _add_common(run)
    run.set_defaults(func=cmd_run)
    chaos.set_defaults(func=lambda _args: chaos.print_help() or 2)


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_state_dir_argument(parser, "the stack's state directory")
    parser.add_argument(
        "--job", type=job_name, default=None, help="job name (default: the stack's job)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    add_bus_arguments(parser)


def _print(entry: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(entry), flush=True)
        return
    status = "" if entry["ok"] else "FAILED "
    when = f"{entry['t_s']:8.1f}s  " if "t_s" in entry else ""
    clear = " (clear)" if entry.get("clear") else ""
    print(
        f"{when}{entry['fault']}{clear}  {entry['target']}: {status}{entry['detail']}", flush=True
    )


def _context(args: argparse.Namespace, seed: int | None = None):
    from goodput.tools.chaos.targets import ChaosContext

    settings = bus_settings_from_args(args)
    url = args.nats_url or os.environ.get("GOODPUT_NATS_URL", "")
    return ChaosContext.open(
        Path(args.state_dir), job=args.job or "", url=url, settings=settings, seed=seed
    )


def cmd_fault(args: argparse.Namespace) -> int:
    from goodput.tools.chaos.actions import clear_slow_rank, fire, slow_rank_detached
    from goodput.tools.chaos.targets import ChaosError

    values = {dest: getattr(args, dest) for _, dest, _ in FAULT_ARGUMENTS[args.kind]}
    if args.kind == "slow-rank" and args.clear:

        async def clear() -> str:
            ctx = _context(args)
            try:
                return await clear_slow_rank(ctx, args.rank)
            finally:
                await ctx.close()

        try:
            print(asyncio.run(clear()))
        except ChaosError as exc:
            print(f"goodput chaos {args.kind}: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        spec = msgspec.convert(values, faults.FAULTS_BY_KIND[args.kind])
    except msgspec.ValidationError as exc:
        print(f"goodput chaos {args.kind}: {exc}", file=sys.stderr)
        return 2

    async def go():
        ctx = _context(args)
        try:
            if isinstance(spec, faults.SlowRank) and args.detach:
                return await slow_rank_detached(spec, ctx)
            return await fire(spec, ctx)
        finally:
            await ctx.close()

    if args.kind == "slow-rank" and not args.detach:
        print(
            f"slowing rank {args.rank} by {args.factor:g}× for {args.duration_s:g} s "
            "(Ctrl-C ends it early; the rank is always resumed)",
            file=sys.stderr,
        )
    try:
        outcome = asyncio.run(go())
    except ChaosError as exc:
        print(f"goodput chaos {args.kind}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"goodput chaos {args.kind}: interrupted", file=sys.stderr)
        return 130
    _print(outcome.as_dict(), args.json)
    return 0 if outcome.ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    from goodput.tools.chaos.scenario import ScenarioError, load_scenario, plan, run_scenario
    from goodput.tools.chaos.targets import ChaosError

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"goodput chaos run: {exc}", file=sys.stderr)
        return 2
    if args.seed is not None:
        scenario = msgspec.structs.replace(scenario, seed=args.seed)
    if args.dry_run:
        for planned in plan(scenario):
            entry = {"planned_s": planned.at_s, "fault": planned.fault.kind}
            entry.update(
                {k: v for k, v in msgspec.structs.asdict(planned.fault).items() if v is not None}
            )
            print(json.dumps(entry) if args.json else f"{planned.at_s:8.1f}s  {planned.fault.kind}")
        return 0

    async def go():
        ctx = _context(args, seed=scenario.seed)
        try:
            return await run_scenario(scenario, ctx, lambda f: _print(f.as_dict(), args.json))
        finally:
            await ctx.close()

    try:
        fired = asyncio.run(go())
    except ChaosError as exc:
        print(f"goodput chaos run: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    failed = sum(not f.outcome.ok for f in fired)
    print(f"{len(fired)} fault(s) fired, {failed} failed", file=sys.stderr)
    return 0 if not failed else 1
