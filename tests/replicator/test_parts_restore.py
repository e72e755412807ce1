"""Parts of a checkpoint sharded across nodes, moved by real replicators: each node's part
goes to its peers and the object store; a node lost during the global commit leaves the
previous step newest; a spare takes a lost node's part (from a peer, then from the object
store when the peers are gone too); a part with a bad checksum is fetched again alone; a
scale-down stages beside the node's own part only the parts its new ranks read (every part
when its records' placement is not predictable) and sets aside the node's part of a newer
step that can never complete."""

from __future__ import annotations

import shutil

from goodput.checkpoint.format import read_manifest, step_dir, step_dirs
from goodput.checkpoint.format.parts import aside_part_dir, staged_parts
from goodput.checkpoint.index.gc import orphaned_staged_parts
from goodput.checkpoint.index.index import IndexSnapshot
from tests.replicator.conftest import Harness
from tests.replicator.parts import expected_part, files_of, write_parts

STEP, LATER, NEWER = 10, 20, 30


def spread(snapshot: IndexSnapshot, step: int, parts: int) -> bool:
    """Every part of ``step`` on two peers and in the object store."""
    view = snapshot.view(step)
    return view.part_count == parts and all(
        len({c.holder for c in view.part_copies(p) if c.tier == "peer"}) >= 2
        and any(c.tier == "object_store" for c in view.part_copies(p))
        for p in range(parts)
    )


def holds_part(h: Harness, node: str, step: int, part: int, parts: int = 3) -> None:
    directory = step_dir(h.replicators.volume(node), step)
    assert files_of(directory) == expected_part(step, part, parts)
    assert read_manifest(directory).part.part == part


async def test_parts_replicate_and_a_spare_takes_a_lost_nodes_part(gcs_harness: Harness) -> None:
    h, reps = gcs_harness, gcs_harness.replicators
    for name, block in (("node-0", "b0"), ("node-1", "b0"), ("node-2", "b1")):
        reps.start(name, block=block)
    write_parts([reps.volume(f"node-{p}") for p in range(3)], STEP)
    snapshot = await h.until(
        lambda s: spread(s, STEP, 3), what="each part on two peers and in the object store"
    )
    newest = snapshot.newest_complete()
    assert newest is not None and newest.step == STEP and newest.part_count == 3
    assert newest.complete_in("peer") and newest.complete_in("object_store")

    # node-2 is killed during step 20's global commit: its part never appears
    write_parts([reps.volume("node-0"), reps.volume("node-1"), None], LATER)
    snapshot = await h.until(
        lambda s: len([c for c in s.view(LATER).copies if c.tier == "local"]) == 2,
        what="step 20's two committed parts indexed",
    )
    assert not snapshot.view(LATER).complete and snapshot.newest_complete().step == STEP

    # a part with a bad checksum on node-0: only that file comes again, from a peer
    damaged = step_dir(reps.volume("node-0"), STEP) / "data-r00001-000.bin"
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = await h.restore("node-0", part=(0, 3))
    assert result.ok, result.detail
    event = h.restored_event("node-0")
    assert (event.step, event.tier, event.bytes) == (STEP, "peer", len(data))
    holds_part(h, "node-0", STEP, 0)

    # node-1 is lost with its disk; a spare with an empty volume takes its place (part 1)
    await h.lose_node("node-1")
    shutil.rmtree(reps.node_dir("node-1"))
    reps.start("node-3", block="b0")
    await h.until(lambda s: s.alive("node-3"), what="the spare announced")
    result = await h.restore("node-3", part=(1, 3))
    assert result.ok, result.detail
    assert h.restored_event("node-3").tier == "peer"
    holds_part(h, "node-3", STEP, 1)
    assert staged_parts(reps.volume("node-3"), STEP) == {}

    # the lost node's peers are gone too: the spare's part comes from the object store
    for peer in ("node-0", "node-2"):
        await h.lose_node(peer)
        shutil.rmtree(reps.node_dir(peer))
    reps.lose_volume("node-3")
    result = await h.restore("node-3", part=(1, 3))
    assert result.ok, result.detail
    assert h.restored_event("node-3").tier == "object_store"
    holds_part(h, "node-3", STEP, 1)

    # a newer step whose other parts no node holds (their nodes lost before any copy)
    newer = write_parts([reps.volume("node-3"), None, None], NEWER)

    # scale-down 3 -> 2: the node keeps its part (1) and stages beside it only part 0: new
    # node 0's ranks hold the first half of the tensor, old ranks 0..2 (parts 0 and 1)
    result = await h.restore("node-3", part=(0, 2))
    assert result.ok and result.detail.endswith("; part 0 staged beside it"), result.detail
    # and sets its part of the newer step aside, out of the ranks' sight, kept
    volume = reps.volume("node-3")
    assert [step for step, _ in step_dirs(volume)] == [STEP]
    aside = aside_part_dir(volume, NEWER, newer.commit)
    assert files_of(aside) == expected_part(NEWER, 0, 3)
    assert orphaned_staged_parts(p.name for p in volume.iterdir()) == []  # kept until GC
    staged = staged_parts(reps.volume("node-3"), STEP)
    assert sorted(staged) == [0]
    for part, directory in staged.items():
        assert files_of(directory) == expected_part(STEP, part, 3)
        assert read_manifest(directory).part.part == part
    holds_part(h, "node-3", STEP, 1)


async def test_a_scale_down_stages_on_each_node_only_the_parts_its_new_ranks_read(
    dir_harness: Harness,
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    nodes = ["node-0", "node-1", "node-2"]
    for name in nodes:
        reps.start(name)
    write_parts([reps.volume(name) for name in nodes], STEP)
    # a step whose records name a placement the rule does not know (torch's _StridedShard)
    write_parts([reps.volume(name) for name in nodes], LATER, placement="_S(0, 2)")
    await h.until(
        lambda s: all(s.view(step).complete for step in (STEP, LATER)),
        what="every part of both steps indexed",
    )

    # 3 -> 2 nodes of 2 ranks: new node 0 reads old ranks 0..2 (parts 0, 1), node 1 ranks
    # 3..5 (parts 1, 2); each stages one other part, not two
    for place, wanted in ((0, 1), (1, 2)):
        node = nodes[place]
        result = await h.restore(node, step=STEP, part=(place, 2))
        assert result.ok, result.detail
        assert result.detail.endswith(f"; part {wanted} staged beside it"), result.detail
        staged = staged_parts(reps.volume(node), STEP)
        assert sorted(staged) == [wanted]
        assert files_of(staged[wanted]) == expected_part(STEP, wanted, 3)
        # one part moved (its data and records; the manifest is written, not moved)
        assert h.restored_event(node).bytes == sum(map(len, files_of(staged[wanted]).values()))
        assert "reads parts" in reps.log(node)

    # what cannot be predicted is staged whole, as before, and the log says why
    result = await h.restore("node-0", step=LATER, part=(0, 2))
    assert result.ok and result.detail.endswith("; parts 1, 2 staged beside it"), result.detail
    assert sorted(staged_parts(reps.volume("node-0"), LATER)) == [1, 2]
    assert "'_S(0, 2)' is not predictable" in reps.log("node-0")
