"""Checkpoint storage tiers: the node's local volume, peers, and an object store.

Bus-independent building blocks the replicator service calls: content-addressed backup to
an object store (directory or GCS), a peer-to-peer TCP data plane with deduplication and
resumable transfers, and restore from the nearest tier with per-file checksum fallback.
"""

from goodput.tiers.backup import (
    BackupReport,
    backed_up_steps,
    backup_checkpoint,
    blob_key,
    is_backup_complete,
    listing_key,
    read_listing,
)
from goodput.tiers.checksum import ChecksumMismatch, file_xxh3_128
from goodput.tiers.manifest import (
    CheckpointManifest,
    FileEntry,
    InvalidManifest,
    build_manifest,
    checkpoint_dirname,
    list_checkpoints,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from goodput.tiers.object_store import (
    DirectoryObjectStore,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
)
from goodput.tiers.restore import (
    FileRestore,
    LocalSource,
    ObjectStoreSource,
    PeerSource,
    RestoreError,
    RestoreReport,
    Source,
    SourceMiss,
    restore_checkpoint,
)

__all__ = [
    "BackupReport",
    "CheckpointManifest",
    "ChecksumMismatch",
    "DirectoryObjectStore",
    "FileEntry",
    "FileRestore",
    "InvalidManifest",
    "LocalSource",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreSource",
    "ObjectStoreUnavailable",
    "PeerSource",
    "RestoreError",
    "RestoreReport",
    "Source",
    "SourceMiss",
    "backed_up_steps",
    "backup_checkpoint",
    "blob_key",
    "build_manifest",
    "checkpoint_dirname",
    "file_xxh3_128",
    "is_backup_complete",
    "list_checkpoints",
    "listing_key",
    "parse_manifest",
    "read_listing",
    "read_manifest",
    "restore_checkpoint",
    "write_manifest",
]
