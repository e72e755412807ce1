"""The keeper under `goodput up`: a crashed service starts again, a refusal or a stop does not.

Real keeper processes running small real commands (no bus needed: the keeper only watches its
child's exit status), and the state directory's lock.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodput.launch.exit_reason import REFUSED_EXIT_CODE
from goodput.launch.restart_backoff import restart_delay
from goodput.owned_process import ProcessIdentity, is_running, spawned
from goodput.tools.stack.keeper import keeper_command, kept_service
from goodput.tools.stack.lock import StackBusy, stack_lock
from tests.processes import kill

#: a service that crashes on its first two runs, then runs until stopped (runs counted in a file)
CRASHES_TWICE = """
import pathlib, sys, time
runs = pathlib.Path(sys.argv[1])
count = int(runs.read_text() or 0) + 1 if runs.exists() else 1
runs.write_text(str(count))
if count <= 2:
    sys.exit(1)
time.sleep(300)
"""


def start_keeper(*command: str) -> tuple[subprocess.Popen, ProcessIdentity]:
    process = subprocess.Popen(keeper_command("svc", list(command)), stderr=subprocess.PIPE)
    return process, spawned(process)


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_crashed_service_is_started_again_and_a_stopped_keeper_stops_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    keeper, identity = start_keeper(sys.executable, "-c", CRASHES_TWICE, str(runs))
    try:
        # two crashes: restarted after 1 s, then 2 s
        wait_for(lambda: runs.exists() and runs.read_text() == "3")
        wait_for(lambda: kept_service(identity) is not None)
        service = kept_service(identity)
        assert service is not None and is_running(service)
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=30) == 0
        wait_for(lambda: not is_running(service), timeout_s=10)
        assert runs.read_text() == "3", "a stopped service is not started again"
        log = keeper.stderr.read().decode()  # type: ignore[union-attr]
        assert "svc exited (exit status 1)" in log and "restart 2 in a row" in log
    finally:
        kill(keeper)


@pytest.mark.parametrize("code", [REFUSED_EXIT_CODE, 2, 0])
def test_a_refusal_or_a_clean_exit_is_not_restarted(code: int) -> None:
    keeper, _ = start_keeper(sys.executable, "-c", f"import sys; sys.exit({code})")
    assert keeper.wait(timeout=30) == code
    assert b"keeper:" not in keeper.stderr.read()  # type: ignore[union-attr]


def test_a_killed_keeper_takes_its_service_with_it(tmp_path: Path) -> None:
    keeper, identity = start_keeper(sys.executable, "-c", "import time; time.sleep(300)")
    try:
        wait_for(lambda: kept_service(identity) is not None)
        service = kept_service(identity)
        assert service is not None
        kill(keeper)
        wait_for(lambda: not is_running(service), timeout_s=10)
    finally:
        kill(keeper)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert [restart_delay(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert restart_delay(10_000) == 30


def test_a_second_holder_of_the_state_directory_waits_then_gives_up_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holds = (
        "import sys, time; from pathlib import Path; from goodput.tools.stack.lock import "
        "stack_lock\nwith stack_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n"
        "    time.sleep(300)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holds, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StackBusy) as busy, stack_lock(tmp_path, wait_s=0.3):
            pass
        assert "still in use by" in str(busy.value.code)
        assert f"(pid {holder.pid}): waiting up to 0 s" in capsys.readouterr().err
    finally:
        kill(holder)
    with stack_lock(tmp_path, wait_s=5), stack_lock(tmp_path, wait_s=0):  # freed; reentrant
        pass
