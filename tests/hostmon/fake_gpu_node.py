"""A FakeNvml for a host monitor *process*: ``--set nvml_module=tests.hostmon.fake_gpu_node:nvml``.

The node has ``GOODPUT_FAKE_GPUS`` GPUs (default 2). XID errors arrive as lines
``<gpu index> <xid>`` that a test appends to the file ``GOODPUT_FAKE_XIDS``, read each time
the probe drains NVML's events, so a test decides when the fault happens. The driver's
recovery action for a GPU is the last line ``<gpu index> <action>`` (``gpu_reset``,
``node_reboot``: ``NVML_GPU_RECOVERY_ACTION_<ACTION>``) of the file ``GOODPUT_FAKE_RECOVERY``
(none until then). A process holds a
GPU while a line ``<gpu index> <pid>`` is in the file ``GOODPUT_FAKE_GPU_HOLDERS`` and the
process runs (FakeNvidiaSmi reads the same file and refuses to reset a held GPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tests.hostmon.fake_nvml import FakeGpu, FakeNvml


@dataclass
class FileScriptedNvml(FakeNvml):
    """FakeNvml whose XID events are read from a file the test appends to."""

    script: Path | None = None
    lines_read: int = 0
    holders: Path | None = None
    recovery: Path | None = None

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int):
        if self.script is not None and self.script.exists():
            lines = self.script.read_text().splitlines()
            for line in lines[self.lines_read :]:
                index, xid = map(int, line.split())
                self.raise_xid(index, xid)
            self.lines_read = len(lines)
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]):
        if self.recovery is not None and self.recovery.exists():
            for line in self.recovery.read_text().splitlines():
                index, action = line.split()
                if int(index) == gpu.index:
                    gpu.recovery_action = getattr(
                        self, f"NVML_GPU_RECOVERY_ACTION_{action.upper()}"
                    )
        return super().nvmlDeviceGetFieldValues(gpu, field_ids)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu):
        gpu.processes = read_holders(self.holders).get(gpu.index, [])
        return super().nvmlDeviceGetComputeRunningProcesses(gpu)


def read_holders(path: Path | None) -> dict[int, list[int]]:
    """GPU index -> the pids the holders file says hold it (running or not)."""
    held: dict[int, list[int]] = {}
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            index, pid = map(int, line.split())
            held.setdefault(index, []).append(pid)
    return held


def hold_gpu(holders: Path, index: int, pid: int) -> None:
    with open(holders, "a") as out:
        out.write(f"{index} {pid}\n")


def set_recovery_action(recovery: Path, index: int, action: str) -> None:
    with open(recovery, "a") as out:
        out.write(f"{index} {action}\n")


def add_xid(script: Path, index: int, xid: int) -> None:
    with open(script, "a") as out:
        out.write(f"{index} {xid}\n")


_script = os.environ.get("GOODPUT_FAKE_XIDS")
_holders = os.environ.get("GOODPUT_FAKE_GPU_HOLDERS")
_recovery = os.environ.get("GOODPUT_FAKE_RECOVERY")
nvml = FileScriptedNvml(
    gpus=[
        FakeGpu(i, f"GPU-fake-{i}") for i in range(int(os.environ.get("GOODPUT_FAKE_GPUS", "2")))
    ],
    script=Path(_script) if _script else None,
    holders=Path(_holders) if _holders else None,
    recovery=Path(_recovery) if _recovery else None,
)
