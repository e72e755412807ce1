"""The main job end to end: every remediation, and the same faults lived through by a job
without goodput (synchronous torch.save, whole-job restarts, no spares, no comparison of the
replicas: its SDC is trained on).

What is asserted holds however loaded the machine is: faults fire at training steps and, for
goodput's run, lost nodes come back at training steps too (``DemoFault.repair_at``), so each
remediation first appears in the scenario's order. Not asserted, because load changes them:
how many in-job restarts a fault costs (a lost node's ranks may be seen to exit before its host
reports), crash-loop back-offs, and the extra decisions a loaded machine adds (seen: during a
scale-up's 27 s graceful relaunch the sensor read the stopping rank as a missed heartbeat and
the host monitor's stale rank count twice as a crash, so the node was then replaced as a
repeat offender).
``tests/demo/test_scenario_timing.py`` plays the decisions at several speeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import goodput_cli

pytestmark = [pytest.mark.slow, pytest.mark.longest]

#: every remediation, in the order the full scenario first calls for each
REMEDIATIONS = [
    "in-process-restart",
    "numerical-rollback",  # the SDC: 2 replicas, no majority, both roll back
    "evict-straggler-hot-swap",
    "hot-swap",
    "scale-down",
    "scale-up",
]
BASELINE_RULES = {"baseline-restart-job", "baseline-ignore-straggler", "baseline-wait-for-repair"}


def _rules(run: dict) -> set[str]:
    return {d["rule"] for d in run["decisions"]}


def _story(run: dict) -> str:
    """What a failed assertion prints: each fault as played, then the decisions' rules in
    order with repeats folded (pytest cuts a long list short)."""
    rules = [d["rule"] for d in run["decisions"]]
    folded = [rule for i, rule in enumerate(rules) if i == 0 or rules[i - 1] != rule]
    faults = "; ".join(f"step {f['step']} {f['fault']}: {f['what']}" for f in run["faults"])
    return f"faults: {faults}\nrules: {' → '.join(folded)}"


#: one run of the full scenario takes about three minutes on an idle machine, and over twenty
#: with a dozen other jobs on two cores (steps of 1.5 s instead of 0.2 s): room for the latter
RUN_TIMEOUT_S = 2400
#: half the demo's 800, in half the suite's time: every fault still has its room (the first
#: node loss, due 64 steps after the straggler, waits for the sensor to flag it: on a quiet
#: machine those 64 slowed steps took 27 s, under the ~25-30 s the sensor's 11 slowed steps
#: and 20 s hold take, and the node's hot swap replaced the straggler unflagged)
STEPS = 400


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)
def test_the_full_scenario_against_the_baseline(tmp_path: Path) -> None:
    result = goodput_cli(
        "demo",
        "--compare-baseline",
        "--json",
        *("--steps", str(STEPS)),
        *("--timeout", str(RUN_TIMEOUT_S)),
        *("--state-dir", str(tmp_path / "demo")),
        *("--html", str(tmp_path / "report")),
        timeout=2 * RUN_TIMEOUT_S + 240,
    )
    run = json.loads(result.stdout)
    baseline = run["baseline"]
    assert run["state"] == baseline["state"] == "finished"
    assert run["steps"] == baseline["steps"] == run["total_steps"] == STEPS
    # the same faults, on the same ranks, at the same training progress
    planned = [(f["fault"], f["rank"]) for f in run["faults"]]
    assert planned == [(f["fault"], f["rank"]) for f in baseline["faults"]]
    assert planned == [
        ("kill-rank", 1),
        ("hang-rank", 0),
        ("sdc", 0),
        ("slow-rank", 1),
        ("fail-node", 0),
        ("fail-node", 1),
    ]
    assert all(f["ok"] for f in run["faults"] + baseline["faults"])
    # goodput used every remediation, each node change in the scenario's order; the baseline
    # only restarted, waited and ignored
    rules = [d["rule"] for d in run["decisions"]]
    assert set(rules) >= set(REMEDIATIONS), _story(run)
    assert sorted(REMEDIATIONS, key=rules.index) == REMEDIATIONS, _story(run)
    # a node loss is never met by restarting the whole job (a refused hot swap once left the
    # job without ranks until job_down)
    assert "restart-job" not in rules, _story(run)
    # the lost nodes came back once goodput's job had trained on without them
    repaired = [f["repaired_at_step"] for f in run["faults"] if f["fault"] == "fail-node"]
    assert repaired[0] >= 0.80 * STEPS and repaired[1] >= 0.70 * STEPS, run["faults"]
    # scaled down to one replica, then back up to two. The size it ends at is not asserted: on a
    # heavily loaded machine a finishing rank falls silent (its shim stops heartbeats) seconds
    # before its exit is reported, and the sensor's missed heartbeat drops it at the last step.
    # (Open defect: with one replica left that stops the job, and the test fails on its state.)
    sizes = run["world_size_history"]
    assert 1 in sizes and 2 in sizes[sizes.index(1) :], sizes
    assert _rules(baseline) == BASELINE_RULES, _story(baseline)  # and a fixed ckpt interval
    # the baseline compares no replicas: its SDC is trained on, unseen
    [sdc] = [f for f in baseline["faults"] if f["fault"] == "sdc"]
    assert "trains on with the corrupted one" in sdc["what"], sdc
    assert not [s for s in baseline["signals"] if s["signal"] == "replica_mismatch"]
    assert set(baseline["world_size_history"]) == {2}
    # both reports cover the same categories; goodput's is the higher
    assert set(run["badput"]) == set(run["baseline_badput"])
    assert run["goodput_pct"] > run["baseline_goodput_pct"] > 0
    assert run["goodput_gain_points"] == pytest.approx(
        run["goodput_pct"] - run["baseline_goodput_pct"], abs=0.01
    )
    assert Path(run["html_report"]).is_file() and Path(baseline["html_report"]).is_file()
