"""A rank that dies of a CUDA failure anywhere still says so in its exit code.

Inside the shim's loop a failed step is classified and a poisoned context or a repeated OOM
leaves with ``EXIT_CODES`` (86, 87: :mod:`goodput.shim.step_faults`). Outside it — while the
script imports and builds its model, in a restore the script calls itself, in a script's own
loop without ``TrainerShim`` — an uncaught exception would end the process with Python's
status 1, and the supervisor would restart a rank whose context cannot continue as if it had
met any crash (warm, where a poisoned rank fails again), or never tell an OOM of every rank
from one node's. So every process goodput launches installs :func:`classified_exit` as
``sys.excepthook`` at start-up (:mod:`goodput.shim.rank_boot`): the traceback is printed as
usual, then the exception is classified by the one owner (``step_faults.classify``) and a
CUDA fault ends the process with its code, its reason the log's last line.

Only the main thread's uncaught exception ends a Python process, so only it is hooked. Every
Python process of a rank starts with this module (data loader workers too), so it imports
nothing but the standard library until an exception has to be read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from types import TracebackType


def cuda_exit(failure: BaseException) -> tuple[int, str] | None:
    """(exit code, reason) when ``failure`` is a CUDA fault this process cannot go on from;
    None otherwise. A process that never imported torch has no CUDA to fail (and importing
    it now, dying, would only add a failure)."""
    if "torch" not in sys.modules:
        return None
    from goodput.shim.step_faults import classify, leave_cold  # torch is loaded: cheap now

    fault = classify(failure)
    if fault.kind == "recoverable":
        return None
    # leave_cold logs the reason as one line, as the shim's loop does
    return leave_cold(fault).exit_code, fault.reason


def classified_exit(
    kind: type[BaseException], value: BaseException, traceback: TracebackType | None
) -> None:
    """``sys.excepthook``: the usual traceback, then a CUDA fault's exit code.

    The process ends here with ``os._exit`` rather than through the interpreter's shutdown:
    that would end it with status 1, and its finalizers (atexit handlers, the collective
    group's destructors, non-daemon threads) would touch a context that fails every call, or
    wait on peers.
    """
    sys.__excepthook__(kind, value, traceback)
    try:
        verdict = cuda_exit(value) if launched_by_goodput() else None
    except Exception:  # a failing classification must not hide the failure
        verdict = None
    if verdict is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to flush
            stream.flush()
    logging.shutdown()
    os._exit(verdict[0])


def install() -> bool:
    """Hook this process; returns whether it did (a hook set before is left alone). Whether
    goodput launched it is asked when an exception comes (:func:`launched_by_goodput`)."""
    if sys.excepthook is not sys.__excepthook__:
        return False
    sys.excepthook = classified_exit
    return True


def launched_by_goodput(env: Mapping[str, str] | None = None) -> bool:
    """A rank or a standby (``GOODPUT_JOB`` set by its launcher, and inherited by what it
    starts); any other Python process that inherited the path keeps Python's exit."""
    from goodput.launch.rank_env import VARIABLES

    return bool((os.environ if env is None else env).get(VARIABLES["job"]))
