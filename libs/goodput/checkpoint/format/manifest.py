"""manifest.json: what a checkpoint holds and how to check it, readable without torch.

The manifest lists every data file with its size and xxh3_128 digest, so that other tools
(the replicator, the peer data plane, the CLI) can copy and verify checkpoints without
understanding tensors. It carries its own digest (over its canonical encoding without that
field): one rule, checked by every reader, so a torn or edited manifest is rejected before
anything in it is trusted, wherever it is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec
import xxhash

from goodput.checkpoint.format.files import NotRegularFile, open_regular, write_file_durably
from goodput.checkpoint.format.layout import MANIFEST_NAME, is_temp_name, step_dirs

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


class ManifestError(ValueError):
    """The manifest is missing, unreadable, or fails its own checksum."""


class FileEntry(msgspec.Struct, kw_only=True):
    """One data file. ``offset`` is where it sits in the checkpoint's byte stream."""

    name: str
    size: int
    xxh3_128: str
    offset: int = 0
    dp_rank: int = 0


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

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_bytes(self) -> bytes:
        """The sealed encoding: what manifest.json holds (identical for a parsed manifest)."""
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


def _self_digest(manifest: Manifest) -> str:
    body = msgspec.structs.replace(manifest, manifest_xxh3_128="")
    return xxhash.xxh3_128_hexdigest(msgspec.json.encode(body))


def encode_manifest(manifest: Manifest) -> bytes:
    """Seal (compute the self digest) and encode."""
    sealed = msgspec.structs.replace(manifest, manifest_xxh3_128=_self_digest(manifest))
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


def parse_manifest(data: bytes, source: str = "manifest") -> Manifest:
    """Decode and verify a manifest: format, its own checksum, safe file names, and a tensor
    layout that fits the file sizes it seals (``tensor_layout``)."""
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ManifestError(f"{source}: invalid or truncated manifest ({exc})") from exc
    if manifest.format != FORMAT:
        raise ManifestError(f"{source}: unknown format {manifest.format!r}, expected {FORMAT!r}")
    if manifest.manifest_xxh3_128 != _self_digest(manifest):
        raise ManifestError(f"{source}: manifest checksum mismatch (edited or corrupt)")
    for entry in manifest.files:
        _check_name(entry.name)
    from goodput.checkpoint.format.tensor_layout import check_manifest_layout  # builds on this

    try:
        check_manifest_layout(manifest)
    except ManifestError as exc:
        raise ManifestError(f"{source}: {exc}") from exc
    return manifest


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


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and verify a manifest; ``path`` is a checkpoint directory or the file itself."""
    path = Path(path)
    return parse_manifest(read_manifest_bytes(path), str(path))


def write_manifest(checkpoint_dir: str | os.PathLike, manifest: Manifest) -> None:
    """Commit a checkpoint: the sealed manifest appears atomically, after every data file."""
    write_file_durably(Path(checkpoint_dir) / MANIFEST_NAME, encode_manifest(manifest))


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
