"""The whole stack, a rank and `goodput status` on a shared bus that requires mutual TLS and a
creds file or an nkey seed (``secure_nats``: each test once per way of signing in).

`goodput status` runs as an operator elsewhere would: with another state directory, knowing
only the bus and the job, it shows every service from their records on the bus, and exits 1
once one of them (the actuator) is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.settings import ENV_VARS
from goodput.launch.exit_reason import REFUSED_EXIT_CODE
from goodput.tools.stack.keeper import kept_service
from goodput.tools.stack.record import read_stack
from tests.actuator.test_authenticated_bus import RANK_SCRIPT
from tests.conftest import goodput_cli, refused_in_one_line
from tests.secure_nats import SecureNats

JOB = "job-secure"
SERVICES = {"sensor", "controller", "actuator", "hostmon@node-0", "replicator@node-0"}
#: a killed service's record is stale after 3 of its 1 s periods; status sees it soon after
STALE_WITHIN_S = 30.0


@pytest.fixture
def secure_stack(secure_nats: SecureNats, tmp_path: Path) -> Iterator[Path]:
    """`goodput up` on the secure bus (its state directory)."""
    state = tmp_path / "stack"
    goodput_cli("up", "--state-dir", str(state), "--job", JOB, "--nodes", "1",
                *secure_nats.flags(), "--wait", "60", timeout=180)  # fmt: skip
    yield state
    goodput_cli("down", "--state-dir", str(state), check=False)


def _status(secure_nats: SecureNats, state: Path, *flags: str) -> tuple[int, dict]:
    """`goodput status --json` from a state directory that holds no stack."""
    result = goodput_cli("status", "--json", "--job", JOB, "--state-dir", str(state),
                         *(flags or secure_nats.flags()), check=False)  # fmt: skip
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"no JSON (exit {result.returncode}): {result.stderr}") from exc


def test_status_reads_a_stack_it_did_not_start_and_exits_1_when_a_service_dies(
    secure_nats: SecureNats, secure_stack: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "operator"
    code, document = _status(secure_nats, elsewhere)
    assert code == 0, document["services"]
    rows = document["services"]
    assert {row["name"] for row in rows} == SERVICES and len(rows) == len(SERVICES)
    assert all(row["healthy"] and row["state"] == "healthy" for row in rows), rows
    record = read_stack(secure_stack)
    assert record is not None
    actuator = next(process for process in record.services if process.name == "actuator")
    service = kept_service(actuator.process)
    assert service is not None
    assert next(row for row in rows if row["name"] == "actuator")["pid"] == service.pid
    # the keeper's process group, keeper and service at once (as a lost host takes them): a
    # service killed alone is started again by its keeper
    os.killpg(actuator.pid, signal.SIGKILL)
    deadline = time.monotonic() + STALE_WITHIN_S
    while True:
        code, document = _status(secure_nats, elsewhere)
        by_name = {row["name"]: row for row in document["services"]}
        if by_name["actuator"]["state"] == "stale" or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert code == 1 and by_name["actuator"]["state"] == "stale", by_name["actuator"]
    assert "stale health record" in by_name["actuator"]["detail"]
    assert all(row["healthy"] for name, row in by_name.items() if name != "actuator"), by_name


def test_status_with_a_credential_the_server_does_not_know_says_so_in_one_line(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    result = goodput_cli("status", "--once", "--job", JOB, "--state-dir", str(tmp_path),
                         *secure_nats.flags(secure_nats.stranger), check=False)  # fmt: skip
    refused_in_one_line(result, "refused", "Authorization Violation", code=1)


def test_up_with_a_credential_the_server_does_not_know_stops_in_one_line(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    state = tmp_path / "stack"
    result = goodput_cli("up", "--state-dir", str(state), "--job", JOB, "--wait", "10",
                         *secure_nats.flags(secure_nats.stranger), check=False)  # fmt: skip
    line = refused_in_one_line(result, code=1)
    assert line.startswith("goodput up: the NATS server"), line
    assert read_stack(state) is None  # refused before any service started


def test_a_service_with_a_credential_the_server_does_not_know_exits_with_one_line(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "goodput_services.sensor", "--job", JOB,
         "--state-dir", str(tmp_path), *secure_nats.flags(secure_nats.stranger)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # a credential the server refuses is refused configuration: its keeper would not restart it
    assert result.returncode == REFUSED_EXIT_CODE and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sensor: cannot use the bus:") and "refused" in last


def _rank(secure_nats: SecureNats, tmp_path: Path, credential: Path | None = None):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS.values()}
    env.update(secure_nats.env(credential), GOODPUT_JOB=JOB, GOODPUT_CKPT_DIR=str(tmp_path / "c"))
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )


async def test_a_rank_signs_in_with_the_goodput_nats_environment(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    bus = await Bus.connect(secure_nats.settings(), name="test")
    try:
        await bus.provision()  # the services' part: a rank publishes into existing streams
        result = await asyncio.to_thread(_rank, secure_nats, tmp_path)
        assert result.returncode == 0, result.stderr
        assert "bus connected: True" in result.stdout and "NOT supervised" not in result.stderr
        stored = await bus.js.get_last_msg(
            subjects.EVENTS_STREAM, subjects.event(JOB, schemas.kind_of(schemas.StepDone), 0)
        )
        step = schemas.decode_event(stored.data)
        assert isinstance(step, schemas.StepDone) and step.step == 2
    finally:
        await bus.close()


def test_a_rank_the_server_refuses_says_so_in_one_line_and_trains_on(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    result = _rank(secure_nats, tmp_path, secure_nats.stranger)
    assert result.returncode == 0, result.stderr
    assert "trained to step 2" in result.stdout and "bus connected: False" in result.stdout
    refusal = [line for line in result.stderr.splitlines() if "NOT supervised" in line]
    assert len(refusal) == 1 and "Authorization Violation" in refusal[0], result.stderr
