"""The node's host-memory tier: the ranks of a node read each other's snapshot buffers from
``/dev/shm`` segments after a restart, verified, and nothing leaks once they are gone.

Real engines (``node_shared=True``, one per rank, sharing one root as the ranks of a node
share its volume), real ``/dev/shm``, and a real rank process killed with SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import msgspec
import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host
from goodput.checkpoint.engine.node_segments import HEADER_BYTES, NodeSegments, SegmentHeader
from goodput.checkpoint.format import read_manifest, step_dir
from goodput.checkpoint.format.shm_segments import segment_prefix
from tests.processes import kill

from .helpers import assert_bit_exact, make_state

RANKS = 4
SHM = Path("/dev/shm")


def segments_of(root: Path) -> list[Path]:
    return sorted(SHM.glob(segment_prefix(root) + "*"))


def engine(root: Path) -> CheckpointEngine:
    return CheckpointEngine(root, min_file_bytes=4096, node_shared=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[list[CheckpointEngine]]:
    """One engine per rank of a node, each having saved its slice of step 5 (committed)."""
    with ExitStack() as stack:
        engines = [stack.enter_context(engine(tmp_path)) for _ in range(RANKS)]
        handles = [
            e.save(make_state(1, scale=8), 5, dp_rank=r, dp_world=RANKS)
            for r, e in enumerate(engines)
        ]
        assert all(handle.wait().ok for handle in handles)
        yield engines
    assert segments_of(tmp_path) == []  # every engine unlinked its segment at close


def files_of(root: Path, dp_rank: int) -> list[Path]:
    manifest = read_manifest(step_dir(root, 5))
    return [step_dir(root, 5) / e.name for e in manifest.files if e.dp_rank == dp_rank]


def segment_holding(root: Path, dp_rank: int) -> Path:
    with NodeSegments(root).peers(5, sharded=False) as peers:
        return next(SHM / p.name for p in peers if p.header.dp_rank == dp_rank)


def test_a_survivor_reads_its_node_mates_slices_from_shared_memory_not_the_volume(
    node: list[CheckpointEngine],
) -> None:
    """The other ranks' data files are gone from the volume: rank 0 restores bit-exact
    anyway, every byte from host memory (its buffer and three segments)."""
    root = node[0].root
    for rank in range(1, RANKS):
        for path in files_of(root, rank):
            path.unlink()
    live = make_state(2, scale=8)
    outcome = restore_from_host(node[0], 5, live)
    assert isinstance(outcome, HostRestore), outcome
    assert_bit_exact(make_state(1, scale=8), outcome.state)
    assert outcome.volume_bytes == 0
    assert outcome.host_bytes == read_manifest(step_dir(root, 5)).stream_bytes
    assert outcome.state["model"]["layer1.weight"] is live["model"]["layer1.weight"]


def test_a_corrupt_segment_is_caught_and_that_slice_read_from_the_volume(
    node: list[CheckpointEngine],
) -> None:
    root = node[0].root
    victim = segment_holding(root, 2)
    with NodeSegments(root).peers(5, sharded=False) as peers:
        slice_start = next(p.header.slice_start for p in peers if p.header.dp_rank == 2)
    with open(victim, "r+b") as segment:  # a flipped byte in rank 2's shared buffer
        segment.seek(HEADER_BYTES + 100)
        byte = segment.read(1)[0]
        segment.seek(HEADER_BYTES + 100)
        segment.write(bytes([byte ^ 0xFF]))
    outcome = restore_from_host(node[0], 5, make_state(2, scale=8))
    assert isinstance(outcome, HostRestore), outcome
    assert_bit_exact(make_state(1, scale=8), outcome.state)
    hit = next(
        e
        for e in read_manifest(step_dir(root, 5)).files
        if e.offset <= slice_start + 100 < e.offset + e.size
    )
    assert outcome.volume_bytes == hit.size  # that file alone, from the volume


def test_a_segment_claiming_another_step_is_not_read(node: list[CheckpointEngine]) -> None:
    victim = segment_holding(node[0].root, 3)
    body = msgspec.json.encode(SegmentHeader(step=6, dp_rank=3, dp_world=RANKS, nbytes=1))
    with open(victim, "r+b") as segment:  # as while rank 3 fills its buffer for step 6
        segment.write(len(body).to_bytes(4, "little") + body)
    outcome = restore_from_host(node[0], 5, make_state(2, scale=8))
    assert isinstance(outcome, HostRestore), outcome
    assert outcome.volume_bytes == sum(p.stat().st_size for p in files_of(node[0].root, 3))
    assert_bit_exact(make_state(1, scale=8), outcome.state)


RANK_1 = textwrap.dedent(
    """
    import sys, time, torch
    from goodput.checkpoint.engine import CheckpointEngine
    engine = CheckpointEngine(sys.argv[1], min_file_bytes=4096, node_shared=True)
    generator = torch.Generator().manual_seed(1)
    state = {"w": torch.randn(300_000, generator=generator), "b": torch.ones(5000)}
    print("ok" if engine.save(state, 5, dp_rank=1, dp_world=2).snapshotted() is None else "",
          flush=True)
    time.sleep(600)
    """
)


def test_a_killed_ranks_segment_serves_its_replacement_and_goes_at_the_next_save(
    tmp_path: Path,
) -> None:
    """Rank 1 saves its slice and is killed (SIGKILL: no cleanup of its own). The rank
    started in its place has no buffer, yet restores every byte from the node's segments,
    its predecessor's included; the first save after that unlinks the dead rank's segment,
    and nothing is left in /dev/shm once the live ranks close."""
    root = tmp_path / "volume"
    generator = torch.Generator().manual_seed(1)
    saved = {"w": torch.randn(300_000, generator=generator), "b": torch.ones(5000)}
    child = subprocess.Popen(
        [sys.executable, "-c", RANK_1, str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with CheckpointEngine(
            root, min_file_bytes=4096, node_shared=True, dp_commit_timeout_s=60
        ) as rank0:
            handle = rank0.save(saved, 5, dp_rank=0, dp_world=2)
            assert child.stdout is not None and child.stdout.readline().strip() == "ok"
            assert handle.wait(120).ok  # committed once rank 1's slice was durable too
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            assert len(segments_of(root)) == 2  # the dead rank's segment outlived it
            with engine(root) as replacement:
                live = {"w": torch.zeros(300_000), "b": torch.zeros(5000)}
                outcome = restore_from_host(replacement, 5, live, own=False)
                assert isinstance(outcome, HostRestore), outcome
                assert outcome.volume_bytes == 0
                assert_bit_exact(saved, outcome.state)
                assert replacement.save(saved, 6, dp_rank=1, dp_world=2).snapshotted() is None
                assert rank0.save(saved, 6, dp_rank=0, dp_world=2).wait(120).ok
                assert len(segments_of(root)) == 2  # the two live ranks' own
        assert segments_of(root) == []
    finally:
        kill(child)
        for path in segments_of(root):
            path.unlink()


def test_a_segment_whose_owner_lives_is_never_swept(tmp_path: Path) -> None:
    with engine(tmp_path) as owner:
        assert owner.save({"w": torch.arange(10.0)}, 1).wait().ok
        assert NodeSegments(tmp_path).sweep() == []
        assert len(segments_of(tmp_path)) == 1
    assert segments_of(tmp_path) == []


def test_where_no_segment_can_be_made_the_buffer_is_private(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path, node_shared=True) as alone:
        alone._segments = NodeSegments(tmp_path, directory=tmp_path / "no-such-dir")
        assert alone.save({"w": torch.arange(10.0)}, 1).wait().ok
        outcome = restore_from_host(alone, 1, {"w": torch.zeros(10)})
        assert isinstance(outcome, HostRestore) and outcome.volume_bytes == 0
    assert os.listdir(tmp_path / "step-0000000001")


def test_a_reused_buffer_no_longer_claims_the_step_it_held(tmp_path: Path) -> None:
    with engine(tmp_path) as owner, engine(tmp_path) as reader:
        assert owner.save({"w": torch.arange(10.0)}, 5).wait().ok
        with reader.node_peers(5, sharded=False) as peers:
            assert [p.header.step for p in peers] == [5]
        assert owner.save({"w": torch.arange(10.0) + 1}, 6).wait().ok
        with reader.node_peers(5, sharded=False) as peers:
            assert peers == []
        with reader.node_peers(6, sharded=False) as peers:
            assert len(peers) == 1 and peers[0].covers(0, 40)


def test_a_fifo_or_link_under_a_segment_name_is_skipped_not_waited_on(
    node: list[CheckpointEngine],
) -> None:
    prefix = segment_prefix(node[0].root)
    fifo, link = SHM / f"{prefix}fifo", SHM / f"{prefix}link"
    os.mkfifo(fifo)
    link.symlink_to(segment_holding(node[0].root, 1))
    try:
        outcome = restore_from_host(node[0], 5, make_state(2, scale=8))
        assert isinstance(outcome, HostRestore) and outcome.volume_bytes == 0
        assert_bit_exact(make_state(1, scale=8), outcome.state)
    finally:
        fifo.unlink()
        link.unlink()


def test_a_second_segment_claiming_the_same_slice_serves_it_when_the_first_is_corrupt(
    node: list[CheckpointEngine],
) -> None:
    """Two claimants (a killed rank's segment and its copy, say): the corrupt one is passed
    over for the intact one, whichever the listing gives first; no volume read."""
    original = segment_holding(node[0].root, 2)
    copy = SHM / f"{segment_prefix(node[0].root)}copy"
    shutil.copyfile(original, copy)
    try:
        with open(original, "r+b") as segment:
            segment.seek(HEADER_BYTES + 100)
            byte = segment.read(1)[0]
            segment.seek(HEADER_BYTES + 100)
            segment.write(bytes([byte ^ 0xFF]))
        outcome = restore_from_host(node[0], 5, make_state(2, scale=8))
        assert isinstance(outcome, HostRestore) and outcome.volume_bytes == 0, outcome
        assert_bit_exact(make_state(1, scale=8), outcome.state)
    finally:
        copy.unlink(missing_ok=True)
