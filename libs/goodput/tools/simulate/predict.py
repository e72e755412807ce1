"""Forward prediction of a `goodput demo` run: its goodput priced by a cost profile alone.

A replay (:mod:`.replay`) feeds in what each remediation of the run cost, so it checks the
decisions and the accounting, not the cost model. A prediction takes from the run only what
a user knows before it runs — the job's shape (nodes, spares, steps, checkpoint interval), its
step time, its checkpoint size, and the scenario's fault schedule (which fault, at which step,
a straggler's factor and scheduled length, when a lost node comes back) — and prices the rest
with the profile: detection and decision, relaunch, restore, start-up (the first one too),
warm restarts and standby readiness, checkpoint stalls and persists, and the ranks' exit.
A scaled-down attempt steps nodes/active times slower: the demo's job keeps its global batch
(its default ``--rescale keep-global-batch``), so fewer ranks do the same work per step.

A profile calibrated on the run's machine knows the pace it was measured at; a run whose median
step was slower met more load, and its machine-bound costs are priced that much dearer
(:mod:`.pace`; ``follow_load=False``: at the profile's pace, whatever the run's).
"""

from __future__ import annotations

from goodput.tools.demo.scenarios import SCENARIOS
from goodput.tools.simulate.demo_run import (
    compare,
    job_spec,
    load_run,
    replay_section,
    simulate_setup,
    step_fault,
)
from goodput.tools.simulate.fleet import StepFault
from goodput.tools.simulate.pace import at_pace, pace_factor
from goodput.tools.simulate.profile import CostProfile, SimulateError


def predict_file(
    path: str,
    profile: CostProfile,
    checkpoint_gb: float | None = None,
    *,
    follow_load: bool = True,
) -> dict:
    """Predict both setups of ``goodput demo --json`` output; ``checkpoint_gb``: the state per
    rank (None: the size the run's checkpoints reported); ``follow_load``: price each setup at
    the pace its steps ran (where the profile knows its own)."""
    run = load_run(path)
    result = compare(
        run,
        lambda setup_run, setup: _predict(setup_run, setup, profile, checkpoint_gb, follow_load),
    )
    return result | {"profile": profile.name}


def _predict(
    run: dict, setup: str, profile: CostProfile, checkpoint_gb: float | None, follow_load: bool
) -> dict:
    with replay_section(setup):
        info = run["replay"]
        step_time = float(info["costs"]["step_time_s"])
        size = (
            float(info["costs"].get("checkpoint_gb") or 0.0)
            if checkpoint_gb is None
            else checkpoint_gb
        )
        if step_time <= 0:
            raise SimulateError(f"the {setup} run has no step time to predict with")
        if size <= 0:
            raise SimulateError(
                f"the {setup} run does not say its checkpoint size: give --checkpoint-gb"
            )
        job = job_spec(info, step_time, size)
        median = info["costs"].get("median_step_time_s")
        factor = pace_factor(profile, setup, median) if follow_load else 1.0
        priced = at_pace(profile, factor)
        faults = _faults(run, setup, step_time, priced.detection.event_latency_s)
    return simulate_setup(
        run,
        setup,
        job,
        priced,
        faults,
        shutdown_s=priced.restart.shutdown_s,
        keep_global_batch=True,
    ) | {"checkpoint_gb": size, "pace": round(factor, 3)}


def _faults(run: dict, setup: str, step_time_s: float, latency_s: float) -> list[StepFault]:
    """The run's faults as scheduled: each strikes one event latency after its step (the
    demo's driver hears the step over the bus, then fires: after that step's save, where the
    save is quicker), and a straggler lasts the scenario's seconds and steps (whichever ends
    later, at its factor's pace), not as long as it lasted in the run (its eviction ended it
    there: the simulated policy must find that itself)."""
    scenario = SCENARIOS.get(str(run.get("scenario")))
    scheduled = [f for f in scenario.faults if f.action == "slow-rank"] if scenario else []
    faults, stragglers = [], iter(scheduled)
    for entry in run["replay"]["faults"]:
        if not entry["ok"]:
            continue
        duration = None
        if entry["action"] == "slow-rank":
            fault = next(stragglers, None)
            if fault is None:
                raise SimulateError(
                    f"the {setup} run's straggler is not in its scenario "
                    f"({run.get('scenario')!r}): its scheduled length is unknown"
                )
            duration = max(fault.duration_s, fault.min_slow_steps * step_time_s * fault.factor)
        faults.append(step_fault(entry, setup, delay_s=latency_s, duration_s=duration))
    return faults
