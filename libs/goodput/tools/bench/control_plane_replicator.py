"""The one real replicator of `goodput bench control-plane`, and what it receives.

It serves the fleet's last node (:func:`replicator_node`), started as `goodput up` starts a
node's replicator: under its keeper, loopback its advertised address, its peer server on a
free port, its volume an empty directory under the bench's state directory, the object store
a ``file://`` directory there. The other nodes' replicators are simulated
(:mod:`.index_fleet`): their addresses and copies fill the index before it starts, and they
change it while it runs. It holds nothing, so it copies nothing: what it costs is following
the index, and its sync and the planners over the index.

What it received is read on the server's side (``/connz``: ``out_bytes`` and ``out_msgs``
of its connection, found by the name every service's connection gives,
``service_connection_name``): the index's changes and its own replies. Beside it, a witness
connection subscribed to every rank's ``CheckpointPersisted`` of the job counts what a
replicator took before issue 36, when those events woke it (now its own volume does:
``replicator/volume_watch.py``), and what its connection is no longer sent.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats.js.errors

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.client import service_connection_name
from goodput.checkpoint.index.records import node_key
from goodput.checkpoint.tiers.peer.address import one_machine_env
from goodput.state_dir import StateDir
from goodput.tools.bench.control_plane_fleet import JOB, node_name
from goodput.tools.bench.control_plane_measure import Snapshot, Wanted

REPLICATOR = "replicator"
REPLICATOR_CONNECTION = service_connection_name(REPLICATOR)
WITNESS_CONNECTION = "goodput-bench-persisted-witness"
#: how long the replicator may take to read the index completely and announce its node
READY_TIMEOUT_S = 180.0


def replicator_node(nodes: int) -> str:
    """The node the real replicator serves: the last, never the lowest-named (which sweeps
    the object store for the fleet: it would delete the simulated nodes' store copies)."""
    return node_name(nodes - 1)


def simulated_nodes(nodes: int) -> list[str]:
    """The nodes whose replicators are simulated: every other one."""
    return [node_name(n) for n in range(nodes - 1)]


def replicator_wanted(nodes: int, state_dir: Path) -> Wanted:
    """How the bench starts the replicator: the stack's flags and environment, and an empty
    ``file://`` object store."""
    store = StateDir(state_dir).object_store
    store.mkdir(parents=True, exist_ok=True)
    flags = ["--set", f'object_store="{store.as_uri()}"']
    return Wanted(REPLICATOR, replicator_node(nodes), flags, one_machine_env(os.environ))


async def wait_announced(url: str, node: str, log: str, started: float) -> float:
    """Seconds from ``started`` (monotonic: the replicator's start) until it announced
    ``node``: it does so once its follower read the index completely (its first sync's
    snapshot is a current one)."""
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-replicator-ready")
    try:
        kv = await bus.js.key_value(subjects.CKPT_INDEX_BUCKET)
        while time.monotonic() - started < READY_TIMEOUT_S:
            try:
                await kv.get(node_key(JOB, node))
                return time.monotonic() - started
            except nats.js.errors.KeyNotFoundError:
                await asyncio.sleep(0.2)
    finally:
        await bus.close()
    raise SystemExit(
        f"the replicator of {node} did not announce itself within {READY_TIMEOUT_S:g} s "
        f"(its complete read of the index not done): see {log}"
    )


async def witness(url: str) -> Bus:
    """A connection subscribed to every rank's ``CheckpointPersisted`` of the job."""
    bus = await Bus.connect(BusSettings(url=url), name=WITNESS_CONNECTION)
    kind = schemas.kind_of(schemas.CheckpointPersisted)

    async def ignore(_msg) -> None:
        return None

    for subject in subjects.events_of_kind(JOB, kind):
        await bus.nc.subscribe(subject, cb=ignore)
    await bus.nc.flush()
    return bus


def replicator_figures(
    before: Snapshot,
    after: Snapshot,
    node: str,
    ready_s: float,
    written: list[tuple[int, int]],
) -> dict:
    """What the replicator's connection received over the window, per second (the index
    follower's changes, its own replies); beside it, the job's persisted events (the
    witness's, which it is not sent) and what the simulated replicators wrote (``written``:
    their copy writes and announcements so far, at the window's start and end)."""
    window = after.wall - before.wall
    replicator = [s.connections[REPLICATOR_CONNECTION] for s in (before, after)]
    witnessed = [s.connections[WITNESS_CONNECTION] for s in (before, after)]
    if replicator[0]["cid"] != replicator[1]["cid"]:
        raise SystemExit(
            "the replicator's connection changed in the window (a reconnect or a restart: "
            "see its log): what it received cannot be told"
        )

    def rate(pair: list[dict], key: str) -> float:
        return (pair[1][key] - pair[0][key]) / window

    received = {key: rate(replicator, key) for key in ("out_bytes", "out_msgs")}
    persisted = {key: rate(witnessed, key) for key in ("out_bytes", "out_msgs")}
    return {
        "node": node,
        "connection": REPLICATOR_CONNECTION,
        # from its start until it announced itself: its complete read of the index done
        "ready_s": round(ready_s, 1),
        # before the window: its complete read of the index at start, mostly
        "received_before_window_bytes": replicator[0]["out_bytes"],
        "received_bytes_per_s": round(received["out_bytes"]),
        "received_msgs_per_s": round(received["out_msgs"], 1),
        "persisted_events_bytes_per_s": round(persisted["out_bytes"]),
        "persisted_events_msgs_per_s": round(persisted["out_msgs"], 1),
        "index_copy_writes_per_s": round((written[1][0] - written[0][0]) / window, 2),
        "index_announcements_per_s": round((written[1][1] - written[0][1]) / window, 2),
    }
