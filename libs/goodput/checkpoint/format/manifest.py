"""manifest.json: what a checkpoint holds and how to check it, readable without torch.

The manifest lists every data file with its size and xxh3_128 digest, so that other tools
(the replicator, the peer data plane, the CLI) can copy and verify checkpoints without
understanding tensors. It carries its own digest (over its canonical encoding without that
field): one rule, checked by every reader, so a torn or edited manifest is rejected before
anything in it is trusted, wherever it is read. The digest catches damage, not forgery: with
the job's key configured (``job_key``) a manifest also carries an HMAC-SHA256 over its
canonical encoding, which the sealer adds and every reader requires.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec
import xxhash

from goodput.checkpoint.format.errors import ManifestError
from goodput.checkpoint.format.file_entry import FileEntry
from goodput.checkpoint.format.files import NotRegularFile, open_regular, write_file_durably
from goodput.checkpoint.format.job_key import (
    FROM_ENV,
    JobKeyError,
    Key,
    is_signed_by,
    resolve_key,
    sign,
)
from goodput.checkpoint.format.layout import MANIFEST_NAME, is_temp_name, step_dirs
from goodput.checkpoint.format.parts import PartOf, check_part
from goodput.checkpoint.format.tensor_layout import check_ranges, check_tiling, shape_nbytes

FORMAT = "goodput-ckpt/1"
KIND_ENGINE = "engine"
KIND_DCP = "dcp"
#: the engine's checkpoint of DTensor state: each rank's shards, located by shard records
#: (``goodput.checkpoint.format.sharded``); ``tensors`` are the global tensors
KIND_SHARDED = "engine-sharded"
#: files without a tensor layout (benchmarks, tools): the tiers move them, nothing loads them
KIND_FILES = "files"
#: a manifest is small; anything bigger is garbage (and must not be read into memory)
MAX_MANIFEST_BYTES = 16 << 20


class TensorEntry(msgspec.Struct, kw_only=True):
    """One tensor: its bytes are ``[offset, offset + nbytes)`` of the byte stream."""

    dtype: str
    shape: list[int]
    offset: int
    nbytes: int


class Manifest(msgspec.Struct, kw_only=True):
    format: str
    step: int
    kind: str
    files: list[FileEntry]
    tensors: list[TensorEntry] = []
    tree: Any = None
    stream_bytes: int = 0
    dp_world: int = 1
    created_ns: int = 0
    metadata: dict[str, Any] = {}
    manifest_xxh3_128: str = ""
    #: HMAC-SHA256 under the job's key; absent (not even encoded) when no key is configured,
    #: so an unkeyed manifest is byte for byte what it was before keys existed
    manifest_hmac_sha256: str | msgspec.UnsetType = msgspec.UNSET
    #: a part of a checkpoint sharded across nodes (``parts``); absent (not even encoded)
    #: for a checkpoint whose one directory holds everything
    part: PartOf | msgspec.UnsetType = msgspec.UNSET

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_bytes(self) -> bytes:
        """The sealed encoding: what manifest.json holds (identical for a parsed manifest
        signed with the configured key, if any)."""
        return encode_manifest(self)


def build_manifest(
    step: int,
    files: Sequence[FileEntry],
    *,
    kind: str = KIND_FILES,
    metadata: dict[str, Any] | None = None,
) -> Manifest:
    """A manifest of plain files (no tensor layout); sealed when written."""
    return Manifest(
        format=FORMAT, step=step, kind=kind, files=list(files), metadata=dict(metadata or {})
    )


def _resolve(key: Key) -> bytes | None:
    try:
        return resolve_key(key)
    except JobKeyError as exc:
        raise ManifestError(str(exc)) from None


def _self_digest(manifest: Manifest) -> str:
    body = msgspec.structs.replace(manifest, manifest_xxh3_128="")
    return xxhash.xxh3_128_hexdigest(msgspec.json.encode(body))


def _mac_body(manifest: Manifest) -> bytes:
    unsigned = msgspec.structs.replace(
        manifest, manifest_xxh3_128="", manifest_hmac_sha256=msgspec.UNSET
    )
    return msgspec.json.encode(unsigned)


def is_authenticated(manifest: Manifest) -> bool:
    """Whether ``manifest`` carries a MAC (checked on parse when a key is configured)."""
    return manifest.manifest_hmac_sha256 is not msgspec.UNSET


def encode_manifest(manifest: Manifest, key: Key = FROM_ENV) -> bytes:
    """Seal (the MAC under ``key`` if any, then the self digest) and encode."""
    secret = _resolve(key)
    mac = msgspec.UNSET if secret is None else sign(_mac_body(manifest), secret)
    signed = msgspec.structs.replace(manifest, manifest_hmac_sha256=mac)
    sealed = msgspec.structs.replace(signed, manifest_xxh3_128=_self_digest(signed))
    return msgspec.json.format(msgspec.json.encode(sealed), indent=1)


def _check_name(name: str) -> None:
    """Refuse names that would escape the checkpoint directory or clash with temp names."""
    path = PurePosixPath(name)
    if (
        not name
        or path.is_absolute()
        or any(part in ("", ".", "..") or is_temp_name(part) for part in path.parts)
        or "\\" in name
    ):
        raise ManifestError(f"unsafe file name in manifest: {name!r}")


def parse_manifest(data: bytes, source: str = "manifest", key: Key = FROM_ENV) -> Manifest:
    """Decode and verify a manifest: format, its own checksum, its MAC under ``key`` (the
    job's, by default) if there is one, safe file names, and a tensor layout that fits the
    file sizes it seals (:func:`check_manifest_layout`)."""
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ManifestError(f"{source}: invalid or truncated manifest ({exc})") from exc
    if manifest.format != FORMAT:
        raise ManifestError(f"{source}: unknown format {manifest.format!r}, expected {FORMAT!r}")
    if manifest.manifest_xxh3_128 != _self_digest(manifest):
        raise ManifestError(f"{source}: manifest checksum mismatch (edited or corrupt)")
    secret = _resolve(key)
    if secret is not None:
        if not is_authenticated(manifest):
            raise ManifestError(f"{source}: manifest not signed with the job's key (forged?)")
        if not is_signed_by(_mac_body(manifest), str(manifest.manifest_hmac_sha256), secret):
            raise ManifestError(f"{source}: manifest MAC mismatch (forged, or another job's key)")
    for entry in manifest.files:
        _check_name(entry.name)
    try:
        check_manifest_layout(manifest)
    except ManifestError as exc:
        raise ManifestError(f"{source}: {exc}") from exc
    return manifest


def check_manifest_layout(manifest: Manifest) -> None:
    """The tensor table of an engine or sharded manifest against the sizes it seals (the
    rules of ``tensor_layout``), and a part's commit table against its files (``parts``)."""
    if manifest.kind == KIND_ENGINE:
        check_tiling(manifest.files, manifest.stream_bytes, "manifest")
        ranges = []
        for index, entry in enumerate(manifest.tensors):
            what = f"tensor {index}"
            if shape_nbytes(entry.dtype, entry.shape, what) != entry.nbytes:
                raise ManifestError(
                    f"{what}: {entry.dtype}{entry.shape} is not the {entry.nbytes} bytes it claims"
                )
            ranges.append((entry.offset, entry.nbytes, what))
        check_ranges(ranges, manifest.stream_bytes)
    elif manifest.kind == KIND_SHARDED:  # global tensors; the shard records hold the bytes
        for index, entry in enumerate(manifest.tensors):
            what = f"tensor {index}"
            if shape_nbytes(entry.dtype, entry.shape, what) != entry.nbytes or entry.offset:
                raise ManifestError(f"{what}: {entry.dtype}{entry.shape} does not match its size")
        if isinstance(manifest.part, PartOf):
            check_part(manifest.part, manifest.files, manifest.dp_world)
    if isinstance(manifest.part, PartOf) and manifest.kind != KIND_SHARDED:
        raise ManifestError(f"a part of a {manifest.kind!r} checkpoint (only sharded ones split)")


def read_manifest_bytes(path: str | os.PathLike) -> bytes:
    """The raw bytes of manifest.json (``path``: a checkpoint directory or the file)."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        fd = open_regular(path)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_MANIFEST_BYTES:
                raise ManifestError(f"{path}: manifest of {size} bytes is implausibly large")
            chunks = []
            while chunk := os.read(fd, MAX_MANIFEST_BYTES):
                chunks.append(chunk)
        finally:
            os.close(fd)
    except NotRegularFile as exc:
        raise ManifestError(f"{path}: manifest is not a regular file") from exc
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc.strerror or exc})") from exc
    return b"".join(chunks)


def read_manifest(path: str | os.PathLike, key: Key = FROM_ENV) -> Manifest:
    """Read and verify a manifest; ``path`` is a checkpoint directory or the file itself."""
    path = Path(path)
    return parse_manifest(read_manifest_bytes(path), str(path), key)


def write_manifest(
    checkpoint_dir: str | os.PathLike, manifest: Manifest, key: Key = FROM_ENV
) -> None:
    """Commit a checkpoint: the sealed manifest appears atomically, after every data file."""
    write_file_durably(Path(checkpoint_dir) / MANIFEST_NAME, encode_manifest(manifest, key))


def committed_steps(root: str | os.PathLike) -> Iterator[tuple[int, Path]]:
    """Committed checkpoints under ``root`` (a manifest that verifies and names the
    directory's step) as (step, dir), oldest first."""
    for step, directory in reversed(step_dirs(root)):
        try:
            manifest = read_manifest(directory)
        except ManifestError:
            continue
        if manifest.step == step:
            yield step, directory
