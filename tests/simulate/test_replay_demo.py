"""The simulator against reality: a short real `goodput demo --compare-baseline`, replayed.

The replay sees only the run's setup, its faults (the steps they fired at) and unit costs
measured from its events — never its goodput or badput — and must predict both runs' goodput
within 3 points of what the calculator measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import goodput_cli

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 2400


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 400)
def test_replay_predicts_the_demo_within_three_points(tmp_path: Path) -> None:
    demo = goodput_cli(
        "demo",
        "--compare-baseline",
        "--json",
        *("--steps", "400"),
        *("--timeout", str(RUN_TIMEOUT_S)),
        *("--state-dir", str(tmp_path / "demo")),
        *("--html", ""),
        timeout=2 * RUN_TIMEOUT_S + 240,
    )
    run_file = tmp_path / "run.json"
    run_file.write_text(demo.stdout)
    run = json.loads(demo.stdout)
    assert run["replay"]["faults"] and run["baseline"]["replay"]["faults"]
    replayed = json.loads(goodput_cli("simulate", "replay", str(run_file), "--json").stdout)
    assert replayed["actual_goodput_pct"] == pytest.approx(run["goodput_pct"], abs=0.01)
    assert replayed["error_points"] <= 3.0, replayed["goodput"]
    assert replayed["baseline_error_points"] <= 3.0, replayed["baseline"]
