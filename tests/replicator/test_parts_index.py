"""The index, retention, planner and staging decisions for parts of a checkpoint sharded
across nodes. Pure: records and a clock go in, answers come out; no bus, no processes."""

from __future__ import annotations

import time

import msgspec
import pytest

from goodput.checkpoint.format import parse_step_dir, step_dir
from goodput.checkpoint.format.parts import aside_part_dir, parse_aside_part, staged_part_dir
from goodput.checkpoint.format.parts_needed import NeededParts
from goodput.checkpoint.index.gc import delete_from_disk, orphaned_staged_parts
from goodput.checkpoint.index.index import IndexSnapshot
from goodput.checkpoint.index.records import (
    INDEX_SCHEMA_VERSION,
    STORE_HOLDER,
    CopyRecord,
    FileRef,
    IndexRecordError,
    NodeAddressRecord,
    decode_copy,
    encode,
)
from goodput.checkpoint.index.retention import Retention, plan_gc, safe_steps
from goodput_services.replicator.options import ReplicatorOptions
from goodput_services.replicator.planner import (
    BackUp,
    Held,
    Memory,
    Push,
    Wait,
    plan_backup,
    plan_replication,
)
from goodput_services.replicator.restore_parts import (
    NodePart,
    PartPlan,
    incomplete_newer,
    narrow,
    plan_parts,
)
from goodput_services.replicator.restore_sources import NothingToRestore

NOW_NS = time.time_ns()
NODES = ["node-0", "node-1", "node-2", "node-3"]


def node(name: str, age_s: float = 0.0, block: str = "b0") -> NodeAddressRecord:
    return NodeAddressRecord(
        node=name,
        host="127.0.0.1",
        port=7000 + int(name[-1]),
        labels={"block": block},
        ts=NOW_NS - int(age_s * 1e9),
    )


def part(
    step: int, p: int, holder: str, tier: str = "local", commit: str = "c1", parts: int = 3
) -> CopyRecord:
    """A copy of part ``p`` of ``commit``; node-p wrote it (the owner)."""
    owner = f"node-{p}"
    return CopyRecord(
        step=step,
        tier=tier,
        holder=STORE_HOLDER if tier == "object_store" else holder,
        owner=owner,
        root="r",
        files=[FileRef(f"data-r{p:05d}-000.bin", 100, f"{commit}{p}".ljust(32, "0"))],
        part=p,
        parts=parts,
        commit=commit,
    )


def snapshot(copies: list[CopyRecord], dead: tuple[str, ...] = ()) -> IndexSnapshot:
    nodes = {n: node(n, 60.0 if n in dead else 0.0) for n in NODES}
    return IndexSnapshot(nodes, copies, node_ttl_s=10, now_ns=NOW_NS)


def every_part(step: int, commit: str = "c1") -> list[CopyRecord]:
    return [part(step, p, f"node-{p}", commit=commit) for p in range(3)]


def test_a_step_is_complete_only_when_every_part_of_one_commit_has_a_copy() -> None:
    view = snapshot(every_part(10)).view(10)
    assert view.complete and view.complete_commit() == ("c1", 3) and view.part_count == 3
    assert view.bytes == 300  # the whole checkpoint: one copy of each part
    assert [c.holder for c in view.part_copies(1)] == ["node-1"]
    # one part alone is no checkpoint, though its own files are all there
    lonely = snapshot([part(10, 0, "node-0")]).view(10)
    assert not lonely.complete and lonely.complete_owners() == []


def test_parts_of_different_commits_never_make_a_complete_step() -> None:
    mixed = [part(10, 0, "node-0", commit="c1"), part(10, 1, "node-1", commit="c2")]
    mixed.append(part(10, 2, "node-2", commit="c1"))
    assert not snapshot(mixed).view(10).complete


def test_a_node_killed_during_the_global_commit_leaves_the_previous_step_newest() -> None:
    """Step 20's parts 0 and 1 were committed; node-2 died before its part was: the commit
    names three parts, one has no copy anywhere, so step 10 stays the newest complete."""
    copies = [*every_part(10), part(20, 0, "node-0"), part(20, 1, "node-1")]
    newest = snapshot(copies).newest_complete()
    assert newest is not None and newest.step == 10
    assert snapshot(copies).complete_steps() == [10]


def test_a_part_held_only_by_a_dead_node_counts_again_from_a_peer_or_the_store() -> None:
    copies = every_part(10)
    assert not snapshot(copies, dead=("node-1",)).view(10).complete
    on_peer = [*copies, part(10, 1, "node-2", tier="peer")]
    view = snapshot(on_peer, dead=("node-1",)).view(10)
    assert view.complete and [c.holder for c in view.part_copies(1)] == ["node-2"]
    in_store = [*copies, part(10, 1, "", tier="object_store")]
    assert snapshot(in_store, dead=("node-1",)).view(10).complete


def test_complete_in_a_tier_needs_every_part_there() -> None:
    copies = every_part(10) + [part(10, p, "", tier="object_store") for p in (0, 1)]
    view = snapshot(copies).view(10)
    assert view.complete_in("local") and not view.complete_in("object_store")
    copies.append(part(10, 2, "", tier="object_store"))
    assert snapshot(copies).view(10).complete_in("object_store")


def test_retention_guards_parts_like_whole_checkpoints() -> None:
    """Step 10 complete on local and in the store; step 20 only locally: 20 is not safe
    under ``require=("object_store",)``, so step 10 survives everywhere."""
    copies = every_part(10) + [part(10, p, "", tier="object_store") for p in range(3)]
    copies += every_part(20)
    snap = snapshot(copies)
    assert safe_steps(snap, ("object_store",)) == {10}
    retention = Retention(
        keep={"local": 1, "peer": 1, "object_store": 1}, require=("object_store",)
    )
    assert plan_gc(snap, retention) == []
    copies += [part(20, p, "", tier="object_store") for p in range(3)]
    doomed = plan_gc(snapshot(copies), retention)
    assert {(c.step, c.tier) for c in doomed} == {(10, "local"), (10, "object_store")}


def test_part_records_round_trip_and_are_checked() -> None:
    record = part(10, 2, "node-2")
    assert decode_copy(encode(record)) == record and record.is_part
    assert INDEX_SCHEMA_VERSION == 2
    whole = CopyRecord(step=1, tier="local", holder="n", owner="n", root="r", files=[])
    assert whole.part_key is None and not whole.is_part
    raw = msgspec.to_builtins(record)
    for bad in ({"part": 3}, {"commit": ""}, {"parts": 0}):
        with pytest.raises(IndexRecordError):
            decode_copy(msgspec.msgpack.encode({**raw, **bad}))
    with pytest.raises(IndexRecordError, match="newer"):
        decode_copy(msgspec.msgpack.encode({**raw, "schema": INDEX_SCHEMA_VERSION + 1}))


def test_a_part_is_never_deduplicated_against_another_part() -> None:
    """node-1's peer area holds part 0 whose files happen to equal part 1's: pushing part 1
    there is a real copy, never a "verify and link"."""
    mine = part(10, 1, "node-1")
    lookalike = msgspec.structs.replace(part(10, 0, "node-2", tier="peer"), files=mine.files)
    assert not mine.same_data(lookalike) and mine.same_data(part(10, 1, "node-3", tier="peer"))
    options = ReplicatorOptions(replicas=1, dedup_wait_s=10)
    held = Held("node-1", mine, first_seen=0.0)
    decision = plan_replication(snapshot([mine, lookalike]), held, 1000.0, options, Memory())
    assert isinstance(decision, list) and decision
    assert all(isinstance(p, Push) and p.reason == "needs a copy" for p in decision)


def test_a_fresh_part_is_pushed_and_backed_up_without_waiting_for_identical_data() -> None:
    """Whole data-parallel checkpoints wait ``dedup_wait_s``/``backup_wait_s`` for peers
    with identical data; a part has none, so it moves at once."""
    options = ReplicatorOptions(replicas=1, dedup_wait_s=10, backup_wait_s=30, backup_every=1)
    mine = part(10, 1, "node-1")
    held = Held("node-1", mine, first_seen=999.0)  # seen one second ago
    snap = snapshot([mine])  # node-0 has not indexed step 10 yet
    pushes = plan_replication(snap, held, 1000.0, options, Memory())
    assert isinstance(pushes, list) and len(pushes) == 1
    assert isinstance(plan_backup(snap, held, 1000.0, options, Memory()), BackUp)
    whole = msgspec.structs.replace(mine, part=0, parts=0, commit="")
    held_whole = Held("node-1", whole, first_seen=999.0)
    assert isinstance(
        plan_replication(snapshot([whole]), held_whole, 1000.0, options, Memory()), Wait
    )
    assert isinstance(plan_backup(snapshot([whole]), held_whole, 1000.0, options, Memory()), Wait)


def test_plan_parts_hot_swap_reshard_and_unknown() -> None:
    # a spare with an empty volume takes node-1's place: part 1, nothing staged
    assert plan_parts(3, NodePart(1, 3), None) == PartPlan(1, reason="part 1")
    # a returning node at another place: the part on its volume is kept aside, not lost
    assert plan_parts(3, NodePart(1, 3), 2) == PartPlan(1, move_aside=2, reason="part 1")
    # scale-down 3 -> 2: every other part, until the own part's records narrow it (below);
    # the one on the volume stays step-N
    assert plan_parts(3, NodePart(1, 2), 2).own == 2
    assert plan_parts(3, NodePart(1, 2), 2).staged == (0, 1)
    assert plan_parts(3, NodePart(1, 2), None).staged == (0, 2)
    # scale-up 2 -> 3: the new node still gets a step-N (its staged parts are no orphans)
    assert plan_parts(2, NodePart(2, 3), None) == PartPlan(1, (0,), reason="reshard 2 -> 3 parts")
    assert plan_parts(3, None, 0).own == 0
    with pytest.raises(NothingToRestore, match="part is not known"):
        plan_parts(3, None, None)
    with pytest.raises(NothingToRestore, match="part 3 of 3"):
        NodePart.of(3, 3)
    assert NodePart.of(None, None) is None


def test_a_reshard_stages_only_the_parts_needed_or_every_one_when_unpredictable() -> None:
    plan = plan_parts(3, NodePart(1, 2), 2)
    narrowed = narrow(plan, NeededParts(frozenset({1, 2}), "node 1 of 2 reads parts 1, 2"))
    assert narrowed == PartPlan(
        2, (1,), reason="reshard 3 -> 2 parts: node 1 of 2 reads parts 1, 2"
    )
    assert narrow(plan, NeededParts(frozenset({2}), "")).staged == ()
    unknown = narrow(plan, NeededParts(None, "every part staged: placement '_S(0, 2)'"))
    assert unknown.staged == (0, 1) and unknown.reason.endswith("'_S(0, 2)'")


def test_only_newer_parts_of_no_complete_commit_are_set_aside() -> None:
    complete = {10: ("c10", 3), 20: ("c20", 3)}
    on_volume = {10: ("c10", 3), 20: ("c20", 3), 30: ("c30", 3), 40: None, 50: ("old", 3)}
    newer = incomplete_newer(10, on_volume, complete.get)
    # 20: complete; 40: not a part; 50: a commit of the step other than the complete one
    assert newer == [30, 50]
    assert incomplete_newer(30, on_volume, complete.get) == [50]


def test_a_set_aside_part_goes_once_the_volume_holds_a_step_as_new(tmp_path) -> None:
    aside = aside_part_dir(tmp_path, 30, "0123456789abcdef" * 2).name
    assert aside == ".incomplete-step-0000000030.0123456789abcdef"
    assert parse_aside_part(aside) == 30 and parse_step_dir(aside) is None
    assert orphaned_staged_parts([aside, "step-0000000010"]) == []
    assert orphaned_staged_parts([aside, "step-0000000030"]) == [aside]
    assert orphaned_staged_parts([aside, "step-0000000040"]) == [aside]


def test_staged_parts_go_with_their_step(tmp_path) -> None:
    root = tmp_path / "volume"
    for name in ("step-0000000010", "step-0000000010.part-00001", "step-0000000020.part-00002"):
        (root / name).mkdir(parents=True)
    assert orphaned_staged_parts(p.name for p in root.iterdir()) == ["step-0000000020.part-00002"]
    record = CopyRecord(
        step=10, tier="local", holder="node-0", owner="node-0", root="volume", files=[]
    )
    delete_from_disk(tmp_path, record)
    assert not step_dir(root, 10).exists() and not staged_part_dir(root, 10, 1).exists()
    assert staged_part_dir(root, 20, 2).exists()  # another step's: the sweep's, not this delete's
