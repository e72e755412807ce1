"""Content-addressed backups in an object store.

Each unique file is stored once as ``<prefix>/blobs/<xxh3_128>``; each backed-up checkpoint
has a listing ``<prefix>/checkpoints/<namespace>/step-<step>.json`` (the checkpoint's
manifest). Identical DP replicas therefore cost one upload. The listing is written last:
a backup is complete only when its listing exists and every blob it names exists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from goodput.checkpoint.format import (
    STEP_PREFIX,
    ChecksumMismatch,
    Manifest,
    file_xxh3_128,
    parse_manifest,
    parse_step_dir,
    read_manifest,
    step_dir_name,
)
from goodput.checkpoint.tiers.object_store import ObjectStore

DEFAULT_PREFIX = "goodput"


def blob_key(xxh3_128: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}/blobs/{xxh3_128}"


def listing_key(namespace: str, step: int, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}/checkpoints/{namespace}/{step_dir_name(step)}.json"


def listing_step(key: str) -> int | None:
    """The step of a listing key (None for any other key)."""
    name = key.rsplit("/", 1)[-1]
    return parse_step_dir(name.removesuffix(".json")) if name.endswith(".json") else None


@dataclass(frozen=True)
class BackupReport:
    namespace: str
    step: int
    files_uploaded: int
    files_skipped: int
    bytes_uploaded: int
    bytes_skipped: int
    seconds: float


def backup_checkpoint(
    checkpoint_dir: Path, store: ObjectStore, namespace: str, prefix: str = DEFAULT_PREFIX
) -> BackupReport:
    """Upload the blobs the store lacks, then the listing. Local files are re-hashed first
    so a corrupt local copy is never stored under the good checksum."""
    started = time.perf_counter()
    checkpoint_dir = Path(checkpoint_dir)
    manifest = read_manifest(checkpoint_dir)
    uploaded = skipped = files_uploaded = files_skipped = 0
    seen: set[str] = set()
    for entry in manifest.files:
        if entry.xxh3_128 in seen:
            skipped += entry.size
            files_skipped += 1
            continue
        seen.add(entry.xxh3_128)
        key = blob_key(entry.xxh3_128, prefix)
        info = store.stat(key)
        if info is not None and info.size == entry.size:
            skipped += entry.size
            files_skipped += 1
            continue
        path = checkpoint_dir / entry.name
        actual = file_xxh3_128(path)
        if actual != entry.xxh3_128:
            raise ChecksumMismatch(f"{path}: xxh3_128 {actual}, manifest says {entry.xxh3_128}")
        store.put_file(key, path, actual)
        uploaded += entry.size
        files_uploaded += 1
    store.put_bytes(listing_key(namespace, manifest.step, prefix), manifest.to_bytes())
    return BackupReport(
        namespace,
        manifest.step,
        files_uploaded,
        files_skipped,
        uploaded,
        skipped,
        time.perf_counter() - started,
    )


def read_listing(
    store: ObjectStore, namespace: str, step: int, prefix: str = DEFAULT_PREFIX
) -> Manifest:
    return parse_manifest(store.get_bytes(listing_key(namespace, step, prefix)))


def backed_up_steps(store: ObjectStore, namespace: str, prefix: str = DEFAULT_PREFIX) -> list[int]:
    """Steps with a listing (complete only if :func:`is_backup_complete` also says so)."""
    steps = []
    for key in store.list(f"{prefix}/checkpoints/{namespace}/{STEP_PREFIX}"):
        step = listing_step(key)
        if step is not None:
            steps.append(step)
    return sorted(steps)


def is_backup_complete(
    store: ObjectStore, namespace: str, step: int, prefix: str = DEFAULT_PREFIX
) -> bool:
    if store.stat(listing_key(namespace, step, prefix)) is None:
        return False
    for entry in read_listing(store, namespace, step, prefix).files:
        info = store.stat(blob_key(entry.xxh3_128, prefix))
        if info is None or info.size != entry.size:
            return False
    return True
