"""A complete read of a KV bucket: every live entry, deletes honoured, nothing left behind,
with writers busy beside it, and on a three-server cluster after losing the bucket's leader."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest

from goodput import subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.cluster import EmbeddedCluster
from goodput.bus.kv_scan import BATCH, current_entries, subject_matches
from goodput.state_dir import StateDir

BUCKET = subjects.CKPT_INDEX_BUCKET
STREAM = f"KV_{BUCKET}"
KEYS = BATCH + 88  # more than one fetch


async def _fill(bus: Bus, job: str, count: int) -> dict[str, bytes]:
    kv = await bus.kv(BUCKET)
    expected = {}
    for i in range(count):
        key = f"{job}.copy.{i}"
        await kv.put(key, f"first {i}".encode())
        await kv.put(key, f"value {i}".encode())  # only the newest value counts
        expected[key] = f"value {i}".encode()
    for i in range(0, count, 7):
        await kv.delete(f"{job}.copy.{i}")
        del expected[f"{job}.copy.{i}"]
    return expected


async def test_every_live_entry_once_while_others_write(bus: Bus) -> None:
    expected = await _fill(bus, "job-a", KEYS)
    await _fill(bus, "job-b", 20)  # another job's entries are not read
    kv = await bus.kv(BUCKET)
    writing = True

    async def write_beside() -> None:
        n = 0
        while writing:
            await kv.put(f"job-b.copy.{n % 20}", b"busy")
            n += 1

    writer = asyncio.create_task(write_beside())
    try:
        reads = await asyncio.gather(*(current_entries(bus, BUCKET, "job-a.>") for _ in range(12)))
    finally:
        writing = False
        await writer
    assert all(read == expected for read in reads)
    assert await current_entries(bus, BUCKET, "job-none.>") == {}
    info = await bus.js.stream_info(STREAM)
    assert info.state.consumer_count == 0, "every read deletes its consumer"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(StateDir(tmp_path / "nats")) as servers:
        yield servers


@pytest.mark.slow
async def test_a_complete_read_after_the_bucket_lost_its_leader(cluster: EmbeddedCluster) -> None:
    bus = await Bus.connect(BusSettings(url=cluster.url), name="test")
    try:
        await bus.provision()
        expected = await _fill(bus, "job-a", 100)
        info = await bus.js.stream_info(STREAM)
        assert info.cluster is not None and info.cluster.leader
        await asyncio.to_thread(cluster.kill, int(info.cluster.leader.rsplit("-", 1)[1]))
        for _ in range(300):  # a new leader is elected within seconds
            try:
                read = await current_entries(bus, BUCKET, "job-a.>", timeout_s=2)
                break
            except nats.errors.Error:  # no leader yet: the read refuses, never guesses
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("no complete read within 30 s of losing the leader")
        assert read == expected
    finally:
        await bus.close()


async def test_a_read_of_the_whole_bucket_holds_only_its_entries(bus: Bus) -> None:
    """Each read writes its mark first; a filter that takes the mark in never returns it."""
    expected = await _fill(bus, "job-a", 10)
    assert await current_entries(bus, BUCKET, ">") == expected
    assert await current_entries(bus, BUCKET, "*.copy.*") == expected


async def test_a_bucket_nobody_made_is_not_found(bus: Bus) -> None:
    with pytest.raises(nats.js.errors.NotFoundError):
        await current_entries(bus, "no-such-bucket")


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        (">", "a", True),
        (">", "=goodput.read-mark", True),
        ("a.>", "a", False),
        ("a.>", "a.b.c", True),
        ("*.copy.*", "job.copy.1", True),
        ("*.copy.*", "job.copy.1.2", False),
        ("job.*", "=goodput.read-mark", False),
        ("job.copy", "job.copy", True),
        ("job.copy", "job", False),
    ],
)
def test_filters_match_as_nats_delivers(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches
