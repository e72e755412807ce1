"""Persisting one snapshot: its data files from several threads, then the atomic commit.

The engine's worker thread calls ``Persister.persist`` for each snapshot it takes off its
queue, once the snapshot's copy into the host buffer is done. Data files are written with
O_DIRECT where the filesystem takes it (``goodput.checkpoint.engine.fileio``), each with its xxh3_128,
fsynced; then ``manifest.json`` goes in last and the directory is renamed
(``goodput.checkpoint.engine.commit``). A state sharded across nodes commits its node's part once
every part is durable (``goodput.checkpoint.engine.parts_commit``). Any problem is a failed result and event, never an exception:
the training loop goes on and earlier checkpoints are untouched.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine.commit import commit, gather_parts, part_path, write_part
from goodput.checkpoint.engine.events import CheckpointFailed, CheckpointPersisted, Listener, emit
from goodput.checkpoint.engine.fileio import DirectIOPolicy, write_data_file
from goodput.checkpoint.engine.handles import SaveResult
from goodput.checkpoint.engine.parts_commit import PartLayout, commit_part
from goodput.checkpoint.engine.plan import IO_ALIGN, SavePlan, align_up
from goodput.checkpoint.engine.sharded_save import ShardedSave, commit_sharded, write_shard_record
from goodput.checkpoint.engine.snapshot import PendingCopy
from goodput.checkpoint.format import FileEntry, fsync_dir, step_dir, tmp_step_dir
from goodput.checkpoint.format.parts import PartOf, summarize

log = logging.getLogger(__name__)


@dataclass
class Persister:
    """Writes snapshots under ``root`` with ``pool``'s threads (one file per task)."""

    root: Path
    pool: ThreadPoolExecutor
    policy: DirectIOPolicy
    listener: Listener | None
    dp_commit_timeout_s: float

    def persist(
        self,
        step: int,
        plan: SavePlan,
        tree: Any,
        data: torch.Tensor,
        copy: PendingCopy,
        metadata: dict[str, Any],
        sharded: ShardedSave | None = None,
    ) -> SaveResult:
        """Wait for ``copy`` to fill ``data``, write and commit it; the result says how it went.

        A DTensor state (``sharded``) also writes its rank's shard record and commits as a
        sharded checkpoint (``goodput.checkpoint.engine.sharded_save``); one spanning nodes
        (``sharded.parts``) as its node's part, after the global commit."""
        started = time.perf_counter()
        tmp = tmp_step_dir(self.root, step)
        layout = sharded.parts if sharded is not None else None
        # the ranks writing into this root, and the one of them that commits
        sharing = layout.local_world if layout is not None else plan.dp_world
        leader = layout.leader if layout is not None else plan.dp_rank == 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if sharing == 1 and tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(exist_ok=True)
            part_path(tmp, plan.dp_rank).unlink(missing_ok=True)
            copy.wait()
            files = self._write_files(plan, data, tmp)
            if sharded is not None:
                files.append(write_shard_record(tmp, sharded, plan, data))
            fsync_dir(tmp)
            committed = False
            if sharing > 1:
                write_part(tmp, plan, files)
                if leader:
                    ranks = layout.node_ranks if layout is not None else None
                    files = gather_parts(plan, tmp, self.dp_commit_timeout_s, ranks)
            if leader and sharded is not None:
                part = None
                if layout is not None:
                    part = self._global_commit(layout, step, plan, files)
                commit_sharded(self.root, step, tmp, sharded, tree, files, metadata, part=part)
                committed = True
            elif leader:
                commit(self.root, step, tmp, plan, tree, files, metadata)
                committed = True
        except Exception as exc:
            if sharing == 1 or (layout is not None and leader):
                shutil.rmtree(tmp, ignore_errors=True)
            error = f"{type(exc).__name__}: {exc}"
            log.warning("checkpoint step %d failed: %s", step, error)
            emit(self.listener, CheckpointFailed(step=step, error=error, dp_rank=plan.dp_rank))
            return SaveResult(step, "failed", error=error)
        duration = time.perf_counter() - started
        final = step_dir(self.root, step)
        emit(
            self.listener,
            CheckpointPersisted(
                step=step,
                path=str(final),
                bytes=plan.slice_bytes,
                duration_s=duration,
                gbps=plan.slice_bytes / duration / 1e9 if duration > 0 else 0.0,
                committed=committed,
                dp_rank=plan.dp_rank,
                dp_world=plan.dp_world,
            ),
        )
        return SaveResult(
            step,
            "persisted",
            path=str(final),
            bytes=plan.slice_bytes,
            duration_s=duration,
            committed=committed,
        )

    def _global_commit(
        self, layout: PartLayout, step: int, plan: SavePlan, files: list[FileEntry]
    ) -> PartOf:
        """The node's part is durable: report it, and wait for every part's (the table)."""
        summary = summarize(layout.part, layout.node_ranks, files)
        return commit_part(layout, layout.key_store(), step, summary, plan.layout_digest)

    def _write_files(self, plan: SavePlan, data: torch.Tensor, directory: Path) -> list[FileEntry]:
        futures = []
        for rng in plan.files:
            first = rng.start - plan.slice_start
            futures.append(
                self.pool.submit(
                    write_data_file,
                    directory / rng.name,
                    data[first : first + align_up(rng.size, IO_ALIGN)],
                    rng.size,
                    self.policy,
                )
            )
        wait(futures)
        digests = [future.result() for future in futures]
        return [
            FileEntry(
                name=rng.name,
                size=rng.size,
                xxh3_128=digest,
                offset=rng.start,
                dp_rank=plan.dp_rank,
            )
            for rng, digest in zip(plan.files, digests, strict=True)
        ]
