"""Replay a real `goodput demo` run in the simulator: its faults at the steps they fired, priced
with the costs the run measured, decided by the same policy — and compare the goodputs.

This is what makes the simulator's numbers worth believing: the prediction is made without
the run's goodput or badput, only from its setup (nodes, spares, steps, checkpoint interval),
its faults, unit costs (step time, checkpoint stall and persist, decision, the first
start-up and the final shutdown) and what each remediation cost (relaunch, restore, start-up,
the step restored, the step time of the phase it started) measured from its events
(:mod:`goodput.simulate.measure`); a straggler slows the job's steps by the factor measured
while it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from goodput.control.checkpoint_interval import IntervalSettings
from goodput.control.crash_loop import CrashLoopLimits
from goodput.control.engine import ControllerSettings
from goodput.demo.scenarios import STRAGGLER_RATIO
from goodput.detect.thresholds import Thresholds
from goodput.simulate.fleet import StepFault
from goodput.simulate.profile import (
    CheckpointCosts,
    CostProfile,
    DetectionCosts,
    JobSpec,
    RestartCosts,
    SimulateError,
)
from goodput.simulate.records import MeasuredCosts, RemediationCost
from goodput.simulate.strategies import strategies
from goodput.simulate.world import World

#: the demo's faults as the simulator's kinds
KINDS = {
    "kill-rank": "crash",
    "hang-rank": "hang",
    "slow-rank": "straggler",
    "fail-node": "node_down",
}
#: the demo runs with these controller and sensor settings (goodput.demo.session)
DEMO_SETTINGS = ControllerSettings(
    checkpoint_interval=IntervalSettings(prior_mtbf_s=120.0),
    crash_loop=CrashLoopLimits(window_s=20.0, max_restarts=3, backoff_s=5.0, max_backoffs=3),
)
DEMO_THRESHOLDS = Thresholds(straggler_ratio=STRAGGLER_RATIO)
#: the host monitor's probe period on the demo's nodes (seconds)
HOST_PROBE_S = 1.0


def replay_file(path: str) -> dict:
    """Replay ``goodput demo --json`` output: the goodput run, and the baseline's if present."""
    try:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SimulateError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SimulateError(f"{path}: not JSON: {exc}") from None
    if not isinstance(run, dict) or "replay" not in run:
        raise SimulateError(
            f"{path}: no 'replay' section: not the output of `goodput demo --json` "
            "(of this version)"
        )
    result = _replay(run, "goodput")
    out = {
        "predicted_goodput_pct": result["predicted"],
        "actual_goodput_pct": result["actual"],
        "error_points": result["error"],
        "goodput": result,
    }
    if isinstance(run.get("baseline"), dict):
        baseline = _replay(run["baseline"], "baseline")
        out |= {
            "baseline_predicted_goodput_pct": baseline["predicted"],
            "baseline_actual_goodput_pct": baseline["actual"],
            "baseline_error_points": baseline["error"],
            "baseline": baseline,
        }
    return out


def _replay(run: dict, setup: str) -> dict:
    try:
        info, actual = run["replay"], run["goodput_pct"]
        costs = info["costs"]
        step_time = float(costs["step_time_s"])
        if actual is None or step_time <= 0:
            raise SimulateError(f"the {setup} run has no goodput or no step time to replay")
        job = JobSpec(
            gpus_per_node=1,
            nodes=int(info["nodes"]),
            num_nodes_per_dp=1,
            spares=int(info["spares"]),
            hours=max(1.0, 20 * float(info["total_s"] or 0) / 3600),
            step_time_s=step_time,
            state_gb_per_node=1.0,
            checkpoint_interval_s=int(info["ckpt_every"]) * step_time,
        )
        slowdowns = iter(costs.get("slowdowns") or [])
        delays = costs.get("fault_delays_s") or [0.0] * len(info["faults"])
        faults = [
            _fault(f, setup, next(slowdowns, 0.0) if f["action"] == "slow-rank" else 0.0, delay)
            for f, delay in zip(info["faults"], delays, strict=True)
            if f["ok"]
        ]
        measured = _measured(costs)
        profile = _profile(costs, measured)
        total_steps = int(info["total_steps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SimulateError(f"the {setup} run's replay section is incomplete: {exc}") from None
    strategy = strategies()["goodput" if setup == "goodput" else "baseline"]
    world = World(
        job,
        profile,
        strategy,
        [],
        settings=DEMO_SETTINGS,
        thresholds=DEMO_THRESHOLDS,
        step_faults=faults,
        until_step=total_steps,
        measured=MeasuredCosts(
            measured, float(costs["first_startup_s"]), _seconds(costs.get("first_step_time_s"))
        ),
        shutdown_s=float(costs.get("shutdown_s") or 0.0),
        follow_every_rank=True,
    )
    result = world.run()
    predicted = round(result.goodput_pct, 2)
    return {
        "predicted": predicted,
        "actual": round(actual, 2),
        "error": round(abs(predicted - actual), 2),
        "predicted_badput_s": {k: round(v, 2) for k, v in result.badput.items()},
        "actual_badput_s": run.get("badput", {}),
        "rules": result.rules,
        "steps": result.steps,
    }


def _fault(entry: dict, setup: str, slowdown: float, delay_s: float) -> StepFault:
    kind = KINDS.get(entry["action"])
    if kind is None:
        raise SimulateError(f"cannot replay a {entry['action']!r} fault")
    repair_step = entry.get("repair_at_step")
    by_step = setup == "goodput" and repair_step is not None
    duration = float(entry.get("duration_s") or 0.0) if kind == "straggler" else 0.0
    if kind == "node_down" and not by_step:
        duration = float(entry.get("repair_after_s") or 0.0)
    return StepFault(
        at_step=int(entry["step"]),
        node=entry["node"],
        kind=kind,  # type: ignore[arg-type]
        duration_s=duration,
        factor=float(entry.get("factor") or 1.0),
        slowdown=float(slowdown),
        repair_at_step=int(repair_step) if by_step else None,
        delay_s=float(delay_s),
    )


def _measured(costs: dict) -> dict[str, list[RemediationCost]]:
    by_action: dict[str, list[RemediationCost]] = {}
    for entry in costs["remediations"]:
        step = entry.get("restored_step")
        by_action.setdefault(entry["action"], []).append(
            RemediationCost(
                relaunch_s=float(entry["relaunch_s"]),
                restore_s=float(entry["restore_s"]),
                startup_s=float(entry["startup_s"]),
                restored_step=None if step is None else int(step),
                step_time_s=_seconds(entry.get("step_time_s")),
                trained_on_s=float(entry.get("trained_on_s") or 0.0),
                trained_on_steps=int(entry.get("trained_on_steps") or 0),
            )
        )
    return by_action


def _seconds(value: object) -> float | None:
    """A measured step time, None where the run has none (a phase without steps)."""
    return None if value is None else float(value)  # type: ignore[arg-type]


def _profile(costs: dict, measured: dict[str, list[RemediationCost]]) -> CostProfile:
    """Measured seconds as a profile of 1 GB states (GB/s = 1 / seconds); what a remediation
    costs comes from its own measurement (``measured``), these are the fallbacks."""

    def rate(seconds: float) -> float:
        return 1.0 / max(float(seconds), 1e-3)

    every = [c for cs in measured.values() for c in cs]
    restore = max((c.restore_s for c in every), default=0.0)
    restart = max((c.relaunch_s for c in every), default=0.0)
    stall = costs["checkpoint_stall_s"]
    persist = costs["checkpoint_persist_s"] or stall
    return CostProfile(
        name="measured",
        description="costs measured from a goodput demo run",
        checkpoint=CheckpointCosts(
            snapshot_gbps=rate(stall),
            local_write_gbps=rate(persist),
            peer_gbps=rate(persist),
            object_write_gbps=rate(stall),
            local_read_gbps=rate(restore),
            peer_read_gbps=rate(restore),
            object_read_gbps=rate(restore),
            latency_s=0.0,
            object_every=1,
        ),
        restart=RestartCosts(
            stop_s=0.0,
            launch_s=restart,
            startup_s=costs["first_startup_s"],
            hot_swap_provision_s=0.0,
            gpu_reset_s=0.0,  # the demo's nodes have no GPU
            # a replay's warm restarts cost what the run measured for each (MeasuredCosts)
            rejoin_s=restart,
            warm_startup_s=costs["first_startup_s"],
            standby_ready_s=costs["first_startup_s"],
        ),
        detection=DetectionCosts(
            event_latency_s=0.01, decision_s=costs["decision_s"], host_probe_s=HOST_PROBE_S
        ),
    )
