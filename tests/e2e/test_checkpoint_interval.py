"""Interval changes mid-run under the real stack: every rank checkpoints the same steps, and
after a crash the job resumes from the newest checkpoint every rank had persisted."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.examples.gpt import supervised_argv
from tests.examples.launch import TINY_MODEL
from tests.stack.helpers import EventTap, job_on_stack

pytestmark = pytest.mark.slow

JOB = "interval"
#: the controller's own (Young) interval commands are off: the test sends its own
NO_YOUNG = "controller:settings={checkpoint_interval={enabled=false}}"


def persisted_steps(tap: EventTap, before_ts: int) -> dict[int, set[int]]:
    """Per rank, the steps it reported persisted at or before ``before_ts``."""
    steps: dict[int, set[int]] = {}
    for event in tap.of(schemas.CheckpointPersisted):
        if event.ts <= before_ts:
            steps.setdefault(event.rank, set()).add(event.step)
    return steps


async def held_with_gap(tap: EventTap, gap: int, timeout_s: float = 180.0) -> int:
    """Wait until both ranks persisted two steps ``gap`` apart, a gap no other interval of
    the test produces (so an interval of ``gap`` is in force); the newer of those steps."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        steps = persisted_steps(tap, schemas.now_ns())
        both = steps.get(0, set()) & steps.get(1, set())
        found = [step for step in both if step - gap in both]
        if found:
            return max(found)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no two checkpoints {gap} steps apart on both ranks: {steps}")


@pytest.mark.timeout(900)  # two rank start-ups and ~70 steps: minutes on a loaded machine
async def test_after_interval_changes_a_crash_resumes_from_the_newest_persisted_step(
    tmp_path: Path,
) -> None:
    start = schemas.StartJob(
        job=JOB,
        argv=supervised_argv(100000, *TINY_MODEL),
        nodes=2,
        procs_per_node=1,
        spares=0,
        env={"GOODPUT_CKPT_EVERY": "10"},
    )
    async with job_on_stack(tmp_path / "stack", JOB, 2, start, "--service-set", NO_YOUNG) as (
        bus,
        tap,
    ):
        await tap.wait_for(
            lambda e: isinstance(e, schemas.StepDone) and e.step >= 12, 180, "step 12"
        )
        # one change, then another once the first is in force: 10 → 7 → 13 (the gaps 7 and
        # 13 tell each one apart from the others)
        for every in (7, 13):
            await bus.send_command(
                subjects.TRAINER, schemas.SetCheckpointInterval(job=JOB, every_steps=every)
            )
            await held_with_gap(tap, every)

        status = next(
            e
            for e in reversed(tap.events[:])
            if isinstance(e, schemas.JobStatus) and e.state == "running"
        )
        killed_ts = schemas.now_ns()
        os.kill(status.pids["node-1"][0], signal.SIGKILL)
        restored = [
            await tap.wait_for(
                lambda e, rank=rank: (
                    isinstance(e, schemas.CheckpointRestored)
                    and e.rank == rank
                    and e.ts > killed_ts
                ),
                180,
                f"rank {rank} restored",
            )
            for rank in (0, 1)
        ]

        before_kill = persisted_steps(tap, killed_ts)
        held_by_both = before_kill[0] & before_kill[1]
        newest = max(held_by_both)
        assert [r.step for r in restored] == [newest, newest], (restored, before_kill)
        # the ranks checkpointed the same steps: what one holds, the other holds too (the
        # killed rank may have persisted one more step than it could report)
        assert {s for s in before_kill[0] if s <= newest} == {
            s for s in before_kill[1] if s <= newest
        }

        # stop the job here, within this test's time, so that tearing the stack down on a
        # loaded machine does not wait for ranks to save and exit
        stop = schemas.Stop(job=JOB, reason="test done")
        await bus.send_command(subjects.ACTUATOR, stop)
        await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.state == "stopped", 300, "stopped"
        )
