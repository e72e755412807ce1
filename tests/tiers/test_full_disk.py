"""A volume that fills up: a real 4 MiB tmpfs (skipped where mounting is not permitted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from goodput.checkpoint.tiers.peer import PeerClient, PeerError, PeerServerProcess
from goodput.checkpoint.tiers.restore import LocalSource, RestoreError, restore_to_volume
from tests.conftest import tmpfs_mount


@pytest.fixture
def tiny_volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs_mount(tmp_path / "tiny", "4m") as mountpoint:
        yield mountpoint


async def test_restore_onto_a_full_volume_fails_cleanly(
    tiny_volume: Path, tmp_path: Path, ckpt
) -> None:
    manifest = ckpt.make(tmp_path / "node0", 1, ckpt.random_files(3, 1_500_000))
    with pytest.raises(RestoreError, match="No space left"):
        await restore_to_volume(
            1, manifest.files, tiny_volume, [LocalSource(tmp_path / "node0")], manifest=manifest
        )
    restored = tiny_volume / "step-0000000001"
    # Whatever is visible is complete and verified; no manifest; no leftover temp files.
    assert "manifest.json" not in ckpt.visible(restored)
    for name in ckpt.visible(restored):
        assert (restored / name).read_bytes() == (
            tmp_path / "node0" / "step-0000000001" / name
        ).read_bytes()
    assert not [p for p in restored.rglob(".*") if p.is_file()]


async def test_peer_with_a_full_volume_refuses_and_stays_usable(
    tiny_volume: Path, tmp_path: Path, ckpt
) -> None:
    ckpt.make(tmp_path / "node0", 1, ckpt.random_files(1, 6_000_000))
    with PeerServerProcess(tiny_volume) as peer:
        async with await PeerClient.connect(peer.host, peer.port) as client:
            with pytest.raises(PeerError, match="No space left"):
                await client.push_checkpoint(
                    tmp_path / "node0" / "step-0000000001", "node0/step-0000000001"
                )
            assert not (await client.stat("node0/step-0000000001/rank0/shard.bin")).exists
    assert ckpt.visible(tiny_volume) == set()
