"""Restore to the nearest tier: local, then peer, then object store, per file, verified."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from goodput.checkpoint.format import Manifest, committed_steps, read_manifest
from goodput.checkpoint.tiers.backup import backup_checkpoint
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer, ensure_bucket
from goodput.checkpoint.tiers.gcs import GcsObjectStore
from goodput.checkpoint.tiers.peer import PeerClient, PeerServerProcess
from goodput.checkpoint.tiers.restore import (
    LocalSource,
    ObjectStoreSource,
    PeerSource,
    RestoreError,
    restore_to_volume,
)

STEP = 12
STEP_DIR = "step-0000000012"


@pytest.fixture
def node(tmp_path: Path, ckpt) -> tuple[Path, Manifest, dict[str, bytes]]:
    files = ckpt.random_files(3, 500_000, seed=1)
    manifest = ckpt.make(tmp_path / "node0", STEP, files)
    return tmp_path / "node0", manifest, files


async def replicate_to(peer: PeerServerProcess, node_root: Path) -> None:
    async with await PeerClient.connect(peer.host, peer.port) as client:
        await client.push_checkpoint(node_root / STEP_DIR, f"node0/{STEP_DIR}")


def assert_restored(dest: Path, manifest: Manifest, files: dict[str, bytes]) -> None:
    restored = dest / STEP_DIR
    for name, data in files.items():
        assert (restored / name).read_bytes() == data
    assert (restored / "manifest.json").read_bytes() == manifest.to_bytes()
    assert [s for s, _ in committed_steps(dest)] == [STEP]


async def test_restore_from_local(node, tmp_path: Path) -> None:
    root, manifest, files = node
    report = await restore_to_volume(
        STEP, manifest.files, tmp_path / "fresh", [LocalSource(root)], manifest=manifest
    )
    assert_restored(tmp_path / "fresh", manifest, files)
    assert {f.tier for f in report.files} == {"local"}
    assert report.bytes_by_tier() == {"local": sum(len(d) for d in files.values())}


async def test_restore_from_peer(node, tmp_path: Path, peer: PeerServerProcess) -> None:
    root, manifest, files = node
    await replicate_to(peer, root)
    async with PeerSource(peer.host, peer.port, "node0") as from_peer:
        sources = [LocalSource(tmp_path / "lost-volume"), from_peer]
        report = await restore_to_volume(
            STEP, manifest.files, tmp_path / "fresh", sources, manifest=manifest
        )
    assert_restored(tmp_path / "fresh", manifest, files)
    assert {f.tier for f in report.files} == {"peer"}
    assert all("SourceMiss" in f.failed_attempts[0] for f in report.files)


async def test_a_peer_serves_several_files_at_once_over_a_connection_each(
    tmp_path: Path, peer: PeerServerProcess, ckpt
) -> None:
    """Two streams: the largest file and the next one come over two connections at once
    (no more are opened); every file verified and committed, the report in manifest order."""
    files = ckpt.random_files(5, 400_000, seed=7)
    manifest = ckpt.make(tmp_path / "node0", STEP, files)
    await replicate_to(peer, tmp_path / "node0")
    async with PeerSource(peer.host, peer.port, "node0") as from_peer:
        report = await restore_to_volume(
            STEP, manifest.files, tmp_path / "fresh", [from_peer], manifest=manifest, streams=2
        )
        assert from_peer.connections == 2
    assert_restored(tmp_path / "fresh", manifest, files)
    assert [f.name for f in report.files] == [e.name for e in manifest.files]
    async with PeerSource(peer.host, peer.port, "node0") as one_at_a_time:
        await restore_to_volume(
            STEP, manifest.files, tmp_path / "again", [one_at_a_time], manifest=manifest, streams=1
        )
        assert one_at_a_time.connections == 1
    assert_restored(tmp_path / "again", manifest, files)


async def test_restore_from_object_store(
    node, tmp_path: Path, gcs_store: GcsObjectStore, prefix: str
) -> None:
    root, manifest, files = node
    backup_checkpoint(root / STEP_DIR, gcs_store, "node0", prefix)
    sources = [LocalSource(tmp_path / "lost"), ObjectStoreSource(gcs_store, prefix)]
    report = await restore_to_volume(
        STEP, manifest.files, tmp_path / "fresh", sources, manifest=manifest
    )
    assert_restored(tmp_path / "fresh", manifest, files)
    assert {f.tier for f in report.files} == {"object_store"}


async def test_corrupt_file_on_each_tier_falls_back_to_the_next(
    node, tmp_path: Path, peer: PeerServerProcess, gcs_store: GcsObjectStore, prefix: str
) -> None:
    root, manifest, files = node
    await replicate_to(peer, root)
    backup_checkpoint(root / STEP_DIR, gcs_store, "node0", prefix)
    names = sorted(files)
    # rank0 is corrupt locally (-> peer); rank1 corrupt locally and on the peer (-> object store).
    corrupt(root / STEP_DIR / names[0])
    corrupt(root / STEP_DIR / names[1])
    corrupt(peer.root / "node0" / STEP_DIR / names[1])
    async with PeerSource(peer.host, peer.port, "node0") as from_peer:
        sources = [LocalSource(root), from_peer, ObjectStoreSource(gcs_store, prefix)]
        report = await restore_to_volume(
            STEP, manifest.files, tmp_path / "fresh", sources, manifest=manifest
        )
    assert_restored(tmp_path / "fresh", manifest, files)
    tiers = {f.name: f.tier for f in report.files}
    assert tiers == {names[0]: "peer", names[1]: "object_store", names[2]: "local"}
    by_name = {f.name: f for f in report.files}
    assert "ChecksumMismatch" in by_name[names[1]].failed_attempts[1]


async def test_no_source_has_it_raises_and_commits_nothing(node, tmp_path: Path) -> None:
    _, manifest, _ = node
    with pytest.raises(RestoreError, match="cannot restore") as error:
        await restore_to_volume(
            STEP,
            manifest.files,
            tmp_path / "fresh",
            [LocalSource(tmp_path / "empty")],
            manifest=manifest,
        )
    assert len(error.value.attempts) == 1
    assert list(committed_steps(tmp_path / "fresh")) == []


async def test_peer_killed_mid_restore_then_retry_resumes(node, tmp_path: Path, ckpt) -> None:
    big = {"big.bin": os.urandom(48 << 20)}
    peer = PeerServerProcess(tmp_path / "peer-volume")
    manifest = ckpt.make(peer.root / "node0", STEP, big)
    peer.start()
    try:
        moved = 0

        def kill_midway(n: int) -> None:
            nonlocal moved
            moved += n
            if moved >= 16 << 20 and peer.process is not None:
                peer.kill()

        dest = tmp_path / "fresh"
        with pytest.raises(RestoreError, match="peer"):
            await restore_to_volume(
                STEP,
                manifest.files,
                dest,
                [PeerSource(peer.host, peer.port, "node0")],
                manifest=manifest,
                progress=kill_midway,
            )
        # Nothing half-written is visible: no data file under its final name, no manifest.
        assert ckpt.visible(dest) == set()

        peer.start()
        async with PeerSource(peer.host, peer.port, "node0") as from_peer:
            report = await restore_to_volume(
                STEP, manifest.files, dest, [from_peer], manifest=manifest
            )
        assert 0 < report.files[0].bytes_moved < len(big["big.bin"])
        assert (dest / STEP_DIR / "big.bin").read_bytes() == big["big.bin"]
        assert read_manifest(dest / STEP_DIR).files == manifest.files
    finally:
        peer.stop()


@contextlib.asynccontextmanager
async def byte_flipping_relay(host: str, port: int, flip_at: int) -> AsyncIterator[int]:
    """A TCP relay in front of a real peer server that inverts the ``flip_at``-th byte the
    server sends on each connection (a link that damages data in flight); yields its port."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flip: bool):
        seen = 0
        try:
            while data := await reader.read(1 << 16):
                if flip and seen <= flip_at < seen + len(data):
                    damaged = bytearray(data)
                    damaged[flip_at - seen] ^= 0xFF
                    data = bytes(damaged)
                seen += len(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter):
        server_reader, server_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(
            pipe(client_reader, server_writer, flip=False),
            pipe(server_reader, client_writer, flip=True),
        )

    relay_server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield relay_server.sockets[0].getsockname()[1]
    finally:
        relay_server.close()


async def test_bytes_damaged_in_flight_are_refused_and_nothing_is_committed(
    tmp_path: Path, ckpt, peer: PeerServerProcess
) -> None:
    """The pulled bytes land through the page cache now, not O_DIRECT: still, a file that
    fails its xxh3_128 is never published under its name, and no manifest is written."""
    files = {"big.bin": os.urandom(3 << 20)}
    manifest = ckpt.make(peer.root / "node0", STEP, files)
    dest = tmp_path / "fresh"
    async with (
        byte_flipping_relay(peer.host, peer.port, flip_at=2 << 20) as port,
        PeerSource("127.0.0.1", port, "node0") as damaged,
    ):
        with pytest.raises(RestoreError, match="ChecksumMismatch"):
            await restore_to_volume(STEP, manifest.files, dest, [damaged], manifest=manifest)
    assert ckpt.visible(dest) == set()
    assert list(committed_steps(dest)) == []
    assert not any((dest / STEP_DIR).iterdir())  # the damaged partial is gone too
    async with PeerSource(peer.host, peer.port, "node0") as intact:  # a sound link restores
        await restore_to_volume(STEP, manifest.files, dest, [intact], manifest=manifest)
    assert (dest / STEP_DIR / "big.bin").read_bytes() == files["big.bin"]


async def test_object_store_down_gives_clear_error_and_retry_succeeds(node, tmp_path: Path) -> None:
    root, manifest, files = node
    with FakeGcsServer(tmp_path / "gcs") as server:
        ensure_bucket(server.client(), "restore-test")
        store = GcsObjectStore("restore-test", server.client(), retry_timeout_s=1.0)
        backup_checkpoint(root / STEP_DIR, store, "node0")
        server.stop()
        with pytest.raises(RestoreError, match="unreachable"):
            await restore_to_volume(
                STEP,
                manifest.files,
                tmp_path / "fresh",
                [ObjectStoreSource(store)],
                manifest=manifest,
            )
        server.start()
        await restore_to_volume(
            STEP, manifest.files, tmp_path / "fresh", [ObjectStoreSource(store)], manifest=manifest
        )
    assert_restored(tmp_path / "fresh", manifest, files)


async def test_already_restored_files_are_verified_not_copied(node, tmp_path: Path) -> None:
    root, manifest, _ = node
    sources = [LocalSource(root)]
    await restore_to_volume(STEP, manifest.files, tmp_path / "fresh", sources, manifest=manifest)
    report = await restore_to_volume(
        STEP, manifest.files, tmp_path / "fresh", sources, manifest=manifest
    )
    assert all(f.already_present and f.bytes_moved == 0 for f in report.files)
    assert {f.tier for f in report.files} == {"local"}


def corrupt(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
