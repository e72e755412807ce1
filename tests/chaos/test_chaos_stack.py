"""End to end: the chaos CLI against a real `goodput up` stack."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodput.bus.embedded import read_record
from goodput.owned_process import is_running
from goodput.state_dir import StateDir
from goodput.tools.stack.keeper import kept_service
from goodput.tools.stack.record import read_stack
from tests.conftest import goodput_cli
from tests.stack.conftest import stack_status


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Path]:
    """A running `goodput up` stack (embedded NATS + every service process); torn down after."""
    state_dir = tmp_path / "stack"
    goodput_cli("up", "--state-dir", str(state_dir), "--job", "job-a", "--wait", "30")
    yield state_dir
    goodput_cli("down", "--state-dir", str(state_dir), check=False)


def wait_healthy(state_dir: Path, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = stack_status(state_dir)
        if all(s["healthy"] for s in status["services"]) or time.monotonic() > deadline:
            return status
        time.sleep(1)


@pytest.mark.slow
def test_kill_service_and_restart_nats_on_a_real_stack(stack: Path):
    keeper = next(s for s in read_stack(stack).services if s.name == "sensor").process
    sensor = kept_service(keeper)
    assert sensor is not None
    result = goodput_cli("chaos", "kill-service", "sensor", "--state-dir", str(stack), "--json")
    assert json.loads(result.stdout)["ok"]
    deadline = time.monotonic() + 10
    while is_running(sensor) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_running(sensor)
    # its keeper starts it again
    status = wait_healthy(stack)
    assert all(s["healthy"] for s in status["services"]), status
    restarted = kept_service(keeper)
    assert restarted is not None and restarted.pid != sensor.pid

    before = read_record(StateDir(stack))
    assert before is not None
    result = goodput_cli("chaos", "restart-nats", "--down-s", "1", "--state-dir", str(stack))
    assert "restarted" in result.stdout
    after = read_record(StateDir(stack))
    assert after is not None and after.servers[0].port == before.servers[0].port
    assert after.servers[0].pid != before.servers[0].pid
    # every service reconnects to the restarted server and reports healthy again
    status = wait_healthy(stack)
    assert all(s["healthy"] for s in status["services"]), status

    # the stack's host monitor runs without fault injection: the fault is refused, with why
    refused = goodput_cli(
        "chaos", "gpu-xid", "--node", "node-0", "--state-dir", str(stack), check=False
    )
    assert refused.returncode == 1 and "fault injection disabled" in refused.stdout
