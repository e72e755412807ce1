"""The on-disk checkpoint format, torch-free: the one owner of what a checkpoint looks like.

- :mod:`~goodput.checkpoint.format.layout`: step directory names (format and parse), hidden temp and
  trash names, and the node layout (``<state>/nodes/<node>/…``).
- :mod:`~goodput.checkpoint.format.manifest`: manifest.json (structs, seal, parse, verify its own
  checksum and tensor layout, read, write, committed steps).
- :mod:`~goodput.checkpoint.format.file_entry`: one data file as a manifest seals it (the manifest
  lists them, a part's commit table digests them).
- :mod:`~goodput.checkpoint.format.tensor_layout`: does a tensor table fit the bytes it seals.
- :mod:`~goodput.checkpoint.format.hashing`: the xxh3_128 hasher, counting what this process hashed.
- :mod:`~goodput.checkpoint.format.files`: regular-file-only opens, hashing files, durable writes
  (fsync file and directory, atomic rename), safe deletion.
- :mod:`~goodput.checkpoint.format.sharded`: the shard records of a sharded (DTensor) checkpoint.
- :mod:`~goodput.checkpoint.format.parts`: a sharded checkpoint across nodes: one part per node
  (its own step directory), the commit table naming every part, staged parts' names.
- :mod:`~goodput.checkpoint.format.verify`: is a checkpoint directory complete (sizes against its
  sealed manifest) and intact (every byte against its digest).
- :mod:`~goodput.checkpoint.format.retention_record`: the volume's ``.goodput-retention`` (which steps
  the replicator says are safe to delete behind).
- :mod:`~goodput.checkpoint.format.clean_record`: the volume's ``.goodput-clean`` (the last step its
  ranks know numerically clean: the checkpoint a rollback restores is kept).

The engine (``goodput.checkpoint.engine``), the tiers (``goodput.checkpoint.tiers``), the replicator and the CLI all
import these; nothing else formats or parses a step directory or a manifest.
"""

from goodput.checkpoint.format.clean_record import (
    CLEAN_RECORD_NAME,
    CleanRecordError,
    read_clean_record,
    remove_clean_record,
    write_clean_record,
)
from goodput.checkpoint.format.file_entry import FileEntry
from goodput.checkpoint.format.files import (
    ChecksumMismatch,
    NotRegularFile,
    Signature,
    copy_and_hash,
    file_signature,
    file_xxh3_128,
    fsync_dir,
    hash_file,
    is_regular_file,
    open_regular,
    publish,
    remove_dir_safely,
    write_all,
    write_file_durably,
)
from goodput.checkpoint.format.hashing import HashTotals, Xxh3, hash_totals
from goodput.checkpoint.format.layout import (
    MANIFEST_NAME,
    STEP_PREFIX,
    TMP_PREFIX,
    TRASH_PREFIX,
    is_temp_name,
    local_root,
    node_dir,
    node_volume,
    parse_step_dir,
    parse_tmp_step_dir,
    partial_path,
    peer_root,
    step_dir,
    step_dir_name,
    step_dirs,
    tmp_step_dir,
    trash_path,
)
from goodput.checkpoint.format.manifest import (
    FORMAT,
    KIND_DCP,
    KIND_ENGINE,
    KIND_FILES,
    KIND_SHARDED,
    Manifest,
    ManifestError,
    TensorEntry,
    build_manifest,
    committed_steps,
    encode_manifest,
    parse_manifest,
    read_manifest,
    read_manifest_bytes,
    write_manifest,
)
from goodput.checkpoint.format.retention_record import (
    RETENTION_RECORD_NAME,
    RetentionRecord,
    RetentionRecordError,
    read_retention_record,
    write_retention_record,
)
from goodput.checkpoint.format.verify import (
    VerifyProblem,
    check_file_sizes,
    check_sealed,
    verify_files,
    verify_manifest_and_files,
)

__all__ = [
    "CLEAN_RECORD_NAME",
    "FORMAT",
    "KIND_DCP",
    "KIND_ENGINE",
    "KIND_FILES",
    "KIND_SHARDED",
    "MANIFEST_NAME",
    "RETENTION_RECORD_NAME",
    "STEP_PREFIX",
    "TMP_PREFIX",
    "TRASH_PREFIX",
    "ChecksumMismatch",
    "CleanRecordError",
    "FileEntry",
    "HashTotals",
    "Manifest",
    "ManifestError",
    "NotRegularFile",
    "RetentionRecord",
    "RetentionRecordError",
    "Signature",
    "TensorEntry",
    "VerifyProblem",
    "Xxh3",
    "build_manifest",
    "check_file_sizes",
    "check_sealed",
    "committed_steps",
    "copy_and_hash",
    "encode_manifest",
    "file_signature",
    "file_xxh3_128",
    "fsync_dir",
    "hash_file",
    "hash_totals",
    "is_regular_file",
    "is_temp_name",
    "local_root",
    "node_dir",
    "node_volume",
    "open_regular",
    "parse_manifest",
    "parse_step_dir",
    "parse_tmp_step_dir",
    "partial_path",
    "peer_root",
    "publish",
    "read_clean_record",
    "read_manifest",
    "read_manifest_bytes",
    "read_retention_record",
    "remove_clean_record",
    "remove_dir_safely",
    "step_dir",
    "step_dir_name",
    "step_dirs",
    "tmp_step_dir",
    "trash_path",
    "verify_files",
    "verify_manifest_and_files",
    "write_all",
    "write_clean_record",
    "write_file_durably",
    "write_manifest",
    "write_retention_record",
]
