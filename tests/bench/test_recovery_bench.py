"""The recovery benchmark's reading of the events: the newest step every rank persisted, and
the job's steady figures (its saves' stall, its shutdown)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from goodput import schemas
from goodput.bus.job_events import JobEvents
from goodput.tools.bench import job_waits
from goodput.tools.bench.job_waits import newest_held_by_all, survivors_after
from goodput.tools.bench.recovery import (
    STEADY,
    most_trials,
    rss_mib,
    shared_global_batch,
    steady_costs,
)
from goodput.tools.simulate import messages as msg
from tests.conftest import goodput_cli

NS = 1_000_000_000


def persisted(rank: int, step: int, ts: int) -> schemas.CheckpointPersisted:
    return schemas.CheckpointPersisted(
        job="j", ts=ts, node=f"node-{rank}", rank=rank, step=step, path="p", bytes=1, duration_s=0
    )


def test_the_newest_step_counts_only_when_every_rank_persisted_it_in_time():
    events = [persisted(0, 10, 1), persisted(1, 10, 2), persisted(0, 20, 3), persisted(1, 20, 9)]
    assert newest_held_by_all(events, world_size=2, before_ts=5) == 10  # rank 1's 20 is later
    assert newest_held_by_all(events, world_size=2, before_ts=9) == 20
    assert newest_held_by_all(events[:1], world_size=2, before_ts=9) == -1


def test_resident_memory_of_a_process_and_of_one_that_is_gone():
    assert rss_mib(os.getpid()) > 1  # this interpreter, with pytest loaded
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert rss_mib(child.pid) is None


def test_survivors_are_the_ranks_that_rejoined_in_process_after_the_decision():
    def rejoined(rank: int, ts: int, ok: bool = True) -> schemas.RankRejoined:
        return schemas.RankRejoined(
            job="j", ts=ts, node="node-0", rank=rank, pid=100 + rank, attempt=1, ok=ok
        )

    events = [rejoined(0, 1), rejoined(1, 5), rejoined(2, 6, ok=False), rejoined(3, 7)]
    assert survivors_after(events, after_ts=2) == [1, 3]  # rank 0's is an earlier trial's


def test_the_jobs_steady_figures_come_from_its_own_events():
    """Two saves of 10 and 30 ms; the last step at 4 s, the last rank out at 5.5 s (the stop's
    final save and persist in between)."""
    events = [
        msg.rank_started("node-0", 0, 0, 2, 1),
        *(msg.step_done("node-0", 0, k * NS, k, 0.5, 0.5, 2) for k in (1, 2, 3, 4)),
        msg.checkpoint_saved("node-0", 2 * NS, 2, 0.01, 0.008),
        msg.checkpoint_saved("node-0", 4 * NS, 4, 0.03, 0.008),
        msg.checkpoint_persisted("node-0", 5 * NS, 4, 0.4),
        msg.rank_exited("node-1", 1, 5_500_000_000, 1, exit_code=0, reason="stop"),
    ]
    steady = steady_costs(events)
    assert set(steady) == set(STEADY)
    assert steady["checkpoint_stall_s"] == 0.02
    assert steady["checkpoint_gb"] == 0.008
    assert steady["checkpoint_persist_s"] == 0.4
    assert steady["shutdown_s"] == 1.5
    assert steady["step_time_s"] == 0.5


def test_more_kills_than_a_job_takes_are_refused_in_one_line():
    """Five warm trials struck node-0 a third time: a repeat offender, replaced by the spare,
    and the benchmark then waited 120 s for a restore that was not the one it measures."""
    assert (most_trials(warm=True), most_trials(warm=False)) == (3, 4)
    refused = goodput_cli("bench", "recovery", "--trials", "4", check=False)
    assert refused.returncode == 2
    assert "repeat offender" in refused.stderr and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1


async def test_the_pace_is_the_median_step_once_nothing_else_happens(monkeypatch):
    """Steps before the job is steady (no checkpoint held by every rank yet, a standby still
    being built) do not count; of those after, the median: one slow step is a burst."""
    monkeypatch.setattr(job_waits, "PACE_S", 0.3)
    log = JobEvents(None, "j")  # type: ignore[arg-type]  # fed by hand: no bus

    def status(standbys: dict[str, list[int]]) -> schemas.JobStatus:
        return schemas.JobStatus(
            job="j", state="running", attempt=1, world_size=2, procs_per_node=1,
            active_nodes=["node-0", "node-1"], standbys=standbys,
        )  # fmt: skip

    async def job() -> None:
        log.events.append(status({"node-0": [7]}))
        for rank in (0, 1):
            log.events.append(persisted(rank, 10, schemas.now_ns()))
        log.events.append(msg.step_done("node-0", 0, schemas.now_ns(), 11, 2.0, 2.0, 2))
        await asyncio.sleep(0.1)  # node-1's standby still importing torch
        log.events.append(status({"node-0": [7], "node-1": [8]}))
        await asyncio.sleep(0.05)
        for step, seconds in enumerate((0.2, 0.25, 0.9, 0.21, 0.22)):
            log.events.append(
                msg.step_done("node-0", 0, schemas.now_ns(), 12 + step, seconds, seconds, 2)
            )

    feeding = asyncio.create_task(job())
    assert await job_waits.pace_step_s(log, standbys=True) == 0.22
    await feeding


def test_the_example_jobs_batch_is_shared_by_four_ranks_per_node():
    """12 micro-batches cannot be shared by 8 ranks: every rank of that job failed at start."""
    assert [shared_global_batch(world) for world in (2, 4, 6, 8)] == [12, 12, 12, 16]
