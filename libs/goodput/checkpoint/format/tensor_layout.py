"""Does a manifest's tensor layout fit the bytes it seals? One rule for every reader.

A manifest (or shard record) says where each tensor's bytes are; a forged or damaged one can
claim a shape that the bytes do not hold (``[2**40]``: an allocation that fails; four times
the saved shape: a tensor three quarters of which is whatever memory held). Before anything
is allocated, every tensor's ``numel x itemsize`` must equal the byte range it claims, and
that range must lie inside the bytes the sealed file sizes add up to, without overlapping
another tensor's. A layout that fails is damage: the reader falls back as for a bad checksum.
The manifest applies these rules to its tensor table when parsed
(``manifest.check_manifest_layout``), the shard records to theirs (``sharded``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from goodput.checkpoint.format.errors import ManifestError
from goodput.checkpoint.format.file_entry import FileEntry

#: the element size of every dtype a checkpoint may hold, by torch's name without ``torch.``
DTYPE_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "uint32": 4,
    "int32": 4,
    "uint64": 8,
    "int64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "bits8": 1,
    "bits16": 2,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
}
#: no tensor has more elements than this (2**48: 256 TiB of bytes at one byte each)
MAX_NUMEL = 1 << 48


def itemsize(dtype: str) -> int:
    """The element size of ``dtype``; ManifestError for a name no checkpoint may hold."""
    size = DTYPE_ITEMSIZE.get(dtype)
    if size is None:
        raise ManifestError(f"unknown dtype {dtype!r}")
    return size


def shape_nbytes(dtype: str, shape: Sequence[int], what: str) -> int:
    """``numel x itemsize`` of a tensor of ``shape``, refusing negative or absurd shapes."""
    if any(type(dim) is not int or dim < 0 for dim in shape):
        raise ManifestError(f"{what}: invalid shape {list(shape)}")
    numel = math.prod(shape)
    if numel > MAX_NUMEL:
        raise ManifestError(f"{what}: shape {list(shape)} has implausibly many elements")
    return numel * itemsize(dtype)


def check_tiling(files: Sequence[FileEntry], stream_bytes: int, what: str) -> None:
    """``files`` (offsets into one byte stream) must tile ``[0, stream_bytes)`` exactly."""
    position = 0
    for entry in sorted(files, key=lambda entry: entry.offset):
        if entry.offset != position or entry.size < 0:
            raise ManifestError(f"{what}: data files leave a gap or overlap at byte {position}")
        position += entry.size
    if position != stream_bytes:
        raise ManifestError(f"{what}: data files end at byte {position}, not {stream_bytes}")


def check_ranges(ranges: Sequence[tuple[int, int, str]], stream_bytes: int) -> None:
    """Byte ranges ``(offset, nbytes, what)`` lie inside ``[0, stream_bytes)``, disjoint."""
    end = 0
    for offset, nbytes, what in sorted(ranges):
        if offset < 0 or offset + nbytes > stream_bytes:
            raise ManifestError(f"{what}: bytes [{offset}, {offset + nbytes}) outside the files")
        if offset < end and nbytes:
            raise ManifestError(f"{what}: bytes from {offset} overlap another tensor's")
        end = max(end, offset + nbytes)
