"""An actuator service process with the local backend, on a test's nats-server, and the rank
script its tests launch: shared by the actuator's tests that drive real rank processes."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from goodput.bus import Bus, BusSettings, EmbeddedNats
from tests import processes
from tests.stack.helpers import EventTap

JOB = "job-act"

# A rank that reports its torchrun-style environment and then waits to be killed.
RANK_SCRIPT = (
    "import os, sys, time\n"
    "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'on', os.environ['GOODPUT_NODE'], flush=True)\n"
    "code = int(os.environ.get('EXIT_AFTER', '-1'))\n"
    "if code >= 0:\n"
    "    sys.exit(code)\n"
    "time.sleep(600)\n"
)


class Actuator:
    def __init__(self, server: EmbeddedNats, state_dir: Path):
        self.server = server
        self.state_dir = state_dir
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "goodput_services.actuator",
                "--job",
                JOB,
                "--nats-url",
                self.server.url,
                "--state-dir",
                str(self.state_dir),
                "--set",
                "restore_timeout_s=0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.state_dir / "actuator.log", "ab"),  # noqa: SIM115
        )

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process, timeout_s=90)


@contextlib.asynccontextmanager
async def running_actuator(
    server: EmbeddedNats, state_dir: Path
) -> AsyncIterator[tuple[Bus, EventTap, Actuator]]:
    """A started actuator, a provisioned bus and a tap of ``JOB``'s events; all stopped after."""
    actuator = Actuator(server, state_dir)
    actuator.start()
    bus = await Bus.connect(BusSettings(url=server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    try:
        yield bus, tap, actuator
    finally:
        actuator.stop()
        await tap.stop()
        await bus.close()
