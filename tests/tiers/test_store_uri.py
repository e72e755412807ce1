"""Store URIs: the spellings of before as aliases, the emulator endpoint inside the URI,
refusals in one line, and the factory opening a directory, a (fake) GCS bucket and an
S3 bucket on moto's server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.checkpoint.index.records import NodeAddressRecord, decode_node, encode
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer
from goodput.checkpoint.tiers.object_store import DirectoryObjectStore, PrefixedStore
from goodput.checkpoint.tiers.open_store import open_object_store
from goodput.checkpoint.tiers.s3 import S3ObjectStore
from goodput.checkpoint.tiers.s3_emulator import MotoS3Server
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
        ("s3://my-bucket", StoreUri("s3", "my-bucket")),
        ("s3://my.bucket/a/b/", StoreUri("s3", "my.bucket", "a/b")),
        ("s3://bkt?region=eu-central-1", StoreUri("s3", "bkt", region="eu-central-1")),
        (f"s3://bkt/p?endpoint={EMULATOR}", StoreUri("s3", "bkt", "p", EMULATOR)),
        (
            "s3://bkt/p?region=us-east-1&endpoint=https://minio.local:9000/",
            StoreUri("s3", "bkt", "p", "https://minio.local:9000", "us-east-1"),
        ),
        ("s3://bkt?endpoint=http://[::1]:9000", StoreUri("s3", "bkt", "", "http://[::1]:9000")),
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
        ("gs://bucket?region=x", "query fields are 'endpoint', each once"),
        (f"gs://bucket?endpoint={EMULATOR}&endpoint={EMULATOR}", "query fields are"),
        ("gs://bucket?endpoint=", "query fields are"),
        ("gs://bucket#x", "has no '#' part"),
        ("s3://b", "not a valid S3 bucket name"),
        ("s3://my_bucket", "not a valid S3 bucket name"),
        ("s3://Bucket", "not a valid S3 bucket name"),
        ("s3://a..b", "not a valid S3 bucket name"),
        ("s3://192.168.1.10", "not a valid S3 bucket name"),
        ("s3://key:secret@bucket", "not a valid S3 bucket name"),
        ("s3://bucket/a//b", "invalid prefix"),
        ("s3://bucket/.x", "invalid prefix"),
        ("s3://bucket?acl=public", "query fields are 'endpoint' and 'region'"),
        ("s3://bucket?region=us-east-1&region=eu-west-1", "query fields are"),
        ("s3://bucket?region=", "query fields are"),
        ("s3://bucket?region=US_EAST", "not a region name"),
        ("s3://bucket?endpoint=minio:9000", "not http(s)://host[:port]"),
        ("s3://bucket?endpoint=http://h/path", "not http(s)://host[:port]"),
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
    assert StoreUri("s3", "bkt", "", EMULATOR, "r-1").key_uri("j/x") == "s3://bkt/j/x"


def test_the_legacy_endpoint_is_a_gs_setting_only() -> None:
    with pytest.raises(StoreUriError, match="applies to a gs:// store"):
        parse_store_uri("s3://bkt", EMULATOR)


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
    s3 = NodeAddressRecord(node="n", host="h", port=1, object_store="s3://bkt/p?region=r-1")
    assert decode_node(encode(s3)).store() == StoreUri("s3", "bkt", "p", region="r-1")
    with pytest.raises(StoreUriError):
        NodeAddressRecord(node="n", host="h", port=1, object_store="s3://x").store()


def test_the_factory_opens_a_directory(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}/objects")
    assert isinstance(store, DirectoryObjectStore) and store.root == tmp_path / "objects"
    with pytest.raises(StoreUriError):
        open_object_store("azure://bucket")


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


def test_an_s3_uri_opens_the_emulator_under_its_prefix(moto_s3: MotoS3Server, prefix: str) -> None:
    store = open_object_store(moto_s3.store_uri(BUCKET, f"{prefix}/cluster"), retry_s=5)
    assert isinstance(store, PrefixedStore) and isinstance(store.inner, S3ObjectStore)
    store.put_bytes("job/a", b"payload")
    assert store.get_bytes("job/a") == b"payload"
    info = store.stat("job/a")
    assert info is not None and (info.key, info.size) == ("job/a", 7)
    assert list(store.list("job/")) == ["job/a"]
    listed = moto_s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    assert [o["Key"] for o in listed["Contents"]] == [f"{prefix}/cluster/job/a"]
    store.delete("job/a")
    assert store.stat("job/a") is None and list(store.list("job/")) == []


def test_an_s3_uri_without_the_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where boto3 is not installed, the factory says which extra brings it."""
    monkeypatch.delitem(sys.modules, "goodput.checkpoint.tiers.s3")
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ModuleNotFoundError
    with pytest.raises(StoreUriError, match=re.escape("pip install 'goodput[s3]'")) as caught:
        open_object_store("s3://bucket/p")
    assert "s3://bucket/p" in str(caught.value) and "\n" not in str(caught.value)
    assert isinstance(open_object_store(f"file://{tmp_path}"), DirectoryObjectStore)


def test_nothing_but_an_s3_store_imports_boto3() -> None:
    """The services and the CLI start without the s3 extra: only opening an s3:// store
    imports boto3, and only ``s3.py`` names it."""
    code = (
        "import sys, goodput.tools.cli.main, goodput_services.replicator.service\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout.strip()) == (0, "[]"), run.stderr
    root = Path(__file__).parents[2]
    importers = sorted(
        path.relative_to(root).as_posix()
        for tree in ("libs", "services")
        for path in (root / tree).rglob("*.py")
        if re.search(r"^\s*(import|from) (boto3|botocore|s3transfer)\b", path.read_text(), re.M)
    )
    assert importers == ["libs/goodput/checkpoint/tiers/s3.py"]
