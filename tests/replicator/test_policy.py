"""The replicator's decisions on their own: completeness, peer choice, retention, options."""

from __future__ import annotations

import time

import pytest

from goodput.checkpoint.index.index import IndexSnapshot
from goodput.checkpoint.index.records import CopyRecord, FileRef, NodeAddressRecord
from goodput.checkpoint.index.retention import Retention, plan_gc
from goodput_services.replicator.options import ReplicatorOptions
from goodput_services.replicator.topology import choose_peers

NOW = time.time_ns()
FILES = [FileRef("data-0.bin", 100, "a" * 32), FileRef("data-1.bin", 100, "b" * 32)]


def node(name: str, block: str = "b0", age_s: float = 0.0) -> NodeAddressRecord:
    return NodeAddressRecord(
        node=name, host="127.0.0.1", port=1, labels={"block": block}, ts=NOW - int(age_s * 1e9)
    )


def copy(step: int, tier: str, holder: str, owner: str = "node-0", files=FILES) -> CopyRecord:
    return CopyRecord(step=step, tier=tier, holder=holder, owner=owner, root="r", files=files)


def snapshot(
    copies: list[CopyRecord], nodes: list[NodeAddressRecord] | None = None
) -> IndexSnapshot:
    nodes = nodes or [node("node-0"), node("node-1"), node("node-2", "b1")]
    return IndexSnapshot({n.node: n for n in nodes}, copies, node_ttl_s=10, now_ns=NOW)


def test_a_step_is_complete_when_every_file_of_a_checkpoint_has_a_verified_copy() -> None:
    # each record lists the files of the manifest it was verified against: a copy on node-1
    # of node-0's checkpoint completes step 5; step 6 is known only from a dead node
    nodes = [node("node-0"), node("node-1"), node("node-9", age_s=60)]
    index = snapshot([copy(5, "peer", "node-1"), copy(6, "local", "node-9")], nodes)
    assert index.steps() == [5]
    assert index.complete_steps() == [5]
    view = index.view(5)
    assert [loc.file.name for loc in view.owners["node-0"]] == ["data-0.bin", "data-1.bin"]
    assert all(loc.tiers == {"peer"} for loc in view.owners["node-0"])
    assert view.complete_in("peer") and not view.complete_in("local")


def test_copies_on_dead_nodes_do_not_count_but_the_object_store_does() -> None:
    nodes = [node("node-0", age_s=60), node("node-1")]
    stale = snapshot([copy(5, "local", "node-0")], nodes)
    assert stale.newest_complete() is None
    stored = snapshot([copy(5, "local", "node-0"), copy(5, "object_store", "store")], nodes)
    newest = stored.newest_complete()
    assert newest is not None and newest.step == 5 and newest.complete_in("object_store")


def test_identical_shards_on_another_node_complete_a_step() -> None:
    # node-1's own checkpoint has the same data: it stands in for node-0's lost copy
    view = snapshot(
        [copy(5, "local", "node-1", owner="node-1"), copy(5, "object_store", "store", "node-1")]
    ).view(5)
    assert view.owner_for("node-0") == "node-1"
    assert view.owner_for("node-1") == "node-1"
    assert {c.tier for loc in view.owners["node-1"] for c in loc.copies} == {
        "local",
        "object_store",
    }


def test_peer_choice_is_one_close_and_one_distant_identical_first() -> None:
    me = node("node-1", "b0")
    others = [
        node("node-0", "b0"),
        node("node-2", "b0"),
        node("node-3", "b1"),
        node("node-4", "b1"),
    ]
    assert choose_peers(me, others, identical=set(), count=2) == ["node-2", "node-3"]
    assert choose_peers(me, others, identical={"node-0", "node-4"}, count=2) == [
        "node-0",
        "node-4",
    ]
    assert choose_peers(me, others, identical=set(), count=3) == ["node-2", "node-3", "node-4"]
    assert choose_peers(me, [node("node-0", "b0")], identical=set(), count=2) == ["node-0"]
    assert choose_peers(me, [], identical=set(), count=2) == []


def test_retention_deletes_old_steps_only_behind_a_newer_qualified_one() -> None:
    retention = Retention(keep={"local": 1, "peer": 1, "object_store": 1}, require=("peer",))
    copies = [copy(s, "local", "node-0") for s in (1, 2, 3)]
    copies += [copy(s, "peer", "node-1") for s in (1, 2)]
    copies += [copy(1, "object_store", "store")]
    doomed = {(c.step, c.tier) for c in plan_gc(snapshot(copies), retention)}
    # step 3 is complete (newest) but not yet on a peer: step 2 is the floor everywhere;
    # the object store keeps step 1, its only complete backup
    assert doomed == {(1, "local"), (1, "peer")}

    copies.append(copy(3, "peer", "node-1"))
    doomed = {(c.step, c.tier) for c in plan_gc(snapshot(copies), retention)}
    assert doomed == {(1, "local"), (2, "local"), (1, "peer"), (2, "peer")}


def test_retention_keeps_as_many_steps_per_tier_as_asked() -> None:
    retention = Retention(keep={"local": 2, "peer": 2, "object_store": 2}, require=("peer",))
    # only step 40 reached a peer; step 10 stays local as the second of two kept
    copies = [copy(10, "local", "node-0"), copy(40, "local", "node-0"), copy(40, "peer", "node-1")]
    copies.append(copy(5, "local", "node-0"))
    assert {(c.step, c.tier) for c in plan_gc(snapshot(copies), retention)} == {(5, "local")}


def test_the_newest_complete_step_is_never_deleted() -> None:
    retention = Retention(keep={"local": 1, "peer": 1, "object_store": 1}, require=())
    # step 4 is newer and complete only in the object store; step 3 is the newest complete
    # everywhere else... and still the newest complete overall is 4, so 3 may go locally but
    # nothing of 4 may go anywhere
    copies = [copy(3, "local", "node-0"), copy(4, "object_store", "store")]
    doomed = plan_gc(snapshot(copies), retention)
    assert all(c.step != 4 for c in doomed)
    assert plan_gc(snapshot([copy(3, "local", "node-0")]), retention) == []
    assert plan_gc(snapshot([]), retention) == []


def test_retention_keeps_the_known_clean_copy_on_every_tier_and_nothing_more() -> None:
    """Per holder, the newest local copy at or before the step its ranks are known clean
    through stays; on peers and in the object store, the newest at or before the oldest
    clean step known (a quarantined node's spare restores it from there); nothing else."""
    retention = Retention(keep={"local": 1, "peer": 1, "object_store": 1}, require=())
    copies = [copy(s, "local", h) for s in (10, 20, 30, 40) for h in ("node-0", "node-1")]
    copies += [copy(s, "peer", "node-2") for s in (10, 20, 30, 40)]
    copies += [copy(s, "object_store", "store") for s in (10, 20, 30, 40)]

    def doomed(clean: dict[str, int] | None) -> set[tuple[int, str, str]]:
        return {(c.step, c.tier, c.holder) for c in plan_gc(snapshot(copies), retention, clean)}

    plain = doomed(None)
    assert {(s, t) for s, t, _ in plain} == {
        (s, t) for s in (10, 20, 30) for t in ("local", "peer", "object_store")
    }
    shared = {(20, "peer", "node-2"), (20, "object_store", "store")}
    assert doomed({"node-0": 25}) == plain - {(20, "local", "node-0")} - shared
    both = doomed({"node-0": 25, "node-1": 30})  # the older claim, on the shared tiers
    assert both == plain - {(20, "local", "node-0"), (30, "local", "node-1")} - shared
    # a claim newer than every copy keeps only what is kept anyway; one older than every
    # copy keeps nothing; a holder of no copy of its own step keeps its next older one
    assert doomed({"node-0": 99}) == plain
    assert doomed({"node-0": 5}) == plain
    copies.remove(copy(20, "local", "node-0"))
    plain = doomed(None)
    assert doomed({"node-0": 25}) == plain - {(10, "local", "node-0")} - shared


def test_options_are_checked() -> None:
    parsed = ReplicatorOptions.from_mapping(
        {"labels": {"block": "b1"}, "keep_local": "3", "gc_require": ["peer", "object_store"]}
    )
    assert parsed.labels == {"block": "b1"} and parsed.keep_local == 3
    for bad in ({"keep_locl": 1}, {"keep_peer": 0}, {"gc_require": ["tape"]}, {"poll_s": "x"}):
        with pytest.raises(SystemExit):
            ReplicatorOptions.from_mapping(bad)
    # the announcement's refresh, a third of the TTL, is checked once per poll
    with pytest.raises(SystemExit, match=r"node_ttl_s \(2\) must be at least 3 x poll_s \(1\)"):
        ReplicatorOptions.from_mapping({"node_ttl_s": 2, "poll_s": 1})
    assert ReplicatorOptions.from_mapping({"node_ttl_s": 3, "poll_s": 1}).node_ttl_s == 3
