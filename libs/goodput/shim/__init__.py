"""The trainer shim: imported by the training script to be supervised by goodput."""

from goodput.shim.rescale import (
    BatchPlan,
    Rescale,
    RescaleCallback,
    RescaleError,
    adjust_schedule,
    keep_global_batch,
    scale_lr,
)
from goodput.shim.restore_result import DpLayout, RestoreResult
from goodput.shim.trainer import EXIT_TERMINATED, ShimConfig, TrainerShim

__all__ = [
    "EXIT_TERMINATED",
    "BatchPlan",
    "DpLayout",
    "Rescale",
    "RescaleCallback",
    "RescaleError",
    "RestoreResult",
    "ShimConfig",
    "TrainerShim",
    "adjust_schedule",
    "keep_global_batch",
    "scale_lr",
]
