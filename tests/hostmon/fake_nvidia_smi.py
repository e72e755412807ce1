#!/usr/bin/env python3
"""FakeNvidiaSmi: stands in for ``nvidia-smi --gpu-reset -i N``, because no GPU runs here.

``GOODPUT_FAKE_NVIDIA_SMI`` says how the reset goes: ``ok`` (exit 0, nvidia-smi's message),
``fail`` (exit 1 with the message nvidia-smi prints for a GPU in use) or ``hang`` (never
returns, as a reset of a wedged GPU can). Each call appends its arguments and pid to
``GOODPUT_FAKE_NVIDIA_SMI_LOG`` when that is set.
"""

import os
import sys
import time

mode = os.environ.get("GOODPUT_FAKE_NVIDIA_SMI", "ok")
log = os.environ.get("GOODPUT_FAKE_NVIDIA_SMI_LOG")
if log:
    with open(log, "a") as out:
        out.write(f"{os.getpid()} {' '.join(sys.argv[1:])}\n")
index = sys.argv[sys.argv.index("-i") + 1] if "-i" in sys.argv else "all"
if mode == "hang":
    while True:
        time.sleep(1)
if mode == "fail":
    print(f"GPU {index}: The following GPUs could not be reset: In use by another client")
    sys.exit(1)
print(f"GPU {index} was successfully reset.")
