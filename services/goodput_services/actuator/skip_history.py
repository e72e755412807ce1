"""The windows whose batches a run skips, rebuilt from the commands the actuator was sent.

A loss spike's rollback (``Restart.skip_steps``) tells every later attempt of the run to skip
its window's batches (:class:`~goodput_services.actuator.rank_environments.RankEnvironments`).
Held only in the actuator's memory, the windows were lost with its process: a run started
again by a restarted actuator (a ``StartJob`` of the same run) trained on the spike's batches
once more. The actuator keeps no store of its own for them: its commands, kept in GP_CMDS,
are the record. A run's start folds the actuator's commands that came before its ``StartJob``
(:func:`run_windows`, pure) as :func:`read_commands_before` reads them (the effect).

What is read: the actuator's own subject only (``gp.<job>.cmd.actuator``: remediations, a few
an hour, never the per-node commands of a relaunch), one request a command. GP_CMDS keeps
``keep_h`` hours of restarts at the job's scale (``goodput.bus.store_sizing``) and 14 days at
most: a run whose ``StartJob`` rolled off keeps no window (it cannot be told from an earlier
run's, :func:`run_windows`), and the start says so in one line.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import nats.js.errors

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.client import retry_transient
from goodput.bus.commands import DoneLog
from goodput.launch.rank_env import format_step_windows

log = logging.getLogger(__name__)

#: how long one read of GP_CMDS waits out a transient bus error (a cluster electing a leader)
READ_DEADLINE_S = 30.0


def with_window(
    windows: tuple[schemas.StepWindow, ...], window: schemas.StepWindow
) -> tuple[schemas.StepWindow, ...]:
    """``windows`` and ``window`` after them, once (a window sent twice is skipped once)."""
    return windows if window in windows else (*windows, window)


@dataclass(frozen=True)
class RunSkips:
    """The fold's state: the run of the newest ``StartJob`` seen (None: none yet) and the
    windows of the restarts since, oldest first."""

    run_id: str | None = None
    windows: tuple[schemas.StepWindow, ...] = ()


def fold(state: RunSkips, command: schemas.Command) -> RunSkips:
    """``state`` after ``command``: a ``StartJob`` of another run begins an empty history, a
    ``Restart`` carrying a window adds it; every other command changes nothing."""
    if isinstance(command, schemas.StartJob) and command.run_id != state.run_id:
        return RunSkips(command.run_id)
    if isinstance(command, schemas.Restart) and command.skip_steps is not None:
        return RunSkips(state.run_id, with_window(state.windows, command.skip_steps))
    return state


def run_windows(commands: Iterable[schemas.Command], run_id: str) -> RunSkips:
    """The fold of ``commands`` (the actuator's, in the order sent); its windows are
    ``run_id``'s when its run is ``run_id``. Restarts before any ``StartJob`` kept (run None)
    belong to a run whose start rolled off, maybe another: the caller takes none of them."""
    return functools.reduce(fold, commands, RunSkips())


async def read_commands_before(bus: Bus, job: str, command_id: str) -> list[schemas.Command]:
    """The commands to ``job``'s actuator kept in GP_CMDS, in the order sent, up to the one
    with ``command_id`` (the one in hand). One that does not decode, or names another job
    than its subject, is left out: anyone on the bus may publish there, and the actuator
    refused to run it too. So is a ``StartJob`` the actuator refused (its result in
    ``gp_done``, one lookup a start): it began no run."""
    subject = subjects.command(job, subjects.ACTUATOR)
    commands: list[schemas.Command] = []
    done = DoneLog(bus, job, subjects.ACTUATOR)
    seq = 1
    while True:
        try:
            message = await retry_transient(
                functools.partial(
                    bus.js.get_msg, subjects.COMMANDS_STREAM, seq, subject=subject, next=True
                ),
                deadline_s=READ_DEADLINE_S,
                what=f"read {subjects.COMMANDS_STREAM}",
            )
        except nats.js.errors.NotFoundError:
            return commands  # no later command on the subject (or no stream)
        seq = message.seq + 1
        try:
            command = schemas.decode_command(message.data or b"")
        except schemas.SchemaError:
            continue
        if command.command_id == command_id:
            return commands
        if subjects.mismatch(subject, command):
            continue
        if isinstance(command, schemas.StartJob) and await _refused(done, command):
            continue  # no run began: the restarts after it were the earlier run's
        commands.append(command)


async def _refused(done: DoneLog, start: schemas.StartJob) -> bool:
    """Whether the actuator recorded ``start`` as refused (a run was going, too few nodes).
    A result rolled off ``gp_done`` or unreadable counts as run: the run is taken as begun."""
    try:
        result = await retry_transient(
            functools.partial(done.result, start.command_id),
            deadline_s=READ_DEADLINE_S,
            what=f"read {subjects.DONE_BUCKET}",
        )
    except schemas.SchemaError:
        return False
    return result is not None and not result.ok


async def read_run_windows(bus: Bus, start: schemas.StartJob) -> tuple[schemas.StepWindow, ...]:
    """The windows the run ``start`` begins (again) skips: those of its restarts before
    ``start``; none for a new run. Windows whose run's start rolled off are not taken, in
    one line that says so."""
    commands = await read_commands_before(bus, start.job, start.command_id)
    history = run_windows(commands, start.run_id)
    if history.run_id is None and history.windows:
        log.warning(
            "run %s: %s holds restarts that skip steps %s but not the start of their run "
            "(rolled off): this run skips none of them",
            start.run_id,
            subjects.COMMANDS_STREAM,
            format_step_windows(history.windows),
        )
    if history.run_id != start.run_id:
        return ()
    if history.windows:
        log.info(
            "run %s started again: it skips steps %s",
            start.run_id,
            format_step_windows(history.windows),
        )
    return history.windows
