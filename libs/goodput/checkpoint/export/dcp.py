"""A goodput checkpoint as a torch.distributed.checkpoint (DCP) checkpoint, for users' own tools.

DCP writes it: ``dcp.save`` in one process (``no_dist``) with DCP's own ``FileSystemWriter``
and a planner (:class:`_ExportPlanner`) whose plan is the checkpoint's saved shards, so the
``.metadata`` (and its pickling) is DCP's, and ``dcp.load`` into any mesh (FSDP2, HSDP, one
process) and ``dcp_to_torch_save`` read the result. The planner hands DCP one chunk at a time:
each saved shard (a sharded checkpoint's pieces; a whole checkpoint's tensors) is read from
the step directories when DCP's writer asks for it, checked, written and dropped, so memory
holds the largest shard, not the state. Shards that are copies of one another (a replicated
DTensor saved by each holder) are written once.

Every byte is verified before it is published: a sharded checkpoint's bytes against the shard
records' per-block digests as they are read, a whole checkpoint's files against their
manifest digests as they stream by in order (the tails after the last tensor too). The export
is written into a hidden sibling of the destination and renamed into place only once DCP's
metadata is written and every digest matched: a failed export leaves nothing behind.

Keys are DCP's own flattening (``flatten_state_dict``) of the saved skeleton, so they are the
keys ``dcp.save`` would have written for the same state: ``model.0.weight``,
``optim.state.0.weight.exp_avg``, ``optim.param_groups.0.lr``. Plain values (the step, the
learning rate) become DCP byte items, which DCP serialises itself (``torch.save``, loaded back
with ``weights_only``); the skeleton's types are data only (goodput's tree), so nothing else
can be in them.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.utils._pytree import tree_leaves

from goodput.checkpoint.engine.reshard import Box, ReshardError, file_segments, plan_reads
from goodput.checkpoint.engine.sharded_load import read_records
from goodput.checkpoint.engine.tree import TreeError, dtype_from_name, unflatten
from goodput.checkpoint.export.sources import Checkpoint, ExportError, StepCopy
from goodput.checkpoint.format import KIND_SHARDED, FileEntry, Manifest, fsync_dir, open_regular
from goodput.checkpoint.format.sharded import data_entries

#: a whole checkpoint's padding and tails are hashed in reads of this size
_HASH_READ_BYTES = 8 << 20


@dataclass(frozen=True)
class Chunk:
    """One saved shard of one tensor: where it sits in the tensor and in a saving rank's stream."""

    fqn: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    source: StepCopy
    rank: int
    stream_offset: int
    nbytes: int
    #: the shard record's per-block digests (sharded); empty: the files' digests (whole)
    blocks: tuple[str, ...] = ()
    block_bytes: int = 0


@dataclass
class ExportReport:
    """What an export wrote (``goodput ckpt export --json`` prints it)."""

    source: list[str]
    out: str
    step: int
    kind: str
    commit: str | None
    parts: int
    tensors: int
    chunks: int
    values: int
    bytes: int
    seconds: float


def _pread(path: Path, offset: int, out: memoryview) -> None:
    try:
        fd = open_regular(path)
    except OSError as exc:  # NotRegularFile included
        raise ExportError(f"{path}: unreadable ({exc})") from None
    try:
        got = 0
        while got < len(out):
            count = os.preadv(fd, [out[got:]], offset + got)
            if count == 0:
                raise ExportError(f"{path}: shorter than its manifest says")
            got += count
    finally:
        os.close(fd)


class _WholeFiles:
    """A whole checkpoint's files, read in stream order and hashed as they go by: each read
    first hashes the bytes before it (padding), and :meth:`finish` the tails."""

    def __init__(self, copy: StepCopy) -> None:
        self.copy = copy
        self.files = sorted(copy.manifest.files, key=lambda entry: entry.offset)
        self.rows = [(entry.name, entry.offset, entry.size) for entry in self.files]
        self.entries = {entry.name: entry for entry in self.files}
        self.hashers = {entry.name: xxhash.xxh3_128() for entry in self.files}
        self.done = dict.fromkeys(self.hashers, 0)

    def _advance(self, entry: FileEntry, upto: int) -> None:
        while (position := self.done[entry.name]) < upto:
            buffer = bytearray(min(_HASH_READ_BYTES, upto - position))
            _pread(self.copy.path / entry.name, position, memoryview(buffer))
            self.hashers[entry.name].update(buffer)
            self.done[entry.name] += len(buffer)

    def read(self, chunk: Chunk, out: memoryview) -> None:
        end = chunk.stream_offset + chunk.nbytes
        try:
            segments = file_segments(chunk.stream_offset, end, self.rows)
        except ReshardError as exc:
            raise ExportError(f"{self.copy.path}: {exc}") from None
        for segment in segments:
            entry = self.entries[segment.name]
            if segment.offset < self.done[entry.name]:
                raise ExportError(f"{entry.name}: tensors overlap in the stream")
            self._advance(entry, segment.offset)
            view = out[segment.dest : segment.dest + segment.length]
            _pread(self.copy.path / entry.name, segment.offset, view)
            self.hashers[entry.name].update(view)
            self.done[entry.name] += segment.length

    def finish(self) -> None:
        for entry in self.files:
            self._advance(entry, entry.size)
            if self.hashers[entry.name].hexdigest() != entry.xxh3_128:
                raise ExportError(f"{self.copy.path / entry.name}: fails its checksum")


def _read_shard(chunk: Chunk, out: memoryview) -> None:
    """A sharded checkpoint's piece, each block checked against its record's digest."""
    manifest = chunk.source.manifest
    rows = [(e.name, e.offset, e.size) for e in data_entries(manifest, chunk.rank)]
    try:
        segments = file_segments(chunk.stream_offset, chunk.stream_offset + chunk.nbytes, rows)
    except ReshardError as exc:
        raise ExportError(f"{chunk.source.path}: rank {chunk.rank}: {exc}") from None
    for segment in segments:
        view = out[segment.dest : segment.dest + segment.length]
        _pread(chunk.source.path / segment.name, segment.offset, view)
    for index, lo in enumerate(range(0, chunk.nbytes, chunk.block_bytes)):
        if xxhash.xxh3_128_hexdigest(out[lo : lo + chunk.block_bytes]) != chunk.blocks[index]:
            raise ExportError(
                f"{chunk.source.path}: rank {chunk.rank}, {chunk.fqn}: block {index} fails its"
                " checksum"
            )


def _keys(manifest: Manifest) -> tuple[dict[int, list[str]], dict[str, Any], dict[str, Any]]:
    """DCP's keys for the skeleton: tensor index -> keys, plain values by key, and DCP's
    mapping from key to path (its ``planner_data``, so ``dcp_to_torch_save`` nests them)."""
    count = len(manifest.tensors)
    placeholders = [
        torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype), device="meta")
        for entry in manifest.tensors
    ]
    try:
        state = unflatten(manifest.tree, placeholders.__getitem__, tensor_count=count)
    except TreeError as exc:
        raise ExportError(f"the saved state does not fit DCP: {exc}") from None
    if not isinstance(state, dict):
        raise ExportError(f"the saved state is a {type(state).__name__}; DCP holds dicts")
    flat, mappings = flatten_state_dict(state)
    index_of = {id(tensor): index for index, tensor in enumerate(placeholders)}
    keys: dict[int, list[str]] = {}
    values: dict[str, Any] = {}
    for key, value in flat.items():
        if isinstance(value, torch.Tensor):
            keys.setdefault(index_of[id(value)], []).append(key)
        elif any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(value)):
            raise ExportError(f"{key}: tensors inside a {type(value).__name__} (DCP saves lists)")
        else:
            values[key] = value
    return keys, values, mappings


def _sharded_chunks(checkpoint: Checkpoint, keys: dict[int, list[str]]) -> Iterator[Chunk]:
    """Each distinct saved shard of each tensor once (copies of a replica dropped); the
    shards of every tensor must tile it exactly."""
    manifest = checkpoint.manifest
    pieces: dict[int, list[tuple[StepCopy, int, Any]]] = {}
    block_bytes = 0
    for copy in checkpoint.copies:
        try:
            records = read_records(copy.path, copy.manifest)
        except (OSError, ValueError) as exc:  # CorruptCheckpointError, ManifestError
            raise ExportError(f"{copy.path}: {exc}") from None
        for record in records:
            if block_bytes and record.block_bytes != block_bytes:
                raise ExportError("the ranks' shard records use different block sizes")
            block_bytes = record.block_bytes
            for piece in record.pieces:
                pieces.setdefault(piece.tensor, []).append((copy, record.rank, piece))
    for index, entry in enumerate(manifest.tensors):
        dtype = dtype_from_name(entry.dtype)
        saved = pieces.get(index, [])
        itemsize = torch.empty((), dtype=dtype).element_size()
        whole = Box((0,) * len(entry.shape), tuple(entry.shape))
        try:
            reads = plan_reads(
                whole,
                [Box(tuple(p.offsets), tuple(p.shape)) for _, _, p in saved],
                itemsize=itemsize,
                block_bytes=block_bytes or itemsize,
            )
        except ReshardError as exc:
            raise ExportError(f"tensor {index} ({keys.get(index, ['?'])[0]}): {exc}") from None
        chosen = [saved[read.piece] for read in reads]
        for fqn in keys.get(index, []):
            if not chosen:  # a tensor of no elements: one empty chunk
                yield Chunk(fqn, whole.offsets, whole.shape, dtype, checkpoint.copies[0], 0, 0, 0)
            for copy, rank, piece in chosen:
                yield Chunk(
                    fqn,
                    tuple(piece.offsets),
                    tuple(piece.shape),
                    dtype,
                    copy,
                    rank,
                    piece.stream_offset,
                    piece.nbytes,
                    tuple(piece.blocks),
                    block_bytes,
                )


def _whole_chunks(checkpoint: Checkpoint, keys: dict[int, list[str]]) -> Iterator[Chunk]:
    """A whole checkpoint's tensors, in stream order (the order its files are hashed in)."""
    copy = checkpoint.copies[0]
    order = sorted(range(len(copy.manifest.tensors)), key=lambda i: copy.manifest.tensors[i].offset)
    for index in order:
        entry = copy.manifest.tensors[index]
        shape = tuple(entry.shape)
        for fqn in keys.get(index, []):
            dtype = dtype_from_name(entry.dtype)
            yield Chunk(fqn, (0,) * len(shape), shape, dtype, copy, 0, entry.offset, entry.nbytes)


def _write_item(chunk: Chunk, global_shape: torch.Size) -> WriteItem:
    offsets = torch.Size(chunk.offsets)
    return WriteItem(
        index=MetadataIndex(chunk.fqn, offsets),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(chunk.shape)),
            properties=TensorProperties(dtype=chunk.dtype),
            size=global_shape,
        ),
    )


class _ExportPlanner(DefaultSavePlanner):
    """DCP's default save planner, with the checkpoint's shards as its plan and its reads
    as the data DCP's writer asks for, one chunk at a time."""

    def __init__(
        self,
        chunks: list[Chunk],
        shapes: dict[str, torch.Size],
        values: dict[str, Any],
        mappings: dict[str, Any],
        read: Callable[[Chunk, memoryview], None],
        progress: Callable[[int], None],
    ) -> None:
        super().__init__(flatten_state_dict=True, flatten_sharded_tensors=False)
        self.chunks = {(c.fqn, torch.Size(c.offsets)): c for c in chunks}
        self.order = chunks
        self.shapes = shapes
        self.values = values
        self.mappings = mappings
        self.read = read
        self.progress = progress
        self.written = 0

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        storage_meta: StorageMeta | None = None,
        is_coordinator: bool = False,
    ) -> None:
        del state_dict, storage_meta  # the plan is the checkpoint's, not a live state's
        self.state_dict = {}
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        items = [
            WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO) for key in self.values
        ]
        items += [_write_item(chunk, self.shapes[chunk.fqn]) for chunk in self.order]
        self.plan = SavePlan(items, planner_data=self.mappings)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        if index.offset is None:
            return self.values[index.fqn]
        chunk = self.chunks[(index.fqn, index.offset)]
        data = torch.empty(chunk.nbytes, dtype=torch.uint8)
        self.read(chunk, data.numpy().data)
        self.written += chunk.nbytes
        self.progress(self.written)
        return data.view(chunk.dtype).reshape(chunk.shape)


def _staging(out: Path) -> Path:
    return out.with_name(f".{out.name}.export-{os.getpid()}")


def export_dcp(
    checkpoint: Checkpoint,
    out: Path,
    *,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> ExportReport:
    """Write ``checkpoint`` as a DCP checkpoint at ``out`` (which must not exist, or be an
    empty directory); ``progress(bytes_done, bytes_total)`` as it goes."""
    started = time.perf_counter()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: exists and is not an empty directory (nothing overwritten)")
    manifest = checkpoint.manifest
    keys, values, mappings = _keys(manifest)
    sharded = manifest.kind == KIND_SHARDED
    chunks = list((_sharded_chunks if sharded else _whole_chunks)(checkpoint, keys))
    shapes = {
        fqn: torch.Size(manifest.tensors[index].shape)
        for index, names in keys.items()
        for fqn in names
    }
    total = sum(chunk.nbytes for chunk in chunks)
    whole = None if sharded else _WholeFiles(checkpoint.copies[0])
    read = _read_shard if whole is None else whole.read
    planner = _ExportPlanner(
        chunks, shapes, values, mappings, read, lambda done: progress(done, total)
    )
    staging = _staging(out)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        writer = dcp.FileSystemWriter(staging, single_file_per_rank=True, thread_count=1)
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*assuming the intent is to save in a single"
            )
            try:
                dcp.save({}, storage_writer=writer, planner=planner, no_dist=True)
            except CheckpointException as exc:  # DCP wraps what the planner raised
                failures = [error for error, _ in exc.failures.values()]
                raise (failures[0] if failures else ExportError(str(exc))) from None
        if whole is not None:
            whole.finish()
        fsync_dir(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportReport(
        source=[str(copy.path) for copy in checkpoint.copies],
        out=str(out),
        step=checkpoint.step,
        kind=manifest.kind,
        commit=checkpoint.commit,
        parts=len(checkpoint.copies),
        tensors=len(keys),
        chunks=len(chunks),
        values=len(values),
        bytes=total,
        seconds=time.perf_counter() - started,
    )
