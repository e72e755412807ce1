"""Ending the processes a test started: an orderly stop within a bound, else SIGKILL; reaped.

Teardowns wrote this out in some twenty places, several leaving a process running (a wait that
timed out raised in ``finally``) or a zombie (killed, never waited for). Here each process is
reaped before its exit code is returned and its pipes are closed, so a test leaves neither; the
process sweep (``process_sweep.py``) stays the net for what a test never handed over, such as a
service's own children.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time


def stop(*processes: subprocess.Popen, timeout_s: float = 30.0) -> list[int]:
    """SIGTERM every process still running (after SIGCONT: a stopped one cannot die of it),
    wait up to ``timeout_s`` in all for them to exit, SIGKILL those that did not; their exit
    codes in order (negative: the signal that ended it). They are signalled together, so
    stopping many costs one bound, not one per process."""
    for process in processes:
        process.send_signal(signal.SIGCONT)  # a no-op once it has exited
        process.terminate()
    deadline = time.monotonic() + timeout_s
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes += kill(process)
    _close_pipes(processes)
    return codes


def kill(*processes: subprocess.Popen) -> list[int]:
    """SIGKILL every process still running and reap each; their exit codes in order."""
    for process in processes:
        process.kill()  # a no-op once it has exited
    codes = [process.wait() for process in processes]
    _close_pipes(processes)
    return codes


async def kill_async(process: asyncio.subprocess.Process) -> int:
    """SIGKILL an asyncio child still running and reap it; its exit code."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    return await process.wait()


def _close_pipes(processes: tuple[subprocess.Popen, ...]) -> None:
    """Nothing more comes from an ended process: its pipes are closed, not left to the GC."""
    for process in processes:
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
