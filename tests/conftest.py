"""Shared fixtures: a real, embedded nats-server with JetStream per test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from goodput.bus import Bus, BusSettings, EmbeddedNats


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats")
    server.state_dir.mkdir(parents=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def bus(nats_server: EmbeddedNats) -> AsyncIterator[Bus]:
    connection = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await connection.provision()
    yield connection
    await connection.close()


def goodput_cli(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess:
    """Run the real `goodput` command line in a subprocess."""
    result = subprocess.run(
        [sys.executable, "-m", "goodput.cli.main", *args],
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
