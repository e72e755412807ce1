"""A real job of 2 nodes x 2 ranks under the local backend (issue 36): each node's first rank
publishes its node's steps rolled up, one ``StepsDone`` per node per step (after each rank's
first, which carries its launch's trace), and a follower reads every rank's steps."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, EmbeddedNats
from tests.actuator.local_actuator import JOB, Actuator, running_actuator
from tests.stack.helpers import EventTap

STEPS = 3
# Ranks under the real shim; a gloo group, as a job has, starts the steps once every rank's
# shim (and so its node's aggregator) is up.
RANK_SCRIPT = f"""\
import sys, time
import torch
import torch.distributed as dist
from goodput.shim import TrainerShim
from goodput.shim.link import wait_for_bus

shim = TrainerShim.from_env()
print("bus connected:", wait_for_bus(shim.link, 60), flush=True)
dist.init_process_group("gloo")
state = {{"w": torch.zeros(4)}}
for step in range(1, {STEPS} + 1):
    state["w"] += 1
    dist.barrier()
    shim.step_done(step, 0.01, tokens=8, loss=1.0)
    time.sleep(0.2)
dist.barrier()
shim.finish(state, {STEPS})
dist.destroy_process_group()
sys.exit(shim.exit_code)
"""


@pytest.fixture
async def rig(
    tmp_path: Path, nats_server: EmbeddedNats
) -> AsyncIterator[tuple[Bus, EventTap, Actuator]]:
    async with running_actuator(nats_server, tmp_path) as running:
        yield running


async def _stored_steps(bus: Bus) -> list[tuple[str, schemas.Event]]:
    kinds = (schemas.kind_of(schemas.StepDone), schemas.kind_of(schemas.StepsDone))
    filters = [f for kind in kinds for f in subjects.events_of_kind(JOB, kind)]
    stored: list[tuple[str, schemas.Event]] = []
    for subject in filters:
        reader = await bus.js.pull_subscribe(subject, stream=subjects.EVENTS_STREAM)
        try:
            while True:
                try:
                    messages = await reader.fetch(100, timeout=1)
                except TimeoutError:
                    break
                stored += [(m.subject, schemas.decode_event(m.data)) for m in messages]
        finally:
            await reader.unsubscribe()
    return stored


async def test_each_node_publishes_its_ranks_steps_in_one_event_per_step(
    rig, tmp_path: Path
) -> None:
    bus, tap, _ = rig
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    start = schemas.StartJob(
        job=JOB,
        argv=[sys.executable, str(script)],
        nodes=2,
        procs_per_node=2,
        spares=0,
        env={"OMP_NUM_THREADS": "1"},
    )
    await bus.send_command(subjects.ACTUATOR, start)
    await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state in ("finished", "failed"),
        timeout_s=300,
        what="the job's end",
    )
    stored = await _stored_steps(bus)
    # a rank's first step carries its launch's trace (``traceparent``): it goes on its own
    assert Counter(subject for subject, _ in stored) == {
        **{f"gp.{JOB}.evt.step.{rank}": 1 for rank in range(4)},
        f"gp.{JOB}.evt.steps.0": STEPS - 1,  # node-0: ranks 0 and 1, rolled up by rank 0
        f"gp.{JOB}.evt.steps.2": STEPS - 1,  # node-1: ranks 2 and 3, rolled up by rank 2
    }
    for subject, event in stored:
        if ".steps." in subject:
            assert isinstance(event, schemas.StepsDone) and len(event.steps) == 2
        else:
            assert isinstance(event, schemas.StepDone) and event.step == 1
    # a follower reads every rank's steps, each once, as the ranks reported them
    reported = sorted((e.rank, e.step, e.node) for e in tap.of(schemas.StepDone))
    nodes = {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}
    assert reported == [(r, s, nodes[r]) for r in range(4) for s in range(1, STEPS + 1)]
