"""`goodput bench recovery`: from a rank's death to the first step after resume, broken down.

The example job runs under the real stack on local nodes; the benchmark kills one rank with
SIGKILL (a crash), reads the job's events and splits the time until training made its next
step into: detect (death → signal), decide (signal → decision), restart (decision → ranks
running and starting to load), load (checkpoint restore) and first step (load → first step
done). It repeats that ``--trials`` times in one job and reports the median of each part.

Each trial starts from a steady job: running again after the previous trial's restart, with a
checkpoint persisted by every rank since its resume; only events stamped after those moments
count, so no trial acts on an earlier one's events. Each trial also reports the step killed
at, the newest step every rank had persisted by then and the step restored (they should be
equal: a lower restore is lost work). Starting a rank (Python, torch, rendezvous) dominates
and grows with the machine's load, so the run also reports the load average around it and a
same-run reference: the time two bare processes take to import torch and the job.

``--mode warm`` (the default) runs this twice, each on a stack of its own: with the built-in
policy and a pre-warmed standby rank per node, whose crash remedy is an in-process restart
(the survivor stays in its process and restores from host memory; the killed rank is
replaced by its node's standby, which imported torch and built the job ahead of time), then
cold: in-process restart and standbys off (``policies/cold_restart.py``, no standby: every
rank started again), and reports both (``warm``, ``cold``) and their ratio. Each warm kill
waits until the victim's node has a ready standby, and reports what a standby and a rank
hold in memory (RSS). The warm job also gets one hang (its training loop blocked,
heartbeats on) recovered in process. ``--mode cold`` measures the cold path alone.

``--procs-per-node`` runs that many ranks on each of the two nodes; they split each
checkpoint into slices (one per rank). Every trial reports where each rank's restore read
from (``restore_tiers``) and which ranks survived in process (``survivors``): a warm trial
should show every survivor on tier "host" (``survivors_from_host``), and with the node's
buffers shared through ``/dev/shm`` every rank, the victim's replacement included, reading
its node-mates' slices (and the victim's, whose segment outlives it) from memory
(``every_rank_from_host``).

Each mode's job ends with a ``Stop`` (its ranks save, persist and exit), and the mode also
reports what the job's own events say of it, as a demo run's costs are read: its step time,
its saves' stall, persist and size, and its shutdown (last step → ranks exited). They are
what ``goodput simulate calibrate`` prices a save's fixed parts and a job's end with. Before
its first trial the job steps undisturbed for a few seconds (``pace_step_s``, its median
step then: the machine's pace, which the profile records it was measured at).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import JobEvents
from goodput.config import add_bus_arguments, count_at_least
from goodput.examples.gpt import supervised_argv
from goodput.launch.rank_env import knobs
from goodput.policy import REPEAT_FAILURES
from goodput.schemas.tiers import HOST
from goodput.supervisor.policy.scripts import cold_restart
from goodput.tools.bench.job_waits import (
    PACE_S,
    WAIT_S,
    held_after,
    newest_held_by_all,
    newest_status,
    pace_step_s,
    restores_after,
    survivors_after,
)
from goodput.tools.simulate.measure import measured_costs
from goodput.tools.stack.launcher import wait_healthy
from goodput.tools.stack.session import StackSession

NS = 1e9
PARTS = ("detect_s", "decide_s", "restart_s", "load_s", "first_step_s")
#: restart_s split: decision → new group spawned (stop the old one, fill volumes, spawn), and
#: spawned → loading (Python start, imports, rendezvous: what a loaded machine slows most)
RESTART_PARTS = ("relaunch_s", "startup_s")
#: the job's active nodes (it has one spare beside them); each trial strikes the next in turn
NODES = 2
#: the job's own figures reported beside the trials (:func:`steady_costs`)
STEADY = (
    "step_time_s",
    "checkpoint_stall_s",
    "checkpoint_persist_s",
    "checkpoint_gb",
    "shutdown_s",
)


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process (MiB; None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0
    )
    return round(kib / 1024, 1)


async def _trial(
    bus: Bus,
    log: JobEvents,
    restarted_ts: int,
    resumed_ts: int,
    fault: str = "kill",
    standbys: bool = False,
    turn: int = 0,
) -> dict:
    """Kill a rank (``fault="kill"``) or hang its loop (``"hang"``: heartbeats go on) once the
    job is steady again: running after ``restarted_ts`` (the previous trial's decision) and a
    checkpoint persisted by every rank after ``resumed_ts`` (its first step). Only events
    stamped after those count: a trial never acts on an earlier one's. The ``turn``-th trial
    strikes the ``turn``-th active node, round robin: a third failure of one node would be
    judged a repeat offender and replaced, which is not the recovery measured here."""
    status = await log.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "running",
        WAIT_S,
        "the job running",
        after_ts=restarted_ts,
    )
    assert isinstance(status, schemas.JobStatus)
    await held_after(log, status.world_size, max(resumed_ts, status.ts))
    latest = newest_status(log)
    victim_node = latest.active_nodes[turn % len(latest.active_nodes)]
    # with several ranks per node, successive trials kill different local ranks
    victim_index = turn % len(latest.pids[victim_node])
    if standbys:
        await log.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and bool(e.standbys.get(victim_node)),
            WAIT_S,
            f"a ready standby on {victim_node}",
            after_ts=latest.ts,
        )
        latest = newest_status(log)
    memory = {
        "rank_rss_mib": rss_mib(latest.pids[victim_node][victim_index]),
        "standby_rss_mib": rss_mib(latest.standbys[victim_node][0]) if standbys else None,
    }
    killed_ts = schemas.now_ns()
    if fault == "hang":
        hang = schemas.InjectFault(
            job=log.job, node=victim_node, fault="hang", reason="goodput bench recovery"
        )
        await bus.send_command(subjects.TRAINER, hang)
    else:
        os.kill(latest.pids[victim_node][victim_index], signal.SIGKILL)
    sig = await log.wait_for(
        lambda e: isinstance(e, schemas.Signal) and e.node == victim_node,
        WAIT_S,
        f"the {fault} signal",
        after_ts=killed_ts,
    )
    assert isinstance(sig, schemas.Signal)
    decision = await log.wait_for(
        lambda e: isinstance(e, schemas.Decision) and e.signal_id == sig.signal_id,
        WAIT_S,
        "the decision",
        after_ts=killed_ts,
    )
    assert isinstance(decision, schemas.Decision)
    relaunched = await log.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "running",
        WAIT_S,
        "relaunch of the group",
        after_ts=decision.ts,
    )
    restored = await log.wait_for(
        lambda e: isinstance(e, schemas.CheckpointRestored) and e.rank == 0,
        WAIT_S,
        "the restore after the restart",
        after_ts=decision.ts,
    )
    assert isinstance(restored, schemas.CheckpointRestored)
    first = await log.wait_for(
        lambda e: isinstance(e, schemas.StepDone) and e.rank == 0 and e.step == restored.step + 1,
        WAIT_S,
        "the first step after resume",
        after_ts=restored.ts,
    )
    tiers = await restores_after(log, status.world_size, decision.ts)
    survivors = survivors_after(log.events[:], decision.ts)
    held = newest_held_by_all(log.events[:], status.world_size, killed_ts)
    load_started = restored.ts - int(restored.duration_s * NS)
    replaced_by = [
        e.pid
        for e in log.events[:]
        if isinstance(e, schemas.RankStarted) and e.ts > decision.ts and e.node == victim_node
    ]
    return {
        "victim": victim_node,
        "replaced_by_standby": bool(standbys and replaced_by)
        and replaced_by[0] in latest.standbys.get(victim_node, []),
        **memory,
        "signal": sig.signal,
        "killed_at_step": max(
            (
                e.step
                for e in log.events[:]
                if isinstance(e, schemas.StepDone) and e.ts <= killed_ts
            ),
            default=0,
        ),
        "newest_persisted_step": held,
        "restored_step": restored.step,
        "restore_tiers": tiers,
        "survivors": survivors,
        "survivors_from_host": bool(survivors) and all(tiers[r] == HOST for r in survivors),
        "every_rank_from_host": bool(tiers) and all(tier == HOST for tier in tiers.values()),
        "detect_s": (sig.ts - killed_ts) / NS,
        "decide_s": (decision.ts - sig.ts) / NS,
        "restart_s": max(load_started - decision.ts, 0) / NS,
        "relaunch_s": (relaunched.ts - decision.ts) / NS,
        "startup_s": max(load_started - relaunched.ts, 0) / NS,
        "load_s": restored.duration_s,
        "first_step_s": (first.ts - restored.ts) / NS,
        "total_s": (first.ts - killed_ts) / NS,
        "rule": decision.rule,
        "fault": fault,
        "decision_ts": decision.ts,
        "resumed_ts": first.ts,
    }


async def _measure(
    settings,
    job: str,
    trials: int,
    steps: int,
    console: Console,
    warm: bool,
    procs_per_node: int = 1,
) -> tuple[list[dict], dict]:
    batch = shared_global_batch(NODES * procs_per_node)
    bus = await Bus.connect(settings, name="goodput-bench-recovery")
    log = await JobEvents(bus, job).start()
    results = []
    try:
        start = schemas.StartJob(
            job=job,
            argv=supervised_argv(steps, "--global-batch", str(batch)),
            nodes=NODES,
            procs_per_node=procs_per_node,
            spares=1,
            env=knobs(ckpt_every=10, enable_fault_injection=warm),
            standbys=1 if warm else 0,
        )
        restarted_ts = resumed_ts = schemas.now_ns()
        await bus.send_command(subjects.ACTUATOR, start)
        with console.status(f"the job's pace: {PACE_S:g} s of steps, nothing else happening…"):
            pace = await pace_step_s(log, standbys=warm)
        faults = ["kill"] * trials + (["hang"] if warm else [])
        for trial, fault in enumerate(faults):
            with console.status(
                f"trial {trial + 1}/{len(faults)}: waiting for a checkpoint on every rank, "
                f"then {fault}…"
            ):
                result = await _trial(
                    bus,
                    log,
                    restarted_ts,
                    resumed_ts,
                    fault,
                    standbys=warm and fault == "kill",
                    turn=trial,
                )
            restarted_ts, resumed_ts = result.pop("decision_ts"), result.pop("resumed_ts")
            console.print(
                f"trial {trial + 1} ({fault}): {result['total_s']:.2f} s ({result['rule']}), step "
                f"{result['killed_at_step']} killed, {result['restored_step']} restored "
                f"(newest on every rank: {result['newest_persisted_step']}); restored from "
                f"{result['restore_tiers']}, survivors {result['survivors']}"
            )
            results.append(result)
        stopping_ts = schemas.now_ns()
        await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=job, reason="benchmark done"))
        with console.status("stopping the job: its ranks save, persist and exit…"):
            await log.wait_for(
                lambda e: isinstance(e, schemas.JobStatus) and e.state == "stopped",
                WAIT_S,
                "the job stopped",
                after_ts=stopping_ts,
            )
        steady = steady_costs(log.events[:]) | {"pace_step_s": pace}
    finally:
        await bus.close()
    return results, steady


def shared_global_batch(world: int) -> int:
    """The example job's global batch, rounded up to a multiple of ``world``: its 12
    micro-batches cannot be shared by 8 ranks (``--procs-per-node 4``), 16 can."""
    from goodput.examples.gpt.training import TrainConfig  # imports torch: only when run

    default = TrainConfig().plan.global_batch
    return -(-default // world) * world


def steady_costs(events: list[schemas.Event]) -> dict:
    """What the job's own events say of its steady state and its end, as ``goodput demo``
    measures a run (:func:`measured_costs`, one owner): its healthy step time, each save's
    stall (the shim's save of the example job's state, walking its tensors included), persist
    and size, and the shutdown, from its last step to its ranks exited (the stop's final save,
    its persist and the exit: what a job that reaches its last step also pays)."""
    costs = measured_costs(events)
    return {key: costs[key] for key in STEADY}


def bare_start_s() -> float:
    """The same-load reference for ``startup_s``: two processes started together (as the
    ranks are) that only import torch and the example job, then exit. What the machine's
    load does to starting a rank shows here as much as in the trials."""
    code = "import torch, goodput.examples.gpt.supervised"
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    if any(p.wait() for p in processes):
        raise RuntimeError("a bare rank process failed to import torch and the example")
    return time.perf_counter() - started


def _summary(trials: list[dict]) -> dict:
    """Medians of the kill trials by part; the hang trial, if any, as it was."""
    kills = [t for t in trials if t["fault"] == "kill"]
    summary = {
        "trials": kills,
        "standby_rss_mib": max((t["standby_rss_mib"] or 0 for t in kills), default=0) or None,
        "rank_rss_mib": max((t["rank_rss_mib"] or 0 for t in kills), default=0) or None,
        "total_s": round(statistics.median(t["total_s"] for t in kills), 3),
        "survivors_from_host": all(t["survivors_from_host"] for t in kills),
        "every_rank_from_host": all(t["every_rank_from_host"] for t in kills),
        **{
            part: round(statistics.median(t[part] for t in kills), 3)
            for part in (*PARTS, *RESTART_PARTS)
        },
    }
    hangs = [t for t in trials if t["fault"] == "hang"]
    if hangs:
        summary["hang"] = hangs[0]
    return summary


#: the bench's own faults are no crash loop: warm trials come seconds apart, and a fourth
#: remediation within the default 10-minute window would be backed off
CONTROLLER = ["--set", "settings={crash_loop={max_restarts=50}}"]


def _run_mode(args: argparse.Namespace, mode: str, console: Console) -> dict:
    """One stack and one job; ``cold``: the built-in policy with in-process restart off."""
    policy = ["--set", f"policy={cold_restart.__file__}"] if mode == "cold" else []
    flags = {"controller": [*CONTROLLER, *policy]}
    with tempfile.TemporaryDirectory(prefix=f"goodput-bench-recovery-{mode}-") as tmp:
        session = StackSession(Path(tmp))
        try:
            stack, settings = session.start(args, "bench", 3, console, flags)
            asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
            trials, steady = asyncio.run(
                _measure(
                    settings,
                    stack.job,
                    args.trials,
                    args.steps,
                    console,
                    mode == "warm",
                    args.procs_per_node,
                )
            )
        finally:
            session.stop()
    return _summary(trials) | steady


def most_trials(warm: bool) -> int:
    """The kills one job can take: its nodes are struck in turn (and the warm job's hang
    after them), and a node's ``REPEAT_FAILURES``-th failure is judged a repeat offender and
    replaced by the spare, not the recovery measured here."""
    return NODES * (REPEAT_FAILURES - 1) - (1 if warm else 0)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    most = most_trials(args.mode == "warm")
    if args.trials > most:
        console.print(
            f"[red]bench recovery: --trials {args.trials} is more than one job takes in "
            f"{args.mode} mode ({most}): a node that fails {REPEAT_FAILURES} times is judged "
            "a repeat offender[/]",
            soft_wrap=True,
        )
        return 2
    load_before = round(os.getloadavg()[0], 2)
    bare_before = bare_start_s()
    modes = ("warm", "cold") if args.mode == "warm" else ("cold",)
    result: dict = {"load_1m_before": load_before, "procs_per_node": args.procs_per_node}
    try:
        for mode in modes:
            console.print(f"[bold]{mode} recovery[/]")
            result[mode] = _run_mode(args, mode, console)
    except TimeoutError as exc:
        console.print(f"[red]bench recovery: the job did not recover: {exc}[/]")
        return 1
    bare = (bare_before + bare_start_s()) / 2
    result.update(load_1m_after=round(os.getloadavg()[0], 2), bare_start_s=round(bare, 3))
    for mode in modes:
        result[mode]["startup_over_bare"] = round(result[mode]["startup_s"] / bare, 2)
    if "warm" in result:
        result["warm_over_cold"] = round(result["warm"]["total_s"] / result["cold"]["total_s"], 3)
        result["target_warm_over_cold"] = 1 / 3
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"recovery from kill -9 of a rank (median of {args.trials})")
    table.add_column("part")
    for mode in modes:
        table.add_column(f"{mode} (s)", justify="right")
    for part in (*PARTS, "total_s"):
        table.add_row(part.removesuffix("_s"), *(f"{result[m][part]:.2f}" for m in modes))
        if part == "restart_s":
            for sub in RESTART_PARTS:
                table.add_row(
                    f"  {sub.removesuffix('_s')}", *(f"{result[m][sub]:.2f}" for m in modes)
                )
    Console().print(table)
    if "hang" in result.get("warm", {}):
        hang = result["warm"]["hang"]
        console.print(f"hang recovered ({hang['rule']}): {hang['total_s']:.2f} s to the next step")
    if "warm_over_cold" in result:
        console.print(f"warm / cold: {result['warm_over_cold']:.2f} (target ≤ 0.33)")
        host = result["warm"]["survivors_from_host"]
        console.print(f"every warm trial's survivors restored from host memory: {host}")
        every = result["warm"]["every_rank_from_host"]
        console.print(f"every warm trial's ranks (replacements too) from host memory: {every}")
    console.print(
        f"bare start (2 processes importing torch + the job, same machine): {bare:.2f} s; "
        f"load average {result['load_1m_before']} → {result['load_1m_after']}"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "recovery",
        help="time from a rank's death to the first step after resume, by phase",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--trials",
        type=count_at_least(1),
        default=3,
        help=f"kills in one job (default 3; at most {most_trials(warm=True)} in warm mode, "
        f"{most_trials(warm=False)} in cold: a node that fails {REPEAT_FAILURES} times is "
        "judged a repeat offender)",
    )
    parser.add_argument(
        "--procs-per-node",
        type=count_at_least(1),
        default=1,
        help="ranks on each of the two nodes (default 1); they save one slice each, and a warm "
        "restore reads them from the node's shared memory",
    )
    parser.add_argument(
        "--mode",
        choices=("warm", "cold"),
        default="warm",
        help="warm (default): in-process restart, measured against the cold path in the same "
        "run (and a hang recovered in process); cold: only the cold path (every rank restarted)",
    )
    parser.add_argument(
        "--steps", type=int, default=2000, help="job length; it is stopped after the trials"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_bus_arguments(parser)
    parser.set_defaults(func=run)
