"""Which step directories make up one checkpoint to export, checked before any data is read.

A checkpoint is one step directory holding everything (a data-parallel ``engine`` checkpoint,
or an ``engine-sharded`` one whose ranks shared a root), or the parts of one sharded commit
(``goodput.checkpoint.format.parts``): one directory per node, from several volumes, or a
node's own part beside the parts staged on its volume. Each path given is a step directory
(it holds ``manifest.json``) or a volume (its committed ``step-N`` directories and staged
parts). Every manifest is parsed with the one rule every reader uses (its seal, the job's MAC
when a key is configured, its layout); parts are grouped by commit id and a group counts only
when every part of its table is there and matches the table. Without ``step`` the newest step
that is complete wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from goodput.checkpoint.format import (
    KIND_DCP,
    KIND_ENGINE,
    KIND_SHARDED,
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    parse_step_dir,
    read_manifest,
    step_dirs,
)
from goodput.checkpoint.format.parts import PartOf, check_part, parse_staged_part, staged_parts

EXPORTABLE = (KIND_ENGINE, KIND_SHARDED)


class ExportError(ValueError):
    """A checkpoint that cannot be exported, said in one line."""


@dataclass(frozen=True)
class StepCopy:
    """One step directory and its verified manifest."""

    path: Path
    manifest: Manifest


@dataclass(frozen=True)
class Checkpoint:
    """The directories of one checkpoint: one, or every part of one commit in part order."""

    step: int
    copies: tuple[StepCopy, ...]

    @property
    def manifest(self) -> Manifest:
        """The first directory's manifest (every part's holds the same tensors and tree)."""
        return self.copies[0].manifest

    @property
    def commit(self) -> str | None:
        part = self.manifest.part
        return part.commit if isinstance(part, PartOf) else None


def _candidates(path: Path, problems: list[str]) -> Iterable[StepCopy]:
    """The step directories under ``path`` whose manifests verify (the others in problems)."""
    if (path / MANIFEST_NAME).exists():
        directories = [path]
    elif path.is_dir():
        listed = step_dirs(path)
        directories = [directory for _, directory in listed]
        for step, _ in listed:  # the other nodes' parts staged beside each of its own
            directories.extend(staged_parts(path, step).values())
    else:
        raise ExportError(f"{path}: no such checkpoint directory or volume")
    for directory in directories:
        try:
            manifest = read_manifest(directory)
        except ManifestError as exc:
            problems.append(str(exc))
            continue
        mismatch = _name_mismatch(directory.name, manifest)
        if mismatch:
            problems.append(f"{directory}: {mismatch}")
        else:
            yield StepCopy(directory, manifest)


def _name_mismatch(name: str, manifest: Manifest) -> str:
    """Why a directory's name (``step-N``, or a staged part's) contradicts its manifest; ""
    when it agrees or is some other name (a copy the user named)."""
    staged = parse_staged_part(name)
    step = staged[0] if staged else parse_step_dir(name)
    if step is not None and step != manifest.step:
        return f"named for step {step}, its manifest is of step {manifest.step}"
    part = manifest.part
    if staged and not (isinstance(part, PartOf) and part.part == staged[1]):
        return f"named part {staged[1]}, its manifest is not that part"
    return ""


def _same_content(first: Manifest, other: Manifest) -> bool:
    """Parts of one checkpoint describe the same global tensors and skeleton."""
    encode = msgspec.json.encode
    return (first.step, first.kind, first.dp_world) == (
        other.step,
        other.kind,
        other.dp_world,
    ) and (encode(first.tensors), encode(first.tree)) == (encode(other.tensors), encode(other.tree))


def _complete_parts(copies: Sequence[StepCopy], problems: list[str]) -> tuple[StepCopy, ...] | None:
    """Every part of one commit's table, in part order, or None if one is missing."""
    by_part: dict[int, StepCopy] = {}
    for copy in copies:
        manifest = copy.manifest
        part = manifest.part
        assert isinstance(part, PartOf)
        try:
            check_part(part, manifest.files, manifest.dp_world)
        except ManifestError as exc:
            problems.append(f"{copy.path}: {exc}")
            continue
        if by_part and not _same_content(next(iter(by_part.values())).manifest, manifest):
            problems.append(f"{copy.path}: its tensors differ from the other parts' of its commit")
            continue
        by_part.setdefault(part.part, copy)
    first = copies[0].manifest.part
    assert isinstance(first, PartOf)  # as every copy's part, above
    count = first.count
    missing = sorted(set(range(count)) - set(by_part))
    if missing:
        step = copies[0].manifest.step
        problems.append(f"step {step}: parts {missing} of {count} not among the paths given")
        return None
    return tuple(by_part[index] for index in range(count))


def find_checkpoint(paths: Sequence[Path], step: int | None = None) -> Checkpoint:
    """The checkpoint the paths hold (``step``, or the newest complete one); ExportError
    naming what was wrong when none is complete."""
    problems: list[str] = []
    found = [copy for path in paths for copy in _candidates(path, problems)]
    if step is not None:
        found = [copy for copy in found if copy.manifest.step == step]
    groups: dict[tuple[int, str], list[StepCopy]] = {}
    for copy in found:
        part = copy.manifest.part
        key = part.commit if isinstance(part, PartOf) else f"whole:{copy.path}"
        groups.setdefault((copy.manifest.step, key), []).append(copy)
    for (found_step, key), copies in sorted(groups.items(), key=lambda item: -item[0][0]):
        kind = copies[0].manifest.kind
        if kind == KIND_DCP:
            raise ExportError(f"{copies[0].path}: already a DCP checkpoint (load it as it is)")
        if kind not in EXPORTABLE:
            problems.append(f"{copies[0].path}: a checkpoint of kind {kind!r} holds no tensors")
            continue
        complete = (copies[0],) if key.startswith("whole:") else _complete_parts(copies, problems)
        if complete is not None:
            return Checkpoint(found_step, complete)
    wanted = f"step {step}" if step is not None else "a complete checkpoint"
    detail = f": {'; '.join(problems[:3])}" if problems else ""
    raise ExportError(f"no {wanted} in {', '.join(map(str, paths))}{detail}")
