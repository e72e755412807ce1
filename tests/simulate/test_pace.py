"""A profile at a run's pace: what this machine's CPUs pay grows with the load, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from goodput.tools.simulate.pace import BANDWIDTHS, SECONDS, at_pace, pace_factor
from goodput.tools.simulate.predict import predict_file
from goodput.tools.simulate.profile import Pace, load_profile

DEMO = Path(__file__).parent / "data" / "demo-full.json"
#: what no load on this machine changes: another service's, a scheduler's, the hardware's,
#: a period, a choice
ELSEWHERE = {
    "checkpoint": {"object_write_gbps", "object_read_gbps", "object_every"},
    "restart": {"hot_swap_provision_s", "gpu_reset_s"},
    "detection": {"host_probe_s"},
}


def test_every_cost_is_either_paced_or_named_as_not() -> None:
    """A cost added to the profile must be placed: priced at the run's load or not."""
    profile = load_profile("local-bench")
    for section in ("checkpoint", "restart", "detection"):
        fields = set(msgspec.structs.asdict(getattr(profile, section)))
        paced = set(SECONDS.get(section, ())) | set(BANDWIDTHS.get(section, ()))
        assert not paced & ELSEWHERE[section]
        assert fields == paced | ELSEWHERE[section], section


def test_a_loaded_machine_pays_more_for_its_own_work_only() -> None:
    profile = load_profile("large-gpu")
    slower = at_pace(profile, 2.0)
    assert slower.restart.startup_s == pytest.approx(2 * profile.restart.startup_s)
    assert slower.checkpoint.snapshot_gbps == pytest.approx(profile.checkpoint.snapshot_gbps / 2)
    assert slower.detection.event_latency_s == pytest.approx(2 * profile.detection.event_latency_s)
    for section, keys in ELSEWHERE.items():
        for key in keys:
            assert getattr(getattr(slower, section), key) == getattr(getattr(profile, section), key)
    assert at_pace(profile, 1.0) is profile


def test_the_factor_is_the_runs_step_over_the_same_setups() -> None:
    profile = msgspec.structs.replace(
        load_profile("large-gpu"), pace=Pace(warm_median_step_s=0.2, cold_median_step_s=0.1)
    )
    assert pace_factor(profile, "goodput", 0.3) == pytest.approx(1.5)
    assert pace_factor(profile, "baseline", 0.3) == pytest.approx(3.0)
    assert pace_factor(msgspec.structs.replace(profile, pace=None), "goodput", 0.3) == 1.0
    assert pace_factor(profile, "goodput", None) == 1.0


def _with_medians(tmp_path: Path, goodput_s: float, baseline_s: float) -> str:
    """The stored demo (recorded before runs reported their median step) with medians."""
    run = json.loads(DEMO.read_text())
    run["replay"]["costs"]["median_step_time_s"] = goodput_s
    run["baseline"]["replay"]["costs"]["median_step_time_s"] = baseline_s
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return str(path)


def test_a_run_that_met_more_load_is_predicted_lower(tmp_path: Path) -> None:
    """The stored demo ran at load 6-10. Against a profile measured at its own pace it is
    priced as the profile says; against one measured on a quiet machine (steps half as long)
    its start-ups cost twice as much, and its goodput is lower."""
    profile = load_profile("local-bench")
    run = _with_medians(tmp_path, 0.6, 0.5)
    as_measured = predict_file(run, profile, follow_load=False)["baseline"]
    own = msgspec.structs.replace(
        profile, pace=Pace(warm_median_step_s=0.6, cold_median_step_s=0.5)
    )
    quiet = msgspec.structs.replace(
        profile, pace=Pace(warm_median_step_s=0.3, cold_median_step_s=0.25)
    )
    at_own, at_load = (predict_file(run, p)["baseline"] for p in (own, quiet))
    assert at_own["pace"] == 1.0
    assert at_own["predicted"] == as_measured["predicted"]
    assert at_load["pace"] == 2.0
    assert at_load["predicted"] < at_own["predicted"] - 3
    startup = "program_startup"
    assert at_load["predicted_badput_s"][startup] > 1.5 * at_own["predicted_badput_s"][startup]


def test_a_run_without_its_median_step_is_priced_at_the_profiles_pace() -> None:
    profile = msgspec.structs.replace(
        load_profile("local-bench"), pace=Pace(warm_median_step_s=0.1, cold_median_step_s=0.1)
    )
    assert predict_file(str(DEMO), profile)["baseline"]["pace"] == 1.0
