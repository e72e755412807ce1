"""The shard record of a sharded checkpoint (DTensor / FSDP2 state), readable without torch.

A checkpoint of kind ``engine-sharded`` is saved by several ranks into one step directory:
each rank writes its own local shards as a byte stream cut into data files (``FileEntry.dp_rank``
is the saving rank, ``offset`` the file's place in that rank's stream) and a shard record
``shards-r<rank>.json`` naming, for every shard it wrote, the global tensor it belongs to, where
it sits in that tensor (global offsets and shape), its placement, where its bytes are in the
rank's stream, and an xxh3_128 digest per block of ``block_bytes``. The manifest's ``tensors``
are then the *global* tensors (dtype and global shape; ``offset`` 0, ``nbytes`` the full size)
and its ``tree`` the skeleton referring to them; the records are listed among its files, so
the tiers copy and verify them like any file, and the plain manifest format is unchanged.

Per-block digests let a rank restoring under another world size read only the blocks of the
shards that overlap its new local shard and still verify every byte it uses.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec
import xxhash

from goodput.checkpoint.format.file_entry import FileEntry
from goodput.checkpoint.format.files import open_regular, unreadable_reason
from goodput.checkpoint.format.manifest import Manifest, ManifestError
from goodput.checkpoint.format.parts import PartOf
from goodput.checkpoint.format.tensor_layout import check_ranges, check_tiling, shape_nbytes

SHARD_FORMAT = "goodput-shards/1"
#: digest granularity of a shard's bytes: a resharded read over-reads at most one block per end
DEFAULT_BLOCK_BYTES = 1 << 20
#: a record lists a rank's shards; anything bigger is garbage (and must not be read into memory)
MAX_RECORD_BYTES = 256 << 20
_RECORD_NAME = re.compile(r"^shards-r(\d{5})\.json$")


class ShardPiece(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One saved shard: elements ``offsets .. offsets + shape`` of global tensor ``tensor``."""

    tensor: int
    offsets: list[int]
    shape: list[int]
    #: where its bytes (row-major, contiguous) start in the saving rank's byte stream
    stream_offset: int
    nbytes: int
    #: xxh3_128 of each ``block_bytes`` block of its bytes (the last one may be shorter)
    blocks: list[str]
    #: how the tensor was placed when saved (``format.placement``), e.g. ``S(0)`` on mesh
    #: ``[2]``; "" plain
    placement: str = ""
    mesh: list[int] = []


class ShardRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every shard one rank saved into a sharded checkpoint."""

    format: str
    rank: int
    world: int
    block_bytes: int
    pieces: list[ShardPiece]


def shard_record_name(rank: int) -> str:
    return f"shards-r{rank:05d}.json"


def is_shard_record(name: str) -> bool:
    return _RECORD_NAME.match(name) is not None


def block_count(nbytes: int, block_bytes: int) -> int:
    return -(-nbytes // block_bytes)


def encode_record(record: ShardRecord) -> bytes:
    return msgspec.json.encode(record)


def parse_record(data: bytes, entry: FileEntry, world: int) -> ShardRecord:
    """Decode a rank's record after checking it against its manifest entry (size, digest)."""
    if len(data) != entry.size or xxhash.xxh3_128_hexdigest(data) != entry.xxh3_128:
        raise ManifestError(f"{entry.name}: does not match its manifest entry")
    try:
        record = msgspec.json.decode(data, type=ShardRecord)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ManifestError(f"{entry.name}: invalid shard record ({exc})") from exc
    if record.format != SHARD_FORMAT:
        raise ManifestError(f"{entry.name}: unknown format {record.format!r}")
    if record.rank != entry.dp_rank or record.world != world or record.block_bytes < 1:
        raise ManifestError(f"{entry.name}: rank, world or block size inconsistent")
    for piece in record.pieces:
        if len(piece.blocks) != block_count(piece.nbytes, record.block_bytes):
            raise ManifestError(f"{entry.name}: shard of tensor {piece.tensor}: block count")
    return record


def saving_ranks(manifest: Manifest) -> list[int]:
    """The global ranks whose shards this directory holds: all of ``dp_world``, or a part's."""
    if isinstance(manifest.part, PartOf):
        return list(manifest.part.summary().ranks)
    return list(range(manifest.dp_world))


def record_entries(manifest: Manifest) -> list[FileEntry]:
    """The shard records a sharded manifest lists, one per saving rank it holds (every rank,
    or a part's ranks), in rank order."""
    records = sorted(
        (entry for entry in manifest.files if is_shard_record(entry.name)),
        key=lambda entry: entry.dp_rank,
    )
    expected = saving_ranks(manifest)
    if manifest.dp_world < 1 or [e.dp_rank for e in records] != expected:
        raise ManifestError(f"expected a shard record for each of ranks {_span(expected)}")
    for entry in records:
        if entry.name != shard_record_name(entry.dp_rank):
            raise ManifestError(f"{entry.name}: named for another rank")
    return records


def _span(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return str(ranks)


def data_entries(manifest: Manifest, rank: int) -> list[FileEntry]:
    """Rank ``rank``'s data files, in stream order."""
    return sorted(
        (e for e in manifest.files if e.dp_rank == rank and not is_shard_record(e.name)),
        key=lambda entry: entry.offset,
    )


def check_record_layout(record: ShardRecord, manifest: Manifest) -> None:
    """Every piece of ``record`` lies inside its global tensor, is ``numel x itemsize`` bytes,
    and those bytes lie inside the rank's data files (as sealed), apart from each other."""
    files = data_entries(manifest, record.rank)
    stream_bytes = sum(entry.size for entry in files)
    what = shard_record_name(record.rank)
    check_tiling(files, stream_bytes, what)
    ranges = []
    for index, piece in enumerate(record.pieces):
        where = f"{what}: shard {index}"
        if not 0 <= piece.tensor < len(manifest.tensors):
            raise ManifestError(f"{where}: of unknown tensor {piece.tensor}")
        tensor = manifest.tensors[piece.tensor]
        dims = len(tensor.shape)
        if len(piece.offsets) != dims or len(piece.shape) != dims:
            raise ManifestError(f"{where}: rank differs from tensor {piece.tensor}'s")
        if shape_nbytes(tensor.dtype, piece.shape, where) != piece.nbytes:
            raise ManifestError(f"{where}: shape {piece.shape} is not its {piece.nbytes} bytes")
        for offset, size, whole in zip(piece.offsets, piece.shape, tensor.shape, strict=True):
            if offset < 0 or offset + size > whole:
                raise ManifestError(f"{where}: outside tensor {piece.tensor}'s {tensor.shape}")
        ranges.append((piece.stream_offset, piece.nbytes, where))
    check_ranges(ranges, stream_bytes)


def _read_whole(path: Path, size: int) -> bytes:
    """The ``size`` bytes of the regular file ``path``; ManifestError naming what is wrong."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise ManifestError(f"{path.name}: {unreadable_reason(exc)}") from exc
    try:
        data = bytearray()
        while len(data) < size:
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                raise ManifestError(f"{path.name}: short file")
            data += chunk
        return bytes(data)
    except OSError as exc:
        raise ManifestError(f"{path.name}: unreadable ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


def read_records(directory: Path, manifest: Manifest) -> list[ShardRecord]:
    """Every shard record ``manifest`` lists in ``directory``, each checked against its
    manifest entry and its layout against the data files' sealed sizes (before anything is
    allocated). Raises ManifestError."""
    records = []
    for entry in record_entries(manifest):
        if entry.size > MAX_RECORD_BYTES:
            raise ManifestError(f"{entry.name}: implausibly large ({entry.size} bytes)")
        record = parse_record(
            _read_whole(directory / entry.name, entry.size), entry, manifest.dp_world
        )
        check_record_layout(record, manifest)
        records.append(record)
    return records
