"""The processes a stack started, known by more than their pid, and the check before a signal.

A pid names whichever process holds it now: once a stack's processes are gone (a reboot, a
crash) their recorded pids may belong to anything, and signalling them hits an unrelated
process. A record therefore keeps a :class:`ProcessIdentity` (pid, start time, command line),
and :func:`standing` compares it with the process holding the pid before any signal or any
"already running". Every process a stack starts also carries :data:`STACK_ENV` naming its
state directory (inherited by what it starts: a service's ranks), so the stack's processes are
found (:func:`marked_processes`) when its record is lost or unreadable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
import psutil

#: names the state directory of the stack a process belongs to (resolved path)
STACK_ENV = "GOODPUT_STACK_DIR"
#: start times of one process read twice may differ this much (boot time is rounded)
START_TOLERANCE_S = 1.0

#: ``running``: the recorded process itself; ``gone``: nothing holds the pid (or a zombie);
#: ``replaced``: another process holds the pid now
Standing = Literal["running", "gone", "replaced"]


class ProcessIdentity(msgspec.Struct, kw_only=True, frozen=True):
    """One process, as recorded when it was started."""

    pid: int
    #: its start time (epoch seconds, psutil ``create_time``)
    started: float
    cmdline: tuple[str, ...]

    def describe(self) -> str:
        program = Path(self.cmdline[0]).name if self.cmdline else "?"
        return f"pid {self.pid} ({program})"


class RecordUnreadable(SystemExit):
    """A record of a stack's processes that cannot be decoded (truncated, corrupt, from an
    older release): one line naming it. A ``SystemExit``, so a command that does not handle
    it ends with that line, not a traceback."""


def identify(pid: int) -> ProcessIdentity:
    """The identity of the live process ``pid`` (raises ``psutil.NoSuchProcess`` if none)."""
    process = psutil.Process(pid)
    with process.oneshot():
        return ProcessIdentity(
            pid=pid, started=process.create_time(), cmdline=tuple(process.cmdline())
        )


def spawned(process: subprocess.Popen) -> ProcessIdentity:
    """The identity of a process just started: its command line as given, not as read back
    (``/proc/<pid>/cmdline`` may still be empty or the parent's while the kernel finishes the
    exec, though ``Popen`` has returned); the start time is the fork's."""
    argv = [process.args] if isinstance(process.args, str | bytes | os.PathLike) else process.args
    return ProcessIdentity(
        pid=process.pid,
        started=psutil.Process(process.pid).create_time(),
        cmdline=tuple(os.fsdecode(arg) for arg in argv),
    )


def standing(identity: ProcessIdentity) -> Standing:
    """Whether the recorded process still holds its pid: same start time and command line. An
    empty command line (read while the kernel finishes an exec: its arguments are not mapped
    yet) leaves the start time to decide."""
    try:
        process = psutil.Process(identity.pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                _reap(identity.pid)
                return "gone"
            cmdline = tuple(process.cmdline())
            same = abs(process.create_time() - identity.started) < START_TOLERANCE_S and (
                cmdline == identity.cmdline or not (cmdline and identity.cmdline)
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "gone"
    except psutil.AccessDenied:
        return "replaced"  # not ours to check: then not ours to signal either
    return "running" if same else "replaced"


@dataclass(frozen=True)
class Checked:
    """Recorded processes, each checked once: the names of those still running, and one line
    for each of the others by name (gone, or their pid held by another process: never
    signalled), in the record's order."""

    running: frozenset[str]
    stale: dict[str, str]


def check_recorded(recorded: Mapping[str, ProcessIdentity]) -> Checked:
    """Check every recorded process (named, e.g. ``sensor@node-0``) against its pid, once."""
    found = {name: standing(identity) for name, identity in recorded.items()}
    return Checked(
        running=frozenset(name for name, state in found.items() if state == "running"),
        stale={
            name: stale_line(name, recorded[name], state)
            for name, state in found.items()
            if state != "running"
        },
    )


def is_running(identity: ProcessIdentity) -> bool:
    return standing(identity) == "running"


def terminate(
    identity: ProcessIdentity, timeout_s: float = 10.0, *, group: bool = False
) -> Standing:
    """SIGTERM the recorded process, wait up to ``timeout_s``, then SIGKILL it (its whole
    process group with ``group``: a keeper and its service). Nothing is sent unless the pid
    still holds the recorded process; what it found is returned (``running``: it was stopped)."""
    found = standing(identity)
    if found != "running":
        return found
    with contextlib.suppress(ProcessLookupError):
        os.kill(identity.pid, signal.SIGTERM)
    if _gone_within(identity, timeout_s):
        return found
    if is_running(identity):
        with contextlib.suppress(ProcessLookupError):
            if group and os.getpgid(identity.pid) == identity.pid:
                os.killpg(identity.pid, signal.SIGKILL)
            else:
                os.kill(identity.pid, signal.SIGKILL)
    _gone_within(identity, 5.0)
    return found


@dataclass(frozen=True)
class Stop:
    """One process of a stop's plan: how long it is given after SIGTERM, and whether SIGKILL
    then goes to its whole process group (a keeper and its service)."""

    identity: ProcessIdentity
    timeout_s: float
    group: bool = False


def terminate_in_order(plan: Sequence[Stop]) -> list[Standing]:
    """Stop each process of ``plan`` in turn, each only if its pid still holds it
    (:func:`terminate`); what each was found as, in the plan's order. A process listed twice,
    or one that went with another (a service with its keeper), is found gone: nothing is sent."""
    return [terminate(stop.identity, stop.timeout_s, group=stop.group) for stop in plan]


def _gone_within(identity: ProcessIdentity, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_running(identity):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _reap(pid: int) -> None:
    """Collect a zombie that is this process's child (a stack started in-process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stack_marker(state_dir: Path) -> dict[str, str]:
    """The environment entry that marks a process as the stack's of ``state_dir``."""
    return {STACK_ENV: str(Path(state_dir).resolve())}


def marked_processes(state_dir: Path) -> list[ProcessIdentity]:
    """Every live process carrying the marker of the stack of ``state_dir``, except this
    process and its ancestors. Reads every process's environment: for `down`, not a loop."""
    marker = stack_marker(state_dir)[STACK_ENV]
    own = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}
    found = []
    for process in psutil.process_iter():
        if process.pid in own:
            continue
        try:
            if process.environ().get(STACK_ENV) != marker:
                continue
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(identify(process.pid))
        except psutil.Error:
            continue  # gone meanwhile, or another user's: not the stack's
    return found


def stale_line(what: str, identity: ProcessIdentity, found: Standing) -> str:
    """How a recorded process that is not running any more is reported (never signalled)."""
    why = "is gone" if found == "gone" else "is held by another process now"
    return f"{what}: {identity.describe()} {why}"
