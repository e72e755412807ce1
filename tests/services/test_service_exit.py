"""A service process whose loop dies, or whose stop never finishes, exits non-zero with the
cause in its log."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.bus import BusSettings, EmbeddedNats
from goodput.config import ServiceConfig
from goodput_services.base import Service
from tests.processes import kill

HERE = Path(__file__).parent


def run_dying_service(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HERE / "dying_service.py"), "--nats-url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_a_service_whose_loop_dies_exits_non_zero(nats_server: EmbeddedNats) -> None:
    result = run_dying_service(nats_server.url)
    assert result.returncode == 1, result.stderr
    assert "the loop broke on purpose" in result.stderr
    assert "service failed" in result.stderr


def test_a_service_whose_loop_returns_unasked_exits_non_zero(nats_server: EmbeddedNats) -> None:
    result = run_dying_service(nats_server.url, "--returns")
    assert result.returncode == 1, result.stderr
    assert "returned before any stop request" in result.stderr


def test_a_service_that_crashes_in_native_code_leaves_its_stacks(nats_server: EmbeddedNats) -> None:
    # a fatal signal ends the process before any Python handler runs: without faulthandler
    # it vanished without a line (a replicator in a CI run, its peers only saw its port close)
    result = run_dying_service(nats_server.url, "--crashes")
    assert result.returncode == -signal.SIGSEGV, result.stderr
    assert "Fatal Python error: Segmentation fault" in result.stderr
    assert "in _crashes" in result.stderr


@pytest.mark.parametrize("how", ["awaiting", "--blocking"])
def test_a_service_whose_stop_hangs_exits_at_its_deadline_with_the_stacks(
    nats_server: EmbeddedNats, how: str
) -> None:
    args = [sys.executable, str(HERE / "stuck_service.py"), "--nats-url", nats_server.url]
    process = subprocess.Popen(
        [*args, *([how] if how.startswith("--") else [])],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    for line in process.stderr:  # the stop request must find the service running
        if "service started" in line:
            break
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=60)
    finally:
        kill(process)
    assert process.returncode == 1, err
    assert "did not stop within 1 s" in err
    # where it was stuck: the blocked thread's frames, or the pending tasks
    assert ("in on_stop" if how == "--blocking" else "Stack for <Task") in err


async def test_a_stop_that_finishes_disarms_its_deadline(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # armed by the process entry point; a clean stop must not leave it to fire later (it would
    # end a program that runs services inside it, such as this test run)
    config = ServiceConfig(state_dir=str(tmp_path), bus=BusSettings(url=nats_server.url))
    service = Service(config)
    service.exit_when_stop_hangs = True
    running = asyncio.create_task(service.run())
    while service.bus is None:
        await asyncio.sleep(0.05)
    service.request_stop()
    await asyncio.wait_for(running, timeout=30)
    assert service._stop_watchdog is not None and service._stop_watchdog.finished.is_set()
