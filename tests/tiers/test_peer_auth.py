"""The peer data plane with the job's key: only a peer that proves the key reads or pushes,
and a manifest committed or fetched must carry the key's MAC."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from goodput.checkpoint.format import encode_manifest, read_manifest, step_dir
from goodput.checkpoint.format.job_key import KEY_FILE_ENV, create_key_file, load_key
from goodput.checkpoint.tiers.peer import (
    PeerAuthError,
    PeerClient,
    PeerError,
    PeerServer,
    PeerServerProcess,
)
from goodput.checkpoint.tiers.peer.channel import ProtocolError

STEP = "node0/step-0000000004"


@pytest.fixture
def job_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The job's key, in this process's environment and so in the peer processes it starts."""
    path = create_key_file(tmp_path / "state" / "ckpt.key")
    monkeypatch.setenv(KEY_FILE_ENV, str(path))
    return load_key(str(path))


@pytest.fixture
def keyed_peer(tmp_path: Path, job_key: bytes):  # type: ignore[no-untyped-def]
    with PeerServerProcess(tmp_path / "peer") as peer:
        yield peer


async def test_peers_holding_the_key_push_and_fetch(keyed_peer, tmp_path: Path, ckpt) -> None:  # type: ignore[no-untyped-def]
    files = ckpt.random_files(2, 100_000)
    ckpt.make(tmp_path / "node0", 4, files)
    async with await PeerClient.connect(keyed_peer.host, keyed_peer.port) as client:
        await client.push_checkpoint(tmp_path / "node0" / "step-0000000004", STEP)
        fetched = await client.fetch_manifest(STEP)
    assert fetched == read_manifest(step_dir(tmp_path / "node0", 4))
    assert ckpt.visible(keyed_peer.root / STEP) == {*files, "manifest.json"}


async def test_a_client_without_the_key_can_neither_read_nor_push(
    keyed_peer, tmp_path: Path, ckpt
) -> None:  # type: ignore[no-untyped-def]
    ckpt.make(tmp_path / "node0", 4, ckpt.random_files(1, 1000))
    async with await PeerClient.connect(keyed_peer.host, keyed_peer.port) as pusher:
        await pusher.push_checkpoint(tmp_path / "node0" / "step-0000000004", STEP)
    before = ckpt.visible(keyed_peer.root)
    async with await PeerClient.connect(keyed_peer.host, keyed_peer.port, key=None) as client:
        with pytest.raises(PeerError, match="requires the job's checkpoint key"):
            await client.stat(f"{STEP}/manifest.json")
    for attempt in ("fetch", "push"):
        async with await PeerClient.connect(keyed_peer.host, keyed_peer.port, key=None) as client:
            with pytest.raises((PeerError, ProtocolError, ConnectionError)):
                if attempt == "fetch":
                    await client.fetch_manifest(STEP)
                else:
                    await client.push_checkpoint(
                        tmp_path / "node0" / "step-0000000004", "intruder/step-0000000004"
                    )
    with pytest.raises(PeerAuthError, match="does not hold the job's checkpoint key"):
        await PeerClient.connect(keyed_peer.host, keyed_peer.port, key=b"w" * 32)
    assert ckpt.visible(keyed_peer.root) == before


async def test_a_server_without_the_key_is_refused_by_a_keyed_client(tmp_path: Path) -> None:
    async with PeerServer(tmp_path / "peer", key=None) as server:
        with pytest.raises(PeerAuthError, match="has no checkpoint key"):
            await PeerClient.connect(server.host, server.port, key=b"k" * 32)


async def test_a_refused_connection_is_one_log_line_and_a_forged_commit_is_refused(
    tmp_path: Path, job_key: bytes, ckpt, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    manifest = ckpt.make(tmp_path / "node0", 4, {"a.bin": b"x" * 10})
    async with PeerServer(tmp_path / "peer") as server:
        with caplog.at_level(logging.WARNING, "goodput.checkpoint.tiers.peer.server"):
            async with await PeerClient.connect(server.host, server.port, key=None) as client:
                with pytest.raises(PeerError):
                    await client.stat("x")
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1 and "\n" not in refusals[0].getMessage()
        async with await PeerClient.connect(server.host, server.port) as client:
            await client.put_file(
                step_dir(tmp_path / "node0", 4) / "a.bin",
                f"{STEP}/a.bin",
                10,
                manifest.files[0].xxh3_128,
            )
            with pytest.raises(PeerError, match="not signed with the job's key"):
                await client.commit(STEP, encode_manifest(manifest, key=None))
    assert not (tmp_path / "peer" / STEP / "manifest.json").exists()
