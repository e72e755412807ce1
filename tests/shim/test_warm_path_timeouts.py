"""The warm path's timeouts are refused at start-up when out of order, in one line."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from goodput import schemas
from goodput.warm_path import WARM_PATH, WarmPathError, WarmPathTimeouts


def test_the_defaults_are_in_order_and_the_command_uses_them() -> None:
    assert WARM_PATH.abort_s < WARM_PATH.rejoin_deadline_s < WARM_PATH.group_s
    command = schemas.RestartInProcess(job="j")
    assert command.deadline_s == WARM_PATH.rejoin_deadline_s


@pytest.mark.parametrize(
    "options",
    [
        {"abort_s": 30.0},  # the abort would outlast the actuator's deadline
        {"group_s": 20.0},  # survivors would fail before the actuator brought a rank back
        {"abort_s": 0.0},
        {"rejoin_wait_s": 0.0},
    ],
)
def test_an_order_that_cannot_work_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(WarmPathError, match=r"must be positive|out of order"):
        WarmPathTimeouts(**options)
    # decoded from configuration, the same check; unknown fields refused too
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(options), type=WarmPathTimeouts)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"group_timeout_s": 10}', type=WarmPathTimeouts)


def test_the_example_refuses_a_group_timeout_under_the_rejoin_deadline() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "goodput.examples.gpt.supervised", "--dist-timeout-s", "20"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("--dist-timeout-s: warm-path timeouts out of order")
    assert "Traceback" not in result.stderr
