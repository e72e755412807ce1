"""Restore a checkpoint onto a node's local volume from the nearest tier that has it.

Per file, sources are tried in order (local volume, then peers, then the object store);
a source that lacks the file, is unreachable, or serves bytes that fail the xxh3_128 check
is skipped for the next one. Files are fetched several at a time, largest first
(:mod:`goodput.checkpoint.tiers.streams`, as a push sends them; a peer source opens a
connection per concurrent fetch). They land under hidden temp names, each fsynced and renamed
after verification; the directory is fsynced once, then the manifest is written last, so the
directory becomes a checkpoint only once everything is durably in place. A peer's bytes are
written through the page cache, not with O_DIRECT: the ranks read them right after
(:class:`~goodput.checkpoint.tiers.peer.channel.FileSink`'s ``cached``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from goodput.checkpoint.format import (
    ChecksumMismatch,
    FileEntry,
    Manifest,
    copy_and_hash,
    file_xxh3_128,
    fsync_dir,
    is_regular_file,
    partial_path,
    publish,
    step_dir,
    step_dir_name,
    write_manifest,
)
from goodput.checkpoint.tiers.backup import DEFAULT_PREFIX, blob_key
from goodput.checkpoint.tiers.object_store import ObjectNotFound, ObjectStore
from goodput.checkpoint.tiers.peer.channel import Progress
from goodput.checkpoint.tiers.peer.client import PeerClient, PeerError
from goodput.checkpoint.tiers.streams import STREAMS, largest_first
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, StorageTier


class SourceMiss(LookupError):
    """This source does not hold the file."""


class RestoreError(RuntimeError):
    """No source could provide a verified copy of a file; ``attempts`` says why, per source."""

    def __init__(self, name: str, attempts: list[str]) -> None:
        super().__init__(f"cannot restore {name}: " + "; ".join(attempts))
        self.name = name
        self.attempts = attempts


# Failures that make restore move on to the next source rather than give up.
FALLBACK_ERRORS = (SourceMiss, ChecksumMismatch, ObjectNotFound, PeerError, OSError, EOFError)


class Source(Protocol):
    tier: StorageTier
    name: str

    async def fetch(self, step: int, entry: FileEntry, partial: Path, progress: Progress) -> int:
        """Leave exactly the verified bytes of ``entry`` at ``partial``; return bytes moved.

        ``partial`` is stable across attempts, so a source may resume from what it holds."""


class LocalSource:
    """The node's own checkpoint volume (``<root>/step-<step>/``)."""

    tier: StorageTier = LOCAL

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.name = f"local:{self.root}"

    async def fetch(self, step: int, entry: FileEntry, partial: Path, progress: Progress) -> int:
        source = step_dir(self.root, step) / entry.name
        if not is_regular_file(source) or source.stat().st_size != entry.size:
            raise SourceMiss(f"{source} absent or of the wrong size")
        try:
            digest = await asyncio.to_thread(copy_and_hash, source, partial)
        except OSError:
            partial.unlink(missing_ok=True)  # nothing to resume from a local copy
            raise
        if digest != entry.xxh3_128:
            raise ChecksumMismatch(f"{source}: xxh3_128 {digest}, expected {entry.xxh3_128}")
        progress(entry.size)
        return entry.size


class PeerSource:
    """Another node's peer server; ``remote_root`` is where that node keeps this node's
    checkpoints, relative to the root it serves. Interrupted pulls resume on retry. Each
    concurrent fetch has a connection of its own (opened on demand, kept for the next)."""

    tier: StorageTier = PEER

    def __init__(self, host: str, port: int, remote_root: str = "") -> None:
        self.host = host
        self.port = port
        self.remote_root = remote_root.strip("/")
        self.name = f"peer:{host}:{port}/{self.remote_root}"
        self._idle: list[PeerClient] = []
        #: connections opened so far: at most the fetches that ran at once
        self.connections = 0

    async def fetch(self, step: int, entry: FileEntry, partial: Path, progress: Progress) -> int:
        parts = [self.remote_root, step_dir_name(step), entry.name]
        remote = "/".join(p for p in parts if p)
        if self._idle:
            client = self._idle.pop()
        else:
            client = await PeerClient.connect(self.host, self.port)
            self.connections += 1
        try:
            result = await client.get_file(remote, partial, entry.size, entry.xxh3_128, progress)
        except PeerError as exc:
            self._idle.append(client)
            raise SourceMiss(str(exc)) from exc
        except BaseException:
            await client.close()  # unusable mid-stream: the next fetch connects again
            raise
        self._idle.append(client)
        return result.bytes_received

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for client in idle:
            await client.close()

    async def __aenter__(self) -> PeerSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ObjectStoreSource:
    """Content-addressed blobs in an object store (see :mod:`goodput.checkpoint.tiers.backup`)."""

    tier: StorageTier = OBJECT_STORE

    def __init__(self, store: ObjectStore, prefix: str = DEFAULT_PREFIX) -> None:
        self.store = store
        self.prefix = prefix
        self.name = f"object_store:{type(store).__name__}/{prefix}"

    async def fetch(self, step: int, entry: FileEntry, partial: Path, progress: Progress) -> int:
        key = blob_key(entry.xxh3_128, self.prefix)
        try:
            await asyncio.to_thread(self.store.get_file, key, partial, entry.xxh3_128)
        except ObjectNotFound as exc:
            raise SourceMiss(f"no blob {key}") from exc
        progress(entry.size)
        return entry.size


@dataclass(frozen=True)
class FileRestore:
    name: str
    #: which tier served it (the local volume when a verified copy was already in place)
    tier: StorageTier
    source: str
    bytes_moved: int
    seconds: float
    failed_attempts: tuple[str, ...] = ()
    #: a verified copy was already in place: nothing was read
    already_present: bool = False


@dataclass
class RestoreReport:
    step: int
    directory: Path
    files: list[FileRestore] = field(default_factory=list)
    seconds: float = 0.0

    def bytes_by_tier(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for f in self.files:
            totals[f.tier] = totals.get(f.tier, 0) + f.bytes_moved
        return totals


async def restore_to_volume(
    step: int,
    files: Sequence[FileEntry],
    dest_root: Path,
    sources: Sequence[Source],
    *,
    manifest: Manifest,
    progress: Callable[[int], None] | None = None,
    directory: Path | None = None,
    streams: int = STREAMS,
) -> RestoreReport:
    """Fill ``dest_root/step-<step>/`` (or ``directory``: a staged part) with ``files`` and
    commit it with ``manifest``: the owner's own manifest (a node restores exactly the
    checkpoint its engine can load). ``streams`` files are fetched at once."""
    started = time.perf_counter()
    directory = directory or step_dir(dest_root, step)
    directory.mkdir(parents=True, exist_ok=True)
    tick = progress or (lambda _n: None)

    async def fetch(entry: FileEntry, _stream: int) -> FileRestore:
        return await _restore_file(step, entry, directory, sources, tick)

    restored = await largest_first(files, lambda e: e.size, fetch, streams)
    # the renames above, durable before the manifest that makes them a checkpoint
    for parent in sorted({(directory / entry.name).parent for entry in files}):
        await asyncio.to_thread(fsync_dir, parent)
    report = RestoreReport(step, directory, restored)
    write_manifest(directory, manifest)
    report.seconds = time.perf_counter() - started
    return report


async def _restore_file(
    step: int, entry: FileEntry, directory: Path, sources: Sequence[Source], progress: Progress
) -> FileRestore:
    final = directory / entry.name
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if await asyncio.to_thread(_is_verified_copy, final, entry):
        progress(entry.size)
        seconds = time.perf_counter() - started
        return FileRestore(entry.name, LOCAL, str(final), 0, seconds, already_present=True)
    partial = partial_path(final, entry.xxh3_128)
    attempts: list[str] = []
    for source in sources:
        attempt_started = time.perf_counter()
        try:
            moved = await source.fetch(step, entry, partial, progress)
        except FALLBACK_ERRORS as exc:
            if isinstance(exc, ChecksumMismatch):
                partial.unlink(missing_ok=True)
            attempts.append(f"{source.name}: {type(exc).__name__}: {exc}")
            continue
        await asyncio.to_thread(publish, partial, final, sync_dir=False)
        return FileRestore(
            entry.name,
            source.tier,
            source.name,
            moved,
            time.perf_counter() - attempt_started,
            tuple(attempts),
        )
    raise RestoreError(entry.name, attempts)


def _is_verified_copy(path: Path, entry: FileEntry) -> bool:
    return (
        is_regular_file(path)
        and path.stat().st_size == entry.size
        and file_xxh3_128(path) == entry.xxh3_128
    )
