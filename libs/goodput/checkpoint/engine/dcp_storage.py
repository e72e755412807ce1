"""torch.distributed.checkpoint storage with this package's layout, commit and verification.

``dcp.save`` / ``dcp.async_save`` with ``GoodputStorageWriter(root, step)`` write torch's
own DCP files into ``<root>/.tmp-step-N/``, with O_DIRECT, each hashed (xxh3_128) as it is
written in the process that writes it (``goodput.checkpoint.engine.dcp_files``); the coordinator then adds
``manifest.json`` (every file with its digest, kind "dcp") and renames the directory to
``step-N``, so a crash mid-save leaves nothing that looks like a checkpoint.
``GoodputStorageReader(root)`` picks the newest complete checkpoint (falling back past
incomplete ones); ``dcp.load`` then reads its files several at once (DCP's own reader takes
one after another), each hashed right after DCP read it; a file that fails its digest fails the
load, and ``load_verified`` then loads the next older checkpoint. The reader also reads a
checkpoint DCP's own FileSystemWriter wrote, as it is. DCP's planner does the resharding, so
a checkpoint written by N ranks loads onto any other world size. The torch classes do the
data IO; this adds the safety.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, Metadata
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import WriteResult

from goodput.checkpoint.engine.catalog import apply_retention
from goodput.checkpoint.engine.dcp_files import DIGEST_SUFFIX, HashingFileSystem
from goodput.checkpoint.engine.dcp_metadata import load_metadata
from goodput.checkpoint.engine.events import CheckpointPersisted, Listener, RestoreFallback, emit
from goodput.checkpoint.engine.fileio import CorruptCheckpointError
from goodput.checkpoint.engine.restore import NoCheckpointError
from goodput.checkpoint.format import (
    FORMAT,
    KIND_DCP,
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestError,
    VerifyProblem,
    check_file_sizes,
    file_xxh3_128,
    fsync_dir,
    read_manifest,
    remove_dir_safely,
    step_dir,
    step_dirs,
    tmp_step_dir,
    write_manifest,
)
from goodput.checkpoint.index.retention import DEFAULT_KEEP
from goodput.schemas.tiers import LOCAL

#: data files dcp.load reads at once through GoodputStorageReader (DCP's takes one at a time)
LOAD_THREADS = 4
#: the file DCP writes its Metadata to
METADATA_NAME = ".metadata"


def _take_digest(tmp: Path, name: str) -> str:
    """The digest the writer left for ``name`` (removed once read), else one computed now."""
    sidecar = tmp / f"{name}{DIGEST_SUFFIX}"
    try:
        digest = sidecar.read_text()
    except FileNotFoundError:
        return file_xxh3_128(tmp / name)
    sidecar.unlink()
    return digest


class GoodputStorageWriter(FileSystemWriter):
    """A DCP StorageWriter that commits ``<root>/step-<step>`` atomically with a manifest."""

    def __init__(
        self,
        root: str | os.PathLike,
        step: int,
        *,
        thread_count: int = 4,
        keep_last: int = DEFAULT_KEEP[LOCAL],
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
        self.fs = HashingFileSystem()

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
            if name != MANIFEST_NAME
            and not name.endswith((".tmp", DIGEST_SUFFIX))
            and (tmp / name).is_file()
        ]
        digests = [_take_digest(tmp, name) for name in names]
        for stale in tmp.glob(f"*{DIGEST_SUFFIX}"):  # .metadata's (written as .metadata.tmp)
            stale.unlink()
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


def select_complete_dcp_checkpoint(
    root: str | os.PathLike, step: int | None = None
) -> tuple[int, Path, Manifest, tuple[RestoreFallback, ...]]:
    """The newest DCP checkpoint (at or before ``step``) with an intact manifest, every file
    there at its size and a ``.metadata`` that verifies (DCP unpickles it before any read);
    the data files' bytes are verified as DCP reads them (``GoodputStorageReader``)."""
    fallbacks = []
    for candidate, path in step_dirs(root):
        if step is not None and candidate > step:
            continue
        try:
            manifest = read_manifest(path)
        except ManifestError as exc:
            fallbacks.append(RestoreFallback(step=candidate, reason=str(exc)))
            continue
        if manifest.kind != KIND_DCP:
            fallbacks.append(
                RestoreFallback(step=candidate, reason=f"kind {manifest.kind!r}, not dcp")
            )
            continue
        problems = check_file_sizes(path, manifest) or _check_metadata(path, manifest)
        if problems:
            fallbacks.append(RestoreFallback(step=candidate, reason="; ".join(map(str, problems))))
            continue
        return candidate, path, manifest, tuple(fallbacks)
    raise NoCheckpointError(f"no intact DCP checkpoint under {root}", tuple(fallbacks))


def _check_metadata(path: Path, manifest: Manifest) -> list[VerifyProblem]:
    """``.metadata`` matches its digest and is DCP metadata (read as data, ``dcp_metadata``):
    DCP gives the reader's own failure back only as text, so a forged step must be found
    here, where it is one more fallback."""
    digests = {entry.name: entry.xxh3_128 for entry in manifest.files}
    if METADATA_NAME not in digests:
        return [VerifyProblem(METADATA_NAME, "missing")]
    if file_xxh3_128(path / METADATA_NAME) != digests[METADATA_NAME]:
        return [VerifyProblem(METADATA_NAME, "xxh3_128 mismatch")]
    try:
        load_metadata((path / METADATA_NAME).read_bytes())
    except CorruptCheckpointError as exc:
        return [VerifyProblem(METADATA_NAME, str(exc))]
    return []


class GoodputStorageReader(FileSystemReader):
    """A DCP StorageReader over the newest complete checkpoint, every byte verified.

    Construction picks the checkpoint (``select_complete_dcp_checkpoint``: ``.step``, and
    ``.fallbacks`` for those skipped). ``dcp.load`` then reads ``load_threads`` files at once
    (DCP's own reader takes one after another), each hashed right after DCP read it, from the
    page cache: the disk sees one reader per file, and verifying costs a pass over memory. A file whose bytes fail their digest makes
    ``dcp.load`` raise CorruptCheckpointError once the reads are done; the state may then hold
    some of those bytes: ``load_verified`` loads again from the next older checkpoint.
    ``root`` may also be a checkpoint written by DCP's own FileSystemWriter (a ``.metadata``
    file and no manifest): it is read as it is (``.step`` None), so checkpoints from before
    switching to goodput still load; they carry no digests, so only DCP's own checks apply.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        step: int | None = None,
        *,
        load_threads: int = LOAD_THREADS,
    ) -> None:
        self.load_threads = load_threads
        path = Path(root)
        self.step: int | None = None
        self.fallbacks: tuple[RestoreFallback, ...] = ()
        self._digests: dict[str, str] | None = None
        if not is_plain_dcp_checkpoint(path):
            self.step, path, manifest, self.fallbacks = select_complete_dcp_checkpoint(root, step)
            self._digests = {entry.name: entry.xxh3_128 for entry in manifest.files}
        super().__init__(path)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """The directory was chosen at construction; a checkpoint_id passed to dcp is ignored."""
        super().reset(None)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata, read as data (``dcp_metadata``: no code runs, whatever the file
        holds) from the very bytes checked against the manifest's digest."""
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        data = (Path(self.path) / name).read_bytes()
        if self._digests is not None and self._digests.get(name) != xxhash.xxh3_128_hexdigest(data):
            raise CorruptCheckpointError(f"step {self.step}: {name} does not match its digest")
        metadata = load_metadata(data)
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        """DCP's own read of each file, ``load_threads`` files at once, each file hashed right
        after DCP read it, from the page cache (DCP's default planners take calls from several
        threads; a custom one must, too)."""
        by_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        read_file = super().read_data

        def read_and_check(name: str, items: list[ReadItem]) -> VerifyProblem | None:
            try:
                read_file(dataclasses.replace(plan, items=items), planner)
            except Exception:  # DCP could not parse it: corrupt bytes say why, and fall back
                problem = self._check(name)
                if problem is None:
                    raise
                return problem
            return self._check(name)

        workers = max(1, min(self.load_threads, len(by_file)))
        with ThreadPoolExecutor(workers, thread_name_prefix="goodput-dcp-read") as pool:
            checks = [pool.submit(read_and_check, name, items) for name, items in by_file.items()]
            problems = [problem for check in checks if (problem := check.result()) is not None]
        if problems:
            raise CorruptCheckpointError(f"step {self.step}: " + "; ".join(map(str, problems)))
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _check(self, name: str) -> VerifyProblem | None:
        if self._digests is None:  # DCP's own checkpoint: nothing to check against
            return None
        if name not in self._digests:
            return VerifyProblem(name, "not in the manifest")
        try:
            digest = file_xxh3_128(Path(self.path) / name)
        except OSError as exc:
            return VerifyProblem(name, f"unreadable ({exc.strerror or exc})")
        return None if digest == self._digests[name] else VerifyProblem(name, "xxh3_128 mismatch")


def load_verified(
    state: dict[str, Any],
    root: str | os.PathLike,
    step: int | None = None,
    *,
    planner: LoadPlanner | None = None,
    process_group: Any = None,
    load_threads: int = LOAD_THREADS,
) -> GoodputStorageReader:
    """``dcp.load`` of ``state`` from the newest checkpoint whose every byte verifies.

    A checkpoint whose bytes fail their digests during the load is skipped and the load runs
    again from the next older one; every rank sees every rank's failure (DCP gathers them),
    so all ranks skip it together. Returns the reader that loaded (``.step``, ``.fallbacks``);
    raises NoCheckpointError when none loads (``state`` may then hold partial data).
    """
    skipped: list[RestoreFallback] = []
    while True:
        try:
            reader = GoodputStorageReader(root, step, load_threads=load_threads)
        except NoCheckpointError as exc:
            raise NoCheckpointError(
                f"no intact DCP checkpoint under {root}", (*skipped, *exc.fallbacks)
            ) from None
        try:
            dcp.load(state, storage_reader=reader, planner=planner, process_group=process_group)
        except CheckpointException as exc:
            corrupt = [e for e, _ in exc.failures.values() if isinstance(e, CorruptCheckpointError)]
            if not corrupt or reader.step is None:
                raise
            skipped.append(RestoreFallback(step=reader.step, reason=str(corrupt[0])))
            step = reader.step - 1
            continue
        reader.fallbacks = (*skipped, *reader.fallbacks)
        return reader


def is_plain_dcp_checkpoint(path: Path) -> bool:
    """A directory DCP's FileSystemWriter committed (its ``.metadata``), with no manifest."""
    return (path / METADATA_NAME).is_file() and not (path / MANIFEST_NAME).exists()
