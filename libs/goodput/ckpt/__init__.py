"""Asynchronous, verified checkpoints for PyTorch training state (no bus needed).

``CheckpointEngine`` snapshots a state into reused host buffers, persists it in the
background and commits atomically; ``restore`` loads the newest intact checkpoint. The
``goodput.ckpt.dcp_storage`` module plugs the same layout into torch.distributed.checkpoint.
"""

from goodput.ckpt.catalog import (
    CheckpointInfo,
    apply_retention,
    latest_complete_step,
    list_checkpoints,
    verify_checkpoint,
)
from goodput.ckpt.engine import CheckpointEngine
from goodput.ckpt.fileio import CorruptCheckpointError
from goodput.ckpt.handles import SaveHandle, SaveResult
from goodput.ckpt.restore import NoCheckpointError, StateMismatchError, restore_checkpoint
from goodput.ckptfmt import (
    Manifest,
    ManifestError,
    VerifyProblem,
    read_manifest,
    verify_files,
)

__all__ = [
    "CheckpointEngine",
    "CheckpointInfo",
    "CorruptCheckpointError",
    "Manifest",
    "ManifestError",
    "NoCheckpointError",
    "SaveHandle",
    "SaveResult",
    "StateMismatchError",
    "VerifyProblem",
    "apply_retention",
    "latest_complete_step",
    "list_checkpoints",
    "read_manifest",
    "restore_checkpoint",
    "verify_checkpoint",
    "verify_files",
]
