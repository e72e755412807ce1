"""Why a service process ended on its own: one line, written by the service, read by `up`.

A service that cannot start (options refused, a policy script the controller will not load)
or whose loop died exits non-zero. The operator must see *why* without opening a log: the
service writes the reason as its last line on stderr (its log; on Kubernetes the pod's last
log line, which ``terminationMessagePolicy: FallbackToLogsOnError`` makes the termination
message) and, when :data:`EXIT_REASON_ENV` names a file, into that file. The launcher names
one file per service process and reads it back when the process is found gone.

A service that refused its configuration exits with :data:`REFUSED_EXIT_CODE`, not 1: the
keeper that restarts a crashed service under `goodput up` (``tools/stack/keeper.py``) must not
restart one that will refuse again.

`goodput run` ends with one of :data:`RUN_EXIT_CODES`, which a batch system acts on: the Slurm
recipe (``deploy/slurm/goodput.sbatch``) requeues the job on :data:`RUN_CANNOT_CONTINUE_EXIT_CODE`
only, so a job that failed for good is not run again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

#: environment variable naming the file a service writes its exit reason to
EXIT_REASON_ENV = "GOODPUT_EXIT_REASON_FILE"
#: exit status of a service that refused its configuration (options, config file, policy
#: script): sysexits' EX_CONFIG; starting it again changes nothing
REFUSED_EXIT_CODE = 78
#: `goodput run`: the job finished
RUN_FINISHED_EXIT_CODE = 0
#: `goodput run`: the job failed for good, and another try would fail the same (its command
#: cannot start, the controller gave up a crash loop, the actuator refused it, a person stopped
#: it, ``--timeout`` passed)
RUN_FAILED_EXIT_CODE = 1
#: `goodput run`: its arguments are refused (argparse's own status)
RUN_USAGE_EXIT_CODE = 2
#: `goodput run`: goodput cannot continue the job on the nodes it has (the policy stopped it for
#: want of healthy nodes): sysexits' EX_TEMPFAIL; a new allocation resumes from its checkpoints
RUN_CANNOT_CONTINUE_EXIT_CODE = 75
#: every status `goodput run` exits with, and what it means to a batch system
RUN_EXIT_CODES: dict[int, str] = {
    RUN_FINISHED_EXIT_CODE: "finished",
    RUN_FAILED_EXIT_CODE: "failed for good: do not requeue",
    RUN_USAGE_EXIT_CODE: "arguments refused: do not requeue",
    RUN_CANNOT_CONTINUE_EXIT_CODE: "cannot continue on these nodes: requeue",
}
#: a reason longer than this is cut (it is shown as one line of a terminal)
MAX_REASON_CHARS = 400


def one_line(text: str) -> str:
    """``text`` folded onto one line and cut to :data:`MAX_REASON_CHARS`."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_REASON_CHARS else flat[: MAX_REASON_CHARS - 1] + "…"


def report_exit(reason: str) -> None:
    """Called by the exiting service: the reason on stderr and in the named file, if any."""
    line = one_line(reason)
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get(EXIT_REASON_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(line + "\n")


def read_exit_reason(reason_file: Path, log_file: Path) -> str:
    """The reason a service left: its reason file, else its log's last line (the ``msg`` of a
    JSON log line); "" if neither says anything."""
    with contextlib.suppress(OSError):
        text = reason_file.read_text().strip()
        if text:
            return one_line(text)
    return last_line(log_file)


def last_line(log_file: Path) -> str:
    """The last non-empty line of ``log_file`` (the ``msg`` of a JSON log line), one line;
    "" if there is none."""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - 16384, 0))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line]
    except OSError:
        return ""
    if not lines:
        return ""
    last = lines[-1]
    with contextlib.suppress(ValueError, AttributeError):
        entry = json.loads(last)
        last = entry.get("msg", last) if isinstance(entry, dict) else last
    return one_line(str(last))
