"""A service process whose loop dies exits non-zero with the cause in its log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from goodput.bus import EmbeddedNats

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
