"""Content-addressed backups: each unique file stored once, listing written last."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.checkpoint.format import ChecksumMismatch
from goodput.checkpoint.tiers.backup import (
    backed_up_steps,
    backup_checkpoint,
    blob_key,
    is_backup_complete,
    listing_key,
    read_listing,
)
from goodput.checkpoint.tiers.object_store import DirectoryObjectStore, ObjectStore


@pytest.fixture(params=["directory", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "directory":
        return DirectoryObjectStore(tmp_path / "bucket")
    return request.getfixturevalue("gcs_store")


def test_three_dp_replicas_store_each_unique_file_once(
    store: ObjectStore, prefix: str, tmp_path: Path, ckpt
) -> None:
    files = ckpt.random_files(3, 256 << 10)
    replica_bytes = sum(len(d) for d in files.values())
    manifests = [ckpt.make(tmp_path / f"node{n}", 5, files) for n in range(3)]
    reports = [
        backup_checkpoint(tmp_path / f"node{n}" / "step-0000000005", store, f"node{n}", prefix)
        for n in range(3)
    ]
    assert sum(r.bytes_uploaded for r in reports) == replica_bytes
    assert sum(r.bytes_skipped for r in reports) == 2 * replica_bytes
    stored = sum(store.stat(k).size for k in store.list(f"{prefix}/blobs/"))
    assert stored == replica_bytes
    for n in range(3):
        assert is_backup_complete(store, f"node{n}", 5, prefix)
        assert backed_up_steps(store, f"node{n}", prefix) == [5]
        assert read_listing(store, f"node{n}", 5, prefix).files == manifests[n].files


def test_backup_is_incomplete_without_listing_or_blob(
    store: ObjectStore, prefix: str, tmp_path: Path, ckpt
) -> None:
    manifest = ckpt.make(tmp_path, 9, {"a.bin": b"a" * 1000, "b.bin": b"b" * 2000})
    assert not is_backup_complete(store, "n", 9, prefix)
    backup_checkpoint(tmp_path / "step-0000000009", store, "n", prefix)
    assert is_backup_complete(store, "n", 9, prefix)
    assert read_listing(store, "n", 9, prefix).files == manifest.files
    store.delete(blob_key(manifest.files[1].xxh3_128, prefix))
    assert not is_backup_complete(store, "n", 9, prefix)
    store.delete(listing_key("n", 9, prefix))
    assert backed_up_steps(store, "n", prefix) == []


def test_corrupt_local_file_is_not_backed_up(tmp_path: Path, ckpt) -> None:
    store = DirectoryObjectStore(tmp_path / "bucket")
    ckpt.make(tmp_path / "node", 1, {"a.bin": b"good" * 100})
    (tmp_path / "node" / "step-0000000001" / "a.bin").write_bytes(b"evil" * 100)
    with pytest.raises(ChecksumMismatch):
        backup_checkpoint(tmp_path / "node" / "step-0000000001", store, "node")
    assert list(store.list("")) == []
