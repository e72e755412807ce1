"""deploy/slurm/goodput.sbatch without Slurm: the commands it runs, with what, and how it
ends, under the fakes of :mod:`.fake_slurm` (the real cluster: ``test_real_slurm.py``).

The recipe keeps the allocation when a node fails (``--no-kill``), runs the agents in one step
that outlives a lost node, takes its sizes from Slurm's variables (overridable), checkpoints
with the engine on node-local storage, stops everything it started on every way out, and
requeues only on `goodput run`'s "cannot continue" status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodput.launch.exit_reason import (
    RUN_CANNOT_CONTINUE_EXIT_CODE,
    RUN_FAILED_EXIT_CODE,
    RUN_FINISHED_EXIT_CODE,
    RUN_USAGE_EXIT_CODE,
)
from tests.deploy.slurm import fake_slurm

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "deploy" / "slurm" / "goodput.sbatch"
TRAIN = ["python", "train.py", "--steps", "10"]
JOB_ID = "4242"


def _slurm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What slurmd gives a batch script of ``sbatch --nodes=3`` on nodes without GPUs."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        fake_slurm.install(bin_dir)
    env = {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": f"{REPO / 'libs'}:{REPO / 'services'}",
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "node-local"),
        "FAKE_SLURM_LOG": str(tmp_path / "calls.jsonl"),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NODELIST": "gpn[0-2]",
        "SLURM_NNODES": "3",
        "SLURM_NTASKS_PER_NODE": "1",
    }
    return {**env, **extra}


def _run(tmp_path: Path, **extra: str) -> tuple[int, list[dict]]:
    done = subprocess.run(
        ["bash", str(RECIPE), *TRAIN],
        env=_slurm_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, _calls(tmp_path)


def _calls(tmp_path: Path) -> list[dict]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _goodput(calls: list[dict], command: str) -> list[list[str]]:
    return [c["argv"] for c in calls if c["cmd"] == "goodput" and command in c["argv"][:1]]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_the_allocation_outlives_a_lost_node_and_may_be_requeued() -> None:
    directives = [
        line.split()[1] for line in RECIPE.read_text().splitlines() if line.startswith("#SBATCH")
    ]
    assert "--no-kill" in directives  # a failed node does not end the job
    assert "--requeue" in directives  # a lost batch host (the supervisor's) does


def test_the_agents_run_in_one_step_that_a_lost_node_does_not_end(tmp_path: Path) -> None:
    code, calls = _run(tmp_path)
    assert code == 0
    (step,) = [c for c in calls if c["cmd"] == "srun"]
    assert {"--no-kill", "--whole", "--ntasks-per-node=1", "--kill-on-bad-exit=0"} <= set(
        step["options"]
    )
    assert "--nodes=3" in step["options"]
    assert step["argv"][:4] == ["goodput", "agent", "--job", "train"]


def test_the_job_checkpoints_with_the_engine_on_node_local_storage(tmp_path: Path) -> None:
    code, calls = _run(tmp_path)
    assert code == 0
    (step,) = [c for c in calls if c["cmd"] == "srun"]
    # the agents' state is node-local: the volume the actuator hands each rank is in it
    assert Path(_flag(step["argv"], "--state-dir")).is_relative_to(tmp_path / "node-local")
    (run,) = _goodput(calls, "run")
    # neither a directory nor a mode of the job's own: the node's volume, the engine (sharded,
    # async); the torch-save mode on a shared directory is gone
    assert "--env" not in run[: run.index("--")]
    (up,) = _goodput(calls, "up")
    # the central services only: every node's agent runs that node's replicator, and a
    # replicator of the batch script's own would be a phantom peer on one of those nodes' disks
    assert _flag(up, "--nodes") == "0"
    # a new node's volume is filled by its replicator before the launch: no waiver
    assert not any("restore_timeout_s" in arg for arg in up)
    assert "actuator:backend=agent" in up
    assert run[run.index("--") + 1 :] == TRAIN


def test_a_checkpoint_directory_of_the_users_own_reaches_the_ranks(tmp_path: Path) -> None:
    code, calls = _run(tmp_path, GOODPUT_CKPT_DIR="/local/ckpt")
    assert code == 0
    (run,) = _goodput(calls, "run")
    assert _flag(run, "--env") == "GOODPUT_CKPT_DIR=/local/ckpt"


def test_every_process_gets_the_jobs_checkpoint_key_kept_across_runs(tmp_path: Path) -> None:
    """The agents' replicators and the ranks sign and check with it: one path on every node
    (the shared home), the same key for a requeued run (SLURM_RESTART_COUNT=1)."""
    code, first = _run(tmp_path)
    assert code == 0
    (key,) = {c["env"]["GOODPUT_CKPT_KEY_FILE"] for c in first}
    assert Path(key).is_relative_to(tmp_path / "home")
    assert Path(key).stat().st_mode & 0o777 == 0o600
    secret = Path(key).read_bytes()
    (tmp_path / "calls.jsonl").unlink()
    code, again = _run(tmp_path, SLURM_RESTART_COUNT="1")
    assert code == 0
    assert {c["env"]["GOODPUT_CKPT_KEY_FILE"] for c in again} == {key}
    assert Path(key).read_bytes() == secret


@pytest.mark.parametrize(
    ("slurm", "nodes", "spares", "procs"),
    [
        ({}, "2", "1", "1"),
        ({"SLURM_NTASKS_PER_NODE": "4"}, "2", "1", "4"),
        ({"SLURM_GPUS_ON_NODE": "8"}, "2", "1", "8"),
        ({"SLURM_GPUS_ON_NODE": "8", "GOODPUT_PROCS_PER_NODE": "2"}, "2", "1", "2"),
        ({"GOODPUT_SPARES": "0"}, "3", "0", "1"),
        ({"GOODPUT_NODES": "2", "GOODPUT_SPARES": "0"}, "2", "0", "1"),
    ],
)
def test_sizes_come_from_slurm_unless_overridden(
    tmp_path: Path, slurm: dict[str, str], nodes: str, spares: str, procs: str
) -> None:
    code, calls = _run(tmp_path, **slurm)
    assert code == 0
    (run,) = _goodput(calls, "run")
    assert (_flag(run, "--nodes"), _flag(run, "--spares"), _flag(run, "--procs-per-node")) == (
        nodes,
        spares,
        procs,
    )


@pytest.mark.parametrize(
    ("outcome", "requeued"),
    [
        (RUN_FINISHED_EXIT_CODE, False),
        (RUN_FAILED_EXIT_CODE, False),
        (RUN_USAGE_EXIT_CODE, False),
        (RUN_CANNOT_CONTINUE_EXIT_CODE, True),
    ],
)
def test_only_a_job_goodput_cannot_continue_is_requeued_and_nothing_is_left(
    tmp_path: Path, outcome: int, requeued: bool
) -> None:
    code, calls = _run(tmp_path, FAKE_RUN_EXIT=str(outcome))
    assert code == outcome  # Slurm records goodput run's own status
    requeues = [c["argv"] for c in calls if c["cmd"] == "scontrol"]
    assert requeues == ([["requeue", JOB_ID]] if requeued else [])
    _assert_stopped_everything(tmp_path, calls)


def test_a_cancelled_job_stops_what_it_started(tmp_path: Path) -> None:
    """scancel: SIGTERM to the batch script while the job trains; the trap stops the rest."""
    script = subprocess.Popen(
        ["bash", str(RECIPE), *TRAIN],
        env=_slurm_env(tmp_path, FAKE_RUN_EXIT="wait"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not _goodput(_calls(tmp_path), "run"):
        assert time.monotonic() < deadline and script.poll() is None, script.stderr
        time.sleep(0.1)
    script.send_signal(signal.SIGTERM)
    assert script.wait(60) == 128 + signal.SIGTERM
    calls = _calls(tmp_path)
    assert not [c for c in calls if c["cmd"] == "scontrol"]
    _assert_stopped_everything(tmp_path, calls)


def _assert_stopped_everything(tmp_path: Path, calls: list[dict]) -> None:
    assert len(_goodput(calls, "up")) == 1
    (down,) = _goodput(calls, "down")
    state_dir = _flag(down, "--state-dir")
    # one state directory per run of the job: a requeued job shares nothing with the run before
    assert state_dir.endswith(f"/slurm-{JOB_ID}-0")
    long_running = [c for c in calls if c["cmd"] in ("srun", "nats-server", "service")]
    long_running += [c for c in calls if c["cmd"] == "goodput" and c["argv"][0] == "run"]
    assert {c["cmd"] for c in long_running} >= {"srun", "nats-server", "service"}
    # the orphaned service is the batch script's child (a child subreaper): Slurm's process
    # tracking follows it, whatever the trap manages before KillWait
    (srun,) = [c for c in calls if c["cmd"] == "srun"]
    (service,) = [c for c in calls if c["cmd"] == "service"]
    assert service["ppid"] == srun["ppid"]
    assert [c for c in long_running if _alive(c["pid"])] == []
    for call in calls:  # the bus the recipe made is the one every command was given
        assert call["env"].get("GOODPUT_STATE_DIR") == state_dir
        assert call["env"].get("GOODPUT_NATS_URL") == "nats://gpn0:4222"
        assert len(call["env"].get("GOODPUT_NATS_TOKEN", "")) == 48
