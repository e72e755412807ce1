"""A replicator is woken by its own volume, not the job's events (issue 36): a checkpoint
committed there is indexed well within a poll, and its connection takes none of the
``CheckpointPersisted`` every rank of the job publishes (a real replicator process, a real
nats-server whose monitoring tells what each connection subscribes to and is sent)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from goodput import schemas, subjects
from goodput.bus import EmbeddedNats
from goodput.bus.client import service_connection_name
from goodput.bus.embedded import free_port
from goodput.state_dir import StateDir
from goodput_services.replicator.volume_watch import SETTLE_NS, VolumeWatch
from tests.replicator.conftest import JOB, Harness, write_checkpoint

pytestmark = pytest.mark.timeout(120)

#: a poll so slow that only the volume's watch can get a checkpoint indexed in time
SLOW_POLL = {"poll_s": "30", "node_ttl_s": "120"}
#: a thirtieth of that poll; the watch looks every 0.2 s (measured: 0.06-0.15 s)
WITHIN_S = 1.0
REPLICATOR = service_connection_name("replicator")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """The harness's server, with its HTTP monitoring on (``/connz``)."""
    server = EmbeddedNats(StateDir(tmp_path / "nats"), monitor_port=free_port())
    server.paths.root.mkdir(parents=True)
    server.start()
    yield server
    server.stop()


def connection(server: EmbeddedNats, name: str) -> dict:
    """The one open connection named ``name``, with its subscriptions, as the server has it."""
    url = f"http://127.0.0.1:{server.monitor_port}/connz?subs=1&limit=1000"
    with urllib.request.urlopen(url, timeout=10) as answer:
        named = [c for c in json.load(answer)["connections"] if c.get("name") == name]
    assert len(named) == 1, f"{len(named)} connections named {name}"
    return named[0]


def commit(volume: Path, staged: Path) -> float:
    """Rename a written checkpoint into the volume, as the engine commits one; when."""
    volume.mkdir(parents=True, exist_ok=True)
    os.rename(staged, volume / staged.name)
    return time.monotonic()


async def indexed_after(h: Harness, node: str, step: int, since: float) -> float:
    """Seconds from ``since`` until the node's own copy of ``step`` is in the index."""
    while not any(
        c.step == step and c.tier == "local" and c.holder == node
        for c in (await h.snapshot()).copies
    ):
        assert time.monotonic() - since < 30, f"step {step} not indexed within the poll"
        await asyncio.sleep(0.01)
    return time.monotonic() - since


async def test_a_checkpoint_committed_in_the_volume_is_indexed_well_within_a_poll(
    dir_harness: Harness, tmp_path: Path
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-a", **SLOW_POLL)
    await h.until(lambda s: "node-a" in s.nodes, what="node-a announced")
    await asyncio.sleep(1.0)  # past the start-up pass; the next poll is ~29 s away
    seconds = []
    for step in (3, 4, 5):
        staged = write_checkpoint(tmp_path / "staging", step=step, seed=step, megabytes=1)
        landed = commit(reps.volume("node-a"), staged)
        seconds.append(await indexed_after(h, "node-a", step, landed))
    assert max(seconds) < WITHIN_S, f"indexed after {seconds} s: not by the watch"


async def test_the_replicator_takes_none_of_the_jobs_persisted_events(
    dir_harness: Harness, nats_server: EmbeddedNats
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-a", **SLOW_POLL)
    await h.until(lambda s: "node-a" in s.nodes, what="node-a announced")
    mine = connection(nats_server, REPLICATOR)
    events = subjects.events_of(JOB).removesuffix(">")
    assert not [s for s in mine["subscriptions_list"] if s.startswith(events) or ">" in s]

    # another node's 8 ranks persist 125 checkpoints each; a witness takes them all
    witnessed = 0

    async def count(_msg: Msg) -> None:
        nonlocal witnessed
        witnessed += 1

    kind = schemas.kind_of(schemas.CheckpointPersisted)
    for subject in subjects.events_of_kind(JOB, kind):
        await h.bus.nc.subscribe(subject, cb=count)
    await h.bus.nc.flush()
    before = connection(nats_server, REPLICATOR)["out_msgs"]
    for step in range(125):
        for rank in range(8, 16):
            await h.bus.emit(
                schemas.CheckpointPersisted(
                    job=JOB, node="node-b", rank=rank, step=step, path="/x", bytes=0, duration_s=0
                )
            )
    await h.bus.nc.flush()
    deadline = time.monotonic() + 10
    while witnessed < 1000:
        assert time.monotonic() < deadline, f"the witness got {witnessed} of 1,000"
        await asyncio.sleep(0.05)
    after = connection(nats_server, REPLICATOR)
    assert after["cid"] == mine["cid"]
    # what it was sent meanwhile is its own traffic (the index, its replies), not the events
    assert after["out_msgs"] - before < 50


def test_the_watch_tells_commits_not_writes(tmp_path: Path) -> None:
    root = tmp_path / "volume"
    watch = VolumeWatch(root)
    watch.start()
    assert watch.look(time.time_ns()) == []  # no volume yet
    staged = write_checkpoint(tmp_path / "staging", step=1, seed=1, megabytes=1)
    root.mkdir()
    (root / ".step-0000000002.tmp").mkdir()  # being written: hidden, no step directory
    (root / "step-0000000003").mkdir()  # no manifest: not committed
    assert watch.look(time.time_ns()) == []
    os.rename(staged, root / staged.name)
    assert watch.look(time.time_ns()) == [staged.name]
    assert watch.look(time.time_ns()) == []  # told once


def test_a_change_within_one_tick_of_the_roots_mtime_is_still_told(tmp_path: Path) -> None:
    """A filesystem whose mtime ticks coarsely leaves the root's mtime unchanged by a second
    change within one tick: a root changed less than ``SETTLE_NS`` ago is listed again."""
    root = tmp_path / "volume"
    root.mkdir()
    watch = VolumeWatch(root)
    watch.start()
    (root / ".step-0000000001.tmp").mkdir()  # the engine starts writing
    mtime = root.stat().st_mtime_ns
    assert watch.look(mtime + SETTLE_NS // 2) == []
    staged = write_checkpoint(tmp_path / "staging", step=1, seed=1, megabytes=1)
    os.rename(staged, root / staged.name)
    os.utime(root, ns=(mtime, mtime))  # the commit within the same tick
    assert watch.look(mtime + SETTLE_NS // 2) == [staged.name]
    # a re-save of the step (after a rollback: the old directory replaced) is a commit too
    again = write_checkpoint(tmp_path / "staging", step=1, seed=2, megabytes=1)
    shutil.rmtree(root / staged.name)
    os.rename(again, root / staged.name)
    os.utime(root, ns=(mtime + 1, mtime + 1))
    assert watch.look(mtime + 2 * SETTLE_NS) == [staged.name]
