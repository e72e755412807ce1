"""Fixtures for the replicator: real replicator processes on a real nats-server, checkpoints
written by the real CheckpointEngine, a real fake-gcs-server or moto S3 server as the object
store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.format import node_volume, read_manifest
from goodput.checkpoint.index.index import CheckpointIndex, IndexSnapshot
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer, ensure_bucket
from goodput.checkpoint.tiers.s3_emulator import EMULATOR_ENV, MotoS3Server
from goodput.checkpoint.tiers.s3_emulator import ensure_bucket as ensure_s3_bucket
from goodput.state_dir import StateDir
from tests import processes
from tests.ckpt.helpers import assert_bit_exact
from tests.conftest import goodput_cli
from tests.stack.helpers import EventTap

JOB = "job-rep"

#: fast polling so tests take seconds, not minutes
FAST = {
    "poll_s": "0.2",
    "dedup_wait_s": "3",
    "backup_wait_s": "3",
    "backup_every": "1",
    "gc_interval_s": "3600",
    "store_retry_s": "3",
}


def make_state(seed: int, megabytes: int = 4) -> dict:
    generator = torch.Generator().manual_seed(seed)
    half = megabytes * (1 << 20) // 8
    return {
        "model": {"w": torch.randn(half, generator=generator)},
        "optim": {"m": torch.randn(half, generator=generator)},
        "step": seed,
    }


def write_checkpoint(volume: Path, step: int, seed: int, megabytes: int = 4) -> Path:
    """A real checkpoint, as a node's ranks write it (engine retention off: GC is ours)."""
    engine = CheckpointEngine(volume, keep_last=0, writer_threads=2)
    try:
        result = engine.save(make_state(seed, megabytes), step).wait(60)
        assert result.ok, result.error
    finally:
        engine.close()
    return volume / f"step-{step:010d}"


def file_checksums(directory: Path) -> dict[str, str]:
    return {f.name: f.xxh3_128 for f in read_manifest(directory).files}


@dataclass
class Replicators:
    """Replicator processes, one per node, as `goodput up` starts them."""

    url: str
    state_dir: Path
    store_options: dict[str, str]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    options: dict[str, dict[str, str]] = field(default_factory=dict)

    def volume(self, node: str) -> Path:
        return node_volume(self.state_dir, node, JOB)

    def lose_volume(self, node: str) -> None:
        """The node's disk is lost: its volume and all in it gone, while its replicator lives
        and may be writing there (its retention record, a temporary file renamed into place:
        ci15's plain rmtree failed on one that vanished under it)."""
        volume = self.volume(node)

        def raced(function, path, exc_info) -> None:
            # a file renamed away (FileNotFoundError), or one written after the listing so its
            # directory is not empty yet (OSError): the loop below goes round again
            if not issubclass(exc_info[0], OSError):
                raise exc_info[1]

        deadline = time.monotonic() + 10
        while volume.exists():
            assert time.monotonic() < deadline, f"{volume} could not be removed"
            shutil.rmtree(volume, onerror=raced)

    def node_dir(self, node: str) -> Path:
        return StateDir(self.state_dir).node(node)

    def start(self, node: str, block: str = "b0", **options: str) -> None:
        if node not in self.options:
            self.options[node] = {
                **FAST,
                **self.store_options,
                "labels": f'{{block = "{block}"}}',
                **options,
            }
        sets = [item for k, v in self.options[node].items() for item in ("--set", f"{k}={v}")]
        log = open(self.state_dir / f"replicator-{node}.log", "ab")  # noqa: SIM115
        self.processes[node] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "goodput_services.replicator",
                *("--job", JOB, "--node", node, "--nats-url", self.url),
                *("--state-dir", str(self.state_dir), *sets),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    def signal(self, node: str, sig: int) -> None:
        os.kill(self.processes[node].pid, sig)

    def kill(self, node: str) -> None:
        processes.kill(self.processes.pop(node))

    def stop(self, node: str) -> None:
        """Stop the node's replicator in order (SIGTERM), as its pod's or unit's stop does."""
        processes.stop(self.processes.pop(node), timeout_s=15)

    def stop_all(self) -> None:
        for node in list(self.processes):
            self.stop(node)

    def log(self, node: str) -> str:
        return (self.state_dir / f"replicator-{node}.log").read_text(errors="replace")[-4000:]

    def standing(self, node: str) -> str:
        """Whether the node's replicator still runs, or how it ended: a process killed from
        outside (SIGKILL) leaves nothing in its log, and its peers see only its port close."""
        code = self.processes[node].poll()
        if code is None:
            return "running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"exited: killed by {signal.Signals(-code).name}"
        return f"exited with status {code}"

    def report(self) -> dict[str, str]:
        """Each replicator's standing and the tail of its log, for a failure message."""
        return {
            node: f"[{self.standing(node)}] {self.log(node)[-1500:]}" for node in self.processes
        }


class Harness:
    """A bus connection with the job's event stream and index, and ways to wait on them."""

    def __init__(self, bus: Bus, replicators: Replicators, gcs: FakeGcsServer | None):
        self.bus = bus
        self.replicators = replicators
        self.gcs = gcs
        self.index = CheckpointIndex(bus, JOB)
        self.events = EventTap(bus, JOB)

    async def snapshot(self) -> IndexSnapshot:
        return await self.index.snapshot()

    async def lose_node(self, node: str) -> None:
        """The node dies (its replicator killed, no orderly stop) and the supervisor, which
        counts it failed, withdraws its address as the actuator does: no peer waits out the
        node TTL (the default, minutes) to stop counting it."""
        self.replicators.kill(node)
        await self.index.withdraw_node(node)

    async def until(self, predicate, timeout_s: float = 40.0, what: str = "condition"):
        """Poll the index until ``predicate(snapshot)`` holds; return the snapshot."""
        deadline = time.monotonic() + timeout_s
        while True:
            snapshot = await self.snapshot()
            if predicate(snapshot):
                return snapshot
            if time.monotonic() > deadline:
                logs = json.dumps(self.replicators.report())
                raise AssertionError(f"timed out waiting for {what}; replicators: {logs}")
            await asyncio.sleep(0.2)

    async def events_of(self, kind: type, count: int, step: int) -> list:
        """The events of ``kind`` for ``step``, once at least ``count`` of them have arrived."""
        for _ in range(300):
            found = [e for e in self.events.of(kind) if e.step == step]
            if len(found) >= count:
                await asyncio.sleep(0.5)  # and a moment for any extra one to show up
                return [e for e in self.events.of(kind) if e.step == step]
            await asyncio.sleep(0.1)
        raise AssertionError(f"{len(found)} {kind.__name__} events for step {step}, not {count}")

    async def restore(
        self,
        node: str,
        step: int | None = None,
        part: tuple[int, int] | None = None,
        before_step: int | None = None,
    ) -> schemas.ActionResult:
        """Send ``RestoreToNode`` (``part``: (part, parts) of a checkpoint sharded across
        nodes, as the actuator sends it; ``before_step``: a rollback's bound) and wait for
        its result."""
        index, count = part or (None, None)
        command = schemas.RestoreToNode(
            job=JOB, node=node, step=step, part=index, parts=count, before_step=before_step
        )
        await self.bus.send_command(subjects.node_target(subjects.REPLICATOR, node), command)
        return await self.events.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.command_id == command.command_id,
            timeout_s=60,
            what=f"the restore result of {node}",
        )

    def restored_event(self, node: str) -> schemas.CheckpointRestored:
        return [e for e in self.events.of(schemas.CheckpointRestored) if e.node == node][-1]


async def assert_refilled_from_store(
    h: Harness, node: str, step: int, saved: Path, expected: dict[str, str], seed: int
) -> None:
    """``node`` loses its volume with no peer left to refill it: the object store does, every
    file of ``saved`` as it was (``expected``: its checksums), and the checkpoint engine loads
    the state of ``seed`` back bit-exact."""
    h.replicators.lose_volume(node)
    result = await h.restore(node)
    assert result.ok, result.detail
    event = h.restored_event(node)
    assert (event.tier, event.step) == ("object_store", step)
    assert file_checksums(saved) == expected
    with CheckpointEngine(h.replicators.volume(node), keep_last=0) as engine:
        restored_step, state = engine.restore()
    assert restored_step == step
    assert_bit_exact(make_state(seed), state)


def ckpt_cli(h: Harness, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`goodput ckpt ...` against the harness's bus and state directory."""
    return goodput_cli(
        "ckpt",
        *args,
        *("--job", JOB, "--nats-url", h.replicators.url),
        *("--state-dir", str(h.replicators.state_dir)),
        check=check,
    )


def peer_copies(snapshot: IndexSnapshot, owner: str, step: int) -> set[str]:
    return {
        c.holder
        for c in snapshot.copies
        if c.tier == "peer" and c.owner == owner and c.step == step
    }


def in_store(snapshot: IndexSnapshot, owner: str, step: int) -> bool:
    return any(
        c.tier == "object_store" and c.owner == owner and c.step == step for c in snapshot.copies
    )


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsServer]:
    with FakeGcsServer(tmp_path_factory.mktemp("gcs")) as server:
        yield server


async def _harness(
    nats_server: EmbeddedNats, state_dir: Path, store_options: dict, gcs: FakeGcsServer | None
) -> AsyncIterator[Harness]:
    replicators = Replicators(nats_server.url, state_dir, store_options)
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test-replicator")
    await bus.provision()
    harness = Harness(bus, replicators, gcs)
    await harness.events.start()
    try:
        yield harness
    finally:
        replicators.stop_all()
        await harness.events.stop()
        await bus.close()


@pytest.fixture
async def gcs_harness(
    nats_server: EmbeddedNats, tmp_path: Path, fake_gcs: FakeGcsServer
) -> AsyncIterator[Harness]:
    """Replicators backing up to fake-gcs-server by its ``gs://…?endpoint=`` URI, in a bucket
    of this test's own, under a prefix (the bucket's other keys are not theirs)."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    ensure_bucket(fake_gcs.client(), bucket)
    options = {"object_store": f'"{fake_gcs.store_uri(bucket, "cluster-a")}"'}
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    async for harness in _harness(nats_server, state_dir, options, fake_gcs):
        yield harness


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3Server]:
    """A moto S3 server; replicators and CLI runs started meanwhile inherit the environment
    in which boto3's standard chain finds the emulator's keys."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in EMULATOR_ENV.items():
            env.setenv(name, value)
        with MotoS3Server() as server:
            yield server


@pytest.fixture
async def s3_harness(
    nats_server: EmbeddedNats, tmp_path: Path, moto_s3: MotoS3Server
) -> AsyncIterator[Harness]:
    """Replicators backing up to moto's S3 server by its ``s3://…?endpoint=`` URI, in a
    bucket of this test's own, under a prefix."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    ensure_s3_bucket(moto_s3.client(), bucket)
    options = {"object_store": f'"{moto_s3.store_uri(bucket, "cluster-a")}"'}
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    async for harness in _harness(nats_server, state_dir, options, None):
        yield harness


@pytest.fixture
async def file_harness(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[Harness]:
    """Replicators backing up to a ``file://`` store outside their state directory (a shared
    volume, as one store serves the job)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    options = {"object_store": f'"file://{tmp_path / "shared store"}"'}
    async for harness in _harness(nats_server, state_dir, options, None):
        yield harness


@pytest.fixture
async def dir_harness(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[Harness]:
    """Replicators with the embedded default object store (a directory)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    async for harness in _harness(nats_server, state_dir, {}, None):
        yield harness
