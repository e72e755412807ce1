"""A replicator follows the index instead of reading it whole every poll: one consumer kept
for its life, not one per snapshot; and when that consumer is lost it reads the index again
and goes on indexing (a real replicator process)."""

from __future__ import annotations

import asyncio
import time

import pytest

from goodput import subjects
from goodput.checkpoint.index.index import IndexSnapshot
from tests.replicator.conftest import Harness, write_checkpoint

pytestmark = pytest.mark.timeout(120)

STREAM = f"KV_{subjects.CKPT_INDEX_BUCKET}"
NODE = "node-a"


async def consumers(h: Harness) -> set[str]:
    return {c.name for c in await h.bus.js.consumers_info(STREAM)}


def own_steps(snapshot: IndexSnapshot) -> set[int]:
    return {c.step for c in snapshot.copies if c.holder == NODE and c.tier == "local"}


async def test_one_consumer_for_its_life_and_a_complete_read_when_it_is_lost(
    dir_harness: Harness,
) -> None:
    h = dir_harness
    write_checkpoint(h.replicators.volume(NODE), step=1, seed=1, megabytes=1)
    h.replicators.start(NODE)  # polls every 0.2 s
    await h.until(lambda s: own_steps(s) == {1}, what="step 1 indexed")

    # ten polls later: still the one consumer (a complete read per poll makes one each time)
    first = await consumers(h)
    await asyncio.sleep(2.0)
    assert await consumers(h) == first and len(first) == 1

    (lost,) = first
    await h.bus.js.delete_consumer(STREAM, lost)
    write_checkpoint(h.replicators.volume(NODE), step=2, seed=2, megabytes=1)
    await h.until(lambda s: own_steps(s) == {1, 2}, what="step 2 indexed after the loss")
    log = h.replicators.state_dir / f"replicator-{NODE}.log"
    deadline = time.monotonic() + 10
    while "reading the whole index again" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, h.replicators.log(NODE)
        await asyncio.sleep(0.2)
    replaced = await consumers(h)
    assert len(replaced) == 1 and replaced != first
