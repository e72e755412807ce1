"""The Prometheus endpoint: a real rank and a real service scraped with a plain HTTP GET; a
port in use is one log line and the process keeps working."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from goodput import schemas
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.prometheus_endpoint import (
    DEFAULT_PORT,
    METRICS_PORT_ENV,
    PORT_ENV,
    SERVICE_PORT_OFFSETS,
    EndpointSettingsError,
    endpoint_port,
)
from tests.examples.launch import free_port
from tests.processes import kill, stop
from tests.telemetry.prometheus_rank import CKPT_EVERY, STEPS

REPO = Path(__file__).resolve().parents[2]
JOB = "metrics-job"
#: starts a rank of the tiny loop (local rank, environment) and returns once it trained
StartRank = Callable[[int, dict[str, str]], subprocess.Popen[str]]


def prometheus_env(**extra: str) -> dict[str, str]:
    """This environment with the Prometheus exporter on the loopback, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key != METRICS_PORT_ENV}
    return {
        **env,
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def scrape(port: int, process: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """The text of ``/metrics``, retried while the process starts its endpoint."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                return reply.read().decode()
        except (urllib.error.URLError, ConnectionError):
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample of metric ``name`` in a Prometheus text page."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            found.append((head[len(name) :], float(value)))
    return found


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[StartRank]:
    """Starts the tiny rank with a local rank and an environment; returns once it trained."""
    started: list[subprocess.Popen[str]] = []

    def start(local_rank: int, env: dict[str, str]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.telemetry.prometheus_rank",
                str(tmp_path),
                str(local_rank),
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "trained", process.communicate(timeout=30)[1][-3000:]
        return process

    yield start
    kill(*started)


def test_a_rank_serves_its_step_rate_and_checkpoint_stall_on_base_port_plus_local_rank(
    rank: StartRank,
) -> None:
    base = free_port() - 1  # the rank of local rank 1 serves on base + 1: a port seen free
    process = rank(1, prometheus_env(**{PORT_ENV: str(base)}))
    text = scrape(base + 1, process)
    ((labels, steps),) = samples(text, "goodput_train_steps_total")
    assert steps == STEPS
    assert 'goodput_job="metrics-job"' in labels and 'goodput_rank="0"' in labels
    ((_, step_count),) = samples(text, "goodput_train_step_time_seconds_count")
    ((_, step_sum),) = samples(text, "goodput_train_step_time_seconds_sum")
    assert step_count == STEPS and 0 < step_sum < 60
    ((_, saves),) = samples(text, "goodput_checkpoint_stall_seconds_count")
    ((_, stall),) = samples(text, "goodput_checkpoint_stall_seconds_sum")
    assert saves == STEPS // CKPT_EVERY and 0 <= stall < 60
    _, err = process.communicate("", timeout=60)
    assert process.returncode == 0, err[-3000:]


def test_a_rank_whose_port_is_taken_logs_one_line_and_trains_on(rank: StartRank) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = rank(0, prometheus_env(**{METRICS_PORT_ENV: str(port)}))
        _, err = process.communicate("", timeout=60)
    assert process.returncode == 0, err[-3000:]
    lines = [line for line in err.splitlines() if "Prometheus" in line]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], err[-3000:]
    assert "Traceback" not in err


def values_of(found: list[tuple[str, float]], *labels: str) -> list[float]:
    """The values of the samples carrying every one of ``labels`` (``name="value"``)."""
    return [value for text, value in found if all(label in text for label in labels)]


def wait_for_sample(
    port: int, process: subprocess.Popen[str], name: str, labels: tuple[str, ...], want: float
) -> list[tuple[str, float]]:
    """The samples of ``name`` once the one carrying ``labels`` is ``want`` (the samples as
    they are after 60 s otherwise)."""
    deadline = time.monotonic() + 60
    while True:
        found = samples(scrape(port, process), name)
        if values_of(found, *labels) == [want]:
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.2)


async def publish_run(url: str) -> None:
    """Two ranks step to 5 (rank 1 a step behind); rank 1 then dies: a crash signal."""
    bus = await Bus.connect(BusSettings(url=url), name="test")
    try:
        await bus.provision()
        common = {"job": JOB, "node": "n0", "world_size": 2}
        for rank in (0, 1):
            await bus.emit(
                schemas.RankStarted(**common, rank=rank, local_rank=rank, pid=100 + rank, attempt=1)
            )
        for step in range(1, 6):
            for rank in (0, 1):
                await bus.emit(
                    schemas.StepDone(
                        **common, rank=rank, step=step - rank, step_time_s=0.1, tokens=1, loss=1.0
                    )
                )
        await bus.emit(
            schemas.RankExited(job=JOB, node="n0", rank=1, pid=101, exit_code=1, attempt=1)
        )
    finally:
        await bus.close()


def test_the_sensor_serves_the_job_step_rate_and_its_signals_on_its_own_port(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    port = free_port()
    argv = ["--nats-url", nats_server.url, "--job", JOB, "--state-dir", str(tmp_path)]
    process = subprocess.Popen(
        [sys.executable, "-m", "goodput_services.sensor", *argv],
        cwd=REPO,
        env=prometheus_env(**{METRICS_PORT_ENV: str(port)}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = scrape(port, process)
        ((_, resident),) = samples(text, "process_resident_memory_bytes")
        assert resident > 1 << 20
        asyncio.run(publish_run(nats_server.url))
        # counted from the first step seen (1) to the newest (5); rank 1's older steps add none
        job = f'goodput_job="{JOB}"'
        steps = wait_for_sample(port, process, "goodput_job_steps_total", (job,), 4)
        assert [value for _, value in steps] == [4], steps
        crash = (job, 'goodput_signal="crash"')
        signals = wait_for_sample(port, process, "goodput_sensor_signals_total", crash, 1)
        assert values_of(signals, *crash) == [1], signals
        text = scrape(port, process)
        assert any(
            'service_name="goodput-sensor"' in labels for labels, _ in samples(text, "target_info")
        )
    finally:
        stop(process, timeout_s=90)


def test_ports_are_the_base_plus_each_process_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(METRICS_PORT_ENV, raising=False)
    monkeypatch.delenv(PORT_ENV, raising=False)
    assert endpoint_port(3) == DEFAULT_PORT + 3
    monkeypatch.setenv(PORT_ENV, "10000")
    ports = [endpoint_port(local_rank) for local_rank in range(8)]
    ports += [endpoint_port(offset) for offset in SERVICE_PORT_OFFSETS.values()]
    assert len(set(ports)) == len(ports) and min(ports) == 10000
    monkeypatch.setenv(METRICS_PORT_ENV, "9999")
    assert endpoint_port(5) == 9999
    monkeypatch.setenv(METRICS_PORT_ENV, "http")
    with pytest.raises(EndpointSettingsError, match="GOODPUT_METRICS_PORT='http'"):
        endpoint_port(0)
    monkeypatch.delenv(METRICS_PORT_ENV)
    monkeypatch.setenv(PORT_ENV, "65535")
    with pytest.raises(EndpointSettingsError, match="past 65535"):
        endpoint_port(1)
