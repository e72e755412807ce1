"""The object-store implementations against the same behaviour: a directory, GCS through a
real fake-gcs-server process, S3 through a real moto S3 server process."""

from __future__ import annotations

import os
import time
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
from goodput.checkpoint.tiers.s3 import S3ObjectStore
from goodput.checkpoint.tiers.s3_emulator import MotoS3Server
from goodput.checkpoint.tiers.s3_emulator import ensure_bucket as ensure_s3_bucket
from tests.tiers.conftest import BUCKET


@pytest.fixture(params=["directory", "gcs", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "directory":
        return DirectoryObjectStore(tmp_path / "bucket")
    return request.getfixturevalue(f"{request.param}_store")


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


def test_listing_a_prefix_reads_every_page(store: ObjectStore, prefix: str) -> None:
    """More keys than a page holds (the S3 fixture's pages hold two): all come, in order."""
    keys = [f"{prefix}/l/{i:02d}" for i in range(5)]
    for key in reversed(keys):
        store.put_bytes(key, key.encode())
    store.put_bytes(f"{prefix}/other", b"x")
    assert list(store.list(f"{prefix}/l/")) == keys


def test_s3_large_files_go_in_parts_and_come_back_whole(
    s3_store: S3ObjectStore, prefix: str, tmp_path: Path
) -> None:
    data = os.urandom((12 << 20) + 7)  # three parts of 5 MiB (the last one short)
    (tmp_path / "big").write_bytes(data)
    s3_store.put_file(f"{prefix}/big", tmp_path / "big")
    head = s3_store.client.head_object(Bucket=s3_store.bucket, Key=f"{prefix}/big")
    assert head["ETag"].strip('"').endswith("-3"), "not one multipart upload of three parts"
    uploads = s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket)
    assert not uploads.get("Uploads"), "a multipart upload was left open"
    info = s3_store.stat(f"{prefix}/big")
    assert info is not None and (info.size, info.xxh3_128) == (len(data), xxh3(data))
    s3_store.get_file(f"{prefix}/big", tmp_path / "back")  # ranged parts, in parallel
    assert (tmp_path / "back").read_bytes() == data


def test_s3_object_altered_in_the_bucket_is_refused(
    s3_store: S3ObjectStore, prefix: str, tmp_path: Path
) -> None:
    """Bytes replaced behind the store's back (metadata kept) fail the stored checksum."""
    (tmp_path / "src").write_bytes(b"a" * 1000)
    s3_store.put_file(f"{prefix}/k", tmp_path / "src")
    s3_store.put_bytes(f"{prefix}/listing", b"{}")
    for key in (f"{prefix}/k", f"{prefix}/listing"):
        stored = s3_store.client.head_object(Bucket=s3_store.bucket, Key=key)["Metadata"]
        s3_store.client.put_object(Bucket=s3_store.bucket, Key=key, Body=b"b", Metadata=stored)
    with pytest.raises(ChecksumMismatch):
        s3_store.get_file(f"{prefix}/k", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ChecksumMismatch):
        s3_store.get_bytes(f"{prefix}/listing")
    with pytest.raises(ObjectNotFound):
        s3_store.get_bytes(f"{prefix}/missing")


def test_s3_refusals_are_one_line_at_once(
    moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A missing bucket or missing credentials is not retried: one line, now."""
    (tmp_path / "src").write_bytes(b"x")
    missing = S3ObjectStore("no-such-bucket", moto_s3.client(), retry_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(ObjectStoreUnavailable, match=r"s3://no-such-bucket refused .*NoSuchBucket"):
        missing.put_file("k", tmp_path / "src")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    anonymous = S3ObjectStore(BUCKET, moto_s3.client(), retry_timeout_s=30)
    with pytest.raises(ObjectStoreUnavailable, match="AWS_ACCESS_KEY_ID") as caught:
        anonymous.stat("k")
    assert "Unable to locate credentials" in str(caught.value) and "\n" not in str(caught.value)
    assert time.monotonic() - started < 10


def test_unavailable_s3_gives_clear_error_then_recovers(
    moto_s3: MotoS3Server, tmp_path: Path
) -> None:
    """A server of its own to stop (``moto_s3`` for the credentials in the environment)."""
    with MotoS3Server() as server:
        ensure_s3_bucket(server.client(), "restart-test")
        store = S3ObjectStore("restart-test", server.client(), retry_timeout_s=1.0)
        source = tmp_path / "src.bin"
        source.write_bytes(b"x" * 4096)
        store.put_file("before", source)

        server.stop()
        with pytest.raises(ObjectStoreUnavailable, match="unreachable during upload during"):
            store.put_file("during", source)
        with pytest.raises(ObjectStoreUnavailable, match="unreachable"):
            store.get_file("before", tmp_path / "out")
        assert not (tmp_path / "out").exists()

        server.start()  # same port; moto keeps objects in memory, so the bucket is new
        ensure_s3_bucket(server.client(), "restart-test")
        store.put_file("during", source)
        store.get_file("during", tmp_path / "out")
        assert (tmp_path / "out").read_bytes() == source.read_bytes()
