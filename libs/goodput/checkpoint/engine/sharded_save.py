"""Saving DTensor (FSDP2) state: each rank writes its own local shards and a shard record.

The engine's plain path assumes every replica holds the same state and splits one byte stream
among them. Under FSDP2 each rank holds different shards, so here each rank's stream is its
own local tensors: a DTensor contributes its local shard (a shard replicated over a
``Replicate`` mesh dimension is written by each of its holders, since which of them share
this root is not known here; a restore reads one copy); a plain tensor is written by rank 0
only (like the plain values, it is rank 0's, so per-rank RNG
states belong in per-rank checkpoints). The manifest then names the global tensors and each
rank's record (``goodput.checkpoint.format.sharded``) where its shards are.

The ranks sharing one root (``dp_rank``/``dp_world`` of ``CheckpointEngine.save``) must hold
every shard between them for the checkpoint to restore: one node's ranks under FSDP2 on that
node, or under HSDP with one replica per node. A mesh spanning nodes saves one **part** per
node instead (``PartLayout``, ``goodput.checkpoint.engine.parts_commit``): ranks are numbered
globally, each node's first rank writes the plain tensors into its part (so a node restoring
its own shards needs no other part), and the manifest carries the commit table.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import msgspec
import torch
import xxhash

from goodput.checkpoint.engine.commit import publish_step
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.engine.plan import FileRange, SavePlan, make_plan, tensor_nbytes
from goodput.checkpoint.engine.reshard import Box, ReshardError, plan_reads
from goodput.checkpoint.engine.tree import FlatState, dtype_name
from goodput.checkpoint.format import (
    FORMAT,
    KIND_SHARDED,
    FileEntry,
    Manifest,
    TensorEntry,
    write_file_durably,
)
from goodput.checkpoint.format.parts import PartOf
from goodput.checkpoint.format.placement import placement_text
from goodput.checkpoint.format.sharded import (
    DEFAULT_BLOCK_BYTES,
    SHARD_FORMAT,
    ShardPiece,
    ShardRecord,
    encode_record,
    parse_record,
    record_entries,
    shard_record_name,
)

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def is_dtensor(tensor: torch.Tensor) -> TypeGuard[DTensor]:
    """True for a DTensor (imported only when torch has distributed support)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local_box(tensor: DTensor) -> Box:
    """Where a DTensor's local shard sits in its global tensor (offsets, shape)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offsets = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return Box(tuple(offsets), tuple(shape))


@dataclass(frozen=True)
class _Piece:
    tensor: int
    box: Box
    placement: str
    mesh: list[int]


@dataclass(frozen=True)
class ShardedSave:
    """What a rank saves of a sharded state, beyond the plan of its own byte stream."""

    rank: int
    world: int
    #: the global tensors, as the manifest lists them
    tensors: list[TensorEntry]
    #: the shard of each local tensor written (``plan.tensors[i]`` holds ``pieces[i]``)
    pieces: list[_Piece]
    block_bytes: int = DEFAULT_BLOCK_BYTES
    #: the node's part this rank saves into, when the state spans nodes; None: one root
    parts: PartLayout | None = None


def _piece(
    index: int, tensor: torch.Tensor, writes_plain: bool
) -> tuple[_Piece, torch.Tensor] | None:
    """The shard of tensor ``index`` this rank writes, with its local tensor; None if not."""
    if not is_dtensor(tensor):
        box = Box((0,) * tensor.dim(), tuple(tensor.shape))
        return (_Piece(index, box, "", []), tensor) if writes_plain else None
    placements = tensor.placements
    if any(p.is_partial() for p in placements):
        raise TypeError(f"tensor {index}: cannot checkpoint a Partial DTensor (reduce it first)")
    if tensor.device_mesh.get_coordinate() is None:
        return None  # this rank holds none of it
    local = tensor.to_local()
    box = local_box(tensor)
    if tuple(local.shape) != box.shape:
        raise ValueError(f"tensor {index}: local shape {list(local.shape)} != {list(box.shape)}")
    mesh = list(tensor.device_mesh.shape)
    return _Piece(index, box, placement_text(placements), mesh), local.detach()


def plan_save(
    flat: FlatState,
    *,
    dp_rank: int,
    dp_world: int,
    files_per_rank: int,
    min_file_bytes: int,
    parts: PartLayout | None = None,
) -> tuple[SavePlan, list[torch.Tensor], ShardedSave | None]:
    """The engine's plan and the tensors to copy: a plain state's own tensors (replicas split
    one stream), or with DTensors this rank's local shards and their bookkeeping (into its
    node's part when ``parts`` says the state spans nodes)."""
    if any(is_dtensor(tensor) for tensor in flat.tensors):
        if parts is not None:
            return plan_sharded_save(
                flat,
                rank=parts.rank,
                world=parts.world,
                files_per_rank=files_per_rank,
                min_file_bytes=min_file_bytes,
                parts=parts,
            )
        return plan_sharded_save(
            flat,
            rank=dp_rank,
            world=dp_world,
            files_per_rank=files_per_rank,
            min_file_bytes=min_file_bytes,
        )
    plan = make_plan(
        flat.tensors,
        dp_rank=dp_rank,
        dp_world=dp_world,
        files_per_rank=files_per_rank,
        min_file_bytes=min_file_bytes,
    )
    return plan, flat.tensors, None


def plan_sharded_save(
    flat: FlatState,
    *,
    rank: int,
    world: int,
    files_per_rank: int,
    min_file_bytes: int,
    parts: PartLayout | None = None,
) -> tuple[SavePlan, list[torch.Tensor], ShardedSave]:
    """This rank's plan (its own stream, files named for it), the local tensors it copies,
    and the shard bookkeeping. Every rank derives the same global layout digest."""
    if not 0 <= rank < world:
        raise ValueError(f"dp_rank {rank} outside dp_world {world}")
    globals_: list[TensorEntry] = []
    pieces: list[_Piece] = []
    local: list[torch.Tensor] = []
    writes_plain = parts.leader if parts is not None else rank == 0
    for index, tensor in enumerate(flat.tensors):
        globals_.append(
            TensorEntry(
                dtype=dtype_name(tensor.dtype),
                shape=list(tensor.shape),
                offset=0,
                nbytes=tensor_nbytes(tensor),
            )
        )
        found = _piece(index, tensor, writes_plain)
        if found is not None and found[1].numel():
            pieces.append(found[0])
            local.append(found[1])
    own = make_plan(local, files_per_rank=files_per_rank, min_file_bytes=min_file_bytes)
    digest = xxhash.xxh3_64_hexdigest(
        repr(("sharded", world, [(e.dtype, e.shape) for e in globals_])).encode()
    )
    plan = dataclasses.replace(
        own,
        dp_rank=rank,
        dp_world=world,
        files=[
            FileRange(f"data-r{rank:05d}-{index:03d}.bin", rng.start, rng.end)
            for index, rng in enumerate(own.files)
        ],
        layout_digest=digest,
    )
    return plan, local, ShardedSave(rank, world, globals_, pieces, parts=parts)


def write_shard_record(
    directory: Path, sharded: ShardedSave, plan: SavePlan, data: torch.Tensor
) -> FileEntry:
    """Digest each shard's blocks from the host buffer (``data``: the plan's slice) and write
    the rank's record durably; returns its file entry for the manifest."""
    view = data.numpy().data
    step = sharded.block_bytes
    pieces = []
    for piece, entry in zip(sharded.pieces, plan.tensors, strict=True):
        start = entry.offset - plan.slice_start
        blocks = [
            xxhash.xxh3_128_hexdigest(view[start + lo : start + min(lo + step, entry.nbytes)])
            for lo in range(0, entry.nbytes, step)
        ]
        pieces.append(
            ShardPiece(
                tensor=piece.tensor,
                offsets=list(piece.box.offsets),
                shape=list(piece.box.shape),
                stream_offset=entry.offset,
                nbytes=entry.nbytes,
                blocks=blocks,
                placement=piece.placement,
                mesh=piece.mesh,
            )
        )
    record = ShardRecord(
        format=SHARD_FORMAT,
        rank=sharded.rank,
        world=sharded.world,
        block_bytes=step,
        pieces=pieces,
    )
    body = encode_record(record)
    path = directory / shard_record_name(sharded.rank)
    write_file_durably(path, body)
    digest = xxhash.xxh3_128_hexdigest(body)
    return FileEntry(name=path.name, size=len(body), xxh3_128=digest, dp_rank=sharded.rank)


def commit_sharded(
    root: Path,
    step: int,
    tmp: Path,
    sharded: ShardedSave,
    tree: Any,
    files: list[FileEntry],
    metadata: dict[str, Any],
    part: PartOf | None = None,
) -> None:
    """Rank 0 (a part's leader), once every rank's files and record are durable (and every
    part's, for a ``part``): the manifest, then the rename.

    Refused (RuntimeError) unless the ranks' shards tile every tensor exactly: a checkpoint
    some restore could not complete must fail when saved, not when it is needed. A part
    holds only its node's shards; the whole is every part's ranks, which the commit table
    covers exactly (``format.parts.check_part``), each rank holding its own local shards."""
    manifest = Manifest(
        format=FORMAT,
        step=step,
        kind=KIND_SHARDED,
        files=files,
        tensors=sharded.tensors,
        tree=tree,
        stream_bytes=0,
        dp_world=sharded.world,
        created_ns=time.time_ns(),
        metadata=metadata,
        part=part if part is not None else msgspec.UNSET,
    )
    saved = _saved_boxes(tmp, manifest)
    if part is None:
        _check_complete(manifest, saved)
    publish_step(root, step, tmp, manifest)


def _saved_boxes(directory: Path, manifest: Manifest) -> list[list[Box]]:
    """Every tensor's saved boxes, from the records as written (each one parsed back)."""
    saved: list[list[Box]] = [[] for _ in manifest.tensors]
    for entry in record_entries(manifest):
        record = parse_record((directory / entry.name).read_bytes(), entry, manifest.dp_world)
        for piece in record.pieces:
            saved[piece.tensor].append(Box(tuple(piece.offsets), tuple(piece.shape)))
    return saved


def _check_complete(manifest: Manifest, saved: list[list[Box]]) -> None:
    for index, (entry, boxes) in enumerate(zip(manifest.tensors, saved, strict=True)):
        whole = Box((0,) * len(entry.shape), tuple(entry.shape))
        try:
            plan_reads(whole, boxes, itemsize=1, block_bytes=1)
        except ReshardError as exc:
            raise RuntimeError(
                f"tensor {index}: {exc}: the {manifest.dp_world} ranks sharing this root do not "
                "hold the whole state (a mesh spanning nodes needs a root they all share)"
            ) from exc
