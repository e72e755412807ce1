"""Reader/writer for the checkpoint directory contract shared with the checkpoint engine.

A checkpoint is ``<root>/step-<step:010d>/`` holding data files and ``manifest.json``; the
manifest is written last, atomically, so a directory without a valid manifest is not a
checkpoint. Only the fields the tiers need are read; other keys are kept verbatim so a
restored or replicated manifest is byte-for-byte the one the engine wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from goodput.tiers.atomic import atomic_write_bytes

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "goodput-ckpt/1"


class InvalidManifest(ValueError):
    """The manifest is missing, unreadable or does not follow ``goodput-ckpt/1``."""


@dataclass(frozen=True)
class FileEntry:
    """One data file of a checkpoint: path relative to the checkpoint dir, size, checksum."""

    name: str
    size: int
    xxh3_128: str


@dataclass(frozen=True)
class CheckpointManifest:
    step: int
    files: tuple[FileEntry, ...]
    raw: bytes = field(repr=False)  # the exact bytes to write back

    def to_bytes(self) -> bytes:
        return self.raw


def checkpoint_dirname(step: int) -> str:
    return f"step-{step:010d}"


def validate_relative_name(name: str) -> str:
    """Refuse names that would escape the checkpoint directory or be hidden (temp) files."""
    path = PurePosixPath(name)
    if (
        not name
        or path.is_absolute()
        or any(part in ("", ".", "..") or part.startswith(".") for part in path.parts)
        or "\\" in name
    ):
        raise InvalidManifest(f"unsafe file name in manifest: {name!r}")
    return name


def parse_manifest(data: bytes) -> CheckpointManifest:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidManifest(f"manifest is not JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise InvalidManifest(f"manifest format is not {MANIFEST_FORMAT!r}")
    step = document.get("step")
    raw_files = document.get("files")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(raw_files, list):
        raise InvalidManifest("manifest needs an integer 'step' and a 'files' list")
    files = []
    for raw in raw_files:
        try:
            entry = FileEntry(str(raw["name"]), int(raw["size"]), str(raw["xxh3_128"]).lower())
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidManifest(f"bad file entry {raw!r}") from exc
        validate_relative_name(entry.name)
        files.append(entry)
    return CheckpointManifest(step=step, files=tuple(files), raw=bytes(data))


def read_manifest(checkpoint_dir: Path) -> CheckpointManifest:
    try:
        data = (Path(checkpoint_dir) / MANIFEST_NAME).read_bytes()
    except OSError as exc:
        raise InvalidManifest(f"no readable manifest in {checkpoint_dir}: {exc}") from exc
    return parse_manifest(data)


def build_manifest(
    step: int, files: Sequence[FileEntry], extra: Mapping[str, Any] | None = None
) -> CheckpointManifest:
    document: dict[str, Any] = dict(extra or {})
    document.update(
        format=MANIFEST_FORMAT,
        step=step,
        files=[{"name": f.name, "size": f.size, "xxh3_128": f.xxh3_128} for f in files],
    )
    raw = json.dumps(document, indent=1).encode()
    return CheckpointManifest(step=step, files=tuple(files), raw=raw)


def write_manifest(checkpoint_dir: Path, manifest: CheckpointManifest) -> None:
    """Commit a checkpoint: the manifest appears atomically, after every data file."""
    atomic_write_bytes(Path(checkpoint_dir) / MANIFEST_NAME, manifest.to_bytes())


def list_checkpoints(root: Path) -> Iterator[tuple[int, Path]]:
    """Committed checkpoints under ``root`` as (step, dir), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return
    found = []
    for child in root.iterdir():
        if child.name.startswith(".") or not child.name.startswith("step-"):
            continue
        try:
            manifest = read_manifest(child)
        except InvalidManifest:
            continue
        found.append((manifest.step, child))
    yield from sorted(found)
