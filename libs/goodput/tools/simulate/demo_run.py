"""A `goodput demo --json` run as the simulator's input: what replay and predict share.

Both read the run's ``replay`` section (the job's shape, the faults at the steps they fired),
run the goodput run with the built-in policy and the baseline with the baseline strategy,
under the demo's controller and sensor settings, and compare the simulated goodput with what
the calculator measured. They differ only in what prices the remediations: the run's own
measurements (:mod:`.replay`) or a cost profile (:mod:`.predict`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from goodput.schemas.tiers import LOCAL
from goodput.supervisor.control.checkpoint_interval import IntervalSettings
from goodput.supervisor.control.crash_loop import CrashLoopLimits
from goodput.supervisor.control.engine import ControllerSettings
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.tools.demo.scenarios import HANG_MIN_TIMEOUT_S, HANG_SAFETY_FACTOR, STRAGGLER_RATIO
from goodput.tools.simulate.fleet import FaultKind, StepFault
from goodput.tools.simulate.profile import CostProfile, JobSpec, SimulateError
from goodput.tools.simulate.records import MeasuredCosts
from goodput.tools.simulate.strategies import strategies
from goodput.tools.simulate.world import World

#: the demo's faults as the simulator's kinds
KINDS: dict[str, FaultKind] = {
    "kill-rank": "crash",
    "hang-rank": "hang",
    "slow-rank": "straggler",
    "fail-node": "node_down",
    "sdc": "sdc",
}
#: the demo runs with these controller and sensor settings (goodput.tools.demo.session)
DEMO_SETTINGS = ControllerSettings(
    checkpoint_interval=IntervalSettings(prior_mtbf_s=120.0),
    crash_loop=CrashLoopLimits(window_s=20.0, max_restarts=3, backoff_s=5.0, max_backoffs=3),
)
DEMO_THRESHOLDS = Thresholds(
    straggler_ratio=STRAGGLER_RATIO,
    hang_safety_factor=HANG_SAFETY_FACTOR,
    hang_min_timeout_s=HANG_MIN_TIMEOUT_S,
)
#: the host monitor's probe period on the demo's nodes (seconds)
HOST_PROBE_S = 1.0
#: the simulated horizon, in multiples of the run's fault-free length: the job ends at its
#: last step long before (a bound, not a cost)
HORIZON = 20

#: one setup ("goodput" or "baseline") of a run, simulated: the comparison's per-setup dict
Simulate = Callable[[dict, str], dict]


def load_run(path: str) -> dict:
    """The run's JSON; one line naming what is wrong with a file that is not a demo run."""
    try:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SimulateError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SimulateError(f"{path}: not JSON: {exc}") from None
    if not isinstance(run, dict) or "replay" not in run:
        raise SimulateError(
            f"{path}: no 'replay' section: not the output of `goodput demo --json` "
            "(of this version)"
        )
    return run


def compare(run: dict, simulate: Simulate) -> dict:
    """Both setups of ``run`` (the baseline where it holds one) simulated by ``simulate``."""
    result = simulate(run, "goodput")
    out = {
        "predicted_goodput_pct": result["predicted"],
        "actual_goodput_pct": result["actual"],
        "error_points": result["error"],
        "goodput": result,
    }
    if isinstance(run.get("baseline"), dict):
        baseline = simulate(run["baseline"], "baseline")
        out |= {
            "baseline_predicted_goodput_pct": baseline["predicted"],
            "baseline_actual_goodput_pct": baseline["actual"],
            "baseline_error_points": baseline["error"],
            "baseline": baseline,
        }
    return out


@contextlib.contextmanager
def replay_section(setup: str) -> Iterator[None]:
    """Reading the ``setup`` run's replay section: a field missing or of the wrong type is
    one line naming the run, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as exc:
        raise SimulateError(f"the {setup} run's replay section is incomplete: {exc}") from None


def job_spec(info: dict, step_time_s: float, state_gb: float) -> JobSpec:
    """The run's shape: its nodes, spares, step time, checkpoint interval and state size, and
    how often its replicas were compared (a run from before the demo recorded it: the
    default; the baseline's period lies past its last step: never)."""
    fingerprints = {}
    if info.get("fingerprint_every") is not None:
        every = int(info["fingerprint_every"])
        if every < 1:
            raise SimulateError(f"fingerprint_every must be a positive step count, not {every}")
        fingerprints["fingerprint_every_steps"] = every
    return JobSpec(
        gpus_per_node=1,
        nodes=int(info["nodes"]),
        num_nodes_per_dp=1,
        spares=int(info["spares"]),
        hours=max(1.0, HORIZON * int(info["total_steps"]) * step_time_s / 3600),
        step_time_s=step_time_s,
        state_gb_per_node=state_gb,
        checkpoint_interval_s=int(info["ckpt_every"]) * step_time_s,
        **fingerprints,
    )


def step_fault(
    entry: dict,
    setup: str,
    *,
    slowdown: float = 0.0,
    slowed_steps: tuple[float, ...] = (),
    after_step_s: float | None = None,
    delay_s: float = 0.0,
    duration_s: float | None = None,
) -> StepFault:
    """One fault of the run at the step it fired. A node loss is repaired at the step the
    scenario names where the job trains on without it (goodput), else after its seconds;
    ``duration_s``: a straggler's length (None: the run's entry's); ``slowdown`` and
    ``slowed_steps``: how much slower the job stepped while it ran, on the whole and step by
    step, and ``after_step_s`` its step time once it ended (a replay's measures)."""
    kind = KINDS.get(entry["action"])
    if kind is None:
        raise SimulateError(f"cannot simulate a {entry['action']!r} fault")
    repair_step = entry.get("repair_at_step")
    repair_at_step = int(repair_step) if setup == "goodput" and repair_step is not None else None
    by_step = repair_at_step is not None
    duration = 0.0
    if kind == "straggler":
        duration = float(entry.get("duration_s") or 0.0) if duration_s is None else duration_s
    elif kind == "node_down" and not by_step:
        duration = float(entry.get("repair_after_s") or 0.0)
    return StepFault(
        at_step=int(entry["step"]),
        node=entry["node"],
        kind=kind,
        duration_s=duration,
        factor=float(entry.get("factor") or 1.0),
        slowdown=float(slowdown),
        slowed_steps=tuple(float(f) for f in slowed_steps),
        after_step_s=None if after_step_s is None else float(after_step_s),
        repair_at_step=repair_at_step,
        delay_s=float(delay_s),
    )


def simulate_setup(
    run: dict,
    setup: str,
    job: JobSpec,
    profile: CostProfile,
    faults: list[StepFault],
    *,
    measured: MeasuredCosts | None = None,
    shutdown_s: float = 0.0,
    keep_global_batch: bool = False,
) -> dict:
    """Run one setup to the run's last step; the predicted and measured goodput and badput."""
    actual = run.get("goodput_pct")
    if not isinstance(actual, int | float):
        raise SimulateError(f"the {setup} run has no measured goodput to compare with")
    known = strategies()
    strategy = known["goodput"]
    if setup != "goodput":  # the demo's baseline torch.saves to its node's directory
        strategy = dataclasses.replace(known["baseline"], single_tier=LOCAL)
    world = World(
        job,
        profile,
        strategy,
        [],
        settings=DEMO_SETTINGS,
        thresholds=DEMO_THRESHOLDS,
        step_faults=faults,
        until_step=int(run["replay"]["total_steps"]),
        measured=measured,
        shutdown_s=shutdown_s,
        follow_every_rank=True,
        keep_global_batch=keep_global_batch,
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
