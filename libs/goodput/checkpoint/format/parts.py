"""A sharded checkpoint across nodes: one part per node, one commit naming every part.

When a sharded (FSDP2/HSDP) state spans nodes, no node holds all of it. Each node's ranks
write their shards into the node's own volume as a **part**: an ordinary step directory
(``step-N``: data files, the shard records of its ranks, ``manifest.json``) whose manifest is
of kind ``engine-sharded`` and carries a :class:`PartOf`. The parts of one checkpoint share one
**commit table**: for every part, the global ranks whose shards it holds and a digest over its
files. The table exists only once every part's files were durable (the coordinator builds it
from the parts' summaries), and a node renames its part to ``step-N`` only after it has the
table: a part is never a restorable checkpoint on its own, and a node lost during the commit
leaves a step that no complete set of parts can ever match.

The tiers move a part like any checkpoint (its manifest lists exactly its own files). A step is
**complete** when, for one commit id, every part of the table has a verified copy somewhere.
A node restoring the same layout needs only its own part; a reshard (another node count) needs
the other parts too: they are staged beside the node's own part under
:func:`staged_part_dir`, a name no step listing matches. A node's own part of a newer step
that can never complete (another node's part of it was lost) is set aside before a restore
under :func:`aside_part_dir`, a hidden name, so the ranks do not offer it.

This module is the one owner of the part structs, the commit id and the staged-part layout.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec
import xxhash

from goodput.checkpoint.format.errors import ManifestError
from goodput.checkpoint.format.file_entry import FileEntry
from goodput.checkpoint.format.layout import step_dir_name

#: a commit table larger than this is garbage (4,096 nodes x a few hundred bytes fits easily)
MAX_PARTS = 4096
_STAGED_PART = re.compile(r"^step-(\d{10})\.part-(\d{5})$")
_ASIDE_PART = re.compile(r"^\.incomplete-step-(\d{10})\.[0-9a-f]{16}$")


class PartSummary(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One part of a checkpoint, as the commit table names it."""

    part: int
    #: the global ranks whose shards (and shard records) the part holds, ascending
    ranks: list[int]
    #: :func:`files_digest` of the part's files (everything its manifest lists)
    files_xxh3_128: str
    nbytes: int


class PartOf(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which part a step directory holds, and the table of every part of its checkpoint."""

    part: int
    table: list[PartSummary]

    @property
    def commit(self) -> str:
        """The checkpoint's identity across its parts (equal in every part's manifest)."""
        return commit_id(self.table)

    @property
    def count(self) -> int:
        return len(self.table)

    def summary(self) -> PartSummary:
        return self.table[self.part]


def files_digest(files: Iterable[FileEntry]) -> str:
    """A part's identity: xxh3_128 over its files' (name, size, digest, rank), name order."""
    rows = sorted((e.name, e.size, e.xxh3_128, e.dp_rank) for e in files)
    return xxhash.xxh3_128_hexdigest(msgspec.json.encode(rows))


def commit_id(table: Sequence[PartSummary]) -> str:
    return xxhash.xxh3_128_hexdigest(msgspec.json.encode(list(table)))


def summarize(part: int, ranks: Sequence[int], files: Sequence[FileEntry]) -> PartSummary:
    """What a node reports for its part once every file of it is durable."""
    return PartSummary(
        part=part,
        ranks=sorted(ranks),
        files_xxh3_128=files_digest(files),
        nbytes=sum(entry.size for entry in files),
    )


def check_part(part_of: PartOf, files: Sequence[FileEntry], world: int) -> None:
    """A part's manifest against its table: parts 0..n-1 in order, each global rank of
    ``world`` in exactly one part, and this part's files are the ones the table sealed.

    Raises ManifestError: a part whose table disagrees with its files is not that part."""
    table = part_of.table
    if not 1 <= len(table) <= MAX_PARTS or not 0 <= part_of.part < len(table):
        raise ManifestError(f"part {part_of.part} of a table of {len(table)} parts")
    if [summary.part for summary in table] != list(range(len(table))):
        raise ManifestError("commit table: parts out of order")
    seen: list[int] = sorted(rank for summary in table for rank in summary.ranks)
    if seen != list(range(world)):
        raise ManifestError(f"commit table: ranks do not cover the {world} ranks exactly once")
    for summary in table:
        if summary.ranks != sorted(summary.ranks) or summary.nbytes < 0:
            raise ManifestError(f"commit table: part {summary.part} malformed")
    own = part_of.summary()
    if files_digest(files) != own.files_xxh3_128 or sum(e.size for e in files) != own.nbytes:
        raise ManifestError(f"part {part_of.part}: files do not match the commit table")
    ranks = set(own.ranks)
    strays = sorted({entry.dp_rank for entry in files} - ranks)
    if strays:
        raise ManifestError(f"part {part_of.part}: holds files of ranks {strays} of other parts")


def staged_part_name(step: int, part: int) -> str:
    return f"{step_dir_name(step)}.part-{part:05d}"


def staged_part_dir(root: str | os.PathLike, step: int, part: int) -> Path:
    """Where another node's part of ``step`` is staged on this volume (for a reshard).

    A staged part is a complete step directory of its own (manifest last); its name is no
    ``step-N`` so the volume's own checkpoints never include it."""
    return Path(root) / staged_part_name(step, part)


def parse_staged_part(name: str) -> tuple[int, int] | None:
    """(step, part) of a staged part's directory name, None for anything else."""
    match = _STAGED_PART.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def staged_parts(root: str | os.PathLike, step: int) -> dict[int, Path]:
    """The parts of ``step`` staged under ``root`` (complete or not), by part index."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        parsed = parse_staged_part(name)
        if parsed is not None and parsed[0] == step:
            found[parsed[1]] = Path(root) / name
    return found


def aside_part_dir(root: str | os.PathLike, step: int, commit: str) -> Path:
    """Where a node's part of ``step`` from ``commit``, a commit that can no longer complete,
    is kept instead of ``step-N``: hidden (a temp name to every lister, so neither the engine
    nor the replicator's scan offers it), named by its commit so a later commit of the same
    step never collides with it; kept until the volume holds a step at least as new."""
    return Path(root) / f".incomplete-{step_dir_name(step)}.{commit[:16]}"


def parse_aside_part(name: str) -> int | None:
    """The step of a set-aside part's directory name, None for anything else."""
    match = _ASIDE_PART.match(name)
    return int(match.group(1)) if match else None
