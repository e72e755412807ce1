"""Ranks reach an authenticated, TLS-protected bus with the actuator's own settings.

A real nats-server requires a user and password over TLS (a throwaway CA made with openssl);
the actuator service, in this process, runs the local backend, which launches a real rank
under the trainer shim. Its heartbeats and step events must reach the bus. A rank that cannot
use the bus (refused as insecure, or rejected by the server) logs why and trains on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.embedded import free_port, nats_server_binary
from goodput.bus.settings import ENV_VARS
from goodput.config import ServiceConfig
from goodput_services.actuator.service import ActuatorService
from tests.conftest import goodput_cli
from tests.processes import stop
from tests.secure_nats import make_certificates
from tests.stack.helpers import EventTap
from tests.telemetry.helpers import running

JOB = "job-auth"
USER, PASSWORD = "trainer", "s3cret-pw"

# A rank under the real shim: it waits for the bus, reports two steps and finishes.
RANK_SCRIPT = """\
import sys, time
import torch
from goodput.shim import TrainerShim
from goodput.shim.link import wait_for_bus

shim = TrainerShim.from_env()
print("bus connected:", wait_for_bus(shim.link, 30), flush=True)
state = {"w": torch.zeros(4)}
for step in (1, 2):
    state["w"] += 1
    shim.step_done(step, 0.01, tokens=8, loss=1.0)
    time.sleep(0.3)  # a few heartbeats
shim.finish(state, 2)
print("trained to step 2", flush=True)
sys.exit(shim.exit_code)
"""


@pytest.fixture
def secure_bus(tmp_path: Path) -> Iterator[BusSettings]:
    """A nats-server with JetStream that requires TLS and a user/password; the settings to use."""
    tls = make_certificates(tmp_path / "tls")
    ca, cert, key = tls.ca, tls.server_cert, tls.server_key
    port = free_port()
    config = tmp_path / "auth.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'tls {{ cert_file: "{cert}", key_file: "{key}" }}\n'
        f'authorization {{ user: "{USER}", password: "{PASSWORD}" }}\n'
    )
    log = open(tmp_path / "nats-server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen([nats_server_binary(), "-c", str(config)], stderr=log)
    try:
        yield BusSettings(
            url=f"tls://127.0.0.1:{port}", user=USER, password=PASSWORD, tls_ca_file=str(ca)
        )
    finally:
        stop(server)
        log.close()


@pytest.fixture
def clean_bus_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of this process's own GOODPUT_NATS_* leaks into the ranks."""
    for name in ENV_VARS.values():
        monkeypatch.delenv(name, raising=False)


async def test_a_rank_reaches_an_authenticated_tls_bus_with_the_actuators_settings(
    tmp_path: Path, secure_bus: BusSettings, clean_bus_environment: None
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    state = tmp_path / "state"
    bus = await Bus.connect(secure_bus, name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    beats: list[schemas.Heartbeat] = []

    async def on_beat(msg) -> None:
        beat = schemas.decode_event(msg.data)
        assert isinstance(beat, schemas.Heartbeat)
        beats.append(beat)

    subscription = await bus.nc.subscribe(subjects.heartbeats_of(JOB), cb=on_beat)
    actuator = ActuatorService(
        ServiceConfig(
            job=JOB, state_dir=str(state), bus=secure_bus, options={"restore_timeout_s": 0}
        )
    )
    try:
        async with running(actuator):
            start = schemas.StartJob(
                job=JOB,
                argv=[sys.executable, str(script)],
                nodes=1,
                procs_per_node=1,
                env={"GOODPUT_HEARTBEAT_PERIOD_S": "0.1"},
            )
            await bus.send_command(subjects.ACTUATOR, start)
            await tap.wait_for(
                lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished",
                timeout_s=120,
                what="the rank finishing",
            )
            steps = await tap.wait_for(
                lambda e: isinstance(e, schemas.StepDone) and e.step == 2, timeout_s=30
            )
            assert (steps.node, steps.rank) == ("node-0", 0)
    finally:
        await subscription.unsubscribe()
        await tap.stop()
        await bus.close()
    assert [b.rank for b in beats] and {b.rank for b in beats} == {0}
    log = (state / "logs" / "ranks" / "attempt-001" / "node-0-rank0.log").read_text()
    assert "bus connected: True" in log and "NOT supervised" not in log


def _run_rank(tmp_path: Path, **bus_env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS.values()}
    env.update(bus_env, GOODPUT_CKPT_DIR=str(tmp_path / "ckpt"))
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_rank_refused_an_unauthenticated_remote_bus_logs_it_and_trains_on(
    tmp_path: Path,
) -> None:
    result = _run_rank(tmp_path, GOODPUT_NATS_URL="nats://10.255.255.1:4222")
    assert result.returncode == 0, result.stderr
    assert "trained to step 2" in result.stdout and "bus connected: False" in result.stdout
    assert "rank 0 is NOT supervised" in result.stderr
    assert "without authentication" in result.stderr


def test_a_rank_the_server_rejects_logs_it_and_trains_on(
    tmp_path: Path, secure_bus: BusSettings
) -> None:
    result = _run_rank(
        tmp_path,
        GOODPUT_NATS_URL=secure_bus.url,
        GOODPUT_NATS_TLS_CA=secure_bus.tls_ca_file,
        GOODPUT_NATS_USER=USER,
        GOODPUT_NATS_PASSWORD="wrong",
    )
    assert result.returncode == 0, result.stderr
    assert "trained to step 2" in result.stdout and "bus connected: False" in result.stdout
    assert "rank 0 is NOT supervised" in result.stderr
    assert f"user {USER!r}" in result.stderr and "wrong" not in result.stderr


def test_goodput_up_hands_a_password_to_the_services_outside_their_command_lines(
    tmp_path: Path, secure_bus: BusSettings, clean_bus_environment: None
) -> None:
    """`goodput up --nats-password` on an authenticated bus: every service connects (healthy),
    and the password is in no process's command line."""
    state = str(tmp_path / "stack")
    bus = [
        *("--nats-url", secure_bus.url, "--nats-user", USER),
        *("--nats-password", PASSWORD, "--nats-tls-ca", secure_bus.tls_ca_file),
    ]
    try:
        goodput_cli("up", "--state-dir", state, "--job", JOB, "--nodes", "1", *bus, "--wait", "30")
        status = json.loads(goodput_cli("status", "--state-dir", state, "--json", *bus).stdout)
        assert status["services"] and all(s["healthy"] for s in status["services"]), status
        for service in status["services"]:
            assert PASSWORD not in " ".join(psutil.Process(service["pid"]).cmdline())
    finally:
        goodput_cli("down", "--state-dir", state, check=False)
