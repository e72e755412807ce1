"""What a run's events say it cost: each phase of steps is priced at the step time it ran at."""

from __future__ import annotations

import msgspec
import pytest

from goodput import schemas
from goodput.measure.accounting.calculator import compute_events_goodput
from goodput.tools.simulate import messages as msg
from goodput.tools.simulate.measure import measured_costs

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def _steps(node: str, start_ns: int, first: int, count: int, step_s: float, world: int) -> list:
    """``count`` steps of rank 0, back to back from ``start_ns``."""
    return [
        msg.step_done(
            node, 0, start_ns + int(i * step_s * NS), first + i - 1, step_s, step_s, world
        )
        for i in range(1, count + 1)
    ]


def _scale_down_run() -> list[schemas.Event]:
    """Two ranks step at 0.5 s; a node is lost; one rank steps at 1.5 s (a job scaled down, or
    a machine loaded since), and goes on for 3 steps after the node returns, until two new
    ranks start and step at 0.25 s."""
    events: list[schemas.Event] = [msg.rank_started("node-0", 0, T0, 2, 1)]
    events += _steps("node-0", T0 + 5 * NS, 1, 10, 0.5, 2)
    t = T0 + 11 * NS
    for n, (world, step_s, first) in enumerate(((1, 1.5, 6), (2, 0.25, 14))):
        signal = schemas.Signal(job=msg.JOB, ts=t, signal="node_down", node="node-1")
        command = f"cmd-{n}"
        events += [
            signal,
            schemas.Decision(
                job=msg.JOB,
                ts=t + NS // 100,
                signal_id=signal.signal_id,
                policy="builtin",
                rule="scale",
                reason="",
                command_ids=[command],
            ),
            schemas.ActionResult(
                job=msg.JOB, ts=t + NS, command_id=command, action="scale_to", ok=True
            ),
        ]
        if n == 1:  # the scaled-down rank trains on while the scale-up prepares
            events += [
                msg.step_done("node-0", 0, t + k * NS // 5, 13 + k, 1.5, 1.5, 1) for k in (1, 2, 3)
            ]
        events.append(msg.rank_started("node-0", 0, t + NS, world, n + 2))
        events += _steps("node-0", t + 3 * NS, first + 3 * n, 8, step_s, world)
        t += 20 * NS
    return events


def test_each_phase_keeps_the_step_time_it_ran_at() -> None:
    costs = measured_costs(_scale_down_run())
    assert costs["first_step_time_s"] == 0.5
    assert [r["step_time_s"] for r in costs["remediations"]] == [1.5, 0.25]
    assert [r["restored_step"] for r in costs["remediations"]] == [None, None]
    # the run's mean stays what it was: every step of rank 0, weighted alike
    assert costs["step_time_s"] == round((10 * 0.5 + 11 * 1.5 + 8 * 0.25) / 29, 4)


def test_an_old_attempt_that_trains_on_after_the_decision_is_measured() -> None:
    costs = measured_costs(_scale_down_run())
    down, up = costs["remediations"]
    assert (down["trained_on_s"], down["trained_on_steps"]) == (0.0, 0)
    # three steps, the last 0.6 s after the event that led to the decision (10 ms before it)
    assert (up["trained_on_s"], up["trained_on_steps"]) == (0.59, 3)
    assert up["relaunch_s"] == 0.99  # decision -> new ranks started, the training on included


def test_a_straggler_slows_the_phase_it_ran_in_not_the_run_mean() -> None:
    events = _scale_down_run()
    # the last phase's last 4 steps ran 4x slower: a straggler, measured against 0.25 s
    last = [e for e in events if isinstance(e, schemas.StepDone)][-4:]
    for event in last:
        event.step_time_s = 1.0
    window = (last[0].ts - 1, last[-1].ts)
    costs = measured_costs(events, slow_windows=[window])
    assert costs["slowdowns"] == [4.0]
    assert costs["remediations"][-1]["step_time_s"] == 0.25


def test_a_straggler_that_fades_is_measured_step_by_step() -> None:
    """Under a moving load the demo's 3× straggler faded while its window ran: its mean
    alone slowed every replayed step to the window's end (17.4 s of straggler badput against
    the run's 8.4 s)."""
    events = _scale_down_run()
    last = [e for e in events if isinstance(e, schemas.StepDone)][-4:]
    for event, seconds in zip(last, (1.0, 0.75, 0.5, 0.25), strict=True):
        event.step_time_s = seconds
    costs = measured_costs(events, slow_windows=[(last[0].ts - 1, last[-1].ts)])
    assert costs["slowed_steps"] == [[4.0, 3.0, 2.0, 1.0]]
    assert costs["slowdowns"] == [2.5]


def test_a_straggler_splits_its_phase_into_the_pace_before_and_after_it() -> None:
    """The load around a straggler changes: a loaded demo's phase stepped at 0.52 s on average
    and at 0.40 s after the window, and a replay stepping on at the mean took those steps for
    the straggler's excess until the next fault."""
    events = _scale_down_run()
    last = [e for e in events if isinstance(e, schemas.StepDone)][-8:]
    for event in last[2:4]:
        event.step_time_s = 1.0  # 4× the 0.25 s before
    for event in last[4:]:
        event.step_time_s = 0.5  # and the load doubled after
    costs = measured_costs(events, slow_windows=[(last[2].ts - 1, last[3].ts + 1)])
    assert costs["remediations"][-1]["step_time_s"] == 0.25  # its pace before the straggler
    assert costs["slowed_steps"] == [[4.0, 4.0]]
    assert costs["slowed_after_step_s"] == [0.5]


def test_a_straggler_ended_by_a_relaunch_has_no_pace_after_it() -> None:
    events = _scale_down_run()
    steps = [e for e in events if isinstance(e, schemas.StepDone)]
    window = (steps[8].ts, steps[14].ts)  # from the first phase into the scale-down
    costs = measured_costs(events, slow_windows=[window])
    assert costs["slowed_after_step_s"] == [None]


def _loaded_phase() -> list[schemas.Event]:
    """Two ranks step at 0.5 s; a save of step 0 before the first step (in the start-up), and
    one of step 3 in which rank 1 stalls 0.1 s after rank 0's 0.04 s, the step after it
    taking 0.8 s from step 3's end (a loaded machine's, with the saves)."""
    started = msg.rank_started("node-0", 0, T0, 2, 1)
    done = [T0 + 5 * NS + int(s * NS) for s in (0.5, 1.0, 1.5, 2.3, 2.8)]
    steps = [msg.step_done("node-0", 0, ts, n, 0.5, 0.5, 2) for n, ts in enumerate(done, 1)]
    rank1 = schemas.CheckpointSaved(
        job=msg.JOB, ts=done[2] + NS // 5, node="node-1", rank=1, step=3, stall_s=0.1, bytes=0
    )
    saves = [
        msg.checkpoint_saved("node-0", T0 + 4 * NS, 0, 0.3, 0.0),
        msg.checkpoint_saved("node-0", done[2] + NS // 20, 3, 0.04, 0.0),
        rank1,
    ]
    return [started, *steps, *saves]


def test_each_step_and_save_is_measured_as_the_calculator_keeps_it() -> None:
    """On a loaded machine the step after a save runs slow and rank 1's save stalls the job
    beyond rank 0's: a replay at one step time and rank 0's mean stall priced neither."""
    events = _loaded_phase()
    costs = measured_costs(events)
    # step 4: 0.8 s after step 3 less the 0.14 s the two saves stalled it
    assert costs["first_steps_s"] == [[1, 0.5], [2, 0.5], [3, 0.5], [4, 0.66], [5, 0.5]]
    # rank 0's stall, which the controller reads, and the union the job waited for; the
    # start's save of step 0 too, which the replay books inside its start-up
    assert costs["first_saves_s"] == [[0, 0.3, 0.3], [3, 0.04, 0.14]]
    assert costs["checkpoint_stall_s"] == round((0.3 + 0.04) / 2, 4)  # rank 0's, as before
    # what the calculator keeps of the steps and charges for the phase's saves
    report = compute_events_goodput(events, job=msg.JOB, nominal_world_size=2)
    kept = report.productive_s + report.badput["straggler_slowdown"]
    assert kept == pytest.approx(sum(s for _, s in costs["first_steps_s"]), abs=1e-3)
    assert report.badput["checkpoint_save"] == pytest.approx(0.3 + 0.14, abs=1e-3)


def test_a_remediation_s_load_is_every_rank_s() -> None:
    """A rank whose load ends after rank 0's holds the job in its load too: the calculator
    charges the union of every rank's, and a replay at rank 0's alone booked the rest as
    start-up (0.27 s predicted against 0.47 s measured under load)."""
    events = _scale_down_run()
    up = min(e.ts for e in events if isinstance(e, schemas.RankStarted) and e.attempt == 2)
    for rank, end_s in ((0, 0.5), (1, 0.8)):
        restored = msg.checkpoint_restored(f"node-{rank}", up + int(end_s * NS), 5, "local", 0.2)
        events.append(msgspec.structs.replace(restored, rank=rank))
    down = measured_costs(events)["remediations"][0]
    assert down["restore_s"] == 0.4  # [0.3, 0.5] and [0.6, 0.8] after the ranks started
    assert down["restored_step"] == 5
    assert down["startup_s"] == 1.6  # 2 s from the ranks started to the first step, less 0.4
