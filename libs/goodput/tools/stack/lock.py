"""One command at a time on a stack's state directory: an exclusive ``flock`` on ``stack.lock``.

Two `goodput up` at once on one state directory each found no server running and started one
on the same JetStream store; `down` then stopped the recorded one and orphaned the other. The
launcher takes this lock while it starts, undoes or stops a stack, so a second `up`, `run` or
`down` waits for the first (saying so in one line) and then finds what the first started. The
lock is the kernel's: it is released when its holder exits, however it exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from goodput.state_dir import StateDir

#: how long a command waits for another on the same stack (a `down` lets ranks save: ~75 s)
LOCK_WAIT_S = 120.0
#: how long a waiter gives the lock's holder to write its name, which it does just after taking it
HOLDER_PATIENCE_S = 2.0


class StackBusy(SystemExit):
    """Another command kept the state directory past the wait: one line, no traceback."""


#: the state directories this process holds the lock of (taken again inside: no wait)
_held: set[Path] = set()


@contextlib.contextmanager
def stack_lock(state_dir: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the state directory's lock, waiting up to ``wait_s`` for another holder. Taken
    again by its holder (`up` holds it around the launcher's start), it is simply held."""
    state_dir.mkdir(parents=True, exist_ok=True)
    key = state_dir.resolve()
    if key in _held:
        yield
        return
    with open(StateDir(state_dir).lock, "a+") as handle:
        holder = None if _try_lock(handle) else _holder(handle)
        if holder is not None:
            print(
                f"{state_dir} is in use by {holder}: waiting up to {wait_s:.0f} s for it",
                file=sys.stderr,
                flush=True,
            )
            deadline = time.monotonic() + wait_s
            while not _try_lock(handle):
                if time.monotonic() > deadline:
                    raise StackBusy(
                        f"{state_dir} is still in use by {holder} after {wait_s:.0f} s; "
                        "try again when it is done"
                    )
                time.sleep(0.1)
        handle.truncate(0)
        handle.write(f"{' '.join(['goodput', *sys.argv[1:2]])} (pid {os.getpid()})")
        handle.flush()
        _held.add(key)
        try:
            yield
        finally:
            _held.discard(key)


def _try_lock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(handle) -> str | None:
    """Who holds the lock, as its holder wrote it (for the message only: never trusted), or
    None once the lock is ours after all. The holder writes its name just after taking the
    lock, so a reader that comes between the two waits a moment for it."""
    deadline = time.monotonic() + HOLDER_PATIENCE_S
    while True:
        handle.seek(0)
        text = " ".join(handle.read(200).split())
        if text:
            return text
        if _try_lock(handle):
            return None
        if time.monotonic() > deadline:
            return "another goodput command"
        time.sleep(0.02)
