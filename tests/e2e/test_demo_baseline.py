"""The main job end to end: every remediation, and the same faults lived through by a job
without goodput (synchronous torch.save, whole-job restarts, no spares)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import goodput_cli

pytestmark = pytest.mark.slow

REMEDIATIONS = {"in-job-restart", "evict-straggler-hot-swap", "hot-swap", "scale-down", "scale-up"}
BASELINE_RULES = {"baseline-restart-job", "baseline-ignore-straggler", "baseline-wait-for-repair"}


def _rules(run: dict) -> set[str]:
    return {d["rule"] for d in run["decisions"]}


@pytest.mark.timeout(1500)  # two runs of the full scenario: about six minutes here
def test_the_full_scenario_against_the_baseline(tmp_path: Path) -> None:
    result = goodput_cli(
        "demo",
        "--compare-baseline",
        "--json",
        *("--state-dir", str(tmp_path / "demo")),
        *("--html", str(tmp_path / "report")),
        timeout=1500,
    )
    run = json.loads(result.stdout)
    baseline = run["baseline"]
    assert run["state"] == baseline["state"] == "finished"
    assert run["steps"] == baseline["steps"] == run["total_steps"] == 800
    # the same faults, on the same ranks, at the same training progress
    planned = [(f["fault"], f["rank"]) for f in run["faults"]]
    assert planned == [(f["fault"], f["rank"]) for f in baseline["faults"]]
    assert planned == [
        ("kill-rank", 1),
        ("hang-rank", 0),
        ("slow-rank", 1),
        ("fail-node", 0),
        ("fail-node", 1),
    ]
    assert all(f["ok"] for f in run["faults"] + baseline["faults"])
    # goodput used every remediation; the baseline only restarted, waited and ignored
    assert _rules(run) >= REMEDIATIONS, _rules(run)
    assert 1 in run["world_size_history"] and run["world_size_history"][-1] == 2
    assert _rules(baseline) == BASELINE_RULES  # and a fixed checkpoint interval
    assert set(baseline["world_size_history"]) == {2}
    # both reports cover the same categories; goodput's is the higher
    assert set(run["badput"]) == set(run["baseline_badput"])
    assert run["goodput_pct"] > run["baseline_goodput_pct"] > 0
    assert run["goodput_gain_points"] == pytest.approx(
        run["goodput_pct"] - run["baseline_goodput_pct"], abs=0.01
    )
    assert Path(run["html_report"]).is_file() and Path(baseline["html_report"]).is_file()
