"""Rank processes on one host, started, watched, signalled and stopped the same way by
whoever starts them: the local backend (where every "node" is this machine) and a node agent
(on its own host).

A rank runs in a session of its own, so that signalling its group reaches whatever it forked
as well. Its output is appended to its log (:func:`goodput.launch.rank_logs.rank_log`), and
the rank boot variables are set over the environment it was given. Its exit is reported as a
``RankExited`` carrying the exit code or the signal, and the reason if the stop was asked for.
A stop is SIGTERM (save and exit), then SIGKILL for any rank still running after the grace.
A node agent's children die with it (:func:`die_with_parent`): an agent gone is its node
gone, and a child left behind would keep holding that host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from goodput import schemas
from goodput.launch.rank_env import with_rank_boot
from goodput.telemetry import untraced_task

log = logging.getLogger(__name__)

EventSink = Callable[[schemas.Event], Awaitable[None]]
#: called once a rank's exit is seen, before its ``RankExited`` is published (nothing awaited
#: in between, so what it decides holds at the exit); an awaitable it returns is awaited
#: after the event
ExitSeen = Callable[["RankProcess"], Awaitable[None] | None]

#: how long ranks asked to stop (SIGTERM: save and exit) may take before SIGKILL
STOP_GRACE_S = 60.0
_PR_SET_PDEATHSIG = 1


@dataclass
class RankProcess:
    """One rank of an attempt, as the process that runs it."""

    node: str
    rank: int
    local_rank: int
    attempt: int
    process: asyncio.subprocess.Process
    #: why its end was asked for (empty: an exit nobody asked for, a fault)
    expected_reason: str = ""
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    #: its watcher saw it exit (the process's own returncode is set earlier, by the loop)
    exited: bool = False

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def record(self) -> schemas.AgentRank:
        """The rank as a node agent's record lists it."""
        code = self.process.returncode
        return schemas.AgentRank(
            rank=self.rank,
            local_rank=self.local_rank,
            attempt=self.attempt,
            pid=self.process.pid,
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            running=code is None,
        )

    def exit_event(self, job: str) -> schemas.RankExited:
        """Its exit, once it has exited: the exit code, or the signal that ended it."""
        code = self.process.returncode
        assert code is not None, "the rank is still running"
        return schemas.RankExited.from_returncode(
            code,
            job=job,
            node=self.node,
            rank=self.rank,
            pid=self.process.pid,
            attempt=self.attempt,
            expected_reason=self.expected_reason,
        )


async def spawn_rank(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    output: Path,
    preexec_fn: Callable[[], None] | None = None,
) -> asyncio.subprocess.Process:
    """Start a rank as a new process leading a session of its own, its output appended to
    ``output``, its environment this process's with ``env`` and the rank boot variables over it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=with_rank_boot({**os.environ, **env}),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )


def watch(entry: RankProcess, job: str, emit: EventSink, seen: ExitSeen | None = None) -> None:
    """Report ``entry``'s exit when it comes (``entry.watcher``). The task is outside the current
    trace: an exit hours later is a fact of its own, not part of the launch that started it."""
    entry.watcher = untraced_task(_watch(entry, job, emit, seen))


async def _watch(entry: RankProcess, job: str, emit: EventSink, seen: ExitSeen | None) -> None:
    code = await entry.process.wait()
    entry.exited = True
    log.info("rank %d (pid %d) exited %d", entry.rank, entry.process.pid, code)
    then = seen(entry) if seen is not None else None
    await emit(entry.exit_event(job))
    if then is not None:
        await then


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads; one already gone, or not ours, is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop_ranks(
    entries: Iterable[RankProcess], why: str, grace_s: float, settle_s: float | None = None
) -> None:
    """Stop the running ones of ``entries``: SIGTERM to each group, SIGKILL to the ranks still
    running ``grace_s`` later (0: SIGKILL at once); then wait for their watchers to report
    the exits (at most ``settle_s``; None: until they have). A rank told earlier why it
    would end keeps that reason."""
    entries = list(entries)
    alive = [entry for entry in entries if entry.running]
    for entry in alive:
        entry.expected_reason = entry.expected_reason or why
        signal_group(entry.process.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    if grace_s > 0 and alive:
        waits = [asyncio.shield(entry.process.wait()) for entry in alive]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), grace_s)
        late = [entry for entry in alive if entry.running]
        if late:
            ranks = sorted(entry.rank for entry in late)
            log.warning("rank(s) %s ignored SIGTERM for %.0f s; killing them", ranks, grace_s)
        for entry in late:
            signal_group(entry.process.pid, signal.SIGKILL)
    watchers = [entry.watcher for entry in entries if entry.watcher is not None]
    if watchers:  # waited for, never cancelled: an exit seen late is still reported
        done, _ = await asyncio.wait(watchers, timeout=settle_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("a rank's exit was not reported: %r", task.exception())


def die_with_parent(sig: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when the process that started it dies (Linux;
    elsewhere a no-op)."""
    return functools.partial(_set_parent_death_signal, sig)


def _set_parent_death_signal(sig: int) -> None:  # pragma: no cover - runs between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
