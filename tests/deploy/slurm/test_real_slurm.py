"""deploy/slurm/goodput.sbatch, verbatim, on a real Slurm (issue 37): slurmctld and three
slurmds in their own network namespaces (:mod:`.cluster`), a tiny CPU gloo job on 2 active
nodes and a spare, checkpoints on each node's own disk and no shared checkpoint directory.

A node whose link is cut, and (separately) a node whose slurmd is killed, is survived inside
the allocation (Slurm marks it down and keeps the job: ``--no-kill``; the supervisor swaps in
the spare, which restores from a peer) and the job completes; after the job ends, and after
a ``scancel``, no process of it is left (every process the job started carries the
submission's marker variable). Skips, saying why, without
root, namespaces or the Slurm binaries (``apt-get install -y slurm-wlm munge``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from goodput.checkpoint.format.layout import STEP_PREFIX
from tests.deploy.slurm.cluster import (
    NODE_INTERFACE,
    SLURMD_TIMEOUT_S,
    Cluster,
    cluster,
    marked,
    until,
)

#: minutes each (a whole job on two shared cores): started first; every wait inside is bounded,
#: and the sum of the bounds is under this timeout, so teardown always runs
pytestmark = [pytest.mark.slow, pytest.mark.longest, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "deploy" / "slurm" / "goodput.sbatch"
MARK = "GOODPUT_SLURM_TEST_MARK"
STEPS = 3000
CKPT_EVERY = 10
#: the bound on a whole job: start, a hot swap, 300 steps on two shared cores
JOB_WAIT_S = 600
#: two ranks, three agents, the supervisor and Slurm share this machine's two cores with the
#: rest of the suite: a heartbeat starved for 5 s is no lost rank here
SERVICE_SETS = "sensor:thresholds={straggler_ratio=100.0,heartbeat_timeout_s=20.0}"
TRAIN = [
    "python", "-m", "goodput.examples.gpt.supervised", "--steps", str(STEPS), "--log-every",
    "0", "--n-layer", "1", "--d-model", "32", "--n-head", "2", "--seq-len", "32",
]  # fmt: skip


def _environment(root: Path, tag: str) -> dict[str, str]:
    """The submitting user's environment: the repository's Python first on PATH, the
    supervisor's state on the "shared" filesystem, node-local storage as TMPDIR."""
    python_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{python_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": f"{REPO / 'libs'}:{REPO / 'services'}",
        "PYTHONUNBUFFERED": "1",
        "GOODPUT_STATE_DIR": str(root / "shared" / "state"),
        "TMPDIR": str(root / "node-local"),
        "GOODPUT_CKPT_EVERY": str(CKPT_EVERY),
        "GOODPUT_SERVICE_SETS": SERVICE_SETS,
        "GLOO_SOCKET_IFNAME": NODE_INTERFACE,
        MARK: tag,
    }


def _submit(slurm: Cluster, tag: str, result: Path) -> str:
    done = slurm.client(
        "sbatch", "--parsable", "--nodes=3", f"--output={slurm.root / 'job.out'}",
        f"--chdir={REPO}", str(RECIPE), *TRAIN, "--result", str(result),
        env=_environment(slurm.root, tag),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _job_output(slurm: Cluster) -> str:
    path = slurm.root / "job.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _checkpoints(slurm: Cluster, node: str) -> list[Path]:
    """The step directories on ``node``'s own disk."""
    local = slurm.node(node).local_dir
    return [p for p in local.rglob("*") if p.is_dir() and p.name.startswith(STEP_PREFIX)]


def _logs(slurm: Cluster):
    def text() -> str:
        return f"{slurm.logs()}\n--- job.out\n{_job_output(slurm)[-6000:]}"

    return text


def _ended(slurm: Cluster, job: str) -> bool:
    return slurm.job(job).get("JobState") not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING")


#: how long Slurm may take to end the job's processes on a node that returns after the job
#: ended: it learns of them only from the node's registration, which slurmctld asks of a node
#: once in about 20 pings (MAX_REG_FREQUENCY), a ping every SlurmdTimeout / 3 (ping_nodes.c);
#: 120 s here was once too short (ci32: the mended node's processes still ran 118 s on)
ORPHANS_ENDED_S = 20 * SLURMD_TIMEOUT_S / 3 + 2 * SLURMD_TIMEOUT_S


def _nothing_left(slurm: Cluster, tag: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while left := marked(MARK, tag):
        if time.monotonic() > deadline:
            lines = "\n".join(left)
            raise AssertionError(f"{timeout_s:.0f} s on, the job left:\n{lines}\n{_logs(slurm)()}")
        time.sleep(1)


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:10]


@pytest.mark.parametrize("fault", ["link cut", "slurmd killed"])
def test_a_lost_node_is_survived_inside_the_allocation_and_nothing_is_left(
    tmp_path: Path, tag: str, fault: str
) -> None:
    """``link cut``: gpn1 drops off the network (its processes run on, cut off). ``slurmd
    killed``: Slurm loses gpn1's slurmd while the job's processes run on; when it is started
    again (as systemd would), Slurm ends the job's processes there, the node being no longer
    the job's. Either way Slurm marks gpn1 down and keeps the job."""
    with cluster(tmp_path, 3, dict(os.environ)) as slurm:
        logs = _logs(slurm)
        result = tmp_path / "shared" / "result.json"
        started = time.monotonic()
        job = _submit(slurm, tag, result)
        # a checkpoint past the first: the lost rank has something to restore from a peer
        until(lambda: len(_checkpoints(slurm, "gpn1")) >= 2, "gpn1's second checkpoint", 300, logs)
        trained_s = time.monotonic() - started
        cut = time.monotonic()
        if fault == "link cut":
            slurm.cut_link("gpn1")
        else:
            slurm.kill_slurmd("gpn1")
        until(
            lambda: slurm.node_states().get("gpn1", "").startswith("down"),
            "Slurm to mark gpn1 down",
            SLURMD_TIMEOUT_S * 4,
            logs,
        )
        assert slurm.job(job).get("JobState") == "RUNNING", logs()  # --no-kill: kept
        if fault == "slurmd killed":
            slurm.start_slurmd(slurm.node("gpn1"))
        until(lambda: "decision hot-swap" in _job_output(slurm), "the hot swap", 120, logs)
        until(lambda: _ended(slurm, job), "the job's end", JOB_WAIT_S, logs)
        ended_s = time.monotonic() - cut
        fields = slurm.job(job)
        if fault == "link cut":
            slurm.mend_link("gpn1")  # Slurm then ends what the cut-off node still ran
        _nothing_left(slurm, tag, ORPHANS_ENDED_S)
        print(f"{fault}: checkpoint 2 after {trained_s:.0f} s; fault to end {ended_s:.0f} s")
        assert (fields.get("JobState"), fields.get("ExitCode")) == ("COMPLETED", "0:0"), logs()
        assert "job finished" in _job_output(slurm), logs()
        summary = json.loads(result.read_text())  # rank 0's, at the end
        assert summary["completed"] and summary["steps"] == STEPS, summary
        # the last attempt resumed from a checkpoint (step > 0), which the spare had only from
        # its peers: no filesystem is shared between the nodes' checkpoint volumes
        assert summary["first_step"] > 0, summary
        # the spare trained on: it restored the lost rank from a peer, then saved on its disk
        assert _checkpoints(slurm, "gpn2"), logs()


def test_a_cancelled_job_leaves_no_process(tmp_path: Path, tag: str) -> None:
    with cluster(tmp_path, 3, dict(os.environ)) as slurm:
        logs = _logs(slurm)
        job = _submit(slurm, tag, tmp_path / "shared" / "result.json")
        until(lambda: "running" in _job_output(slurm), "the job running", 300, logs)
        cancelled = time.monotonic()
        assert slurm.client("scancel", job).returncode == 0
        # KillWait (30 s) bounds what Slurm lets the trap do before SIGKILL
        _nothing_left(slurm, tag, 60)
        print(f"nothing left {time.monotonic() - cancelled:.0f} s after scancel")
        # Slurm's own bookkeeping of the end (COMPLETING) may take a little longer
        until(
            lambda: slurm.job(job).get("JobState") in ("CANCELLED", ""),
            "Slurm to record the job cancelled",
            60,
            logs,
        )
