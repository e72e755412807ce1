"""The end of a persisted save: DP replicas' parts stitched by replica 0, then the commit.

Each data-parallel replica writes its slice and then a small durable part file naming its
files; replica 0 waits for every part, checks that all replicas planned the same layout,
and commits. The commit writes the manifest last and renames the temporary directory to
``step-N``, so a crash at any point leaves either the old checkpoints or the new one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgspec

from goodput.checkpoint.engine.plan import SavePlan
from goodput.checkpoint.format import (
    FORMAT,
    KIND_ENGINE,
    FileEntry,
    Manifest,
    fsync_dir,
    remove_dir_safely,
    step_dir,
    write_file_durably,
    write_manifest,
)


class _Part(msgspec.Struct, kw_only=True):
    """What one DP replica wrote, for replica 0 to stitch into the manifest."""

    dp_rank: int
    layout_digest: str
    files: list[FileEntry]


def part_path(directory: Path, dp_rank: int) -> Path:
    return directory / f".part-r{dp_rank:05d}.json"


def write_part(directory: Path, plan: SavePlan, files: list[FileEntry]) -> None:
    part = _Part(dp_rank=plan.dp_rank, layout_digest=plan.layout_digest, files=files)
    write_file_durably(part_path(directory, plan.dp_rank), msgspec.json.encode(part))


def gather_parts(
    plan: SavePlan, directory: Path, timeout_s: float, ranks: list[int] | None = None
) -> list[FileEntry]:
    """Replica 0 waits until every replica's part is durable, then stitches them.

    ``ranks``: the ranks sharing ``directory`` (a node's ranks saving one part of a state
    that spans nodes); every one of ``dp_world`` by default."""
    deadline = time.monotonic() + timeout_s
    ranks = list(range(plan.dp_world)) if ranks is None else ranks
    parts: dict[int, _Part] = {}
    while len(parts) < len(ranks):
        for rank in ranks:
            if rank in parts:
                continue
            try:
                part = msgspec.json.decode(part_path(directory, rank).read_bytes(), type=_Part)
            except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            if part.layout_digest != plan.layout_digest:
                raise RuntimeError(f"DP replica {rank} saved a different state layout")
            parts[rank] = part
        if len(parts) < len(ranks):
            if time.monotonic() > deadline:
                missing = sorted(set(ranks) - set(parts))
                raise TimeoutError(f"DP replicas {missing} did not finish their slices")
            time.sleep(0.02)
    for rank in parts:
        part_path(directory, rank).unlink(missing_ok=True)
    return [entry for rank in sorted(parts) for entry in parts[rank].files]


def commit(
    root: Path,
    step: int,
    tmp: Path,
    plan: SavePlan,
    tree: Any,
    files: list[FileEntry],
    metadata: dict[str, Any],
) -> None:
    """Write the manifest into ``tmp`` and rename it to ``step-N`` (replacing an older one)."""
    manifest = Manifest(
        format=FORMAT,
        step=step,
        kind=KIND_ENGINE,
        files=files,
        tensors=plan.tensors,
        tree=tree,
        stream_bytes=plan.stream_bytes,
        dp_world=plan.dp_world,
        created_ns=time.time_ns(),
        metadata=metadata,
    )
    publish_step(root, step, tmp, manifest)


def publish_step(root: Path, step: int, tmp: Path, manifest: Manifest) -> None:
    """Write the sealed manifest last into ``tmp``, then rename it to ``step-N``."""
    write_manifest(tmp, manifest)
    final = step_dir(root, step)
    if final.exists():
        remove_dir_safely(final)
    os.replace(tmp, final)
    fsync_dir(root)
