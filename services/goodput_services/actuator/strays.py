"""Children of this process that no one watches: a rank forked by a spawn that then failed.

``asyncio.create_subprocess_exec`` forks first and only then sets up the watch of the child
(a thread per child under Python 3.11's default watcher); when that fails (``can't start new
thread``) the call raises with the child already running and its pid lost. The actuator
starts no child but ranks and standbys, so a child that is neither is such a stray.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def child_pids() -> set[int]:
    """This process's children (Linux ``/proc/self/task/*/children``; empty where absent)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(pid) for pid in (task / "children").read_text().split())
    return pids


def stop_strays(known: set[int]) -> list[int]:
    """SIGKILL and reap every child not in ``known`` (with its process group, which a rank
    leads once it started its session); the pids stopped."""
    strays = sorted(child_pids() - known)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # killed: reaped at once, or it stays a zombie no one waits for
    return strays
