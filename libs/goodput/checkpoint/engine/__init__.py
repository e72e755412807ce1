"""Asynchronous, verified checkpoints for PyTorch training state (no bus needed).

``CheckpointEngine`` snapshots a state into reused host buffers, persists it in the
background and commits atomically; ``restore`` loads the newest intact checkpoint. The
``goodput.checkpoint.engine.dcp_storage`` module plugs the same layout into torch.distributed.checkpoint.
"""

from goodput.checkpoint.engine.catalog import (
    CheckpointInfo,
    apply_retention,
    latest_complete_step,
    list_checkpoints,
    verify_checkpoint,
)
from goodput.checkpoint.engine.engine import CheckpointEngine
from goodput.checkpoint.engine.fileio import CorruptCheckpointError
from goodput.checkpoint.engine.handles import SaveHandle, SaveResult
from goodput.checkpoint.engine.load_into import StateMismatchError
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.engine.restore import NoCheckpointError, restore_checkpoint
from goodput.checkpoint.format import (
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
    "PartLayout",
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
