"""manifest.json: what a checkpoint holds and how to check it, readable without torch.

The manifest lists every data file with its size and xxh3_128 digest, so that other tools
(the multi-tier replicator) can copy and verify checkpoints without understanding tensors.
It also carries its own digest (over its canonical encoding without that field), so a torn or
edited manifest is detected before anything in it is trusted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from goodput.ckpt.layout import MANIFEST_NAME, write_file_durably

FORMAT = "goodput-ckpt/1"
KIND_ENGINE = "engine"
KIND_DCP = "dcp"
_HASH_CHUNK = 16 << 20


class ManifestError(Exception):
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


@dataclass(frozen=True)
class VerifyProblem:
    """One reason a checkpoint directory cannot be trusted."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def _self_digest(manifest: Manifest) -> str:
    body = msgspec.structs.replace(manifest, manifest_xxh3_128="")
    return xxhash.xxh3_128_hexdigest(msgspec.json.encode(body))


def encode_manifest(manifest: Manifest) -> bytes:
    sealed = msgspec.structs.replace(manifest, manifest_xxh3_128=_self_digest(manifest))
    return msgspec.json.format(msgspec.json.encode(sealed), indent=1)


def write_manifest(checkpoint_dir: Path, manifest: Manifest) -> None:
    """Write manifest.json durably (temp name, fsync, rename, fsync the directory)."""
    write_file_durably(checkpoint_dir / MANIFEST_NAME, encode_manifest(manifest))


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and self-verify a manifest; ``path`` is a checkpoint directory or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc.strerror or exc})") from exc
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ManifestError(f"{path}: invalid or truncated manifest ({exc})") from exc
    if manifest.format != FORMAT:
        raise ManifestError(f"{path}: unknown format {manifest.format!r}, expected {FORMAT!r}")
    if manifest.manifest_xxh3_128 != _self_digest(manifest):
        raise ManifestError(f"{path}: manifest checksum mismatch (edited or corrupt)")
    return manifest


def hash_file(path: str | os.PathLike) -> tuple[int, str]:
    """Size and xxh3_128 hex digest of a whole file."""
    hasher = xxhash.xxh3_128()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(_HASH_CHUNK)
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            hasher.update(view[:count])
            size += count
    return size, hasher.hexdigest()


def check_file_sizes(checkpoint_dir: Path, manifest: Manifest) -> list[VerifyProblem]:
    """Cheap completeness check: every listed file exists with the listed size."""
    problems = []
    for entry in manifest.files:
        try:
            size = os.stat(checkpoint_dir / entry.name).st_size
        except FileNotFoundError:
            problems.append(VerifyProblem(entry.name, "missing"))
            continue
        if size != entry.size:
            problems.append(VerifyProblem(entry.name, f"size {size} != {entry.size} in manifest"))
    return problems


def verify_files(checkpoint_dir: str | os.PathLike) -> list[VerifyProblem]:
    """Every reason not to trust ``checkpoint_dir`` (empty list: complete and intact).

    Reads every data file in full and compares its xxh3_128 digest with the manifest.
    """
    checkpoint_dir = Path(checkpoint_dir)
    try:
        manifest = read_manifest(checkpoint_dir)
    except ManifestError as exc:
        return [VerifyProblem(MANIFEST_NAME, str(exc))]
    problems = check_file_sizes(checkpoint_dir, manifest)
    broken = {problem.name for problem in problems}
    for entry in manifest.files:
        if entry.name in broken:
            continue
        try:
            _, digest = hash_file(checkpoint_dir / entry.name)
        except OSError as exc:
            problems.append(VerifyProblem(entry.name, f"unreadable ({exc.strerror or exc})"))
            continue
        if digest != entry.xxh3_128:
            problems.append(VerifyProblem(entry.name, "xxh3_128 mismatch"))
    return problems
