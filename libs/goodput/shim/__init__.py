"""The trainer shim: imported by the training script to be supervised by goodput.

Names are imported on first use, so ``goodput.shim.rescale`` (the rescale rules, no torch) can
be read by the command line without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from goodput.launch.rank_env import EXIT_TERMINATED
    from goodput.shim.config import ShimConfig
    from goodput.shim.data_position import DataPositionError, ResumableSampler
    from goodput.shim.dp_layout import DpLayout
    from goodput.shim.fsdp_regroup import FsdpRegroupError, regroup_fsdp
    from goodput.shim.rescale import (
        BatchPlan,
        Rescale,
        RescaleCallback,
        RescaleError,
        adjust_schedule,
        keep_global_batch,
        scale_lr,
    )
    from goodput.shim.restore_result import (
        RestoreResult,
        UnfilledVolumeError,
        UnrestorableCheckpointError,
    )
    from goodput.shim.standby import JobRun, run_job
    from goodput.shim.trainer import TrainerShim
    from goodput.warm_path import WarmPathTimeouts

#: public name -> the module that defines it
_EXPORTS = {
    "BatchPlan": "goodput.shim.rescale",
    "Rescale": "goodput.shim.rescale",
    "RescaleCallback": "goodput.shim.rescale",
    "RescaleError": "goodput.shim.rescale",
    "adjust_schedule": "goodput.shim.rescale",
    "keep_global_batch": "goodput.shim.rescale",
    "scale_lr": "goodput.shim.rescale",
    "DpLayout": "goodput.shim.dp_layout",
    "RestoreResult": "goodput.shim.restore_result",
    "UnfilledVolumeError": "goodput.shim.restore_result",
    "UnrestorableCheckpointError": "goodput.shim.restore_result",
    "JobRun": "goodput.shim.standby",
    "run_job": "goodput.shim.standby",
    "EXIT_TERMINATED": "goodput.launch.rank_env",
    "ShimConfig": "goodput.shim.config",
    "DataPositionError": "goodput.shim.data_position",
    "ResumableSampler": "goodput.shim.data_position",
    "FsdpRegroupError": "goodput.shim.fsdp_regroup",
    "regroup_fsdp": "goodput.shim.fsdp_regroup",
    "TrainerShim": "goodput.shim.trainer",
    "WarmPathTimeouts": "goodput.warm_path",
}

__all__ = [
    "EXIT_TERMINATED",
    "BatchPlan",
    "DataPositionError",
    "DpLayout",
    "FsdpRegroupError",
    "JobRun",
    "Rescale",
    "RescaleCallback",
    "RescaleError",
    "RestoreResult",
    "ResumableSampler",
    "ShimConfig",
    "TrainerShim",
    "UnfilledVolumeError",
    "UnrestorableCheckpointError",
    "WarmPathTimeouts",
    "adjust_schedule",
    "keep_global_batch",
    "regroup_fsdp",
    "run_job",
    "scale_lr",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'goodput.shim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
