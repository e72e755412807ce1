"""The replicator's planner on its own: pushes, backups and index updates, with their reasons.

Pure: an index snapshot, what the node holds, its memory and the time go in; no bus, no disk.
"""

from __future__ import annotations

import time

import msgspec

from goodput.checkpoint.index.index import IndexSnapshot
from goodput.checkpoint.index.records import CopyRecord, FileRef, NodeAddressRecord
from goodput_services.replicator.options import ReplicatorOptions
from goodput_services.replicator.planner import (
    BackUp,
    Held,
    Memory,
    Push,
    Wait,
    plan,
    plan_backup,
    plan_index_sync,
    plan_replication,
    recall_last_backup,
    sweeps_store,
)

NOW_NS = time.time_ns()
T = 1000.0  # monotonic seconds "now" in these tests
FILES = [FileRef("data-0.bin", 100, "a" * 32)]
OTHER = [FileRef("data-0.bin", 100, "b" * 32)]
OPTIONS = ReplicatorOptions(replicas=2, dedup_wait_s=10, backup_every=3, backup_wait_s=30)


def node(name: str, block: str = "b0", age_s: float = 0.0) -> NodeAddressRecord:
    """A node of a stack on one machine: loopback, each its own port (node-N: 7000 + N)."""
    return NodeAddressRecord(
        node=name,
        host="127.0.0.1",
        port=7000 + int(name.rsplit("-", 1)[1]),
        labels={"block": block},
        ts=NOW_NS - int(age_s * 1e9),
    )


def copy(step: int, tier: str, holder: str, owner: str = "node-1", files=FILES) -> CopyRecord:
    return CopyRecord(step=step, tier=tier, holder=holder, owner=owner, root="r", files=files)


NODES = [node("node-0", "b0"), node("node-1", "b0"), node("node-2", "b0"), node("node-3", "b1")]


def snapshot(copies: list[CopyRecord], nodes: list[NodeAddressRecord] = NODES) -> IndexSnapshot:
    return IndexSnapshot({n.node: n for n in nodes}, copies, node_ttl_s=10, now_ns=NOW_NS)


def held(step: int = 7, files=FILES, age_s: float = 60.0, name: str = "node-1") -> Held:
    return Held(name, copy(step, "local", name, owner=name, files=files), first_seen=T - age_s)


def test_a_new_checkpoint_goes_to_a_close_and_a_distant_peer() -> None:
    mine = held(files=OTHER)  # nobody else has these files
    pushes = plan_replication(snapshot([mine.newest_own]), mine, T, OPTIONS, Memory())
    assert pushes == [Push(7, "node-2", "needs a copy"), Push(7, "node-3", "needs a copy")]


def test_nothing_to_push_without_an_own_checkpoint_or_once_enough_peers_hold_it() -> None:
    assert isinstance(
        plan_replication(snapshot([]), Held("node-1", None), T, OPTIONS, Memory()), Wait
    )
    mine = held()
    copies = [mine.newest_own, copy(7, "peer", "node-2"), copy(7, "peer", "node-3")]
    decision = plan_replication(snapshot(copies), mine, T, OPTIONS, Memory())
    assert decision == Wait("replicate", "step 7 has 2 peer copies")


def test_a_recent_push_counts_until_the_holder_indexes_it_then_expires() -> None:
    mine = held(files=OTHER)
    memory = Memory(pushed={(7, "node-2"): T - 1.0, (7, "node-3"): T - 1.0})
    assert isinstance(plan_replication(snapshot([mine.newest_own]), mine, T, OPTIONS, memory), Wait)
    later = T + 60.0  # never indexed: pushed again
    pushes = plan_replication(snapshot([mine.newest_own]), mine, later, OPTIONS, memory)
    assert {p.peer for p in pushes} == {"node-2", "node-3"}


def test_a_peer_that_failed_is_skipped_while_cooling_down() -> None:
    mine = held(files=OTHER)
    memory = Memory(cooldown_until={"node-2": T + 5.0})
    pushes = plan_replication(snapshot([mine.newest_own]), mine, T, OPTIONS, memory)
    assert [p.peer for p in pushes] == ["node-0", "node-3"]
    pushes = plan_replication(snapshot([mine.newest_own]), mine, T + 6.0, OPTIONS, memory)
    assert [p.peer for p in pushes] == ["node-2", "node-3"]


def test_identical_data_waits_for_peers_then_prefers_them() -> None:
    # node-1 and node-2 saved identical data-parallel shards; node-2 has not indexed yet
    mine = held(age_s=1.0)
    twin = copy(7, "local", "node-2", owner="node-2")
    decision = plan_replication(snapshot([mine.newest_own]), mine, T, OPTIONS, Memory())
    assert decision == Wait("replicate", "step 7: waiting for peers with identical data")
    # a push that only verifies and links need not wait
    one = msgspec.structs.replace(OPTIONS, replicas=1)
    pushes = plan_replication(snapshot([mine.newest_own, twin]), mine, T, one, Memory())
    assert pushes == [Push(7, "node-2", "holds identical data: verify and link")]
    # a peer that needs a real copy waits for the patience, then gets one
    index = snapshot([mine.newest_own, twin])
    assert isinstance(plan_replication(index, mine, T, OPTIONS, Memory()), Wait)
    late = held(age_s=30.0)
    pushes = plan_replication(snapshot([late.newest_own, twin]), late, T, OPTIONS, Memory())
    assert pushes == [
        Push(7, "node-2", "holds identical data: verify and link"),
        Push(7, "node-3", "needs a copy"),
    ]


def test_first_backup_at_once_then_every_k_checkpoints_or_interval() -> None:
    mine = held()
    assert plan_backup(snapshot([mine.newest_own]), mine, T, OPTIONS, Memory()) == BackUp(
        7, "no backup yet"
    )
    memory = Memory(last_backup=(5, T - 1.0), local_steps_seen={5, 6, 7})
    assert plan_backup(snapshot([]), mine, T, OPTIONS, memory) == Wait(
        "back up", "step 7 is not due"
    )
    memory.local_steps_seen |= {8}
    assert plan_backup(snapshot([]), held(8), T, OPTIONS, memory) == BackUp(
        8, "3 checkpoints since the last backup"
    )
    old = Memory(last_backup=(5, T - 700.0), local_steps_seen={5, 6})
    assert plan_backup(snapshot([]), held(6), T, OPTIONS, old) == BackUp(
        6, "700 s since the last backup"
    )


def test_after_a_restart_the_last_backup_comes_from_the_index() -> None:
    stored = copy(6, "object_store", "store", owner="node-1")
    index = snapshot([stored])
    assert recall_last_backup(index, "node-1", T, Memory()) == (6, T)
    assert recall_last_backup(index, "node-2", T, Memory()) is None
    assert recall_last_backup(index, "node-1", T, Memory(last_backup=(9, 1.0))) == (9, 1.0)
    decision = plan_backup(index, held(7), T, OPTIONS, Memory(local_steps_seen={7}))
    assert decision == Wait("back up", "step 7 is not due")


def test_a_failed_backup_is_retried_later() -> None:
    memory = Memory(backup_retry_at=T + 2.0)
    decision = plan_backup(snapshot([]), held(), T, OPTIONS, memory)
    assert decision == Wait("back up", "retrying later after a failed backup")
    assert isinstance(plan_backup(snapshot([]), held(), T + 2.0, OPTIONS, memory), BackUp)


def test_an_identical_group_backs_up_after_its_leader() -> None:
    # node-1 and node-3 hold identical data: node-1 (lower name) leads, node-3 follows
    twin = copy(7, "local", "node-3", owner="node-3")
    mine = held(age_s=1.0)
    follower = held(age_s=1.0, name="node-3")
    nodes = [node("node-1"), node("node-3")]
    assert isinstance(
        plan_backup(snapshot([mine.newest_own, twin], nodes), mine, T, OPTIONS, Memory()),
        BackUp,
    )
    decision = plan_backup(snapshot([mine.newest_own, twin], nodes), follower, T, OPTIONS, Memory())
    assert decision == Wait("back up", "step 7: the identical-data group's leader goes first")
    stored = copy(7, "object_store", "store", owner="node-1")
    index = snapshot([mine.newest_own, twin, stored], nodes)
    assert isinstance(plan_backup(index, follower, T, OPTIONS, Memory()), BackUp)
    # a follower never waits longer than backup_wait_s
    late = held(age_s=31.0, name="node-3")
    index = snapshot([mine.newest_own, twin], nodes)
    assert isinstance(plan_backup(index, late, T, OPTIONS, Memory()), BackUp)


def test_plan_gives_every_decision_with_a_reason() -> None:
    mine = held(files=OTHER)
    actions = plan(snapshot([mine.newest_own]), mine, T, OPTIONS, Memory())
    assert actions == [
        Push(7, "node-2", "needs a copy"),
        Push(7, "node-3", "needs a copy"),
        BackUp(7, "no backup yet"),
    ]
    assert all(action.reason for action in actions)


def test_index_sync_puts_new_and_changed_copies_and_withdraws_vanished_ones() -> None:
    kept, changed, gone, new = (copy(s, "local", "node-1") for s in (1, 2, 3, 4))
    held_now = {"k1": kept, "k2": copy(2, "local", "node-1", files=OTHER), "k4": new}
    indexed = {"k1": kept, "k2": changed, "k3": gone}
    puts, deletes = plan_index_sync(held_now, indexed)
    assert puts == [held_now["k2"], new]
    assert deletes == [gone]
    assert plan_index_sync(indexed, indexed) == ([], [])


def test_one_sweeper_for_the_shared_store_the_lowest_named_live_node() -> None:
    nodes = [node("node-0", age_s=60), node("node-1"), node("node-2")]
    assert sweeps_store(snapshot([], nodes), "node-1")
    assert not sweeps_store(snapshot([], nodes), "node-2")
    assert not sweeps_store(snapshot([], []), "node-1")


def test_a_peer_announcing_this_hosts_loopback_or_my_own_address_gets_nothing() -> None:
    """Stale or forged address records: pushing there would land on this very node."""
    me = NodeAddressRecord(node="node-1", host="10.8.0.1", port=7450, ts=NOW_NS)
    peers = [
        NodeAddressRecord(node="node-0", host="127.0.0.1", port=7450, ts=NOW_NS),
        NodeAddressRecord(node="node-2", host="localhost", port=7450, ts=NOW_NS),
        NodeAddressRecord(node="node-3", host="10.8.0.1", port=7450, ts=NOW_NS),
        NodeAddressRecord(node="node-4", host="::1", port=7450, ts=NOW_NS),
        NodeAddressRecord(node="node-5", host="10.8.0.5", port=7450, ts=NOW_NS),
    ]
    mine = held(files=OTHER)
    pushes = plan_replication(snapshot([mine.newest_own], [me, *peers]), mine, T, OPTIONS, Memory())
    assert pushes == [Push(7, "node-5", "needs a copy")]
    # on one machine every node announces loopback, each its own port: none is excluded
    assert {
        p.peer for p in plan_replication(snapshot([mine.newest_own]), mine, T, OPTIONS, Memory())
    } == {"node-2", "node-3"}
