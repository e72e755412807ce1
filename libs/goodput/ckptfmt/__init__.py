"""The on-disk checkpoint format, torch-free: the one owner of what a checkpoint looks like.

- :mod:`~goodput.ckptfmt.layout`: step directory names (format and parse), hidden temp and
  trash names, and the node layout (``<state>/nodes/<node>/…``).
- :mod:`~goodput.ckptfmt.manifest`: manifest.json (structs, seal, parse, verify its own
  checksum, read, write, committed steps).
- :mod:`~goodput.ckptfmt.hashing`: the xxh3_128 hasher, counting what this process hashed.
- :mod:`~goodput.ckptfmt.files`: regular-file-only opens, hashing files, durable writes
  (fsync file and directory, atomic rename), safe deletion.
- :mod:`~goodput.ckptfmt.sharded`: the shard records of a sharded (DTensor) checkpoint.
- :mod:`~goodput.ckptfmt.verify`: is a checkpoint directory complete (sizes against its
  sealed manifest) and intact (every byte against its digest).
- :mod:`~goodput.ckptfmt.retention_record`: the volume's ``.goodput-retention`` (which steps
  the replicator says are safe to delete behind).

The engine (``goodput.ckpt``), the tiers (``goodput.tiers``), the replicator and the CLI all
import these; nothing else formats or parses a step directory or a manifest.
"""

from goodput.ckptfmt.files import (
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
from goodput.ckptfmt.hashing import HashTotals, Xxh3, hash_totals
from goodput.ckptfmt.layout import (
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
from goodput.ckptfmt.manifest import (
    FORMAT,
    KIND_DCP,
    KIND_ENGINE,
    KIND_FILES,
    KIND_SHARDED,
    FileEntry,
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
from goodput.ckptfmt.retention_record import (
    RETENTION_RECORD_NAME,
    RetentionRecord,
    RetentionRecordError,
    read_retention_record,
    write_retention_record,
)
from goodput.ckptfmt.verify import (
    VerifyProblem,
    check_file_sizes,
    check_sealed,
    verify_files,
    verify_manifest_and_files,
)

__all__ = [
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
    "read_manifest",
    "read_manifest_bytes",
    "read_retention_record",
    "remove_dir_safely",
    "step_dir",
    "step_dir_name",
    "step_dirs",
    "tmp_step_dir",
    "trash_path",
    "verify_files",
    "verify_manifest_and_files",
    "write_all",
    "write_file_durably",
    "write_manifest",
    "write_retention_record",
]
