"""A loss spike's skip windows outlive the actuator: a run started again by a restarted actuator
reads them back from the commands kept in GP_CMDS (``actuator/skip_history.py``)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, EmbeddedNats
from goodput.bus.commands import DoneLog
from goodput_services.actuator.skip_history import RunSkips, fold, read_run_windows, run_windows
from tests.actuator.local_actuator import JOB, Actuator, running_actuator
from tests.stack.helpers import EventTap

SPIKE = schemas.StepWindow(41, 45)
LATER = schemas.StepWindow(90, 92)


def _start(run_id: str = "run-a", argv: list[str] | None = None) -> schemas.StartJob:
    return schemas.StartJob(
        job=JOB, argv=argv or ["true"], nodes=1, procs_per_node=1, run_id=run_id
    )


def _spike(window: schemas.StepWindow) -> schemas.Restart:
    return schemas.Restart(
        job=JOB, reason="loss_spike", restore_before_step=window.first, skip_steps=window
    )


# ---- the fold (pure) ---------------------------------------------------------------------------


def test_a_run_started_again_keeps_the_windows_of_its_restarts() -> None:
    commands = [_start(), _spike(SPIKE), schemas.Restart(job=JOB, reason="crash"), _spike(LATER)]
    assert run_windows(commands, "run-a") == RunSkips("run-a", (SPIKE, LATER))
    # the same run started again in between (an earlier actuator restart) goes on with them
    again = [*commands[:2], _start(), _spike(LATER)]
    assert run_windows(again, "run-a").windows == (SPIKE, LATER)


def test_a_new_run_skips_nothing_of_an_earlier_one() -> None:
    commands = [_start("run-a"), _spike(SPIKE), _start("run-b")]
    assert run_windows(commands, "run-b") == RunSkips("run-b", ())
    assert run_windows([_start("run-a"), _spike(SPIKE)], "run-b").run_id == "run-a"


def test_a_window_sent_twice_is_skipped_once() -> None:
    state = fold(fold(RunSkips("run-a"), _spike(SPIKE)), _spike(SPIKE))
    assert state.windows == (SPIKE,)


def test_restarts_whose_start_rolled_off_belong_to_no_run() -> None:
    """The stream dropped the run's StartJob: the windows left cannot be told from an
    earlier run's, and the caller takes none of them."""
    assert run_windows([_spike(SPIKE)], "run-a") == RunSkips(None, (SPIKE,))


# ---- a real actuator restarted between the decision and the relaunch -----------------------

# a rank that writes the windows it was told to skip, then waits to be stopped
SKIP_SCRIPT = (
    "import os, time\n"
    "print('skip', os.environ.get('GOODPUT_SKIP_STEPS', '-'), time.time_ns(), flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
async def stack(
    tmp_path: Path, nats_server: EmbeddedNats
) -> AsyncIterator[tuple[Bus, EventTap, Actuator]]:
    async with running_actuator(nats_server, tmp_path) as running:
        yield running


async def _told(logs: Path, lines: int, timeout_s: float = 30.0) -> list[str]:
    """What the ranks were told, oldest first, once ``lines`` of them started (the logs of
    an attempt number are appended to by every run and actuator)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        told = sorted(
            (
                line.split()[1:]
                for log in logs.glob("logs/ranks/attempt-*/*.log")
                for line in log.read_text().splitlines()
                if line.startswith("skip ")
            ),
            key=lambda words: int(words[1]),
        )
        if len(told) >= lines:
            return [words[0] for words in told]
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the ranks wrote fewer than {lines} lines under {logs}")


async def _ok(bus: Bus, tap: EventTap, command: schemas.Command) -> None:
    await bus.send_command("actuator", command)
    result = await tap.result_of(command, timeout_s=60)
    assert result.ok, result.detail


async def test_the_window_survives_an_actuator_restart(stack, tmp_path: Path) -> None:
    bus, tap, actuator = stack
    argv = [sys.executable, "-c", SKIP_SCRIPT]
    await _ok(bus, tap, _start(argv=argv))
    assert await _told(tmp_path, 1) == ["-"]  # each rank is heard before it is replaced
    await _ok(bus, tap, _spike(SPIKE))
    assert await _told(tmp_path, 2) == ["-", "41-45"]
    # the actuator goes (its ranks save and stop with it) and a new one takes its place
    actuator.stop()
    actuator.start()
    await _ok(bus, tap, _start(argv=argv))  # the same run, started again
    assert (await _told(tmp_path, 3))[2] == "41-45"
    # a later spike's window joins it; a new run of the job skips none of them
    await _ok(bus, tap, _spike(LATER))
    assert (await _told(tmp_path, 4))[3] == "41-45,90-92"
    await _ok(bus, tap, schemas.Stop(job=JOB))
    await _ok(bus, tap, _start("run-b", argv=argv))
    assert (await _told(tmp_path, 5))[4] == "-"


# ---- the read: what GP_CMDS holds, forged and rolled off ----------------------------------


async def test_the_read_takes_the_runs_commands_and_leaves_out_what_is_not_one(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone on the bus may publish on the actuator's subject: bytes that do not decode
    and a command naming another job are not the run's; a later run's commands are not read."""
    subject = subjects.command(JOB, subjects.ACTUATOR)
    forged = _spike(schemas.StepWindow(7, 8))
    forged.job = "other-job"
    current = _start()
    for command in (_start(), _spike(SPIKE), _spike(SPIKE)):  # a window sent twice
        await bus.send_command(subjects.ACTUATOR, command)
    await bus.js.publish(subject, b"\xff not a command")
    await bus.publish(subject, forged, msg_id="forged")
    for command in (_spike(LATER), current, _spike(schemas.StepWindow(200, 201))):
        await bus.send_command(subjects.ACTUATOR, command)
    assert await read_run_windows(bus, current) == (SPIKE, LATER)
    # a new run skips none of them, and says nothing: its start is no loss
    assert await read_run_windows(bus, _start("run-b")) == ()
    assert "rolled off" not in caplog.text


async def test_windows_whose_run_start_rolled_off_are_not_taken_and_the_start_says_so(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    await bus.send_command(subjects.ACTUATOR, _spike(SPIKE))  # its StartJob is gone
    current = _start()
    await bus.send_command(subjects.ACTUATOR, current)
    assert await read_run_windows(bus, current) == ()
    assert "41-45" in caplog.text and "rolled off" in caplog.text


async def test_a_refused_start_begins_no_run(bus: Bus) -> None:
    """A StartJob of another run sent while this one went was refused (recorded so in
    gp_done): the restarts after it are still this run's."""
    refused = _start("run-b")
    for command in (_start(), _spike(SPIKE), refused, _spike(LATER)):
        await bus.send_command(subjects.ACTUATOR, command)
    await DoneLog(bus, JOB, subjects.ACTUATOR).record(
        refused.command_id,
        schemas.ActionResult(job=JOB, command_id=refused.command_id, action="start_job", ok=False),
    )
    current = _start()
    await bus.send_command(subjects.ACTUATOR, current)
    assert await read_run_windows(bus, current) == (SPIKE, LATER)
