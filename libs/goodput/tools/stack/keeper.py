"""A service of `goodput up` restarted when it crashes: its keeper process.

On Kubernetes the Deployment restarts a service that died; on a bare host nothing would, and a
controller that crashed (a policy calling ``os._exit``, an OOM kill) left the job unsupervised
until someone ran `up` again. So `up` starts each service under a keeper,
``python -m goodput.tools.stack.keeper --name KEY -- COMMAND…``, which the stack's record
holds: the keeper runs the service and, when it exits, starts it again after a capped
backoff (1, 2, 4 … 30 s; back to 1 s once a run lasted a minute:
:mod:`goodput.launch.restart_backoff`), except when

- the service refused its configuration (``REFUSED_EXIT_CODE``) or its flags (argparse's 2):
  it would refuse again; the keeper exits with that status and `up` reports the reason;
- the service exited 0: it was stopped on purpose (SIGTERM);
- the keeper itself was told to stop (`goodput down` sends it SIGTERM): it passes SIGTERM to
  the service, waits for it and exits 0.

The service is the keeper's child in the keeper's process group; on Linux it also gets SIGTERM
if the keeper dies (``PR_SET_PDEATHSIG``), so a killed keeper leaves no service behind for a
later `up` to duplicate.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

import psutil

from goodput.launch.exit_reason import EXIT_REASON_ENV, REFUSED_EXIT_CODE
from goodput.launch.restart_backoff import restart_delay, restarts_in_a_row
from goodput.owned_process import ProcessIdentity, identify, is_running

#: exit statuses after which the service is not started again (see the module docstring)
FINAL_CODES = frozenset({0, 2, REFUSED_EXIT_CODE})
#: the module run as the keeper (how a keeper is recognised on a command line)
KEEPER_MODULE = "goodput.tools.stack.keeper"
_PR_SET_PDEATHSIG = 1


def keeper_command(key: str, command: list[str]) -> list[str]:
    """The command line that runs ``command`` under a keeper (``key`` names it in its log)."""
    return [sys.executable, "-m", KEEPER_MODULE, "--name", key, "--", *command]


def kept_service(keeper: ProcessIdentity) -> ProcessIdentity | None:
    """The service a keeper runs now: its child running the command on the keeper's own
    command line, if the keeper is still the recorded process (None between restarts, while
    the child is still execing, or when the keeper is gone)."""
    if not is_running(keeper) or "--" not in keeper.cmdline:
        return None
    command = keeper.cmdline[keeper.cmdline.index("--") + 1 :]
    try:
        children = [identify(child.pid) for child in psutil.Process(keeper.pid).children()]
    except psutil.Error:
        return None
    return next((child for child in children if child.cmdline == command), None)


class Keeper:
    """Runs one service until told to stop, restarting it after an unexpected exit."""

    def __init__(self, name: str, command: list[str]):
        self.name = name
        self.command = command
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def stop(self, signum: int, _frame: FrameType | None) -> None:
        """SIGTERM/SIGINT handler: stop the service and, once it is gone, the keeper."""
        self.stopping = True
        if self.child is not None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        restarts = 0
        while not self.stopping:
            reason_file = os.environ.get(EXIT_REASON_ENV)
            if reason_file:  # an earlier run's reason is not this one's
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(reason_file)
            started = time.monotonic()
            self.child = subprocess.Popen(self.command, preexec_fn=_die_with_keeper)
            if self.stopping:  # a stop that came while the service was being started
                self.child.send_signal(signal.SIGTERM)
            code = self.child.wait()
            ran_s = time.monotonic() - started
            if self.stopping:
                return 0
            if code in FINAL_CODES:
                return code
            restarts = restarts_in_a_row(restarts, ran_s)
            delay = restart_delay(restarts)
            restarts += 1
            print(
                f"keeper: {self.name} exited ({_exit_status(code)}) after {ran_s:.1f} s; "
                f"starting it again in {delay:.0f} s (restart {restarts} in a row)",
                file=sys.stderr,
                flush=True,
            )
            self._sleep(delay)
        return 0

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.1)


def _exit_status(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _die_with_keeper() -> None:
    """In the service before it execs: SIGTERM when the keeper dies (Linux only)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="goodput-keeper", description=__doc__)
    parser.add_argument("--name", required=True, help="the service's key, for the log")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the service's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the service's command after --")
    keeper = Keeper(args.name, command)
    signal.signal(signal.SIGTERM, keeper.stop)
    signal.signal(signal.SIGINT, keeper.stop)
    return keeper.run()


if __name__ == "__main__":
    sys.exit(main())
