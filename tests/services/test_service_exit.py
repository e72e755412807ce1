"""A service process whose loop dies exits non-zero with the cause in its log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from goodput.bus import EmbeddedNats

HERE = Path(__file__).parent


def test_a_service_whose_loop_dies_exits_non_zero(nats_server: EmbeddedNats) -> None:
    result = subprocess.run(
        [sys.executable, str(HERE / "dying_service.py"), "--nats-url", nats_server.url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 1, result.stderr
    assert "the loop broke on purpose" in result.stderr
    assert "service failed" in result.stderr
