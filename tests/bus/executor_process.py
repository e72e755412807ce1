"""An actuator-like executor in its own process, for tests that kill it mid-command.

``FileJob`` is a fake, named as one: a job whose attempt each restart advances, as the
actuator's backend does, kept in a file so that an executor process killed with SIGKILL and
its successor see one job (as two actuators see one cluster). Its fence is that attempt.

``python -m tests.bus.executor_process URL JOB_FILE [HOLD_FILE [before]]`` runs a command
runner on it; with HOLD_FILE, each execution waits for that file to exist after the restart
took effect and before returning (the moment to take the bus away or kill the process), or,
with ``before``, before the restart takes effect.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, CommandRunner
from tests.bus.samples import JOB

TARGET = subjects.ACTUATOR
#: short, so a command left un-acked through an outage would be redelivered during a test
ACK_WAIT_S = 2.0


class FileJob:
    """Stands in for the actuator's backend: a restart starts the next attempt."""

    def __init__(self, path: Path, hold: Path | None = None, *, hold_before: bool = False):
        self.path = path
        self.hold = hold
        self.hold_before = hold_before
        if not path.exists():
            self._save(0, [])

    def _load(self) -> tuple[int, list[str]]:
        data = json.loads(self.path.read_text())
        return data["attempt"], data["executed"]

    def _save(self, attempt: int, executed: list[str]) -> None:
        self.path.write_text(json.dumps({"attempt": attempt, "executed": executed}))

    @property
    def attempt(self) -> int:
        return self._load()[0]

    @property
    def executed(self) -> list[str]:
        """Command ids in the order they were executed."""
        return self._load()[1]

    def fence(self, command: schemas.Command) -> str:
        return f"attempt {self.attempt}"

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        if self.hold_before:
            await self._held()
        attempt, executed = self._load()
        self._save(attempt + 1, [*executed, command.command_id])
        if not self.hold_before:
            await self._held()
        return True, f"restarted (attempt {attempt + 1})"

    async def _held(self) -> None:
        while self.hold is not None and not self.hold.exists():
            await asyncio.sleep(0.02)


def runner(bus: Bus, job: FileJob) -> CommandRunner:
    return CommandRunner(
        bus,
        job=JOB,
        target=TARGET,
        service="actuator",
        execute=job.execute,
        fence=job.fence,
        ack_wait_s=ACK_WAIT_S,
    )


async def _main(url: str, job_file: str, hold: str = "", when: str = "") -> None:
    bus = await Bus.connect(BusSettings(url=url), name="executor")
    job = FileJob(Path(job_file), Path(hold) if hold else None, hold_before=when == "before")
    await runner(bus, job).run()


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:]))
