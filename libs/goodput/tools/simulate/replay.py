"""Replay a real `goodput demo` run in the simulator: its faults at the steps they fired, priced
with the costs the run measured, decided by the same policy — and compare the goodputs.

It checks the simulator's decisions and accounting against a real run (its cost model is
checked by :mod:`.predict`, which uses none of the run's measured remediation costs): the
prediction is made without the run's goodput or badput, only from its setup (nodes, spares,
steps, checkpoint interval), its faults, unit costs (step time, checkpoint stall and persist,
decision, the first start-up and the final shutdown) and what each remediation cost (relaunch,
restore, start-up, the step restored, the step time of the phase it started) measured from its
events (:mod:`goodput.tools.simulate.measure`); each phase's steps and saves take what the run
measured for each (its step's span less the saves in it, and the union of every rank's stall:
a loaded machine's steps are not one constant, and the calculator charges the slow ones);
a straggler slows the job's steps as they were measured while it ran, step by step (a run
measured before they were: by their mean), and the job steps at the pace it kept after it
once it ends. A step or save the run did not make in that phase (the controller's interval
fell elsewhere, a rollback went further) is priced at the phase's mean step and the mean save.
"""

from __future__ import annotations

import math
import statistics
from itertools import chain

from goodput.tools.simulate.demo_run import (
    HOST_PROBE_S,
    compare,
    job_spec,
    load_run,
    replay_section,
    simulate_setup,
    step_fault,
)
from goodput.tools.simulate.profile import (
    CheckpointCosts,
    CostProfile,
    DetectionCosts,
    RestartCosts,
    SimulateError,
)
from goodput.tools.simulate.records import MeasuredCosts, Pace, RemediationCost


def replay_file(path: str) -> dict:
    """Replay ``goodput demo --json`` output: the goodput run, and the baseline's if present."""
    return compare(load_run(path), _replay)


def _replay(run: dict, setup: str) -> dict:
    with replay_section(setup):
        info = run["replay"]
        costs = info["costs"]
        step_time = float(costs["step_time_s"])
        if step_time <= 0:
            raise SimulateError(f"the {setup} run has no step time to replay")
        job = job_spec(info, step_time, state_gb=1.0)
        slowdowns = iter(costs.get("slowdowns") or [])
        slowed_steps = iter(costs.get("slowed_steps") or [])
        after_step_s = iter(costs.get("slowed_after_step_s") or [])
        delays = costs.get("fault_delays_s") or [0.0] * len(info["faults"])
        faults = [
            step_fault(
                f,
                setup,
                slowdown=next(slowdowns, 0.0) if f["action"] == "slow-rank" else 0.0,
                slowed_steps=next(slowed_steps, ()) if f["action"] == "slow-rank" else (),
                after_step_s=next(after_step_s, None) if f["action"] == "slow-rank" else None,
                delay_s=delay,
            )
            for f, delay in zip(info["faults"], delays, strict=True)
            if f["ok"]
        ]
        entries = [costs.get("first_saves_s"), *(r.get("saves_s") for r in costs["remediations"])]
        waits = [_cost(save[2]) for save in chain.from_iterable(e or () for e in entries)]
        wait_s = statistics.fmean(waits) if waits else None
        measured = _measured(costs, wait_s)
        profile = _profile(costs, measured)
        first = MeasuredCosts(
            measured,
            float(costs["first_startup_s"]),
            _seconds(costs.get("first_step_time_s")),
            _pace(costs.get("first_steps_s"), costs.get("first_saves_s"), wait_s),
        )
    return simulate_setup(
        run,
        setup,
        job,
        profile,
        faults,
        measured=first,
        shutdown_s=float(costs.get("shutdown_s") or 0.0),
    )


def _measured(costs: dict, wait_s: float | None) -> dict[str, list[RemediationCost]]:
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
                pace=_pace(entry.get("steps_s"), entry.get("saves_s"), wait_s),
            )
        )
    return by_action


def _pace(steps: list | None, saves: list | None, wait_s: float | None) -> Pace:
    """A phase's measured steps ([step, seconds]) and saves ([step, rank 0's stall, the job's
    wait]); none: a run measured before they were. ``wait_s``: the run's mean wait."""
    return Pace(
        {int(step): _cost(seconds) for step, seconds in steps or ()},
        {int(step): (_cost(own), _cost(waited)) for step, own, waited in saves or ()},
        wait_s,
    )


def _number(value: object) -> float:
    """A record's number (JSON's int or float); any other value, a forged or broken record's,
    is a ``TypeError`` (the run's replay section is incomplete)."""
    if not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _cost(value: object) -> float:
    """Measured seconds: a forged or broken record's negative, infinite or NaN is refused."""
    seconds = _number(value)
    if not 0.0 <= seconds < math.inf:
        raise ValueError(f"{value!r} is not a measured number of seconds")
    return seconds


def _seconds(value: object) -> float | None:
    """A measured step time, None where the run has none (a phase without steps)."""
    return None if value is None else _number(value)


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
