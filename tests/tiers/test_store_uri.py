"""Store URIs: the spellings of before as aliases, the emulator endpoint inside the URI,
refusals in one line, and the factory opening a directory and a (fake) GCS bucket."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from goodput.checkpoint.index.records import NodeAddressRecord, decode_node, encode
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer
from goodput.checkpoint.tiers.object_store import DirectoryObjectStore, PrefixedStore
from goodput.checkpoint.tiers.open_store import open_object_store
from goodput.checkpoint.tiers.store_uri import StoreUri, StoreUriError, parse_store_uri
from tests.tiers.conftest import BUCKET

EMULATOR = "http://127.0.0.1:4443"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dir:/mnt/ckpt", StoreUri("file", "/mnt/ckpt")),
        ("file:///mnt/ckpt", StoreUri("file", "/mnt/ckpt")),
        ("file://localhost/mnt/ckpt/", StoreUri("file", "/mnt/ckpt")),
        ("file:///mnt/my%20ckpt", StoreUri("file", "/mnt/my ckpt")),
        ("gcs:my-bucket", StoreUri("gs", "my-bucket")),
        ("gs://my-bucket", StoreUri("gs", "my-bucket")),
        ("gs://my-bucket/a/b/", StoreUri("gs", "my-bucket", "a/b")),
        (f"gs://my_bucket.x?endpoint={EMULATOR}/", StoreUri("gs", "my_bucket.x", "", EMULATOR)),
    ],
)
def test_spellings_and_round_trip(text: str, expected: StoreUri) -> None:
    uri = parse_store_uri(text)
    assert uri == expected
    assert parse_store_uri(str(uri)) == uri


def test_the_legacy_endpoint_folds_into_the_uri() -> None:
    assert str(parse_store_uri("gcs:b-1", EMULATOR)) == f"gs://b-1?endpoint={EMULATOR}"
    assert parse_store_uri(f"gs://b-1?endpoint={EMULATOR}", EMULATOR).endpoint == EMULATOR
    with pytest.raises(StoreUriError, match="applies to a gs:// store"):
        parse_store_uri("dir:/x", EMULATOR)
    with pytest.raises(StoreUriError, match="another endpoint"):
        parse_store_uri(f"gs://b-1?endpoint={EMULATOR}", "http://10.0.0.1:1")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not a store URI"),
        ("/mnt/ckpt", "not a store URI"),
        ("s3://bucket/x", "S3 is not supported yet"),
        ("azure://x", "unknown scheme 'azure'"),
        ("dir:relative/path", "absolute path"),
        ("file:///a/../b", "absolute path"),
        ("file://otherhost/a", "file:///<absolute path>"),
        ("file:///a?x=1", "file:///<absolute path>"),
        ("gs://B", "not a valid bucket name"),
        ("gs://Upper-Case", "not a valid bucket name"),
        ("gs://user@bucket", "not a valid bucket name"),
        ("gs://bucket/../x", "invalid prefix"),
        ("gs://bucket/.hidden", "invalid prefix"),
        ("gs://bucket?region=x", "only query field"),
        (f"gs://bucket?endpoint={EMULATOR}&endpoint={EMULATOR}", "only query field"),
        ("gs://bucket?endpoint=ftp://h", "not http(s)://host[:port]"),
        ("gs://bucket?endpoint=http://h/path", "not http(s)://host[:port]"),
        ("gs://bucket?endpoint=http://u:p@h", "not http(s)://host[:port]"),
        ("gs://bucket?endpoint=http://h:99999", "endpoint"),
    ],
)
def test_refusals_are_one_typed_line(text: str, says: str) -> None:
    with pytest.raises(StoreUriError, match=re.escape(says)) as caught:
        parse_store_uri(text)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


def test_object_uris_name_the_key_inside_the_store() -> None:
    assert StoreUri("file", "/a b").key_uri("j/n/x") == "file:///a%20b/j/n/x"
    assert StoreUri("gs", "bkt", "p/q", EMULATOR).key_uri("j/x") == "gs://bkt/p/q/j/x"


def test_node_records_of_before_decode_with_their_endpoint() -> None:
    """Schema 2 records written by the build before carry the spec and the endpoint apart."""
    old = encode(
        NodeAddressRecord(
            node="n", host="h", port=1, object_store="gcs:bkt", legacy_endpoint=EMULATOR
        )
    )
    assert decode_node(old).store() == StoreUri("gs", "bkt", "", EMULATOR)
    new = NodeAddressRecord(node="n", host="h", port=1, object_store=f"file://{Path('/x')}")
    assert decode_node(encode(new)).store() == StoreUri("file", "/x")
    assert NodeAddressRecord(node="n", host="h", port=1).store() is None
    with pytest.raises(StoreUriError):
        NodeAddressRecord(node="n", host="h", port=1, object_store="s3://x").store()


def test_the_factory_opens_a_directory(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}/objects")
    assert isinstance(store, DirectoryObjectStore) and store.root == tmp_path / "objects"
    with pytest.raises(StoreUriError):
        open_object_store("s3://bucket")


def test_a_gs_uri_opens_the_emulator_under_its_prefix(fake_gcs: FakeGcsServer, prefix: str) -> None:
    store = open_object_store(fake_gcs.store_uri(BUCKET, f"{prefix}/cluster"), retry_s=5)
    assert isinstance(store, PrefixedStore)
    store.put_bytes("job/a", b"payload")
    assert store.get_bytes("job/a") == b"payload"
    info = store.stat("job/a")
    assert info is not None and (info.key, info.size) == ("job/a", 7)
    assert list(store.list("job/")) == ["job/a"]
    bucket = fake_gcs.client().bucket(BUCKET)
    assert [b.name for b in bucket.list_blobs(prefix=prefix)] == [f"{prefix}/cluster/job/a"]
    store.delete("job/a")
    assert store.stat("job/a") is None and list(store.list("job/")) == []
