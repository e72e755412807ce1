"""The demo's SDC end to end: a bit flipped in one of the two replicas by the demo's driver
(``goodput chaos sdc``), found at the replicas' next fingerprint and rolled back, the job then
ending bit-identical to an uninterrupted run; the baseline, which compares no replicas, trains
on with the flip and ends with other parameters.

The `sdc` scenario alone, short: the full scenario's SDC is the same fault
(``tests/e2e/test_demo_baseline.py`` plays it among the others).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput import schemas
from goodput.tools.demo.scenarios import FINGERPRINT_EVERY
from tests.conftest import goodput_cli

pytestmark = pytest.mark.slow

#: the SDC is due at step 40 (half of them), after the agreed fingerprints at 20 and 40, and
#: found at 60
STEPS = 80
RUN_TIMEOUT_S = 600


def _demo(tmp_path: Path, scenario: str, *extra: str) -> dict:
    result = goodput_cli(
        "demo",
        *("--scenario", scenario),
        *("--steps", str(STEPS)),
        *("--ckpt-every", "10"),
        "--json",
        *("--timeout", str(RUN_TIMEOUT_S)),
        *("--state-dir", str(tmp_path / scenario)),
        *("--html", ""),
        *extra,
        timeout=2 * RUN_TIMEOUT_S + 120,
    )
    return json.loads(result.stdout)


@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 300)
def test_the_demos_sdc_is_rolled_back_and_the_baselines_is_trained_on(tmp_path: Path) -> None:
    run = _demo(tmp_path, "sdc", "--compare-baseline")
    baseline = run["baseline"]
    for setup in (run, baseline):
        assert setup["state"] == "finished" and setup["steps"] == STEPS, setup
        [fault] = setup["faults"]
        assert (fault["fault"], fault["rank"], fault["ok"]) == ("sdc", 0, True), fault
        assert "sdc command" in fault["what"], fault
    sdc_step = run["faults"][0]["step"]
    # goodput: the split is seen at the first fingerprint after the flip; two replicas hold no
    # majority, so it names no node, and every rank rolls back to before the last agreed one
    [mismatch] = [s for s in run["signals"] if s["signal"] == "replica_mismatch"]
    assert mismatch["node"] == "" and mismatch["rank"] is None, mismatch
    agreed = mismatch["first_bad_step"] - 1
    assert agreed % FINGERPRINT_EVERY == 0 and 0 < agreed <= sdc_step, (mismatch, sdc_step)
    decision = next(d for d in run["decisions"] if d["signal_id"] == mismatch["signal_id"])
    assert decision["rule"] == "numerical-rollback", decision
    assert run["restarts"] >= 1
    # the baseline: the flip is trained on, unseen, and nothing is rolled back
    assert "trains on with the corrupted one" in baseline["faults"][0]["what"]
    numerical = [s for s in baseline["signals"] if s["signal"] in schemas.NUMERICAL_SIGNALS]
    assert numerical == [], numerical
    assert not any(d["rule"].startswith("numerical") for d in baseline["decisions"])
    # what the rollback bought: goodput's job ends as if the flip never happened, the
    # baseline's with the flip trained into its parameters
    reference = _demo(tmp_path, "none")
    assert reference["state"] == "finished" and reference["steps"] == STEPS
    assert run["final_params_sha256"] == reference["final_params_sha256"]
    assert baseline["final_params_sha256"] != reference["final_params_sha256"]
