"""The recovery benchmark's reading of the events: the newest step every rank persisted."""

from __future__ import annotations

import os
import subprocess
import sys

from goodput import schemas
from goodput.tools.bench.recovery import newest_held_by_all, rss_mib, survivors_after


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
