"""The shard record of a sharded checkpoint: checked against its manifest entry, strictly."""

from __future__ import annotations

import msgspec
import pytest
import xxhash

from goodput.checkpoint.format import FORMAT, KIND_SHARDED, FileEntry, Manifest, ManifestError
from goodput.checkpoint.format.sharded import (
    SHARD_FORMAT,
    ShardPiece,
    ShardRecord,
    data_entries,
    encode_record,
    parse_record,
    record_entries,
    shard_record_name,
)


def record(rank: int = 1, *, blocks: int = 2, fmt: str = SHARD_FORMAT) -> ShardRecord:
    piece = ShardPiece(
        tensor=0,
        offsets=[4, 0],
        shape=[3, 10],
        stream_offset=0,
        nbytes=120,
        blocks=["0" * 32] * blocks,
        placement="S(0)",
        mesh=[2],
    )
    return ShardRecord(format=fmt, rank=rank, world=2, block_bytes=64, pieces=[piece])


def entry_for(body: bytes, rank: int = 1) -> FileEntry:
    return FileEntry(
        name=shard_record_name(rank),
        size=len(body),
        xxh3_128=xxhash.xxh3_128_hexdigest(body),
        dp_rank=rank,
    )


def test_a_record_round_trips() -> None:
    body = encode_record(record())
    assert parse_record(body, entry_for(body), world=2) == record()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (encode_record(record(fmt="goodput-shards/9")), "unknown format"),
        (encode_record(record(blocks=1)), "block count"),
        (encode_record(record(rank=0)), "inconsistent"),
        (b'{"format": "goodput-shards/1", "surprise": 1}', "invalid shard record"),
    ],
)
def test_a_bad_record_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(ManifestError, match=reason):
        parse_record(body, entry_for(body), world=2)


def test_a_record_that_is_not_the_one_the_manifest_lists_is_refused() -> None:
    body = encode_record(record())
    with pytest.raises(ManifestError, match="does not match"):
        parse_record(body + b" ", entry_for(body), world=2)
    with pytest.raises(ManifestError, match="inconsistent"):
        parse_record(body, entry_for(body), world=3)


def manifest(files: list[FileEntry], world: int = 2) -> Manifest:
    return Manifest(format=FORMAT, step=1, kind=KIND_SHARDED, files=files, dp_world=world)


def test_records_and_data_files_of_a_manifest() -> None:
    data = [
        FileEntry(name="data-r00001-001.bin", size=8, xxh3_128="x", offset=8, dp_rank=1),
        FileEntry(name="data-r00001-000.bin", size=8, xxh3_128="x", offset=0, dp_rank=1),
        FileEntry(name="data-r00000-000.bin", size=8, xxh3_128="x", offset=0, dp_rank=0),
    ]
    records = [entry_for(b"{}", 1), entry_for(b"{}", 0)]
    found = manifest(data + records)
    assert [e.dp_rank for e in record_entries(found)] == [0, 1]
    assert [e.name for e in data_entries(found, 1)] == [
        "data-r00001-000.bin",
        "data-r00001-001.bin",
    ]
    with pytest.raises(ManifestError, match=r"a shard record for each of ranks 0\.\.1"):
        record_entries(manifest(data + records[:1]))
    misnamed = msgspec.structs.replace(records[0], name=shard_record_name(0))
    with pytest.raises(ManifestError, match="named for another rank"):
        record_entries(manifest([misnamed, records[1]]))
