"""torch.distributed.checkpoint storage with this package's layout, commit and verification.

``dcp.save`` / ``dcp.async_save`` with ``GoodputStorageWriter(root, step)`` write torch's
own DCP files into ``<root>/.tmp-step-N/``; the coordinator then adds ``manifest.json`` (every
file with its xxh3_128 digest, kind "dcp") and renames the directory to ``step-N``, so a
crash mid-save leaves nothing that looks like a checkpoint. ``GoodputStorageReader(root)``
picks the newest checkpoint whose every file verifies (several files read at once, falling
back past bad ones) before ``dcp.load`` reads it (or reads a checkpoint DCP's own
FileSystemWriter wrote, as it is); DCP's planner does the resharding, so a checkpoint
written by N ranks loads onto any other world size. The torch classes do the data IO; this adds the safety.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, Metadata
from torch.distributed.checkpoint.storage import WriteResult

from goodput.ckpt.catalog import DEFAULT_KEEP_LAST, apply_retention
from goodput.ckpt.events import CheckpointPersisted, Listener, RestoreFallback, emit
from goodput.ckpt.restore import NoCheckpointError
from goodput.ckptfmt import (
    FORMAT,
    KIND_DCP,
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestError,
    file_xxh3_128,
    fsync_dir,
    read_manifest,
    remove_dir_safely,
    step_dir,
    step_dirs,
    tmp_step_dir,
    verify_files,
    write_manifest,
)

#: data files verified at once before a load (DCP writes one file per writer thread and rank)
VERIFY_THREADS = 8


class GoodputStorageWriter(FileSystemWriter):
    """A DCP StorageWriter that commits ``<root>/step-<step>`` atomically with a manifest."""

    def __init__(
        self,
        root: str | os.PathLike,
        step: int,
        *,
        thread_count: int = 4,
        keep_last: int = DEFAULT_KEEP_LAST,
        listener: Listener | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.root = Path(root)
        self.step = step
        self.keep_last = keep_last
        self.listener = listener
        self.user_metadata = dict(metadata or {})
        self._started = time.perf_counter()
        super().__init__(tmp_step_dir(root, step), thread_count=thread_count, sync_files=True)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """The directory is chosen by (root, step); a checkpoint_id passed to dcp is ignored."""
        super().reset(None)
        self._started = time.perf_counter()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if is_coordinator:
            shutil.rmtree(self.path, ignore_errors=True)
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        tmp = Path(self.path)
        names = [
            name
            for name in sorted(os.listdir(tmp))
            if name != MANIFEST_NAME and not name.endswith(".tmp") and (tmp / name).is_file()
        ]
        # The files were just written (still in the page cache): hash them all at once.
        with ThreadPoolExecutor(max(1, min(self.thread_count, len(names) or 1))) as pool:
            digests = list(pool.map(lambda name: file_xxh3_128(tmp / name), names))
        files = [
            FileEntry(name=name, size=(tmp / name).stat().st_size, xxh3_128=digest)
            for name, digest in zip(names, digests, strict=True)
        ]
        manifest = Manifest(
            format=FORMAT,
            step=self.step,
            kind=KIND_DCP,
            files=files,
            created_ns=time.time_ns(),
            metadata=self.user_metadata,
        )
        write_manifest(tmp, manifest)
        final = step_dir(self.root, self.step)
        if final.exists():
            remove_dir_safely(final)
        os.replace(tmp, final)
        fsync_dir(self.root)
        duration = time.perf_counter() - self._started
        total = manifest.total_bytes
        emit(
            self.listener,
            CheckpointPersisted(
                step=self.step,
                path=str(final),
                bytes=total,
                duration_s=duration,
                gbps=total / duration / 1e9 if duration > 0 else 0.0,
                committed=True,
            ),
        )
        if self.keep_last > 0:
            apply_retention(self.root, self.keep_last, self.listener)


def select_verified_dcp_checkpoint(
    root: str | os.PathLike, step: int | None = None, *, threads: int = VERIFY_THREADS
) -> tuple[int, Path, tuple[RestoreFallback, ...]]:
    """The newest DCP checkpoint (at or before ``step``) whose every file verifies (``threads``
    files read at once)."""
    fallbacks = []
    for candidate, path in step_dirs(root):
        if step is not None and candidate > step:
            continue
        try:
            kind = read_manifest(path).kind
        except ManifestError as exc:
            fallbacks.append(RestoreFallback(step=candidate, reason=str(exc)))
            continue
        if kind != KIND_DCP:
            fallbacks.append(RestoreFallback(step=candidate, reason=f"kind {kind!r}, not dcp"))
            continue
        problems = verify_files(path, threads=threads)
        if problems:
            reason = "; ".join(map(str, problems))
            fallbacks.append(RestoreFallback(step=candidate, reason=reason))
            continue
        return candidate, path, tuple(fallbacks)
    raise NoCheckpointError(f"no intact DCP checkpoint under {root}", tuple(fallbacks))


class GoodputStorageReader(FileSystemReader):
    """A DCP StorageReader over the newest verified checkpoint (``.step``, ``.fallbacks``).

    Verification happens here, before DCP unpickles ``.metadata``; raises NoCheckpointError
    when no candidate verifies. ``root`` may also be a checkpoint written by DCP's own
    FileSystemWriter (a ``.metadata`` file and no manifest): it is read as it is (``.step``
    None), so checkpoints from before switching to goodput still load; they carry no
    digests, so only DCP's own checks apply to them.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        step: int | None = None,
        *,
        verify_threads: int = VERIFY_THREADS,
    ) -> None:
        path = Path(root)
        if is_plain_dcp_checkpoint(path):
            self.step, self.fallbacks = None, ()
        else:
            self.step, path, self.fallbacks = select_verified_dcp_checkpoint(
                root, step, threads=verify_threads
            )
        super().__init__(path)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """The directory was chosen and verified at construction; a checkpoint_id is ignored."""
        super().reset(None)


def is_plain_dcp_checkpoint(path: Path) -> bool:
    """A directory DCP's FileSystemWriter committed (its ``.metadata``), with no manifest."""
    return (path / ".metadata").is_file() and not (path / MANIFEST_NAME).exists()
