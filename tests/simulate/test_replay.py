"""Replay input handling (the real comparison is the slow test_replay_demo)."""

from __future__ import annotations

import json

import pytest

from goodput.tools.simulate.profile import SimulateError
from goodput.tools.simulate.replay import replay_file

FAULTS = [
    {"step": 40, "action": "kill-rank", "node": "node-1", "ok": True},
    {"step": 90, "action": "hang-rank", "node": "node-0", "ok": True},
    {
        "step": 140,
        "action": "slow-rank",
        "node": "node-1",
        "ok": True,
        "factor": 4.0,
        "duration_s": 60.0,
    },
    {
        "step": 200,
        "action": "fail-node",
        "node": "node-0",
        "ok": True,
        "repair_after_s": 45.0,
        "repair_at_step": 320,
    },
]
COSTS = {
    "step_time_s": 0.2,
    "checkpoint_stall_s": 0.05,
    "checkpoint_persist_s": 0.3,
    "first_startup_s": 4.0,
    "shutdown_s": 2.0,
    "decision_s": 0.02,
    "remediations": [
        {
            "action": "restart",
            "relaunch_s": 3.0,
            "restore_s": 0.2,
            "restored_step": 40,
            "startup_s": 4.0,
        },
        {
            "action": "hot_swap",
            "relaunch_s": 3.5,
            "restore_s": 0.2,
            "restored_step": 180,
            "startup_s": 4.0,
        },
    ],
    "slowdowns": [2.5],
    "fault_delays_s": [0.1, 0.1, 0.1, 0.05],
}


def demo_run(spares: int, goodput_pct: float) -> dict:
    return {
        "goodput_pct": goodput_pct,
        "badput": {},
        "replay": {
            "nodes": 2,
            "spares": spares,
            "ckpt_every": 20,
            "total_steps": 400,
            "total_s": 150.0,
            "faults": FAULTS,
            "costs": COSTS,
        },
    }


def test_both_runs_are_replayed_with_their_own_policy(tmp_path):
    run = demo_run(2, 60.0) | {"baseline": demo_run(0, 40.0)}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    result = replay_file(str(path))
    assert result["actual_goodput_pct"] == 60.0
    assert result["error_points"] == pytest.approx(abs(result["predicted_goodput_pct"] - 60.0))
    assert {"evict-straggler-hot-swap", "hot-swap", "in-process-restart"} <= set(
        result["goodput"]["rules"]
    )
    assert "baseline-wait-for-repair" in result["baseline"]["rules"]
    # the baseline waits for its node and saves synchronously: it must come out lower
    assert result["baseline_predicted_goodput_pct"] < result["predicted_goodput_pct"]


def test_not_a_demo_run_is_one_line(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"goodput_pct": 50}))
    with pytest.raises(SimulateError, match="no 'replay' section"):
        replay_file(str(path))


def _scale_down_up(scaled_down_step_s: float | None) -> dict:
    """A node lost at step 20 and back at step 60, two nodes and no spare: scaled down, then up."""
    remediation = {"action": "scale_to", "relaunch_s": 0.5, "restore_s": 0.2, "startup_s": 2.0}
    down = remediation | {"restored_step": 20, "step_time_s": scaled_down_step_s}
    up = remediation | {"restored_step": 60, "step_time_s": 0.2}
    fault = {"step": 20, "action": "fail-node", "node": "node-1", "ok": True}
    return demo_run(0, 50.0)["replay"] | {
        "total_steps": 100,
        "faults": [fault | {"repair_after_s": 20.0, "repair_at_step": 60}],
        "costs": COSTS
        | {
            "first_step_time_s": 0.2,
            "remediations": [down, up],
            "slowdowns": [],
            "fault_delays_s": [0.0],
        },
    }


def test_each_phase_is_replayed_at_the_step_time_it_ran_at(tmp_path):
    """The scaled-down phase ran 3x slower than the others: its idle half costs 3x as long."""
    idle = {}
    for step_s in (None, 0.6):
        path = tmp_path / f"run-{step_s}.json"
        path.write_text(
            json.dumps({"goodput_pct": 50.0, "badput": {}, "replay": _scale_down_up(step_s)})
        )
        result = replay_file(str(path))
        assert {"scale-down", "scale-up"} <= set(result["goodput"]["rules"])
        idle[step_s] = result["goodput"]["predicted_badput_s"]["scaled_down_idle"]
    # 40 steps at one of two nodes: half the job idle for their duration
    assert idle[None] == pytest.approx(40 * 0.2 / 2, rel=0.1)
    assert idle[0.6] == pytest.approx(40 * 0.6 / 2, rel=0.1)


def test_an_old_attempt_that_trained_on_is_replayed_training(tmp_path):
    """A scale-up whose old ranks trained 8 of its 10 s relaunch: 8 s less of reprovisioning."""
    booked = {}
    for trained_s in (0.0, 8.0):
        replay = _scale_down_up(0.2)
        replay["costs"]["remediations"][1] |= {
            "relaunch_s": 10.0,
            "trained_on_s": trained_s,
            "trained_on_steps": int(trained_s / 0.4),  # 0.4 s a step while the new ranks start
            "restored_step": 60 + int(trained_s / 0.4),  # what they saved when stopped
        }
        path = tmp_path / f"run-{trained_s}.json"
        path.write_text(json.dumps({"goodput_pct": 50.0, "badput": {}, "replay": replay}))
        booked[trained_s] = replay_file(str(path))["goodput"]["predicted_badput_s"]
    reprovision = {k: v["restart_reprovision"] for k, v in booked.items()}
    assert reprovision[0.0] - reprovision[8.0] == pytest.approx(8.0, abs=0.5)
    # those 8 s ran on one of two nodes at twice the 0.2 s healthy step: 4 s of step-time
    # deviation, half the other 4 idle, and nothing of them lost
    straggling = {k: v["straggler_slowdown"] for k, v in booked.items()}
    assert straggling[8.0] - straggling[0.0] == pytest.approx(4.0, abs=0.5)
    idle = {k: v["scaled_down_idle"] for k, v in booked.items()}
    assert idle[8.0] - idle[0.0] == pytest.approx(2.0, abs=0.5)
    assert booked[8.0]["wasted_progress"] == pytest.approx(booked[0.0]["wasted_progress"], abs=0.5)


def _straggler_run(slowed_steps: list[list[float]], after_s: float | None = None) -> dict:
    """The baseline (it ignores stragglers) meets a 4× straggler for 60 s at step 140, and
    steps at ``after_s`` once it ended (None: at the run's pace)."""
    replay = demo_run(0, 50.0)["replay"] | {"faults": [FAULTS[2]]}
    replay["costs"] = COSTS | {
        "remediations": [],
        "slowdowns": [4.0],
        "slowed_steps": slowed_steps,
        "slowed_after_step_s": [after_s],
        "fault_delays_s": [0.0],
    }
    run = {"goodput_pct": 50.0, "badput": {}, "replay": replay}
    return run | {"baseline": run}


def test_a_straggler_is_replayed_step_by_step_as_it_was_measured(tmp_path):
    """A straggler whose slowdown faded (under a moving load) costs what its slowed steps did:
    the calculator charges each slow step and none of those back near the healthy median, and
    the window's mean alone slowed every replayed step to its end."""
    straggling = {}
    for name, steps in (
        ("mean", []),
        ("steady", [[4.0] * 75]),
        ("fading", [[4.0] * 45 + [1.0] * 40]),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_straggler_run(steps)))
        baseline = replay_file(str(path))["baseline"]
        assert baseline["rules"].keys() == {"baseline-ignore-straggler"}
        straggling[name] = baseline["predicted_badput_s"]["straggler_slowdown"]
    assert straggling["steady"] == pytest.approx(straggling["mean"], abs=1.0)
    # its 60 s window: 75 steps at 4× (0.8 s) for the mean; 45 at 4×, 40 back at 1× and the
    # window's last 16 s at the mean (20 steps) when fading: 10 fewer slow steps, 0.6 s each
    assert straggling["fading"] == pytest.approx(straggling["mean"] - 10 * 0.6, abs=1.0)


def test_after_a_straggler_the_job_steps_at_the_pace_its_run_kept(tmp_path):
    """Slower steps after the window, as the run measured them, are what the calculator then
    counts against: here 0.4 s steps, most of the run's, become its median, and the 4×
    window's steps (0.8 s) are charged their excess over them."""
    straggling = {}
    for after_s in (None, 0.4):
        path = tmp_path / f"after-{after_s}.json"
        path.write_text(json.dumps(_straggler_run([[4.0] * 75], after_s)))
        baseline = replay_file(str(path))["baseline"]
        straggling[after_s] = baseline["predicted_badput_s"]["straggler_slowdown"]
    # the window's 75 steps at 0.8 s: 0.6 s over the 0.2 s median, 0.4 s over the 0.4 s one
    assert straggling[None] == pytest.approx(75 * 0.6, rel=0.1)
    assert straggling[0.4] == pytest.approx(75 * 0.4, rel=0.1)


def _paced_run(paced: bool) -> dict:
    """The baseline without a fault, 100 steps of 0.2 s, saving every 20 steps: each step
    after a save ran 0.5 s and each save stalled the job 0.15 s, rank 0 0.05 s of it (a
    loaded machine's); ``paced``: the run measured them one by one."""
    costs = COSTS | {"remediations": [], "slowdowns": [], "fault_delays_s": []}
    if paced:
        after_save = {21, 41, 61, 81}
        steps = [[n, 0.5 if n in after_save else 0.2] for n in range(1, 101)]
        costs |= {
            "first_steps_s": steps,
            "first_saves_s": [[n, 0.05, 0.15] for n in (20, 40, 60, 80)],
        }
    replay = demo_run(0, 50.0)["replay"] | {"total_steps": 100, "faults": [], "costs": costs}
    run = {"goodput_pct": 50.0, "badput": {}, "replay": replay}
    return run | {"baseline": run}


def test_each_step_and_save_is_replayed_as_its_run_measured_it(tmp_path):
    """The calculator charges a loaded machine's slow steps (flagged or not) and every rank's
    save stall: a replay at one step time and rank 0's stall predicted neither."""
    booked = {}
    for paced in (False, True):
        path = tmp_path / f"paced-{paced}.json"
        path.write_text(json.dumps(_paced_run(paced)))
        baseline = replay_file(str(path))["baseline"]
        assert baseline["steps"] == 100
        booked[paced] = baseline["predicted_badput_s"]
    assert booked[False]["straggler_slowdown"] == 0.0
    # four steps 0.3 s over the 0.2 s median, and four saves of 0.15 s
    assert booked[True]["straggler_slowdown"] == pytest.approx(4 * 0.3, abs=0.01)
    assert booked[True]["checkpoint_save"] == pytest.approx(4 * 0.15, abs=0.01)


@pytest.mark.parametrize("forged", [[[1, -0.2]], [[1, "nan"]], [[1]]])
def test_a_forged_measured_step_is_one_line(tmp_path, forged):
    run = _paced_run(paced=True)
    run["replay"]["costs"]["first_steps_s"] = forged
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with pytest.raises(SimulateError, match="replay section is incomplete"):
        replay_file(str(path))


def test_saves_outside_the_steps_are_booked_as_saves_at_no_extra_time(tmp_path):
    """The first start's save of step 0 and the last step's at the end are inside the run's
    measured start-up and shutdown, where the calculator charges them as saves: the replay
    books them so, and the goodput stays what it was."""
    results = {}
    for outside in (False, True):
        run = _paced_run(paced=True)
        if outside:
            saves = run["replay"]["costs"]["first_saves_s"]
            run["replay"]["costs"]["first_saves_s"] = [[0, 0.1, 0.2], *saves, [100, 0.1, 0.2]]
        path = tmp_path / f"outside-{outside}.json"
        path.write_text(json.dumps(run))
        results[outside] = replay_file(str(path))["baseline"]
    before, after = (results[k]["predicted_badput_s"] for k in (False, True))
    assert after["checkpoint_save"] == pytest.approx(before["checkpoint_save"] + 0.4, abs=0.01)
    assert after["program_startup"] == pytest.approx(before["program_startup"] - 0.2, abs=0.01)
    assert after["job_down"] == pytest.approx(before["job_down"] - 0.2, abs=0.01)
    assert results[True]["predicted"] == results[False]["predicted"]


def _with_sdc(fingerprint_every: int) -> dict:
    """The replay section of a run whose replica on node-0 a bit flip struck at step 50."""
    sdc = {"step": 50, "action": "sdc", "node": "node-0", "ok": True}
    rollback = {"action": "restart", "relaunch_s": 2.0, "restore_s": 0.2, "startup_s": 3.0}
    return demo_run(0, 80.0)["replay"] | {
        "total_steps": 200,
        "fingerprint_every": fingerprint_every,
        "faults": [sdc],
        "costs": COSTS
        | {"remediations": [rollback | {"restored_step": 40}], "fault_delays_s": [0.0]},
    }


def test_an_sdc_is_rolled_back_where_the_run_compared_its_replicas(tmp_path):
    """The demo's job compares them every 20 steps: the split at 60 is rolled back. The
    baseline's period lies past its last step (a job without goodput compares none): it trains
    on, and its goodput is not charged for a rollback it never made."""
    run = {"goodput_pct": 80.0, "badput": {}, "replay": _with_sdc(20)} | {
        "baseline": {"goodput_pct": 80.0, "badput": {}, "replay": _with_sdc(210)}
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    result = replay_file(str(path))
    assert "numerical-rollback" in result["goodput"]["rules"]
    assert not any(rule.startswith("numerical") for rule in result["baseline"]["rules"])
    assert result["goodput"]["predicted_badput_s"]["numerical_rollback"] > 0
    assert result["baseline"]["predicted_badput_s"]["numerical_rollback"] == 0
    assert result["baseline"]["predicted_badput_s"]["wasted_progress"] == 0


def test_a_forged_fingerprint_period_is_one_line(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"goodput_pct": 80.0, "badput": {}, "replay": _with_sdc(0)}))
    with pytest.raises(SimulateError, match="fingerprint_every must be a positive step count"):
        replay_file(str(path))
