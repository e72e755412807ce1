"""Parts of a checkpoint sharded across nodes, written with the format's own functions.

What a node's ranks will leave on its volume once the engine saves parts (branch
sharded-parts): each rank's data file and shard record, a manifest of kind
``engine-sharded`` with the commit table of every part, committed last. The bytes are
seeded, so a test can say which part (and which step) a directory must hold, bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xxhash

from goodput.checkpoint.format import (
    FORMAT,
    KIND_SHARDED,
    FileEntry,
    Manifest,
    TensorEntry,
    step_dir,
    write_file_durably,
    write_manifest,
)
from goodput.checkpoint.format.parts import PartOf, summarize
from goodput.checkpoint.format.sharded import (
    SHARD_FORMAT,
    ShardPiece,
    ShardRecord,
    encode_record,
    shard_record_name,
)

ROWS = 64 * 1024  # float32 elements of each rank's shard (256 KiB)


def rank_bytes(step: int, rank: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng([seed, step, rank])
    return rng.standard_normal(ROWS, dtype=np.float32).tobytes()


def _rank_files(
    step: int, rank: int, world: int, seed: int, placement: str = "S(0)"
) -> dict[str, tuple[bytes, int]]:
    data = rank_bytes(step, rank, seed)
    record = ShardRecord(
        format=SHARD_FORMAT,
        rank=rank,
        world=world,
        block_bytes=len(data),
        pieces=[
            ShardPiece(
                tensor=0,
                offsets=[rank * ROWS],
                shape=[ROWS],
                stream_offset=0,
                nbytes=len(data),
                blocks=[xxhash.xxh3_128_hexdigest(data)],
                placement=placement,
                mesh=[world],
            )
        ],
    )
    return {
        f"data-r{rank:05d}-000.bin": (data, rank),
        shard_record_name(rank): (encode_record(record), rank),
    }


def part_entries(
    step: int, ranks: list[int], world: int, seed: int, placement: str = "S(0)"
) -> tuple[list[FileEntry], dict]:
    contents: dict[str, tuple[bytes, int]] = {}
    for rank in ranks:
        contents |= _rank_files(step, rank, world, seed, placement)
    entries = [
        FileEntry(name=name, size=len(data), xxh3_128=xxhash.xxh3_128_hexdigest(data), dp_rank=rank)
        for name, (data, rank) in sorted(contents.items())
    ]
    return entries, contents


def write_parts(
    volumes: list[Path | None],
    step: int,
    ranks_per_part: int = 2,
    seed: int = 0,
    placement: str = "S(0)",
) -> PartOf:
    """Write part ``i`` of ``step`` onto ``volumes[i]`` (None: that node died before the
    commit, so its part is missing) and return the commit table's PartOf of part 0. Each rank
    holds one ``Shard(0)`` shard of one tensor (``placement``: the text its record says)."""
    world = len(volumes) * ranks_per_part
    parts = [list(range(p * ranks_per_part, (p + 1) * ranks_per_part)) for p in range(len(volumes))]
    built = [part_entries(step, ranks, world, seed, placement) for ranks in parts]
    table = [summarize(p, parts[p], entries) for p, (entries, _) in enumerate(built)]
    for p, volume in enumerate(volumes):
        if volume is None:
            continue
        entries, contents = built[p]
        directory = step_dir(volume, step)
        directory.mkdir(parents=True, exist_ok=True)
        for name, (data, _) in contents.items():
            write_file_durably(directory / name, data)
        manifest = Manifest(
            format=FORMAT,
            step=step,
            kind=KIND_SHARDED,
            files=entries,
            tensors=[
                TensorEntry(
                    dtype="float32", shape=[world * ROWS], offset=0, nbytes=world * ROWS * 4
                )
            ],
            dp_world=world,
            created_ns=0,
            part=PartOf(part=p, table=table),
        )
        write_manifest(directory, manifest)
    return PartOf(part=0, table=table)


def expected_part(
    step: int,
    part: int,
    parts: int,
    ranks_per_part: int = 2,
    seed: int = 0,
    placement: str = "S(0)",
) -> dict[str, bytes]:
    """Every data file of ``part`` (name -> bytes), as :func:`write_parts` wrote it."""
    world = parts * ranks_per_part
    ranks = range(part * ranks_per_part, (part + 1) * ranks_per_part)
    return {
        name: data
        for rank in ranks
        for name, (data, _) in _rank_files(step, rank, world, seed, placement).items()
    }


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file of a step directory but its manifest (name -> bytes)."""
    return {
        name: (directory / name).read_bytes()
        for name in sorted(os.listdir(directory))
        if name != "manifest.json"
    }
