"""A FakeNvml for a host monitor *process*: ``--set nvml_module=tests.hostmon.fake_gpu_node:nvml``.

The node has ``GOODPUT_FAKE_GPUS`` GPUs (default 2). XID errors arrive as lines
``<gpu index> <xid>`` that a test appends to the file ``GOODPUT_FAKE_XIDS``, read each time
the probe drains NVML's events, so a test decides when the fault happens.
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

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int):
        if self.script is not None and self.script.exists():
            lines = self.script.read_text().splitlines()
            for line in lines[self.lines_read :]:
                index, xid = map(int, line.split())
                self.raise_xid(index, xid)
            self.lines_read = len(lines)
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)


def add_xid(script: Path, index: int, xid: int) -> None:
    with open(script, "a") as out:
        out.write(f"{index} {xid}\n")


_script = os.environ.get("GOODPUT_FAKE_XIDS")
nvml = FileScriptedNvml(
    gpus=[
        FakeGpu(i, f"GPU-fake-{i}") for i in range(int(os.environ.get("GOODPUT_FAKE_GPUS", "2")))
    ],
    script=Path(_script) if _script else None,
)
