"""The executor the bus tests watch: a command runner that only records what it executes."""

from __future__ import annotations

from goodput import schemas
from goodput.bus import Bus, CommandRunner


def recording_runner(
    bus: Bus, job: str, executed: list[str], target: str = "sensor"
) -> CommandRunner:
    """A runner of ``job``'s commands to ``target`` that appends each command id it executes
    to ``executed`` and reports success."""

    async def execute(command: schemas.Command) -> tuple[bool, str]:
        executed.append(command.command_id)
        return True, ""

    return CommandRunner(bus, job=job, target=target, service=target, execute=execute)
