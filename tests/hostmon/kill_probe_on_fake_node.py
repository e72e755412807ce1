"""``python -m tests.hostmon.kill_probe_on_fake_node ARGS``: the kill probe's own ``main`` on
the fake GPU node (tests/hostmon/fake_gpu_node.py), the process it is told to kill listed as
holding GPU 0, as the driver lists a process with a CUDA context: `bench gpu`'s phase D run
here, where no GPU is (tests/bench/test_gpu_bench_dry.py)."""

from __future__ import annotations

import sys

from goodput_services.hostmon import kill_probe
from tests.hostmon.fake_gpu_node import hold_gpu, nvml

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--kill" in args and nvml.holders is not None:
        hold_gpu(nvml.holders, 0, int(args[args.index("--kill") + 1]))
    kill_probe.main(args, nvml=nvml)
