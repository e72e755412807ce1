"""Persisting one snapshot: its data files from several threads, then the atomic commit.

The engine's worker thread calls ``Persister.persist`` for each snapshot it takes off its
queue, once the snapshot's copy into the host buffer is done. Data files are written with
O_DIRECT where the filesystem takes it (``goodput.checkpoint.engine.fileio``), each with its xxh3_128,
fsynced; then ``manifest.json`` goes in last and the directory is renamed
(``goodput.checkpoint.engine.commit``). Any problem is a failed result and event, never an exception:
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
from goodput.checkpoint.engine.plan import IO_ALIGN, SavePlan, align_up
from goodput.checkpoint.engine.sharded_save import ShardedSave, commit_sharded, write_shard_record
from goodput.checkpoint.engine.snapshot import PendingCopy
from goodput.checkpoint.format import FileEntry, fsync_dir, step_dir, tmp_step_dir

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
        sharded checkpoint (``goodput.checkpoint.engine.sharded_save``)."""
        started = time.perf_counter()
        tmp = tmp_step_dir(self.root, step)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if plan.dp_world == 1 and tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(exist_ok=True)
            part_path(tmp, plan.dp_rank).unlink(missing_ok=True)
            copy.wait()
            files = self._write_files(plan, data, tmp)
            if sharded is not None:
                files.append(write_shard_record(tmp, sharded, plan, data))
            fsync_dir(tmp)
            committed = False
            if plan.dp_world > 1:
                write_part(tmp, plan, files)
                if plan.dp_rank == 0:
                    files = gather_parts(plan, tmp, self.dp_commit_timeout_s)
            if plan.dp_rank == 0 and sharded is not None:
                commit_sharded(self.root, step, tmp, sharded, tree, files, metadata)
                committed = True
            elif plan.dp_rank == 0:
                commit(self.root, step, tmp, plan, tree, files, metadata)
                committed = True
        except Exception as exc:
            if plan.dp_world == 1:
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
