"""Shared fixtures: a real, embedded nats-server with JetStream per test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.state_dir import StateDir

# processes a test leaves running are killed with their process groups when it ends
pytest_plugins = ["tests.process_sweep", "tests.secure_nats"]

# Property tests draw the same examples on every run: the suite gates every landing, and a
# failing draw must not depend on the seed of the day (a clean-clone run once drew an ETTR
# above 1 that 300 draws a run had missed for weeks). `GOODPUT_HYPOTHESIS=explore` draws
# new random examples, 20x as many, to look for more. No deadline: the suite shares two cores.
settings.register_profile("gate", derandomize=True, max_examples=300, deadline=None)
settings.register_profile("explore", derandomize=False, max_examples=6000, deadline=None)
settings.load_profile(os.environ.get("GOODPUT_HYPOTHESIS", "gate"))

#: a slow test's time limit unless it sets its own: it starts stacks and torch processes,
#: which take ten times longer on two cores loaded ~20 deep than on a quiet machine (the
#: suite-wide 300 s in pyproject.toml is the limit of the fast ones)
SLOW_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
    # the longest run first, then the files with slow tests, the quick files last: started
    # late, a long one would keep a worker busy for minutes after the other had run out of
    # tests. `just test` passes --no-loadscope-reorder, or xdist would hand out the files with
    # the most tests first instead (a stable sort keeps every other order)
    items.sort(
        key=lambda item: (
            item.get_closest_marker("longest") is None,
            item.get_closest_marker("slow") is None,
        )
    )


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(StateDir(tmp_path / "nats"))
    server.paths.root.mkdir(parents=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def bus(nats_server: EmbeddedNats) -> AsyncIterator[Bus]:
    connection = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await connection.provision()
    yield connection
    await connection.close()


@contextlib.contextmanager
def tmpfs_mount(mountpoint: Path, size: str = "4m") -> Iterator[Path]:
    """A small real filesystem to fill (root can mount one); skips the test where refused."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def goodput_cli(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess:
    """Run the real `goodput` command line in a subprocess."""
    result = subprocess.run(
        [sys.executable, "-m", "goodput.tools.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"goodput {' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def refused_in_one_line(
    result: subprocess.CompletedProcess, *words: str, code: int | None = None
) -> str:
    """Assert a command was refused as users are promised: a failing exit status (``code``
    where named), one line on stderr holding every one of ``words``, no traceback; the line."""
    if code is None:
        assert result.returncode != 0, result.stdout + result.stderr
    else:
        assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
