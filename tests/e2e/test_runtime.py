"""The whole loop with real services, real rank processes and the example job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import goodput_cli

pytestmark = pytest.mark.slow

STEPS = "60"


def _demo(scenario: str, tmp_path: Path, *extra: str) -> dict:
    result = goodput_cli(
        "demo",
        "--scenario",
        scenario,
        "--steps",
        STEPS,
        "--json",
        "--state-dir",
        str(tmp_path / scenario),
        *extra,
        timeout=600,
    )
    return json.loads(result.stdout)


def test_killed_twice_ends_bit_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    reference = _demo("none", tmp_path)
    interrupted = _demo("kill-twice", tmp_path)
    assert reference["state"] == interrupted["state"] == "finished"
    assert reference["restarts"] == 0 and interrupted["restarts"] == 2
    assert interrupted["world_size_history"] == [2, 2, 2]
    assert [d["rule"] for d in interrupted["decisions"] if d["rule"] != "checkpoint-interval"] == [
        "in-job-restart",
        "hot-swap",
    ]
    assert interrupted["final_params_sha256"] == reference["final_params_sha256"]
    assert interrupted["steps"] == int(STEPS)


def test_a_script_that_crashes_at_start_up_is_not_restarted_forever(tmp_path: Path) -> None:
    result = goodput_cli(
        "run",
        "--nodes",
        "1",
        "--spares",
        "0",
        "--json",
        "--timeout",
        "240",
        "--state-dir",
        str(tmp_path / "stack"),
        "--service-set",
        "controller:settings={crash_loop={window_s=60.0,max_restarts=2,backoff_s=0.5,max_backoffs=1}}",
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
        check=False,
        timeout=300,
    )
    summary = json.loads(result.stdout)
    assert result.returncode != 0
    assert summary["state"] == "stopped"
    last = summary["decisions"][-1]
    # the node keeps failing: either the crash-loop guard or the repeat-offender rule gives up
    assert last["rule"] in ("crash-loop-give-up", "repeat-offender"), last
    assert "stop" in last["reason"]
    assert summary["restarts"] <= 4
