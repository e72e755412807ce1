"""What every module of the GPU kit (tests/gpu) is marked with.

The kit is collected everywhere and skipped, with this reason, where torch sees no CUDA
device, so a CPU run lists each GPU test as skipped rather than hiding it. ``just test-gpu``
runs it on a machine with a GPU (and refuses to run where there is none)."""

from __future__ import annotations

import pytest
import torch

REASON = (
    f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}): "
    "the GPU kit runs with `just test-gpu` on a machine with an NVIDIA GPU"
)

#: ``pytestmark = GPU`` in each kit module
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=REASON)]
