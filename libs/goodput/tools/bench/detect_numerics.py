"""The numerical phases of ``goodput bench detect`` (issue 39): a NaN loss, a 10× loss spike
and a silent data corruption (one node's replica), one at a time, each on a job stepping
steadily, each timed from the ``InjectFault`` sent to the trainer to its signal
(``nonfinite``, ``loss_spike``, ``replica_mismatch``), with the controller's decision on it
(``numerical-rollback`` expected) and the job trained on again after the rollback.

A NaN or a spike is seen at the end of the numerics window it fell in, an SDC at the next
fingerprint: the bound is that period, plus one step (the rank applies the fault at the
step boundary after the command reaches it, which may be the step after the one reported
when it was sent), in steps; in seconds, those steps at the 95th percentile of the job's
last 50 steps before the trial (at its median, a loaded run's NaN once took 2.03 s against a
1.95 s "bound"), plus the sensor's poll. On 2 nodes (2 replicas) an SDC has no majority: the judge
cannot tell the flipped replica from the sound one, and its signal names neither.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import JobEvents
from goodput.supervisor.detect.numerics import NumericsJudge
from goodput.tools.bench.detect_waits import (
    LOOK_S,
    BenchError,
    after_resume,
    signal_after,
    step_of,
    step_times,
    stepping_on,
)
from goodput.tools.bench.job_waits import WAIT_S

NS = 1e9
#: the job's numerics window and fingerprint period (``GOODPUT_NUMERICS_EVERY``,
#: ``GOODPUT_FINGERPRINT_EVERY``): the shim's default window; a fingerprint every 50 steps,
#: half the default, so that the SDC trial takes seconds, not minutes, of a loaded machine
NUMERICS_EVERY = 10
FINGERPRINT_EVERY = 50
SPIKE_FACTOR = 10.0
#: the steps a fault may land after the step reported when it was sent
LANDING_STEPS = 1
#: the decision every numerical trial expects from the built-in policy
ROLLBACK = "numerical-rollback"


@dataclass(frozen=True)
class Trial:
    fault: str  # the ``InjectFault`` sent to the trainer
    signal: str  # the signal it should raise
    period: int  # the steps between the readings that can see it


TRIALS = (
    Trial("nan", "nonfinite", NUMERICS_EVERY),
    Trial("loss-spike", "loss_spike", NUMERICS_EVERY),
    Trial("sdc", "replica_mismatch", FINGERPRINT_EVERY),
)


def bound_steps(trial: Trial) -> int:
    """The most steps from the fault's command to its signal's window end."""
    return trial.period + LANDING_STEPS


def bound_s(trial: Trial, step_s: float, poll_s: float) -> float:
    """The most seconds from the command to the signal at a ``step_s`` step."""
    return round(bound_steps(trial) * step_s + poll_s, 2)


async def run_trials(bus: Bus, log: JobEvents, job: str, poll_s: float) -> dict:
    """Every numerical trial in turn; the figures for the benchmark's JSON."""
    trials = {trial.fault: await _trial(bus, log, job, trial, poll_s) for trial in TRIALS}
    return {"numerics_every": NUMERICS_EVERY, "fingerprint_every": FINGERPRINT_EVERY, **trials}


async def _trial(bus: Bus, log: JobEvents, job: str, trial: Trial, poll_s: float) -> dict:
    if trial.fault == "loss-spike":
        await _spikes_judged(log)
    status = await stepping_on(log, 2)
    times = step_times(log, last=50)
    node = status.active_nodes[-1] if trial.fault == "sdc" else status.active_nodes[0]
    command = schemas.InjectFault(
        job=job,
        node=node,
        fault=trial.fault,
        factor=SPIKE_FACTOR if trial.fault == "loss-spike" else 1.0,
        reason="goodput bench detect",
    )
    if trial.fault == "loss-spike":
        await _clear_of_a_fingerprint(log)
    sent_step, sent_ts = step_of(log), schemas.now_ns()
    await bus.send_command(subjects.TRAINER, command)
    bound = bound_s(trial, times["p95"], poll_s)
    found = await signal_after(log, trial.signal, sent_ts, max(WAIT_S, 3 * bound))
    decision = await log.wait_for(
        lambda e: isinstance(e, schemas.Decision) and e.signal_id == found.signal_id,
        WAIT_S,
        f"the decision on the {trial.signal} signal",
        after_ts=sent_ts,
    )
    assert isinstance(decision, schemas.Decision)
    same = [
        e
        for e in log.events
        if isinstance(e, schemas.Signal)
        and e.signal == trial.signal
        and e.ts >= sent_ts
        and e.last_bad_step == found.last_bad_step
    ]
    await after_resume(log, found.ts)
    return {
        "node": node,
        "sent_at_step": sent_step,
        "signal_step": found.last_bad_step,
        "detect_steps": found.last_bad_step - sent_step,
        "bound_steps": bound_steps(trial),
        "detect_s": round((found.ts - sent_ts) / NS, 2),
        "bound_s": bound,
        "step_s": times,  # median and p95 of the last 50 steps before the trial
        "first_bad_step": found.first_bad_step,
        "decision": decision.rule,
        "nodes_named": sorted({e.node for e in same if e.node}),  # job-wide: none
        "detail": found.detail,
    }


def spikes_judged(events: list[schemas.Event]) -> bool:
    """Whether the sensor's judge, given the job's windows so far, judges the next one's loss:
    its warm-up counts the windows of the job's current timeline only, and a job that went
    back to an early checkpoint and then on to a newer one has fewer behind it than its step
    says (the judge itself answers: its rule has one owner)."""
    judge = NumericsJudge()
    for event in events:
        if isinstance(event, schemas.Numerics):
            judge.observe(event, {})
    return judge.judging_spikes


async def _spikes_judged(log: JobEvents, timeout_s: float = 2 * WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not spikes_judged(log.events):
        if asyncio.get_running_loop().time() >= deadline:
            raise BenchError(f"the spike judge was not warmed up within {timeout_s:g} s")
        await asyncio.sleep(LOOK_S)


def window_end(step: int) -> int:
    """The last step of the numerics window ``step`` falls in."""
    return -(-step // NUMERICS_EVERY) * NUMERICS_EVERY


def spike_clear_of_a_fingerprint(sent_at_step: int) -> bool:
    """Whether a spike sent at rank 0's step ``sent_at_step`` lands in a window that does not
    end at a fingerprint step. Its rollback skips that window's steps, a fingerprint due at
    the window's end with them, so the next SDC's bound falls back a fingerprint period, under
    the checkpoint the rollback left as known clean (ARCHITECTURE, numerical faults, "Not
    done yet"; bench run of 2026-11-29: every rank then refused the SDC's rollback)."""
    landings = range(sent_at_step + 1, sent_at_step + 2 + LANDING_STEPS)
    return all(window_end(step) % FINGERPRINT_EVERY for step in landings)


async def _clear_of_a_fingerprint(log: JobEvents, timeout_s: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not spike_clear_of_a_fingerprint(step_of(log)):
        if asyncio.get_running_loop().time() >= deadline:
            raise BenchError(f"the job made no step for {timeout_s:g} s")
        await asyncio.sleep(LOOK_S / 10)  # a window is a few seconds: look at every step


def table_rows(numerics: dict) -> list[tuple[str, str, str]]:
    """(figure, measured, bound) rows for the benchmark's table."""
    rows = []
    for trial in TRIALS:
        got = numerics[trial.fault]
        rows += [
            (
                f"{trial.fault} → {trial.signal}, steps",
                str(got["detect_steps"]),
                f"≤ {got['bound_steps']}",
            ),
            (f"{trial.fault} → {trial.signal}, s", f"{got['detect_s']:g}", f"≤ {got['bound_s']:g}"),
            (f"{trial.fault}: decision", got["decision"], ROLLBACK),
        ]
    sdc = numerics["sdc"]
    rows.append(
        ("sdc: node the signal named", ", ".join(sdc["nodes_named"]), f"{sdc['node']} flipped")
    )
    return rows
