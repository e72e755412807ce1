"""The simulator against reality: a short real `goodput demo --compare-baseline`, replayed.

The replay sees only the run's setup, its faults (the steps they fired at, how long after)
and costs measured from its events — never its goodput or badput — and must predict both
runs' goodput within 3 points of what the calculator measured. The scenario is the shortest
that both setups can finish and that relaunches in every way a node loss does: goodput scales
down and back up, the baseline waits for the repair (`docs/BENCHMARKS.md` has the `full`
scenario's figures, whose baseline alone waits over a minute for repairs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import goodput_cli

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 300


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_replay_predicts_the_demo_within_three_points(tmp_path: Path) -> None:
    demo = goodput_cli(
        "demo",
        *("--scenario", "scale-down-up"),
        "--compare-baseline",
        "--json",
        *("--steps", "30"),
        *("--ckpt-every", "5"),
        *("--timeout", str(RUN_TIMEOUT_S)),
        *("--state-dir", str(tmp_path / "demo")),
        *("--html", ""),
        timeout=2 * RUN_TIMEOUT_S + 60,
    )
    run_file = tmp_path / "run.json"
    run_file.write_text(demo.stdout)
    run = json.loads(demo.stdout)
    for setup in (run, run["baseline"]):
        assert setup["state"] == "finished"
        assert [f["action"] for f in setup["replay"]["faults"]] == ["fail-node"]
        assert setup["replay"]["costs"]["remediations"], "every relaunch is measured"
    replayed = json.loads(goodput_cli("simulate", "replay", str(run_file), "--json").stdout)
    assert replayed["actual_goodput_pct"] == pytest.approx(run["goodput_pct"], abs=0.01)
    # the real policy decided the same remediations as the run's controller did
    assert {"scale-down", "scale-up"} <= set(replayed["goodput"]["rules"])
    assert "baseline-wait-for-repair" in replayed["baseline"]["rules"]
    assert replayed["error_points"] <= 3.0, replayed["goodput"]
    assert replayed["baseline_error_points"] <= 3.0, replayed["baseline"]
