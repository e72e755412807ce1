#!/usr/bin/env python3
"""FakeNvidiaSmi: stands in for ``nvidia-smi --gpu-reset -i N``, because no GPU runs here.

``GOODPUT_FAKE_NVIDIA_SMI`` says how the reset goes: ``ok`` (exit 0, nvidia-smi's message),
``fail`` (exit 1 with the message nvidia-smi prints for a GPU in use) or ``hang`` (never
returns, as a reset of a wedged GPU can). Each call appends its arguments and pid to
``GOODPUT_FAKE_NVIDIA_SMI_LOG`` when that is set. As the real one, it refuses to reset a GPU
a running process holds (``GOODPUT_FAKE_GPU_HOLDERS``, the file of ``fake_gpu_node``).
"""

import os
import sys
import time
from pathlib import Path


def running(pid: int) -> bool:
    """The process exists (this script runs under any python3: no psutil)."""
    return Path(f"/proc/{pid}").exists()


mode = os.environ.get("GOODPUT_FAKE_NVIDIA_SMI", "ok")
log = os.environ.get("GOODPUT_FAKE_NVIDIA_SMI_LOG")
if log:
    with open(log, "a") as out:
        out.write(f"{os.getpid()} {' '.join(sys.argv[1:])}\n")
index = sys.argv[sys.argv.index("-i") + 1] if "-i" in sys.argv else "all"
if mode == "hang":
    while True:
        time.sleep(1)
holders = Path(os.environ.get("GOODPUT_FAKE_GPU_HOLDERS", "/nonexistent"))
held = [
    int(pid)
    for gpu, pid in (line.split() for line in holders.read_text().splitlines())
    if gpu == index and running(int(pid))
] if holders.exists() else []  # fmt: skip
if mode == "fail" or held:
    print(f"GPU {index}: The following GPUs could not be reset: In use by another client")
    sys.exit(1)
print(f"GPU {index} was successfully reset.")
