"""`goodput run`: launch a training script under supervision.

On the local backend it starts the stack on this machine if needed. With ``--backend
kubernetes`` it starts nothing: it sends the StartJob through the cluster's bus (``--nats-url``
with credentials, e.g. through ``kubectl port-forward``) to the in-cluster actuator, which
runs every rank as a pod of ``--image``, and follows the run as the local path does. With
``--backend agent`` it starts nothing either: the StartJob goes to the actuator of a stack
running ``backend = "agent"`` (``--nats-url``, else the stack of ``--state-dir``), whose node
agents (``goodput agent``, one per host) run the ranks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import msgspec
from rich.console import Console

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, BusSettingsError, BusUnavailableError
from goodput.config import add_bus_arguments, bus_settings_from_args, count_at_least
from goodput.launch import capacity
from goodput.launch.exit_reason import last_line
from goodput.launch.rank_env import knobs
from goodput.launch.rank_logs import rank_log
from goodput.tools.cli.stack import add_stack_arguments
from goodput.tools.stack.launcher import (
    ServiceExited,
    add_embedded_nats_arguments,
    add_service_set_argument,
    check_policy_options,
    resolve_url,
    service_flags_from_args,
    wait_healthy,
)
from goodput.tools.stack.runs import find_clash, missing_actuator
from goodput.tools.stack.session import StackSession
from goodput.tools.stack.watch import JobWatcher, run_exit_code, summary


async def supervise(
    settings: BusSettings,
    start: schemas.StartJob,
    *,
    total_steps: int,
    timeout_s: float,
    console: Console | None,
    remote: bool = False,
) -> JobWatcher:
    """Send the start command and follow the new run until it ends (or ``timeout_s`` passes);
    refused (``watcher.state``) if a run of the job is going, or, ``remote``, if no actuator
    of the job is there to take it."""
    bus = await Bus.connect(settings, name="goodput-run")
    watcher = await JobWatcher(bus, start.job, total_steps, console, run_start=start).start()
    try:
        clash = (await missing_actuator(bus, start.job) if remote else None) or await find_clash(
            bus, start.job
        )
        if clash is not None:
            watcher.state, watcher.refusal = "refused", clash
            return watcher
        await bus.send_command(subjects.ACTUATOR, start)
        ended = await watcher.wait(timeout_s)
        if watcher.state == "launch failed":  # the same on every try: no restart helps
            reason = f"goodput run: launch failed: {watcher.refusal}"
            await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=start.job, reason=reason))
        elif not ended:
            await bus.send_command(
                subjects.ACTUATOR, schemas.Stop(job=start.job, reason="goodput run timed out")
            )
            await watcher.wait(90)
    except asyncio.CancelledError:
        await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=start.job, reason="interrupted"))
        raise
    finally:
        await watcher.stop()
        await bus.close()
    return watcher


def cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("goodput run: give the training command after --", file=sys.stderr)
        return 2
    problems = shape_problems(args)
    if problems:
        print(f"goodput run: {'; '.join(problems)}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    if args.backend == "kubernetes":
        return run_in_cluster(args, argv, console)
    if args.backend == "agent":
        return run_on_agents(args, argv, console)
    if args.image or args.gpus_per_rank is not None or args.workdir:
        print("goodput run: --image, --gpus-per-rank and --workdir need --backend kubernetes",
              file=sys.stderr)  # fmt: skip
        return 2
    if argv[0] in ("python", "python3"):
        # the interpreter goodput runs in has goodput (and torch) installed
        argv[0] = sys.executable
    session = StackSession(args.state_dir)
    service_flags = service_flags_from_args(args.service_set)
    check_policy_options(service_flags)
    stack, settings = session.start(
        args, args.job, args.nodes + args.spares, console, service_flags
    )
    try:
        try:
            asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
        except ServiceExited as exc:
            session.undo()
            print(f"goodput run: {exc.code}", file=sys.stderr)
            return 1
        start = start_command(args, stack.job, argv, workdir=os.getcwd())
        watcher = follow(args, settings, start, console, remote=False)
    finally:
        if session.before is None and not args.keep_stack:
            session.stop()
    return report(args, watcher, console)


def shape_problems(args: argparse.Namespace) -> list[str]:
    """Why the job's shape is refused before anything starts: past the documented maxima on
    any backend; on the local one, past what this machine can run (ranks and the stack's
    per-node services)."""
    shape = {
        "nodes": args.nodes,
        "procs_per_node": args.procs_per_node,
        "spares": args.spares,
        "standbys": args.standbys,
    }
    if args.backend != "local":
        return capacity.job_problems(**shape)
    host = capacity.read_host_facts()
    return capacity.local_job_problems(**shape, host=host) or capacity.local_stack_problems(
        nodes=args.nodes + args.spares, host=host
    )


def start_command(
    args: argparse.Namespace, job: str, argv: list[str], *, workdir: str
) -> schemas.StartJob:
    env = dict(args.env)
    if args.ckpt_every is not None:
        env.update(knobs(ckpt_every=args.ckpt_every))
    return schemas.StartJob(
        job=job,
        argv=argv,
        nodes=args.nodes,
        procs_per_node=args.procs_per_node,
        spares=args.spares,
        num_nodes_per_dp=args.nodes_per_dp,
        env=env,
        workdir=workdir,
        image=args.image or "",
        gpus_per_rank=args.gpus_per_rank,
        standbys=args.standbys,
    )


def follow(
    args: argparse.Namespace,
    settings: BusSettings,
    start: schemas.StartJob,
    console: Console,
    *,
    remote: bool,
) -> JobWatcher:
    """Send the job and follow it to its end (or ``--timeout``), with progress unless --json."""
    return asyncio.run(
        supervise(
            settings,
            start,
            total_steps=args.steps or 0,
            timeout_s=args.timeout,
            console=None if args.json else console,
            remote=remote,
        )
    )


def run_in_cluster(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    """Send the job to the actuator of a remote stack through its bus and follow it."""
    url = args.nats_url or os.environ.get("GOODPUT_NATS_URL")
    if not url:
        print("goodput run: --backend kubernetes needs the cluster's bus: --nats-url with "
              "--nats-creds and --nats-tls-ca (deploy/k8s/README.md)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        settings = bus_settings_from_args(args)
        settings.check_security()
    except BusSettingsError as exc:
        print(f"goodput run: {exc}", file=sys.stderr)
        return 2
    start = start_command(args, args.job, argv, workdir=args.workdir or "")
    return _send_and_follow(args, settings, start, console, f"the actuator on {url}")


def run_on_agents(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    """Send the job to an agent-backend actuator (its bus: ``--nats-url`` or the stack of
    ``--state-dir``) and follow it; the agents' hosts run the ranks, in ``--workdir`` (default:
    this directory, which a shared filesystem gives every host)."""
    if args.image or args.gpus_per_rank is not None:
        print("goodput run: --image and --gpus-per-rank need --backend kubernetes",
              file=sys.stderr)  # fmt: skip
        return 2
    url, _ = resolve_url(args, Path(args.state_dir).resolve())
    if not url:
        print("goodput run: --backend agent needs the stack's bus: --nats-url, or a stack "
              "started here by `goodput up --service-set actuator:backend=agent`",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        settings = msgspec.structs.replace(bus_settings_from_args(args), url=url)
        settings.check_security()
    except BusSettingsError as exc:
        print(f"goodput run: {exc}", file=sys.stderr)
        return 2
    start = start_command(args, args.job, argv, workdir=args.workdir or os.getcwd())
    return _send_and_follow(args, settings, start, console, f"the agents' actuator on {url}")


def _send_and_follow(
    args: argparse.Namespace,
    settings: BusSettings,
    start: schemas.StartJob,
    console: Console,
    actuator: str,
) -> int:
    """Send ``start`` to a remote stack's actuator and follow the job to its end."""
    console.print(f"sending job {start.job} to {actuator}")
    try:
        watcher = follow(args, settings, start, console, remote=True)
    except BusUnavailableError as exc:
        print(f"goodput run: {exc}", file=sys.stderr)
        return 1
    return report(args, watcher, console)


def report(args: argparse.Namespace, watcher: JobWatcher, console: Console) -> int:
    """The run's outcome on stdout (one line, or JSON); its exit status, one of
    ``goodput.launch.exit_reason.RUN_EXIT_CODES``: 0 only when it finished, 75 when goodput
    cannot continue on the nodes it has."""
    if watcher.state == "refused":
        print(f"goodput run: {watcher.refusal}", file=sys.stderr)
        return 1
    result = summary(watcher)
    if watcher.state == "launch failed":
        output = rank_output(args, watcher)
        line = f"launch failed: {watcher.refusal}" + (f"; rank 0 said: {output}" if output else "")
        print(f"goodput run: {line}", file=sys.stderr)
        if args.json:  # a machine reading stdout gets the outcome too, with the same reason
            print(json.dumps({**result, "refusal": line}, indent=2))
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(
            f"job {result['state']}: {result['steps']} steps, {result['restarts']} restart(s), "
            f"world sizes {result['world_size_history']}"
        )
    return run_exit_code(watcher.state, watcher.decisions)


def rank_output(args: argparse.Namespace, watcher: JobWatcher) -> str:
    """The last line rank 0 of the failed first attempt wrote (local backend: its log)."""
    exit_ = next((e for e in watcher.launch_exits if e.rank == 0), None)
    if args.backend != "local" or exit_ is None:
        return ""
    # a rank restarted in process exits under the new attempt, still writing its first log
    attempts = dict.fromkeys((exit_.attempt, *range(exit_.attempt - 1, 0, -1)))
    logs = (rank_log(args.state_dir, attempt, exit_.node, 0) for attempt in attempts)
    return next((line for line in map(last_line, logs) if line), "")


def environment_item(text: str) -> tuple[str, str]:
    """argparse type of ``--env KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="launch a training script under supervision (local or Kubernetes)",
        description=(
            "Start the stack if needed, launch N local nodes of P rank processes each (torchrun "
            "environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT), keep S spare nodes, and remediate "
            "failures by policy until the job finishes. A command starting with python or python3 "
            "runs in goodput's own interpreter. Example: goodput run --nodes 2 "
            "--procs-per-node 1 --spares 1 -- python -m goodput.examples.gpt.supervised --steps 200. "
            "With --backend kubernetes nothing starts here: the job goes through the cluster's "
            "bus to its actuator, which runs P rank pods of --image on each of N GPU nodes "
            "(--nodes = num_dp_replicas x --nodes-per-dp). Example: goodput run --backend "
            "kubernetes --job train --image REGISTRY/goodput-rank:0.1.0 --gpus-per-rank 1 "
            "--procs-per-node 8 --nodes 4 --spares 1 --nats-url tls://localhost:4222 "
            "--nats-creds goodput.creds --nats-tls-ca ca.crt -- python -m "
            "goodput.examples.gpt.supervised"
        ),
    )
    parser.add_argument(
        "--backend",
        choices=("local", "agent", "kubernetes"),
        default="local",
        help="local: ranks are processes here; agent: send the job to a stack whose actuator "
        "runs backend=agent (--nats-url or --state-dir), its node agents run the ranks; "
        "kubernetes: send the job to the cluster's actuator through --nats-url (default local)",
    )
    parser.add_argument("--image", help="kubernetes: the image every rank pod runs")
    parser.add_argument(
        "--gpus-per-rank",
        type=count_at_least(0),
        help="kubernetes: GPUs each rank pod requests (default: the actuator's gpus_per_rank)",
    )
    parser.add_argument(
        "--workdir",
        help="kubernetes: the rank containers' working directory (default: image's); agent: "
        "the ranks' working directory on their hosts (default: this one)",
    )
    parser.add_argument(
        "--nodes", type=count_at_least(1), default=2, help="active nodes (default 2)"
    )
    parser.add_argument(
        "--procs-per-node", type=count_at_least(1), default=1, help="ranks per node (default 1)"
    )
    parser.add_argument(
        "--spares", type=count_at_least(0), default=1, help="spare nodes (default 1)"
    )
    parser.add_argument(
        "--standbys",
        type=count_at_least(0),
        default=0,
        help="pre-warmed standby ranks per node, spares included (default 0; local and agent "
        "backends; Kubernetes: the spares only): "
        "each builds the job's state ahead of time and takes a lost rank's place. The script "
        "must run its job through goodput.shim.run_job",
    )
    parser.add_argument(
        "--nodes-per-dp",
        type=count_at_least(1),
        default=1,
        help="nodes per data-parallel replica",
    )
    parser.add_argument("--ckpt-every", type=count_at_least(1), help="checkpoint interval in steps")
    parser.add_argument("--steps", type=int, help="expected steps, for the progress bar")
    parser.add_argument(
        "--env",
        action="append",
        type=environment_item,
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the ranks",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="stop the job after this many seconds"
    )
    add_stack_arguments(parser)
    parser.add_argument(
        "--keep-stack", action="store_true", help="leave the stack running afterwards"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    add_service_set_argument(parser)
    add_embedded_nats_arguments(parser)
    add_bus_arguments(parser)
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- the training command")
    parser.set_defaults(func=cmd_run)
