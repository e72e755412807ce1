"""A profile from benchmark JSON: every number from its field, missing input named."""

from __future__ import annotations

import json

import pytest

from goodput.tools.simulate.calibrate import calibrate
from goodput.tools.simulate.profile import SimulateError, load_profile

# the fields `goodput bench ckpt|restore|recovery --json` print (values: any plausible run)
CKPT = {
    "size_gb": 2.0,
    "methods": {
        "goodput": {"stall_s": 0.001, "write_gbps": 2.0, "restore_gbps": 1.25},
        "goodput_blocking": {"stall_s": 0.25},
        "torch_save": {"write_gbps": 0.4},
    },
}
RESTORE = {"size_gb": 1.0, "replication_gbps": 0.8, "peer_s": 1.6, "object_store_s": 4.0}
RECOVERY = {
    "cold": {
        "relaunch_s": 0.7,
        "startup_s": 20.0,
        "first_step_s": 1.0,
        "detect_s": 0.3,
        "decide_s": 0.01,
        "checkpoint_stall_s": 0.0125,
        "checkpoint_persist_s": 0.05,
        "checkpoint_gb": 0.02,
        "shutdown_s": 1.5,
        "pace_step_s": 0.2,
    },
    "load_1m_before": 9.5,
}


def bench_dir(tmp_path, **drop):
    for name, data in (("ckpt", CKPT), ("restore", RESTORE), ("recovery", RECOVERY)):
        if name not in drop:
            (tmp_path / f"{name}.json").write_text(json.dumps(data))
    return tmp_path


def test_calibrated_profile_loads_and_cites_its_sources(tmp_path):
    text = calibrate(str(bench_dir(tmp_path)))
    path = tmp_path / "local.toml"
    path.write_text(text)
    profile = load_profile(str(path))
    # the shim's blocking save: 2 GB / 0.25 s, and the example job's 0.02 GB save took
    # 12.5 ms, 2.5 ms of it its copy at 8 GB/s
    assert profile.checkpoint.snapshot_gbps == pytest.approx(8.0)
    assert profile.checkpoint.snapshot_latency_s == pytest.approx(0.01)
    # its persist took 50 ms, 10 ms of it its write at the 2 GB/s of goodput's 1 GB save
    assert profile.checkpoint.latency_s == pytest.approx(0.04)
    assert profile.restart.shutdown_s == pytest.approx(1.5)
    assert profile.checkpoint.object_write_gbps == pytest.approx(0.4)
    assert profile.restart.startup_s == pytest.approx(21.0)
    assert "# recovery.json cold.relaunch_s" in text
    assert "load average 9.5" in text


def test_warm_restart_costs_come_from_the_warm_mode(tmp_path):
    """``bench recovery --mode warm`` prices the warm path; without it the cold figure, said so."""
    cold_only = calibrate(str(bench_dir(tmp_path)))
    assert "rejoin_s = 0.7  # no warm mode" in cold_only
    warm = {"relaunch_s": 0.8, "startup_s": 0.1, "first_step_s": 0.4}
    (tmp_path / "recovery.json").write_text(json.dumps({**RECOVERY, "warm": warm}))
    path = tmp_path / "warm.toml"
    path.write_text(calibrate(str(tmp_path)))
    restart = load_profile(str(path)).restart
    assert (restart.rejoin_s, restart.warm_startup_s) == pytest.approx((0.8, 0.5))
    assert restart.standby_ready_s == pytest.approx(21.0)  # a cold rank's start-up


def test_the_profile_records_the_pace_it_was_measured_at(tmp_path):
    """The example job's step time in both modes: what a prediction measures a run's load
    against. A cold-only recovery has no reference for a run beside standbys: no pace."""
    cold_only = tmp_path / "cold.toml"
    cold_only.write_text(calibrate(str(bench_dir(tmp_path))))
    assert load_profile(str(cold_only)).pace is None
    warm = {"relaunch_s": 0.8, "startup_s": 0.1, "first_step_s": 0.4, "pace_step_s": 0.3}
    (tmp_path / "recovery.json").write_text(json.dumps({**RECOVERY, "warm": warm}))
    text = calibrate(str(tmp_path))
    (tmp_path / "warm.toml").write_text(text)
    pace = load_profile(str(tmp_path / "warm.toml")).pace
    assert pace is not None
    assert (pace.warm_median_step_s, pace.cold_median_step_s) == pytest.approx((0.3, 0.2))
    assert "cold_median_step_s = 0.2  # recovery.json cold.pace_step_s" in text


def test_repeated_benches_give_each_field_its_median_and_range(tmp_path):
    """The VM is noisy: three recovery runs within an hour measured a cold start-up of 4.5,
    5.5 and 7.4 s."""
    runs = []
    for n, startup in enumerate((7.0, 4.0, 5.0)):
        where = tmp_path / f"run{n}"
        where.mkdir()
        cold = {**RECOVERY["cold"], "startup_s": startup}
        (where / "recovery.json").write_text(json.dumps({**RECOVERY, "cold": cold}))
        for name, data in (("ckpt", CKPT), ("restore", RESTORE)):
            (where / f"{name}.json").write_text(json.dumps(data))
        runs.append(str(where))
    text = calibrate(runs)
    path = tmp_path / "median.toml"
    path.write_text(text)
    profile = load_profile(str(path))
    assert profile.restart.startup_s == pytest.approx(6.0)  # 5 s + the first step's 1 s
    assert "median of 3: 5-8" in text
    # a field every run agrees on says nothing more
    assert "snapshot_gbps = 8.0  # ckpt.json size_gb / methods.goodput_blocking" in text
    assert "median of" not in text.split("snapshot_gbps", 1)[1].splitlines()[0]


def test_a_missing_benchmark_is_named(tmp_path):
    with pytest.raises(SimulateError, match=r"recovery\.json.*goodput bench recovery --json"):
        calibrate(str(bench_dir(tmp_path, recovery=True)))
