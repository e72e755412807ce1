"""One keep count per node volume: the ranks' engine keeps as many checkpoints there as the
node's replicator does (its ``keep_local``, published in the volume's retention record), so
neither deletes what the other keeps. A real replicator process, a real CheckpointEngine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from goodput.checkpoint.engine import CheckpointEngine, list_checkpoints
from goodput.checkpoint.format import read_retention_record
from goodput.checkpoint.index.retention import DEFAULT_KEEP
from tests.replicator.conftest import Harness, make_state

#: more than the engine's own default: an engine keeping its own count would delete one more
KEEP_LOCAL = DEFAULT_KEEP["local"] + 1


def steps_on(volume: Path) -> list[int]:
    return sorted(info.step for info in list_checkpoints(volume))


async def published_keep(volume: Path) -> int | None:
    for _ in range(100):
        record = read_retention_record(volume)
        if record is not None:
            return record.keep
        await asyncio.sleep(0.2)
    raise AssertionError(f"no retention record in {volume}")


@pytest.mark.slow
async def test_the_engine_keeps_as_many_checkpoints_as_the_replicator(
    dir_harness: Harness,
) -> None:
    reps = dir_harness.replicators
    reps.start("node-0", keep_local=str(KEEP_LOCAL), gc_interval_s="1")
    volume = reps.volume("node-0")
    steps = range(1, KEEP_LOCAL + 4)
    # the engine's own count (keep_last) is the default: the replicator's is what it keeps
    with CheckpointEngine(volume, writer_threads=1) as engine:
        assert engine.save(make_state(steps[0], 1), steps[0]).wait(60).committed
        assert await published_keep(volume) == KEEP_LOCAL
        for step in steps[1:]:
            assert engine.save(make_state(step, 1), step).wait(60).committed
            engine.wait_until_idle()
    kept = list(steps[-KEEP_LOCAL:])
    await dir_harness.until(
        lambda s: sorted(v.step for v in s.views() if v.complete_in("local")) == kept,
        what=f"the index holding local copies of {kept} only",
    )
    assert steps_on(volume) == kept
    await asyncio.sleep(3)  # three more GC rounds: the replicator keeps as many
    assert steps_on(volume) == kept
