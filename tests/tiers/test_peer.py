"""The peer data plane against a real peer-server process: push, pull, stat, dedup, and
resumption after the peer is killed mid-transfer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest
import xxhash

from goodput.checkpoint.format import ChecksumMismatch, committed_steps, partial_path, read_manifest
from goodput.checkpoint.tiers.peer import PeerClient, PeerError, PeerServer, PeerServerProcess
from tests.tiers.budget_relay import BudgetRelay


async def connect(peer: PeerServerProcess) -> PeerClient:
    return await PeerClient.connect(peer.host, peer.port)


async def test_push_checkpoint_is_bit_exact_and_committed_last(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    files = ckpt.random_files(3, 300_000) | {"tiny/empty.bin": b""}
    ckpt.make(tmp_path / "node0", 4, files)
    async with await connect(peer) as client:
        report = await client.push_checkpoint(
            tmp_path / "node0" / "step-0000000004", "node0/step-0000000004"
        )
        replica = peer.root / "node0" / "step-0000000004"
        for name, data in files.items():
            assert (replica / name).read_bytes() == data
            assert (await client.stat(f"node0/step-0000000004/{name}")).xxh3_128 == xxh3(data)
        assert (replica / "manifest.json").read_bytes() == (
            tmp_path / "node0" / "step-0000000004" / "manifest.json"
        ).read_bytes()
        assert report.bytes_sent == sum(len(d) for d in files.values())
        assert report.bytes_skipped == 0
        assert not (await client.stat("node0/missing")).exists
        fetched = await client.fetch_manifest("node0/step-0000000004")
        assert fetched.to_bytes() == (replica / "manifest.json").read_bytes()


async def test_three_dp_replicas_cost_one_replica_of_traffic(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    files = ckpt.random_files(4, 200_000)
    replica_bytes = sum(len(d) for d in files.values())
    reports = []
    async with await connect(peer) as client:
        for n in range(3):
            ckpt.make(tmp_path / f"node{n}", 8, files)
            reports.append(
                await client.push_checkpoint(
                    tmp_path / f"node{n}" / "step-0000000008", f"node{n}/step-0000000008"
                )
            )
    assert sum(r.bytes_sent for r in reports) == replica_bytes
    assert sum(r.bytes_skipped for r in reports) == 2 * replica_bytes
    for n in range(3):
        assert [s for s, _ in committed_steps(peer.root / f"node{n}")] == [8]
        for name, data in files.items():
            assert (peer.root / f"node{n}" / "step-0000000008" / name).read_bytes() == data
    # Identical content is hard-linked, not stored three times.
    first = peer.root / "node0" / "step-0000000008" / "rank0/shard.bin"
    assert first.stat().st_nlink == 3


async def test_dedup_uses_the_peers_own_checkpoint_after_verifying_it(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    files = ckpt.random_files(2, 100_000)
    ckpt.make(peer.root / "own", 3, files)  # the peer's own DP replica, written by its engine
    ckpt.make(tmp_path / "node1", 3, files)
    async with await connect(peer) as client:
        report = await client.push_checkpoint(
            tmp_path / "node1" / "step-0000000003", "node1/step-0000000003"
        )
    assert report.bytes_sent == 0
    # A corrupted local copy on the peer is not trusted: the bytes are sent instead.
    (peer.root / "own" / "step-0000000003" / "rank1/shard.bin").write_bytes(b"x" * 100_000)
    ckpt.make(tmp_path / "node2", 3, files)
    async with await connect(peer) as client:
        report = await client.push_checkpoint(
            tmp_path / "node2" / "step-0000000003", "node2/step-0000000003"
        )
    assert report.bytes_sent == 100_000
    assert (peer.root / "node2" / "step-0000000003" / "rank1/shard.bin").read_bytes() == files[
        "rank1/shard.bin"
    ]


async def test_corrupt_source_is_refused_by_the_receiver(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    ckpt.make(tmp_path / "node0", 1, {"a.bin": b"a" * 5000})
    (tmp_path / "node0" / "step-0000000001" / "a.bin").write_bytes(b"b" * 5000)
    async with await connect(peer) as client:
        with pytest.raises(PeerError, match="checksum mismatch"):
            await client.push_checkpoint(
                tmp_path / "node0" / "step-0000000001", "node0/step-0000000001"
            )
        # The connection stays usable and nothing is visible on the peer.
        assert not (await client.stat("node0/step-0000000001/a.bin")).exists
    assert ckpt.visible(peer.root) == set()


@pytest.mark.timeout(60)
async def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    """A named pipe would block an open until a writer comes: sender and server refuse it."""
    ckpt.make(tmp_path / "node0", 1, {"a.bin": b"a" * 5000})
    shard = tmp_path / "node0" / "step-0000000001" / "a.bin"
    shard.unlink()
    os.mkfifo(shard)
    served = peer.root / "node0" / "step-0000000002"
    served.mkdir(parents=True)
    os.mkfifo(served / "b.bin")
    async with await connect(peer) as client:
        with pytest.raises(OSError, match="not a regular file"):
            await client.push_checkpoint(
                tmp_path / "node0" / "step-0000000001", "node0/step-0000000001"
            )
    async with await connect(peer) as client:  # what `goodput ckpt verify` asks a holder
        assert not (await client.stat("node0/step-0000000002/b.bin")).exists
        with pytest.raises(PeerError, match="no such file"):
            await client.get_file(
                "node0/step-0000000002/b.bin", tmp_path / "b.partial", 1, "0" * 32
            )
    assert ckpt.visible(peer.root / "node0" / "step-0000000001") == set()


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/.hidden", "a/../../b"])
async def test_paths_outside_the_served_root_are_refused(
    peer: PeerServerProcess, path: str
) -> None:
    async with await connect(peer) as client:
        with pytest.raises(PeerError, match="not allowed"):
            await client.stat(path)


async def test_push_resumes_after_the_receiving_peer_is_killed(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    data = os.urandom(64 << 20)
    ckpt.make(tmp_path / "node0", 2, {"big.bin": data})
    source = tmp_path / "node0" / "step-0000000002"
    sent = 0

    def kill_halfway(n: int) -> None:
        nonlocal sent
        sent += n
        if sent >= 40 << 20 and peer.process is not None:
            peer.kill()

    client = await connect(peer)
    with pytest.raises((ConnectionError, OSError)):
        await client.put_file(
            source / "big.bin", "node0/step-0000000002/big.bin", len(data), xxh3(data), kill_halfway
        )
    await client.close()
    final = peer.root / "node0" / "step-0000000002" / "big.bin"
    received_before = partial_path(final, xxh3(data)).stat().st_size
    assert 0 < received_before < len(data)
    assert not final.exists()

    peer.start()  # the node comes back with what it had on disk
    async with await connect(peer) as client:
        report = await client.push_checkpoint(source, "node0/step-0000000002")
    assert report.bytes_sent == len(data) - received_before
    assert report.bytes_skipped == received_before
    assert final.read_bytes() == data
    assert read_manifest(final.parent).files[0].xxh3_128 == xxh3(data)


async def test_parallel_push_with_one_bad_file_commits_nothing_and_retries_cleanly(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    files = ckpt.random_files(6, 300_000)
    ckpt.make(tmp_path / "node0", 5, files)
    source = tmp_path / "node0" / "step-0000000005"
    (source / "rank3/shard.bin").write_bytes(b"rot" * 100_000)  # same size, wrong bytes
    async with await connect(peer) as client:
        with pytest.raises(PeerError, match="checksum mismatch"):
            await client.push_checkpoint(source, "node0/step-0000000005", streams=3)
        replica = peer.root / "node0" / "step-0000000005"
        # No manifest, so no copy a replicator would index; what is visible is verified.
        assert not (replica / "manifest.json").exists()
        assert "rank3/shard.bin" not in ckpt.visible(replica)
        for name in ckpt.visible(replica):
            assert (replica / name).read_bytes() == files[name]
        published = sum(len(files[name]) for name in ckpt.visible(replica))
        # The connection that carried the bad file stays usable; a retry sends the rest.
        (source / "rank3/shard.bin").write_bytes(files["rank3/shard.bin"])
        report = await client.push_checkpoint(source, "node0/step-0000000005", streams=3)
    assert report.bytes_skipped == published
    assert report.bytes_sent == sum(len(d) for d in files.values()) - published
    assert ckpt.visible(replica) == set(files) | {"manifest.json"}
    for name, data in files.items():
        assert (replica / name).read_bytes() == data


async def test_parallel_push_resumes_after_the_receiving_peer_is_killed(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    files = {f"rank{i}/big.bin": os.urandom(24 << 20) for i in range(3)}
    total = sum(len(d) for d in files.values())
    ckpt.make(tmp_path / "node0", 7, files)
    source = tmp_path / "node0" / "step-0000000007"
    replica = peer.root / "node0" / "step-0000000007"

    def on_disk() -> int:
        """Bytes the receiver has written (files come and go under it: publish renames)."""
        count = 0
        for path in replica.rglob("*") if replica.exists() else ():
            with contextlib.suppress(FileNotFoundError):
                count += path.stat().st_size if path.is_file() else 0
        return count

    # the receiver gets three quarters of the bytes at most, over its three connections; it is
    # killed once some of them are on its disk (a kill timed by the sender's progress once came
    # after everything had arrived: the client sends from worker threads)
    async with BudgetRelay(peer.host, peer.port, budget=total * 3 // 4) as relay:
        client = await PeerClient.connect(relay.host, relay.port)
        push = asyncio.create_task(
            client.push_checkpoint(source, "node0/step-0000000007", streams=3)
        )
        await asyncio.wait_for(relay.exhausted.wait(), timeout=120)
        deadline = time.monotonic() + 60
        while on_disk() == 0:
            assert time.monotonic() < deadline, "nothing reached the receiver's disk"
            await asyncio.sleep(0.01)
        peer.kill()
        with pytest.raises((ConnectionError, OSError)):
            await asyncio.wait_for(push, timeout=120)
        await client.close()
    assert not (replica / "manifest.json").exists()
    for name in ckpt.visible(replica):  # a file another stream completed is verified
        assert (replica / name).read_bytes() == files[name]
    kept = sum(p.stat().st_size for p in replica.rglob(".*.partial"))
    kept += sum(len(files[name]) for name in ckpt.visible(replica))
    assert 0 < kept < total

    peer.start()
    async with await connect(peer) as client:
        report = await client.push_checkpoint(source, "node0/step-0000000007", streams=3)
    assert report.bytes_skipped == kept
    assert report.bytes_sent == total - kept
    for name, data in files.items():
        assert (replica / name).read_bytes() == data
    assert read_manifest(replica).step == 7


async def test_pull_resumes_after_the_sending_peer_is_killed(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    data = os.urandom(48 << 20)
    ckpt.make(peer.root / "node0", 6, {"big.bin": data})
    partial = tmp_path / ".big.bin.partial"

    def written() -> int:
        return partial.stat().st_size if partial.exists() else 0

    # the client gets 24 MiB at most; the sender is killed once 16 MiB are on the client's disk
    async with BudgetRelay(peer.host, peer.port, budget=24 << 20, to_upstream=False) as relay:
        client = await PeerClient.connect(relay.host, relay.port)
        pull = asyncio.create_task(
            client.get_file("node0/step-0000000006/big.bin", partial, len(data), xxh3(data))
        )
        await asyncio.wait_for(relay.exhausted.wait(), timeout=120)
        deadline = time.monotonic() + 60
        while written() < 16 << 20:
            assert time.monotonic() < deadline, f"{written()} bytes on disk, not 16 MiB"
            await asyncio.sleep(0.01)
        peer.kill()
        with pytest.raises((ConnectionError, OSError, EOFError)):
            await asyncio.wait_for(pull, timeout=120)
        await client.close()
    kept = partial.stat().st_size
    assert kept >= 16 << 20

    peer.start()
    async with await connect(peer) as client:
        result = await client.get_file(
            "node0/step-0000000006/big.bin", partial, len(data), xxh3(data)
        )
    assert result.resumed_from == kept
    assert result.bytes_received == len(data) - kept
    assert partial.read_bytes() == data


async def test_pull_with_wrong_expected_checksum_discards_the_partial(
    peer: PeerServerProcess, tmp_path: Path, ckpt
) -> None:
    ckpt.make(peer.root / "n", 1, {"a.bin": b"a" * 10_000})
    partial = tmp_path / ".a.partial"
    async with await connect(peer) as client:
        with pytest.raises(ChecksumMismatch):
            await client.get_file("n/step-0000000001/a.bin", partial, 10_000, xxh3(b"other"))
        with pytest.raises(PeerError, match="no such file"):
            await client.get_file("n/step-0000000001/zzz", partial, 1, xxh3(b"z"))
    assert not partial.exists()


def xxh3(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


async def test_a_commit_records_the_copy_verified_on_receive_only_if_every_file_was(
    tmp_path: Path, ckpt
) -> None:
    """What lets the holder's scan skip hashing a copy: every file verified as it landed."""
    source = tmp_path / "node0" / "step-0000000004"
    ckpt.make(tmp_path / "node0", 4, ckpt.random_files(2, 100_000))
    seal = read_manifest(source).manifest_xxh3_128
    committed: list[Path] = []
    server = PeerServer(tmp_path / "volume", on_commit=committed.append, track_received=True)
    async with server, await PeerClient.connect(server.host, server.port) as client:
        await client.push_checkpoint(source, "node0/step-0000000004")
        # files put in place behind the server's back, then committed: not verified here
        planted = server.root / "node1" / "step-0000000004"
        shutil.copytree(source, planted)
        (planted / "manifest.json").unlink()
        await client.commit("node1/step-0000000004", (source / "manifest.json").read_bytes())
    received = server.root / "node0" / "step-0000000004"
    assert server.received == {received: seal}
    assert committed == [received, planted]
