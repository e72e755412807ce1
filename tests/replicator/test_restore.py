"""Lose a node's volume, then its peers too: RestoreToNode refills it from the nearest tier,
bit-exact, and the checkpoint engine loads it."""

from __future__ import annotations

import shutil

from goodput import schemas, subjects
from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.format import write_clean_record
from tests.ckpt.helpers import assert_bit_exact
from tests.replicator.conftest import (
    JOB,
    Harness,
    assert_refilled_from_store,
    ckpt_cli,
    file_checksums,
    in_store,
    make_state,
    peer_copies,
    write_checkpoint,
)

STEP = 100


async def test_restore_from_peer_then_from_object_store(gcs_harness: Harness) -> None:
    h, reps = gcs_harness, gcs_harness.replicators
    reps.start("node-0", block="b0")
    reps.start("node-1", block="b0")
    reps.start("node-2", block="b1")
    saved = write_checkpoint(reps.volume("node-0"), STEP, seed=7)
    expected = file_checksums(saved)

    snapshot = await h.until(
        lambda s: (
            peer_copies(s, "node-0", STEP) == {"node-1", "node-2"} and in_store(s, "node-0", STEP)
        ),
        what="replication to a close and a distant peer, and the backup",
    )
    newest = snapshot.newest_complete()
    assert newest is not None and newest.step == STEP
    assert newest.complete_in("peer") and newest.complete_in("object_store")

    table = ckpt_cli(h, "ls").stdout
    assert "newest complete: 100" in table and "node-1←node-0" in table

    # the node loses its volume: the close peer (same block) refills it
    reps.lose_volume("node-0")
    result = await h.restore("node-0")
    assert result.ok, result.detail
    assert "from peer" in result.detail
    event = h.restored_event("node-0")
    assert (event.tier, event.step, event.rank) == ("peer", STEP, -1)
    assert event.bytes == sum(
        f.stat().st_size for f in saved.iterdir() if f.name != "manifest.json"
    )
    assert file_checksums(saved) == expected

    # the peers are lost too (process and disk): the object store refills it
    for peer in ("node-1", "node-2"):
        await h.lose_node(peer)
        shutil.rmtree(reps.node_dir(peer))
    await assert_refilled_from_store(h, "node-0", STEP, saved, expected, seed=7)


async def test_restore_with_nothing_saved_is_a_no_op(dir_harness: Harness) -> None:
    dir_harness.replicators.start("node-0")
    result = await dir_harness.restore("node-0")
    assert result.ok and "nothing to restore" in result.detail
    missing = await dir_harness.restore("node-0", step=5)
    assert not missing.ok and "not complete" in missing.detail

    # a command naming another node is refused, not executed on the wrong volume
    wrong = schemas.RestoreToNode(job=JOB, node="node-9")
    await dir_harness.bus.send_command(subjects.node_target(subjects.REPLICATOR, "node-0"), wrong)
    refused = await dir_harness.events.wait_for(
        lambda e: isinstance(e, schemas.ActionResult) and e.command_id == wrong.command_id
    )
    assert not refused.ok and "serves node-0" in refused.detail


async def test_a_rollbacks_restore_fills_the_volume_with_the_clean_step_kept_on_the_peer(
    dir_harness: Harness,
) -> None:
    """A quarantined node's spare starts empty and the newest step holds the numerical
    fault: the peer kept the known-clean step past its own retention (one copy kept), and the
    rollback's restore fetches that one, the step the ranks will restore."""
    h, reps = dir_harness, dir_harness.replicators
    eager = {"gc_interval_s": "1", "gc_require": "[]", "keep_peer": "1", "keep_local": "1"}
    reps.start("node-0", **eager)
    reps.start("node-1", **eager)
    for node in ("node-0", "node-1"):  # every node's ranks record the step known clean
        write_clean_record(reps.volume(node), STEP)
    for step in (STEP, 2 * STEP, 3 * STEP):  # each node's ranks save (data parallel)
        for node in ("node-0", "node-1"):
            write_checkpoint(reps.volume(node), step, seed=step)
        await h.until(
            lambda s, step=step: peer_copies(s, "node-0", step) == {"node-1"},
            what=f"step {step} copied to the peer",
        )
    # the peer's GC ran (it deleted step 200, neither its newest nor known clean) and kept
    # the clean step, which its own retention (one copy) would have deleted
    snapshot = await h.until(
        lambda s: not peer_copies(s, "node-0", 2 * STEP),
        what="a garbage collection of the peer's copies",
    )
    assert peer_copies(snapshot, "node-0", STEP) == {"node-1"}
    reps.lose_volume("node-0")
    result = await h.restore("node-0", before_step=STEP + 1)  # the step after the clean one
    assert result.ok, result.detail
    assert h.restored_event("node-0").step == STEP
    with CheckpointEngine(reps.volume("node-0"), keep_last=0) as engine:
        step, state = engine.restore()
    assert step == STEP
    assert_bit_exact(make_state(STEP), state)
    nothing = await h.restore("node-0", before_step=STEP)  # none older: nothing to fetch
    assert nothing.ok and "nothing to restore" in nothing.detail
    refused = await h.restore("node-0", step=3 * STEP, before_step=3 * STEP)
    assert not refused.ok and "not before step 300" in refused.detail
