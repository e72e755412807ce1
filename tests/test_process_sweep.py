"""Processes started by a failing or timed-out test do not outlive it (tests/process_sweep.py).

An inner pytest run (its own session) has a fixture that starts a detached process group as
`goodput up` does (a new session whose leader starts a child) and cleans up as a careless
fixture would: it kills the leader only, so the child lives on. One test fails, one times out.
A module-scoped fixture's process, also one set up from inside a test, must survive from one
test to the next, and be killed at the end of the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

INNER = """\
import subprocess, sys, time
import pytest

SCRIPT = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \\
    "'import time; time.sleep(300)']); time.sleep(300)"

@pytest.fixture
def detached_group(request):
    leader = subprocess.Popen([sys.executable, "-c", SCRIPT], start_new_session=True)
    with open("pids.txt", "a") as out:
        out.write(f"{leader.pid}\\n")
    time.sleep(0.5)  # the leader starts its child
    yield leader
    leader.kill()  # the leader only: its child is left running
    leader.wait()

@pytest.fixture(scope="module")
def shared():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                               start_new_session=True)
    with open("shared.txt", "a") as out:
        out.write(f"{process.pid}\\n")
    return process  # no teardown at all

@pytest.fixture(scope="module")
def lazy():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                               start_new_session=True)
    with open("shared.txt", "a") as out:
        out.write(f"{process.pid}\\n")
    return process

def test_uses_shared(shared, request):
    assert shared.poll() is None
    assert request.getfixturevalue("lazy").poll() is None  # set up from inside the test

def test_fails(detached_group):
    assert False, "a failing test"

@pytest.mark.timeout(2)
def test_times_out(detached_group):
    time.sleep(60)

def test_shared_outlives_the_test_that_started_it(shared, lazy):
    assert shared.poll() is None and lazy.poll() is None
"""


SWEEP = ["-p", "tests.process_sweep"]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_failing_or_timed_out_tests_processes_are_killed_with_their_group(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SWEEP, "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "2 failed, 2 passed" in result.stdout, result.stdout[-3000:]
    groups = [int(line) for line in (tmp_path / "pids.txt").read_text().split()]
    groups += [int(line) for line in (tmp_path / "shared.txt").read_text().split()]
    assert len(groups) == 4
    deadline = time.monotonic() + 5
    while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [g for g in groups if _group_alive(g)]
    for group in alive:  # not left behind by this test either
        os.killpg(group, 9)
    assert not alive, f"process groups {alive} outlived their tests"
    assert "processes left running by tests (killed)" in result.stdout
