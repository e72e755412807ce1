"""A net under test teardown: processes a test leaves behind are killed, group and all.

Every process a test starts inherits ``GOODPUT_TEST_SESSION`` (this pytest run) and
``GOODPUT_TEST_ID`` (the test) through its environment, however far it is detached: the
services `goodput up` starts in sessions of their own, the ranks they launch, nats-server,
background chaos workers. When a test ends (passed, failed, or timed out: pytest-timeout's
signal method raises inside the test, so teardown runs), every process still carrying its id
has its process group killed; at the end of the session, every process carrying the session's
tag (module- and session-scoped fixtures). A test's own teardown (`goodput down`, ``stop()``)
runs first and stays the graceful path; a timed-out test whose stacks outlived it slowed every
test after it. What was killed is listed in the terminal summary, so a leaky test shows.

Registered by ``tests/conftest.py``; ``pytest -p tests.process_sweep`` loads it elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SESSION_VAR = "GOODPUT_TEST_SESSION"
TEST_VAR = "GOODPUT_TEST_ID"

_killed: list[str] = []


def tagged_pids(variable: str, value: str) -> list[int]:
    """Live processes started with ``variable=value`` in their environment (not this one or
    its ancestors: the environment a process was started with is what /proc shows)."""
    needle = f"{variable}={value}".encode()
    spared = {os.getpid(), *_ancestors()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or a zombie
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _ancestors() -> list[int]:
    pids, pid = [], os.getppid()
    while pid > 1:
        pids.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def kill_tagged(variable: str, value: str, owner: str) -> int:
    """SIGKILL the process group of every process tagged ``variable=value``; how many."""
    own_group = os.getpgrp()
    pids = tagged_pids(variable, value)
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            _killed.append(f"{owner}: pid {pid} {command.decode(errors='replace')[:120]}")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, signal.SIGCONT)  # a stopped group dies only once resumed
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    return len(pids)


def kill_process_group(process) -> None:
    """SIGKILL a process started with ``start_new_session=True`` and everything it started in
    its session (a child left running would outlive the test); reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def pytest_configure(config: pytest.Config) -> None:
    os.environ[SESSION_VAR] = uuid.uuid4().hex  # fresh: a pytest run inside a test is its own


@pytest.fixture(autouse=True)
def _sweep_processes_of_this_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tags what the test starts; kills what is left of it once its other fixtures are down.

    Autouse and function-scoped, so it is set up before the test's other function-scoped
    fixtures and torn down after them; wider-scoped fixtures are not tagged (see below).
    """
    test_id = uuid.uuid4().hex
    os.environ[TEST_VAR] = test_id
    try:
        yield
    finally:
        os.environ.pop(TEST_VAR, None)
        kill_tagged(TEST_VAR, test_id, request.node.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """A wider-scoped fixture outlives the test that first asked for it, even one set up from
    inside a test (``request.getfixturevalue``, a parametrized fixture): untagged by it."""
    test_id = os.environ.pop(TEST_VAR, None) if fixturedef.scope != "function" else None
    try:
        yield
    finally:
        if test_id is not None:
            os.environ[TEST_VAR] = test_id


def pytest_sessionfinish(session: pytest.Session) -> None:
    if session.config.pluginmanager.hasplugin("dsession"):
        return  # pytest-xdist's controller: its workers carry its tag and sweep their own
    kill_tagged(SESSION_VAR, os.environ[SESSION_VAR], "end of session")


def pytest_terminal_summary(terminalreporter) -> None:
    if _killed:
        terminalreporter.section("processes left running by tests (killed)")
        for line in _killed:
            terminalreporter.line(line)
