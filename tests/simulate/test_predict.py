"""`goodput simulate predict` on a stored real demo run: a prediction for both setups that no
measured remediation cost moves.

data/demo-full.json is a full `goodput demo --compare-baseline --json` (2026-11-27, load
6-10), trimmed to what the simulator and the comparison read; it was recorded before the demo
reported ``checkpoint_gb``, which holds the size of each run's checkpoint file (9.7 MB)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from goodput.measure.accounting.categories import BADPUT_KEYS
from goodput.tools.simulate.demo_run import DEMO_THRESHOLDS
from goodput.tools.simulate.predict import predict_file
from goodput.tools.simulate.profile import SimulateError, load_profile
from goodput.tools.simulate.render import print_prediction
from goodput.tools.simulate.replay import replay_file
from tests.conftest import goodput_cli

DEMO = Path(__file__).parent / "data" / "demo-full.json"


def test_both_setups_of_a_real_demo_are_predicted() -> None:
    result = predict_file(str(DEMO), load_profile("local-bench"))
    assert result["profile"] == "local-bench"
    for setup in ("goodput", "baseline"):
        r = result[setup]
        assert math.isfinite(r["predicted"]) and 0 < r["predicted"] <= 100
        assert r["error"] == pytest.approx(abs(r["predicted"] - r["actual"]), abs=0.01)
        assert r["steps"] == 800
    # the real policy answers the scenario's faults as the run's controller did
    assert {"in-process-restart", "hot-swap", "scale-down", "scale-up"} <= set(
        result["goodput"]["rules"]
    )
    assert "baseline-wait-for-repair" in result["baseline"]["rules"]


def _costlier(run: dict) -> dict:
    """The run with every measured remediation, start-up and fault timing made much worse."""
    worse = copy.deepcopy(run)
    for setup in (worse, worse["baseline"]):
        costs = setup["replay"]["costs"]
        costs["first_startup_s"] += 30.0
        costs["shutdown_s"] += 10.0
        costs["decision_s"] += 1.0
        costs["checkpoint_stall_s"] += 1.0
        costs["slowdowns"] = [s * 2 for s in costs["slowdowns"]]
        for remediation in costs["remediations"]:
            remediation["relaunch_s"] += 20.0
            remediation["startup_s"] += 10.0
    return worse


def test_no_measured_remediation_cost_moves_the_prediction(tmp_path: Path) -> None:
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(_costlier(json.loads(DEMO.read_text()))))
    profile = load_profile("local-bench")
    assert predict_file(str(worse), profile) == predict_file(str(DEMO), profile)
    # ... while a replay prices exactly those
    replayed, replayed_worse = replay_file(str(DEMO)), replay_file(str(worse))
    for setup in ("predicted_goodput_pct", "baseline_predicted_goodput_pct"):
        assert replayed_worse[setup] < replayed[setup] - 5


def test_the_checkpoint_size_is_priced() -> None:
    profile = load_profile("local-bench")
    small = predict_file(str(DEMO), profile)
    large = predict_file(str(DEMO), profile, checkpoint_gb=1.0)
    # the baseline saves synchronously (to its node's disk, as the demo's does): a 100x larger
    # state stalls it
    save = "checkpoint_save"
    assert large["baseline"]["predicted_badput_s"][save] > (
        10 * small["baseline"]["predicted_badput_s"][save]
    )
    assert large["baseline"]["checkpoint_gb"] == 1.0


def test_a_saves_fixed_cost_is_priced_and_moves_the_interval() -> None:
    """The shim's save walks and plans the state's tensors before its copy: 13-27 ms for the
    demo's 9.7 MB state, against 2 ms at its bytes alone (and 7 microseconds as the overlapped
    save of the profile before). Priced at its bytes, the policy's Young interval was one
    step, and the prediction lost no step to a fault: 0.1 s of recomputed steps against the
    run's 6-12 s."""
    profile = load_profile("local-bench")

    def predicted(latency_s: float) -> dict:
        checkpoint = msgspec.structs.replace(profile.checkpoint, snapshot_latency_s=latency_s)
        run = predict_file(str(DEMO), msgspec.structs.replace(profile, checkpoint=checkpoint))
        return run["goodput"]["predicted_badput_s"]

    free, costly = predicted(0.0), predicted(0.02)
    assert costly["checkpoint_save"] > free["checkpoint_save"] + 2.0
    # fewer saves, each a longer way back from a fault
    assert costly["wasted_progress"] > free["wasted_progress"] + 2.0


@pytest.mark.parametrize("startup_s", [2.0, 4.4, 8.0, 15.6])
def test_the_demos_hang_is_found_whatever_the_start_up(startup_s: float) -> None:
    """The simulated sensor heard live ranks only once per heartbeat timeout, took that quiet
    for a stall of its own and deferred the hang's verdict: 5.2 s of detection here against
    the run's 2.0 s, and on another demo run, at start-ups under 12 s, a hang never found
    (the job hung to the horizon: 1 % goodput)."""
    profile = load_profile("local-bench")
    restart = msgspec.structs.replace(profile.restart, startup_s=startup_s)
    result = predict_file(str(DEMO), msgspec.structs.replace(profile, restart=restart))
    goodput = result["goodput"]
    assert goodput["rules"]["in-process-restart"] == 2  # the crash and the hang
    # the demo's hang floor (3 s) and a crash's detection: well under the 5.2 s of the defect
    bound = DEMO_THRESHOLDS.hang_min_timeout_s + 1.0
    assert goodput["predicted_badput_s"]["failure_detection"] < bound
    assert goodput["steps"] == 800


def test_json_output_names_both_setups_and_the_profile() -> None:
    out = json.loads(goodput_cli("simulate", "predict", str(DEMO), "--json").stdout)
    assert out["profile"] == "local-bench"
    for prefix in ("", "baseline_"):
        for key in ("predicted_goodput_pct", "actual_goodput_pct", "error_points"):
            assert isinstance(out[prefix + key], float)
    for setup in ("goodput", "baseline"):
        assert set(out[setup]) >= {"predicted", "actual", "error", "predicted_badput_s"}
        # the stored run was measured before `numerical_rollback` existed: it lacks that key
        predicted, measured = out[setup]["predicted_badput_s"], out[setup]["actual_badput_s"]
        assert set(predicted) == set(BADPUT_KEYS) == set(measured) | {"numerical_rollback"}
    table = goodput_cli("simulate", "predict", str(DEMO), "--profile", "large-gpu").stdout
    assert "profile large-gpu" in table and "baseline: predicted" in table


def test_a_category_the_run_did_not_measure_is_not_shown_as_a_measured_zero() -> None:
    """A run recorded before ``numerical_rollback`` existed charged its rollbacks elsewhere."""
    setup = {"predicted": 80.0, "actual": 81.0, "error": 1.0}
    result = {
        "profile": "local-bench",
        "goodput": setup
        | {
            "predicted_badput_s": {"numerical_rollback": 3.5, "wasted_progress": 1.0},
            "actual_badput_s": {"wasted_progress": 4.0},
        },
    }
    console = Console(record=True, width=160)
    print_prediction(result, console)
    cells = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in console.export_text().splitlines()
        if line.startswith("│")
    ]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["numerical rollback (s)"] == ["3.5", "n/a"]
    assert rows["steps lost and recomputed (s)"] == ["1.0", "4.0"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ('{"goodput_pct": 50}', "no 'replay' section"),
    ],
)
def test_a_bad_input_file_is_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    failed = goodput_cli("simulate", "predict", str(path), check=False)
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and message in failed.stderr, failed.stderr


def test_a_run_without_its_checkpoint_size_asks_for_it(tmp_path: Path) -> None:
    run = json.loads(DEMO.read_text())
    del run["replay"]["costs"]["checkpoint_gb"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with pytest.raises(SimulateError, match="--checkpoint-gb"):
        predict_file(str(path), load_profile("local-bench"))
    assert predict_file(str(path), load_profile("local-bench"), checkpoint_gb=0.01)["goodput"]
