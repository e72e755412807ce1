"""The trainer shim: imported by the training script to be supervised by goodput."""

from goodput.shim.trainer import EXIT_TERMINATED, ShimConfig, TrainerShim

__all__ = ["EXIT_TERMINATED", "ShimConfig", "TrainerShim"]
