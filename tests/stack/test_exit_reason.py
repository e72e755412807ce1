"""A service that ends on its own leaves one line saying why, where `goodput up` reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from goodput.bus import EmbeddedNats
from goodput.launch.exit_reason import EXIT_REASON_ENV, last_line, read_exit_reason

DYING_SERVICE = Path(__file__).parents[1] / "services" / "dying_service.py"


def test_a_dying_loop_leaves_its_reason_in_the_file_and_as_the_last_line(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    reason_file = tmp_path / "dying.exit"
    result = subprocess.run(
        [sys.executable, str(DYING_SERVICE), "--nats-url", nats_server.url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1", EXIT_REASON_ENV: str(reason_file)},
    )
    assert result.returncode == 1, result.stderr
    reason = reason_file.read_text().strip()
    assert "failed: service loop" in reason and "the loop broke on purpose" in reason
    assert result.stderr.strip().splitlines()[-1] == reason


def test_without_a_reason_file_the_log_s_last_line_is_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "sensor.log"
    log.write_text('{"level": "info", "msg": "service started"}\n{"level": "error", "msg": "x"}\n')
    assert read_exit_reason(tmp_path / "none.exit", log) == "x"
    log.write_text("invalid sensor option: Expected `float`\n\n")
    assert last_line(log) == "invalid sensor option: Expected `float`"
    assert read_exit_reason(tmp_path / "none.exit", tmp_path / "no.log") == ""
