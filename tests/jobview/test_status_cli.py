"""`goodput status --once` against a real nats-server: stored events and live heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, EmbeddedNats
from tests.conftest import goodput_cli

JOB = "job-view"
NODES = ["node-0", "node-1", "node-2"]


def job_events() -> list[schemas.Event]:
    events: list[schemas.Event] = [
        schemas.JobStatus(
            job=JOB, state="running", attempt=1, world_size=2, procs_per_node=1,
            active_nodes=NODES[:2], spare_nodes=NODES[2:], pids={"node-0": [4100], "node-1": [4101]},
        ),
        schemas.RankStarted(job=JOB, node="node-0", rank=0, local_rank=0, world_size=2, pid=4100,
                            attempt=1),
        schemas.RankStarted(job=JOB, node="node-1", rank=1, local_rank=0, world_size=2, pid=4101,
                            attempt=1),
    ]  # fmt: skip
    for number in range(1, 6):
        events += [
            schemas.StepDone(job=JOB, node=f"node-{rank}", rank=rank, step=number, step_time_s=0.1,
                             tokens=512, loss=3.0 - number / 10, world_size=2)
            for rank in (0, 1)
        ]  # fmt: skip
    events += [
        schemas.CheckpointPersisted(job=JOB, node="node-0", rank=0, step=5, path="p", bytes=10,
                                    duration_s=0.2),
        schemas.Signal(job=JOB, signal="straggler", node="node-1", rank=1, detail="1.8x median"),
        schemas.Decision(job=JOB, signal_id="s1", policy="builtin", rule="watch_straggler",
                         reason="first offence"),
        # rank 0's plan after a rescale from 2 data-parallel ranks (the keep-global-batch rule)
        schemas.TrainingPlan(job=JOB, node="node-0", rank=0, step=5, world_size=2, dp_size=2,
                             global_batch=12, micro_batch=1, accumulation_steps=6, lr=3e-3,
                             rescaled_from_dp=1, callbacks=["keep_global_batch"]),
    ]  # fmt: skip
    return events


async def _beat(bus: Bus, stop: asyncio.Event) -> None:
    """Rank 0 heartbeats (core NATS, never stored) until ``stop``."""
    while not stop.is_set():
        beat = schemas.Heartbeat(job=JOB, node="node-0", rank=0, pid=4100, step=5, busy="save")
        await bus.publish_core(subjects.heartbeat(JOB, "node-0", 0), beat)
        await asyncio.sleep(0.1)


async def test_status_once_json_shows_the_job_from_its_events_and_heartbeats(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    await bus.emit_many(job_events())
    await bus.emit(schemas.Signal(job="other-job", signal="hang", node="elsewhere"))
    stop = asyncio.Event()
    beating = asyncio.create_task(_beat(bus, stop))
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "goodput.tools.cli.main", "status", "--once", "--json",
            "--job", JOB, "--nats-url", nats_server.url, "--state-dir", str(tmp_path / "none"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await beating
    assert process.returncode == 0, err.decode()
    document = json.loads(out)
    assert document["services"] == [] and document["caught_up"] is True
    view = document["job_view"]
    assert (view["job"], view["state"], view["attempt"], view["world_size"]) == (
        JOB,
        "running",
        1,
        2,
    )
    assert view["events"] == len(job_events())
    assert view["step"]["step"] == 5 and view["step"]["steps_per_s"] > 0
    roles = {node["name"]: (node["role"], node["ranks"], node["pids"]) for node in view["nodes"]}
    assert roles == {
        "node-0": ("active", [0], [4100]),
        "node-1": ("active", [1], [4101]),
        "node-2": ("spare", [], []),
    }
    assert view["ranks"][0]["busy"] == "save"  # only a live heartbeat says so
    assert [(c["tier"], c["step"]) for c in view["checkpoints"]] == [("persisted", 5)]
    assert [s["signal"] for s in view["signals"]] == ["straggler"]
    assert [d["rule"] for d in view["decisions"]] == ["watch_straggler"]
    assert view["goodput"] is not None and 0 < view["goodput"]["goodput_pct"] <= 100
    plan = view["plan"]
    assert (plan["global_batch"], plan["accumulation_steps"], plan["lr"]) == (12, 6, 3e-3)
    assert (plan["rescaled_from_dp"], plan["callbacks"]) == (1, ["keep_global_batch"])


async def test_status_once_renders_the_jobs_nodes_as_text(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    await bus.emit_many(job_events())
    result = await asyncio.to_thread(
        goodput_cli,
        "status", "--once", "--job", JOB, "--nats-url", nats_server.url,
        "--state-dir", str(tmp_path / "none"),
    )  # fmt: skip
    expected = ("job job-view", "running", *NODES, "spare", "straggler", "watch_straggler",
                "12 per step", "lr 0.003", "from 1 to 2", "keep_global_batch")  # fmt: skip
    for text in expected:
        assert text in result.stdout, result.stdout


def test_status_without_a_stack_or_job_says_what_to_do(tmp_path: Path) -> None:
    result = goodput_cli("status", "--state-dir", str(tmp_path), check=False)
    assert result.returncode == 1 and "--job" in result.stderr
