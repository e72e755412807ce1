"""Both object-store implementations against the same behaviour; GCS through a real
fake-gcs-server process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from goodput.checkpoint.format import ChecksumMismatch
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer, ensure_bucket
from goodput.checkpoint.tiers.gcs import PARTS_PREFIX, GcsObjectStore
from goodput.checkpoint.tiers.object_store import (
    DirectoryObjectStore,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
)


@pytest.fixture(params=["directory", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "directory":
        return DirectoryObjectStore(tmp_path / "bucket")
    return request.getfixturevalue("gcs_store")


def test_put_get_stat_list_delete(store: ObjectStore, prefix: str, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 123)  # several parts with the 1 MiB test part size
    source = tmp_path / "src.bin"
    source.write_bytes(data)
    key = f"{prefix}/dir/object.bin"
    store.put_file(key, source)

    info = store.stat(key)
    assert info is not None
    assert (info.size, info.xxh3_128) == (len(data), xxh3(data))
    assert store.stat(f"{prefix}/missing") is None

    store.get_file(key, tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == data

    store.put_bytes(f"{prefix}/small.json", b"{}")
    assert store.get_bytes(f"{prefix}/small.json") == b"{}"
    assert sorted(store.list(f"{prefix}/")) == [f"{prefix}/dir/object.bin", f"{prefix}/small.json"]
    if isinstance(store, GcsObjectStore):  # the parts of the multi-part upload are gone
        assert not list(store.client.list_blobs(store.bucket, prefix=PARTS_PREFIX))

    store.delete(key)
    store.delete(key)  # deleting twice is not an error
    assert store.stat(key) is None
    with pytest.raises(ObjectNotFound):
        store.get_file(key, tmp_path / "never.bin")
    assert not (tmp_path / "never.bin").exists()


def test_directory_store_refuses_a_file_that_does_not_match_its_checksum(tmp_path: Path) -> None:
    store = DirectoryObjectStore(tmp_path / "bucket")
    source = tmp_path / "src.bin"
    source.write_bytes(b"payload")
    with pytest.raises(ChecksumMismatch):
        store.put_file("x", source, xxh3(b"other"))
    assert store.stat("x") is None


def test_download_of_corrupt_object_is_refused_and_leaves_nothing(
    store: ObjectStore, prefix: str, tmp_path: Path
) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(2 << 20))
    store.put_file(f"{prefix}/obj", source)
    dest = tmp_path / "dest.bin"
    with pytest.raises(ChecksumMismatch):
        store.get_file(f"{prefix}/obj", dest, xxh3(b"what the manifest promised"))
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_directory_store_detects_bit_rot(tmp_path: Path) -> None:
    store = DirectoryObjectStore(tmp_path / "bucket")
    source = tmp_path / "src.bin"
    source.write_bytes(b"a" * 1000)
    store.put_file("k", source)
    with open(tmp_path / "bucket" / "k", "r+b") as f:
        f.seek(500)
        f.write(b"b")
    with pytest.raises(ChecksumMismatch):
        store.get_file("k", tmp_path / "out")


def test_unavailable_gcs_gives_clear_error_then_recovers(tmp_path: Path) -> None:
    with FakeGcsServer(tmp_path / "gcs-data") as server:
        ensure_bucket(server.client(), "restart-test")
        store = GcsObjectStore("restart-test", server.client(), retry_timeout_s=1.0)
        source = tmp_path / "src.bin"
        source.write_bytes(b"x" * 4096)
        store.put_file("before", source)

        server.stop()
        with pytest.raises(ObjectStoreUnavailable, match="unreachable"):
            store.put_file("during", source)
        with pytest.raises(ObjectStoreUnavailable):
            store.get_file("before", tmp_path / "out")
        assert not (tmp_path / "out").exists()

        server.start()  # same port, same data directory
        store.put_file("during", source)
        store.get_file("before", tmp_path / "out")
        assert (tmp_path / "out").read_bytes() == source.read_bytes()


def xxh3(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def test_gcs_large_parts_use_resumable_uploads(
    gcs_store: GcsObjectStore, prefix: str, tmp_path: Path
) -> None:
    """Parts above 8 MiB go through resumable uploads, which read each part from offset 0."""
    store = GcsObjectStore(
        gcs_store.bucket.name, gcs_store.client, part_bytes=9 << 20, max_workers=2
    )
    data = os.urandom(20 << 20)
    (tmp_path / "big").write_bytes(data)
    store.put_file(f"{prefix}/big", tmp_path / "big")
    store.get_file(f"{prefix}/big", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == data
    assert store.stat(f"{prefix}/big").xxh3_128 == xxh3(data)
