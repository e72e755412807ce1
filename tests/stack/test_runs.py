"""A job name run again: a new run with clean accounting; a clash with a live run: refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from goodput import schemas
from goodput.state_dir import StateDir
from goodput.tools.stack.runs import running_clash
from tests.conftest import goodput_cli
from tests.processes import stop

JOB = "again"
#: the machine may be loaded: a rank starved for seconds is not what these tests are about
SLACK = "sensor:thresholds={heartbeat_timeout_s=60.0,hang_min_timeout_s=120.0}"
NOW = 1_800_000_000 * 10**9

# A rank that reports STEPS steps (no restore: each run trains from scratch) and finishes.
RANK_SCRIPT = """
import os, sys, time
import torch
from goodput.shim import TrainerShim
from goodput.shim.link import wait_for_bus

shim = TrainerShim.from_env()
wait_for_bus(shim.link)
state = {"w": torch.zeros(4)}
steps = int(os.environ["STEPS"])
for step in range(1, steps + 1):
    state["w"] += 1
    shim.step_done(step, 0.01, tokens=8, loss=1.0)
    time.sleep(float(os.environ.get("STEP_S", "0")))
shim.finish(state, steps)
"""


def _status(state: str, ts: int) -> schemas.JobStatus:
    return schemas.JobStatus(
        job=JOB, state=state, attempt=2, world_size=1, procs_per_node=1, ts=ts, run_id="r1"
    )  # type: ignore[arg-type]


def _actuator(started_ts: int, ts: int = NOW, healthy: bool = True) -> schemas.ServiceHealth:
    return schemas.ServiceHealth(
        job=JOB,
        service="actuator",
        instance="a",
        pid=1,
        healthy=healthy,
        started_ts=started_ts,
        ts=ts,
    )


def test_a_live_run_clashes_and_names_its_attempt_and_start() -> None:
    run = schemas.RunStarted(job=JOB, run_id="r1", command_id="c", ts=NOW - 60 * 10**9)
    clash = running_clash(JOB, _status("running", NOW - 10**9), run, _actuator(NOW - 10**11), NOW)
    assert clash == (
        f"job {JOB} is already running (attempt 2, started 2027-01-15 07:59:00 UTC); "
        "stop it with goodput down or pick --job"
    )


def test_what_a_gone_run_left_behind_is_no_clash() -> None:
    old_actuator = _actuator(NOW - 10**11)
    for state in ("finished", "failed", "stopped"):
        assert running_clash(JOB, _status(state, NOW - 10**9), None, old_actuator, NOW) is None
    assert running_clash(JOB, None, None, old_actuator, NOW) is None
    running = _status("running", NOW - 10**10)
    # written by an actuator that is gone: the new one started after it
    assert running_clash(JOB, running, None, _actuator(NOW - 10**9), NOW) is None
    # the actuator's record is stale or unhealthy, or there is none
    stale = _actuator(NOW - 10**11, ts=NOW - 60 * 10**9)
    assert running_clash(JOB, running, None, stale, NOW) is None
    sick = _actuator(NOW - 10**11, healthy=False)
    assert running_clash(JOB, running, None, sick, NOW) is None
    assert running_clash(JOB, running, None, None, NOW) is None


def _run(state: Path, script: Path, steps: int, *flags: str, step_s: float = 0.0):
    return goodput_cli(
        "run",
        "--nodes",
        "1",
        "--spares",
        "0",
        "--json",
        "--timeout",
        "240",
        "--state-dir",
        str(state),
        "--job",
        JOB,
        "--env",
        f"STEPS={steps}",
        "--env",
        f"STEP_S={step_s}",
        "--service-set",
        SLACK,
        *flags,
        "--",
        sys.executable,
        str(script),
        check=False,
        timeout=300,
    )


def test_a_second_run_of_a_job_name_runs_and_reports_only_itself(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    state = tmp_path / "stack"
    try:
        first = _run(state, script, 6, "--keep-stack")
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["steps"] == 6
        # the stack stays up, its actuator has run the job, the stream holds the first run
        second = _run(state, script, 3, "--keep-stack")
        assert second.returncode == 0, second.stderr
        summary = json.loads(second.stdout)
        assert (summary["state"], summary["steps"], summary["restarts"]) == ("finished", 3, 0)
        assert summary["world_size_history"] == [1]
        report = json.loads(
            goodput_cli("report", "--state-dir", str(state), "--job", JOB, "--json").stdout
        )
        whole = json.loads(
            goodput_cli(
                "report", "--state-dir", str(state), "--job", JOB, "--json", "--all-runs"
            ).stdout
        )
        # the report is the second run's alone: its steps, and none of the first run's time —
        # its tail and the gap between the runs are "job down" only when every run is asked for
        assert (report["steps_productive"], report["interruptions"]) == (3, 0), report
        assert whole["start_ts_ns"] < report["start_ts_ns"]
        assert whole["total_s"] > report["total_s"]
        assert whole["badput"]["job_down"] > report["badput"].get("job_down", 0.0)
    finally:
        goodput_cli("down", "--state-dir", str(state), check=False)


def test_a_second_run_while_the_first_is_running_is_refused_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    state = tmp_path / "stack"
    goodput_cli(
        "up",
        "--state-dir",
        str(state),
        "--job",
        JOB,
        "--nodes",
        "1",
        "--wait",
        "60",
        "--service-set",
        SLACK,
    )
    try:
        first = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "goodput.tools.cli.main",
                "run",
                "--nodes=1",
                "--spares=0",
                f"--state-dir={state}",
                f"--job={JOB}",
                "--env=STEPS=1000",
                "--env=STEP_S=0.2",
                "--",
                sys.executable,
                str(script),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while not StateDir(state).ranks_record(JOB).exists():  # written once ranks are launched
                assert time.monotonic() < deadline, "the first run never started its rank"
                time.sleep(0.5)
            second = _run(state, script, 3)
            assert second.returncode == 1
            lines = second.stderr.strip().splitlines()
            assert lines[-1].startswith(f"goodput run: job {JOB} is already running (attempt 1")
            assert "goodput down or pick --job" in lines[-1] and "Traceback" not in second.stderr
        finally:
            stop(first, timeout_s=120)
    finally:
        goodput_cli("down", "--state-dir", str(state), check=False)
