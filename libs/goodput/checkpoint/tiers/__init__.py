"""Checkpoint storage tiers: the node's local volume, peers, and an object store.

Bus-independent building blocks the replicator service calls: content-addressed backup to
an object store (named by a URI, ``store_uri``: a directory, GCS or S3), a peer-to-peer TCP
data plane with deduplication and resumable transfers, and restore from the nearest tier
with per-file checksum fallback.
The checkpoint format itself (names, manifest, hashing) is :mod:`goodput.checkpoint.format`.
"""

from goodput.checkpoint.tiers.backup import (
    BackupReport,
    backed_up_steps,
    backup_checkpoint,
    blob_key,
    is_backup_complete,
    listing_key,
    read_listing,
)
from goodput.checkpoint.tiers.object_store import (
    DirectoryObjectStore,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
)
from goodput.checkpoint.tiers.restore import (
    FileRestore,
    LocalSource,
    ObjectStoreSource,
    PeerSource,
    RestoreError,
    RestoreReport,
    Source,
    SourceMiss,
    restore_to_volume,
)

__all__ = [
    "BackupReport",
    "DirectoryObjectStore",
    "FileRestore",
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
    "is_backup_complete",
    "listing_key",
    "read_listing",
    "restore_to_volume",
]
