"""A node's address record is written on change, not every poll: an unchanged fleet sends the
followers no announcement at all; an orderly stop withdraws the record; a live node whose
record was withdrawn (the supervisor took it for failed) says so again. The decision
(``checkpoint/index/announcement.py``) pure; the rest on a real nats-server with real
replicator processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from goodput.bus import Bus
from goodput.checkpoint.index.announcement import announcement_due, refresh_s
from goodput.checkpoint.index.follower import IndexFollower
from goodput.checkpoint.index.index import DEFAULT_NODE_TTL_S, CheckpointIndex
from goodput.checkpoint.index.records import NodeAddressRecord
from tests.replicator.conftest import JOB, Harness

pytestmark = pytest.mark.timeout(180)

NOW = 1_000_000 * 10**9
TTL_S = 30.0
#: other nodes' records present while the replicators run: what a follower would re-receive
#: every poll if each node still announced itself every poll
OTHERS = 300


def record(ts: int = NOW, **changed) -> NodeAddressRecord:
    fields = {"node": "n", "host": "10.0.0.1", "port": 7450, "labels": {"block": "b0"}, "ts": ts}
    return NodeAddressRecord(**{**fields, **changed})


def due(wanted: NodeAddressRecord, indexed: NodeAddressRecord | None, announced=True):
    return announcement_due(
        wanted, indexed, announced=announced, now_ns=wanted.ts, node_ttl_s=TTL_S
    )


def test_a_node_announces_at_start_on_change_when_withdrawn_and_as_a_slow_refresh() -> None:
    standing = record(ts=NOW - 5 * 10**9)
    assert due(record(), standing) is None, "unchanged and fresh: nothing to write"
    assert due(record(), standing, announced=False) == "starting"
    assert due(record(), None) == "not in the index (withdrawn)"
    assert due(record(port=7451), standing) == "changed: port"
    assert due(record(labels={"block": "b1"}, host="10.0.0.2"), standing) == "changed: host, labels"
    assert due(record(object_store="gcs:b"), standing) == "changed: object_store"
    assert due(record(), record(ts=NOW + 10**9)) == "timestamp ahead of this clock"
    stale = NOW - int(refresh_s(TTL_S) * 1e9)
    assert due(record(), record(ts=stale)) == f"refresh after {refresh_s(TTL_S):.0f} s"
    # the default refreshes every few minutes, so a follower of 2,048 nodes receives ~7/s
    assert refresh_s(DEFAULT_NODE_TTL_S) == 300.0


async def test_a_withdrawal_names_the_record_it_removes(bus: Bus) -> None:
    index, other = CheckpointIndex(bus, JOB), CheckpointIndex(bus, JOB)
    mine = await index.announce(record(node="n1"))
    await other.announce(record(node="n1", port=7451))  # the node's newer announcement
    assert not await index.withdraw_node("n1", if_last_seq=mine), "not the record it wrote"
    assert "n1" in (await index.snapshot()).nodes
    assert await other.withdraw_node("n1")  # the supervisor's: whatever the record is
    assert "n1" not in (await index.snapshot()).nodes
    assert index.written_seq < other.written_seq


async def test_an_unchanged_fleet_announces_nothing_and_a_stop_withdraws(
    dir_harness: Harness,
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    for n in range(OTHERS):
        await h.index.announce(record(node=f"other-{n}", ts=time.time_ns()))
    nodes = ["node-a", "node-b", "node-c"]
    for node in nodes:
        reps.start(node)  # polls every 0.2 s
    await h.until(lambda s: all(s.alive(n) for n in nodes), what="every replicator announced")

    async with IndexFollower(h.bus, JOB).running() as follower:
        await follower.snapshot()
        await asyncio.sleep(3.0)  # 15 polls of each replicator
        await follower.snapshot(current=True)  # every write before now received
        assert follower.counts.messages["node"] == 0, "an unchanged node announced again"

        # the supervisor withdraws a node it counts failed, but its replicator lives
        await h.index.withdraw_node("node-b")
        await h.until(lambda s: s.alive("node-b"), what="node-b announced again")
        assert "not in the index (withdrawn)" in reps.log("node-b")

        # an orderly stop takes the record with it, long before the TTL
        reps.stop("node-a")
        snapshot = await follower.snapshot(current=True)
        assert "node-a" not in snapshot.nodes, reps.log("node-a")
        assert {"node-b", "node-c"} <= {n.node for n in snapshot.live_nodes()}
        assert follower.counts.reads == 1 and follower.counts.messages["node"] == 3
