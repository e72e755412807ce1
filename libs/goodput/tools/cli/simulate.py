"""`goodput simulate`: a simulated fleet in which goodput's real sensor, controller and policy
decide; the strategies compared on one seeded failure trace, and what-if sweeps."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console


def run(args: argparse.Namespace) -> int:
    from goodput.tools.simulate.profile import SimulateError

    try:
        if args.action == "sweep":
            return _sweep(args)
        if args.action == "replay":
            return _replay(args)
        if args.action == "predict":
            return _predict(args)
        if args.action == "calibrate":
            return _calibrate(args)
        return _simulate(args)
    except SimulateError as exc:
        print(f"goodput simulate: {exc}", file=sys.stderr)
        return 2


def _inputs(args: argparse.Namespace):
    from goodput.tools.simulate.profile import load_preset, load_profile
    from goodput.tools.simulate.run import with_job
    from goodput.tools.simulate.strategies import pick

    preset = load_preset(args.preset)
    if args.hours is not None:
        preset = with_job(preset, hours=args.hours)
    profile = load_profile(args.profile or preset.profile)
    names = [n.strip() for n in args.strategies.split(",")] if args.strategies else None
    policy = str(Path(args.policy).resolve()) if args.policy else None
    return preset, profile, pick(names, policy)


def _simulate(args: argparse.Namespace) -> int:
    from goodput.tools.simulate.render import print_result
    from goodput.tools.simulate.run import simulate

    preset, profile, strategies = _inputs(args)
    err = Console(stderr=True)
    with err.status("simulating") as status:
        result = simulate(
            preset,
            profile,
            strategies,
            seed=args.seed,
            progress=lambda name: status.update(f"simulating {name}"),
        )
    if args.html:
        from goodput.tools.simulate.html import write_html

        result["html"] = str(write_html(result, args.html))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result)
        if args.html:
            print(f"HTML: {result['html']}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from goodput.tools.simulate.sweep import plot, recommendation, sweep

    preset, profile, strategies = _inputs(args)
    try:
        values = [float(v) for v in args.values.split(",")]
    except ValueError:
        print(f"goodput simulate sweep: --values {args.values!r} is not a list of numbers")
        return 2
    err = Console(stderr=True)
    with err.status("sweeping") as status:
        result = sweep(
            preset,
            profile,
            args.axis,
            values,
            strategies,
            seed=args.seed,
            progress=lambda what: status.update(f"sweeping: {what}"),
        )
    if args.axis == "spares":
        result["recommendation"] = recommendation(result, preset.job.step_time_s, preset.job.hours)
    if args.out:
        result["plot"] = str(plot(result, Path(args.out) / f"goodput-vs-{args.axis}.png"))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    console = Console()
    for point in result["points"]:
        console.print(
            f"{args.axis}={point['value']:g}  {point['strategy']:<18} {point['goodput_pct']:.2f} %"
        )
    if "recommendation" in result:
        console.print(result["recommendation"])
    if "plot" in result:
        console.print(f"plot: {result['plot']}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from goodput.tools.simulate.replay import replay_file

    result = replay_file(args.run)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    console = Console()
    for setup in ("goodput", "baseline"):
        if setup in result:
            r = result[setup]
            console.print(
                f"{setup}: predicted {r['predicted']:.1f} %, measured {r['actual']:.1f} % "
                f"(error {r['error']:.1f} points)"
            )
    return 0


def _predict(args: argparse.Namespace) -> int:
    from goodput.tools.simulate.predict import predict_file
    from goodput.tools.simulate.profile import load_profile
    from goodput.tools.simulate.render import print_prediction

    result = predict_file(
        args.run,
        load_profile(args.profile),
        args.checkpoint_gb,
        follow_load=not args.at_profile_pace,
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_prediction(result)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from goodput.tools.simulate.calibrate import calibrate

    text = calibrate(args.from_bench, args.name)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default="case-study",
        help="a shipped preset (case-study, llama3-16k) or a preset TOML file",
    )
    parser.add_argument(
        "--profile",
        help="cost profile: a shipped name (large-gpu, local-bench) or a TOML file (default: the preset's)",
    )
    parser.add_argument(
        "--strategies",
        help="comma-separated: baseline, +async, +multi-tier, +hot-swap, +scale-down/up, "
        "+interval-tuning, goodput (default: all)",
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="a policy script for the goodput strategy (default: built-in)",
    )
    parser.add_argument("--seed", type=int, default=1, help="failure trace seed (default 1)")
    parser.add_argument("--hours", type=float, help="override the preset's job length")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate a fleet: goodput per strategy, decided by goodput's real sensor and policy",
        description=(
            "A discrete-event SIMULATION of one training job on a fleet: seeded failures, "
            "priced by a cost profile, decided by goodput's real Detector, controller engine "
            "and policy. Compares strategies (baseline ... goodput) on one failure trace. "
            "Subcommand `sweep` varies spares, interval or cluster size."
        ),
    )
    _common(parser)
    parser.add_argument(
        "--html", metavar="DIR", help="also write simulation.html, goodput.png, result.json"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    swept = actions.add_parser(
        "sweep", help="what-if: goodput vs spares, checkpoint interval or cluster size"
    )
    swept.add_argument("axis", choices=["spares", "interval", "size"])
    swept.add_argument(
        "--values", required=True, help="comma-separated values (spares; minutes; GPUs)"
    )
    swept.add_argument("--out", metavar="DIR", help="write goodput-vs-<axis>.png here")
    _common(swept)
    replayed = actions.add_parser(
        "replay",
        help="predict a real `goodput demo --json` run's goodput from its faults and measured "
        "costs, and compare with what it measured",
    )
    replayed.add_argument("run", metavar="RUN.json", help="what `goodput demo --json` printed")
    replayed.add_argument("--json", action="store_true", help="machine-readable output")
    predicted = actions.add_parser(
        "predict",
        help="predict a real `goodput demo --json` run's goodput from its shape, step time, "
        "checkpoint size and fault schedule alone, priced by a cost profile (none of its "
        "measured remediation costs), and compare with what it measured",
    )
    predicted.add_argument("run", metavar="RUN.json", help="what `goodput demo --json` printed")
    predicted.add_argument(
        "--profile",
        default="local-bench",
        help="cost profile: a shipped name or a TOML file, e.g. from `goodput simulate "
        "calibrate` on the machine the run ran on (default: local-bench)",
    )
    predicted.add_argument(
        "--checkpoint-gb",
        type=float,
        metavar="GB",
        help="the checkpoint state per rank (default: the size the run's checkpoints reported)",
    )
    predicted.add_argument(
        "--at-profile-pace",
        action="store_true",
        help="price the run at the load the profile was measured at (default: where the "
        "profile records its pace, a run whose median step was slower met more load, and the "
        "costs this machine's CPUs pay are priced that many times dearer)",
    )
    predicted.add_argument("--json", action="store_true", help="machine-readable output")
    calibrated = actions.add_parser(
        "calibrate",
        help="write a cost profile from this machine's `goodput bench ckpt|restore|recovery "
        "--json` results",
    )
    calibrated.add_argument(
        "--from-bench",
        required=True,
        nargs="+",
        metavar="DIR",
        help="directory with ckpt.json, restore.json, recovery.json; several (the benches "
        "repeated: the machine is noisy) give each field their median",
    )
    calibrated.add_argument("--name", default="local-bench", help="the profile's name")
    calibrated.add_argument("--out", metavar="FILE", help="write here (default: stdout)")
    parser.set_defaults(func=run, action=None)
