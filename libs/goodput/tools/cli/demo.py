"""`goodput demo`: the whole system on embedded defaults, driven through a fault scenario.

It starts the embedded NATS server and every service, runs the example GPT job on local nodes
(with spares where the scenario wants them), injects the scenario's faults as training
progresses, and ends with what happened (steps, world sizes, restarts, the decisions taken,
the hash of the final parameters) and the goodput report.

--compare-baseline runs the same scenario a second time the way a job without goodput runs:
synchronous torch.save checkpoints, the whole job restarted on any fault, no spares.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput.config import add_bus_arguments, count_at_least, job_name
from goodput.launch import capacity
from goodput.measure.accounting import GoodputReport
from goodput.measure.accounting.html import write_html_report
from goodput.measure.accounting.table import render as render_report
from goodput.shim.rescale import BUILTIN_RULES
from goodput.tools.demo.scenarios import SCENARIOS
from goodput.tools.demo.session import (
    DEMO_PROCS_PER_NODE,
    DEMO_STANDBYS,
    RunOutcome,
    RunPlan,
    Setup,
    run_once,
)

DEFAULT_STEPS = {"full": 800}


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    scenario = SCENARIOS[args.scenario]
    if args.compare_baseline and not scenario.comparable:
        console.print(
            f"[red]scenario {args.scenario} takes a node away for good: a job without spares "
            "could never finish it. Compare with a scenario whose nodes come back (full, "
            "scale-down-up, none)."
        )
        return 2
    problems = capacity.local_job_problems(
        nodes=args.nodes,
        procs_per_node=DEMO_PROCS_PER_NODE,
        spares=_spares("goodput", args.spares, scenario.spares),
        standbys=DEMO_STANDBYS,
        host=capacity.read_host_facts(),
    )
    if problems:
        print(f"goodput demo: {'; '.join(problems)}", file=sys.stderr)
        return 2
    steps = args.steps or DEFAULT_STEPS.get(args.scenario, 200)
    setups: list[Setup] = ["goodput", "baseline"] if args.compare_baseline else ["goodput"]
    started = time.monotonic()
    outcomes: dict[str, RunOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="goodput-demo-") as tmp:
        root = Path(args.state_dir or tmp).resolve()
        for setup in setups:
            plan = RunPlan(
                setup=setup,
                scenario_name=args.scenario,
                scenario=scenario,
                steps=steps,
                nodes=args.nodes,
                spares=_spares(setup, args.spares, scenario.spares),
                ckpt_every=args.ckpt_every,
                timeout_s=args.timeout,
                # its own job name: on a shared bus (--nats-url) the two runs' events stay apart
                job=args.job if setup == "goodput" else f"{args.job}-baseline",
                rescale=args.rescale,
            )
            state_dir = root if len(setups) == 1 else root / setup
            outcomes[setup] = run_once(args, plan, state_dir, console)
    results = {setup: outcome.summary for setup, outcome in outcomes.items()}
    reports = {setup: outcome.report for setup, outcome in outcomes.items()}
    for name, report in reports.items():
        if report is not None and args.html:
            where = Path(args.html) if name == "goodput" else Path(args.html) / name
            results[name]["html_report"] = str(write_html_report(report, where))
    result = _combine(results, steps, time.monotonic() - started)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(results, reports, result, console)
    unfired = [f"{setup}: {f['fault']} ({f['what']})" for setup, r in results.items()
               for f in r["faults"] if not f["ok"]]  # fmt: skip
    for line in unfired:  # the scenario was not played as written: never a silent success
        print(f"goodput demo: fault failed: {line}", file=sys.stderr)
    ok = all(r["state"] == "finished" and r["steps"] == steps for r in results.values())
    return 0 if ok and not unfired else 1


def _spares(setup: Setup, asked: int | None, scenario_default: int) -> int:
    """The baseline has none; goodput's run has what was asked for, else the scenario's."""
    if setup == "baseline":
        return 0
    return scenario_default if asked is None else asked


def _combine(results: dict[str, dict], steps: int, took: float) -> dict:
    """The goodput run's fields at the top level; the baseline's beside them, prefixed."""
    product = results["goodput"]
    combined = {key: value for key, value in product.items() if key != "setup"}
    baseline = results.get("baseline")
    if baseline is not None:
        combined |= {
            "baseline_goodput_pct": baseline["goodput_pct"],
            "baseline_badput": baseline["badput"],
            "baseline_ettr": baseline["ettr"],
            "baseline": {k: v for k, v in baseline.items() if k != "setup"},
        }
        if product["goodput_pct"] is not None and baseline["goodput_pct"] is not None:
            combined["goodput_gain_points"] = round(
                product["goodput_pct"] - baseline["goodput_pct"], 2
            )
    combined["total_steps"] = steps
    combined["total_elapsed_s"] = round(took, 2)
    return combined


def _print(
    results: dict[str, dict],
    reports: dict[str, GoodputReport | None],
    result: dict,
    console: Console,
) -> None:
    for setup, run_result in results.items():
        table = Table(title=f"goodput demo — {setup} — scenario {run_result['scenario']}")
        table.add_column("what")
        table.add_column("value")
        for key in (
            "state",
            "steps",
            "restarts",
            "world_size_history",
            "final_loss",
            "final_params_sha256",
            "elapsed_s",
        ):
            table.add_row(key, str(run_result[key]))
        Console().print(table)
        intervals = [d for d in run_result["decisions"] if d["rule"] == "checkpoint-interval"]
        for decision in run_result["decisions"]:
            if decision["rule"] != "checkpoint-interval":
                Console().print(f"decision [magenta]{decision['rule']}[/]: {decision['reason']}")
        if intervals:
            Console().print(
                f"checkpoint interval retuned {len(intervals)} time(s), last: "
                f"{intervals[-1]['reason']}"
            )
        report = reports.get(setup)
        if report is not None:
            Console().print(render_report(report))
        if "html_report" in run_result:
            console.print(f"HTML report ({setup}): {run_result['html_report']}", soft_wrap=True)
    if "baseline_goodput_pct" in result:
        Console().print(
            f"[bold]goodput {result['goodput_pct']:.1f} %[/] with goodput's remediation and "
            f"checkpoints vs [bold]{result['baseline_goodput_pct']:.1f} %[/] for the baseline "
            f"(+{result.get('goodput_gain_points', 0):.1f} points)"
        )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job: the whole system on embedded defaults, with a fault scenario",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="full",
        help="faults to inject (default: full); "
        + "; ".join(f"{k}: {v.description}" for k, v in SCENARIOS.items()),
    )
    parser.add_argument("--steps", type=int, help="training steps (default 800 for full, else 200)")
    parser.add_argument(
        "--nodes", type=count_at_least(1), default=2, help="active local nodes (default 2)"
    )
    parser.add_argument(
        "--spares", type=count_at_least(0), help="spare nodes (default: what the scenario needs)"
    )
    parser.add_argument(
        "--ckpt-every", type=int, default=20, help="initial checkpoint interval in steps"
    )
    parser.add_argument(
        "--rescale",
        choices=sorted(BUILTIN_RULES),
        default="keep-global-batch",
        help="what the example job changes when it resumes at another data-parallel size "
        "(scale-down-up): keep the global batch with more gradient accumulation "
        "(keep-global-batch, default) or keep the per-rank batch and scale the LR (linear-lr, "
        "sqrt-lr); the resulting batch and LR are in the job's events and `goodput status`",
    )
    parser.add_argument(
        "--compare-baseline",
        action="store_true",
        help="run the scenario again as a job without goodput (synchronous torch.save, whole "
        "job restarted on any fault, no spares) and report both goodputs",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="give up on a run after this many seconds"
    )
    parser.add_argument("--state-dir", help="keep the demo's state here (default: a temp dir)")
    parser.add_argument("--job", type=job_name, default="demo", help="job name (default: demo)")
    parser.add_argument(
        "--html",
        default="goodput-demo-report",
        help="directory for the HTML goodput report with its plots ('' for none; default "
        "./goodput-demo-report; the baseline's goes to its baseline/ subdirectory)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_bus_arguments(parser)
    parser.set_defaults(func=run)
