"""Bad input at the operator's edge: one clear line, exit != 0, nothing left running.

Real `goodput` processes, a real nats-server and real service processes: a service that
refuses its options, a controller that refuses its policy script, a training command that
cannot start. After each, the process sweep finds nothing of the test still running.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from goodput import schemas
from goodput.bus.embedded import pid_alive
from goodput.tools.stack.record import read_stack
from goodput.tools.stack.watch import launch_failure
from tests.cli.test_edge_validation import goodput as quick_goodput
from tests.process_sweep import TEST_VAR, tagged_pids


def goodput(*args: str, **env: str):
    """`goodput` with room for a loaded machine: a stack starts in 5-20 s here."""
    return quick_goodput(*args, timeout=180, **env)


def clear_failure(result, *words: str) -> str:
    """The failure's stderr is at most three lines, the last one saying ``words``; no traceback,
    no process of this test left running."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 3, result.stderr
    for word in words:
        assert word in lines[-1], lines[-1]
    assert tagged_pids(TEST_VAR, os.environ[TEST_VAR]) == []
    return lines[-1]


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ('sensor:thresholds={heartbeat_timeout_s="soon"}', ("sensor", "heartbeat_timeout_s")),
        ("controller:settings={crash_loop={max_restarts=true}}", ("controller", "max_restarts")),
    ],
)
def test_up_stops_at_once_when_a_service_refuses_its_options(
    tmp_path: Path, flag: str, words: tuple[str, ...]
) -> None:
    state = tmp_path / "state"
    result = goodput("up", "--state-dir", str(state), "--wait", "60", "--service-set", flag)
    clear_failure(result, "exited", *words)
    assert read_stack(state) is None


def test_up_shows_a_wrong_type_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "goodput.toml"
    config.write_text("[services.sensor.thresholds]\nhang_min_timeout_s = 'ten'\n")
    result = goodput("up", "--state-dir", str(tmp_path / "s"), GOODPUT_CONFIG=str(config))
    clear_failure(result, "sensor", "hang_min_timeout_s")


@pytest.mark.parametrize(
    "source",
    ["def decide(signal, state)\n    return None\n", "def choose(signal, state):\n    pass\n"],
    ids=["syntax-error", "no-decide"],
)
def test_up_shows_the_controllers_refusal_of_a_policy_script(tmp_path: Path, source: str) -> None:
    policy = tmp_path / "broken_policy.py"
    policy.write_text(source)
    result = goodput(
        "up",
        "--state-dir",
        str(tmp_path / "s"),
        "--service-set",
        f'controller:policy="{policy}"',
    )
    clear_failure(result, "controller exited", "broken_policy.py")


def test_a_script_that_cannot_start_is_a_launch_failure_not_a_crash_loop(tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    result = goodput(
        "run", "--state-dir", str(tmp_path / "s"), "--nodes", "2", "--spares", "0",
        "--", "python", str(missing),
    )  # fmt: skip
    line = clear_failure(result, "launch failed", "exit code 2", "missing.py")
    assert "before the first step" in line


def test_a_missing_executable_is_one_line(tmp_path: Path) -> None:
    result = goodput(
        "run", "--state-dir", str(tmp_path / "s"), "--nodes", "1", "--spares", "0",
        "--", "no-such-executable-goodput",
    )  # fmt: skip
    clear_failure(result, "launch failed", "no-such-executable-goodput")


def test_down_stops_every_process_an_earlier_up_started(tmp_path: Path) -> None:
    """`run --nodes 1` against a 2-node stack keeps node-1's services in the record."""
    state = tmp_path / "s"
    up = goodput("up", "--state-dir", str(state), "--nodes", "2", "--wait", "60")
    assert up.returncode == 0, up.stderr
    before = read_stack(state)
    assert before is not None and len(before.services) == 7
    run = goodput(
        "run", "--state-dir", str(state), "--nodes", "1", "--spares", "0",
        "--", "python", "-c", "pass",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    after = read_stack(state)
    assert after is not None
    assert {s.key: s.pid for s in after.services} == {s.key: s.pid for s in before.services}
    assert after.nodes == ["node-0", "node-1"]
    assert goodput("down", "--state-dir", str(state)).returncode == 0
    assert not [s.key for s in before.services if pid_alive(s.pid)]
    assert tagged_pids(TEST_VAR, os.environ[TEST_VAR]) == []


def _exit(rank: int, code: int | None, attempt: int = 1, expected: str = "") -> schemas.RankExited:
    return schemas.RankExited(
        job="j", node=f"node-{rank}", rank=rank, pid=10 + rank, exit_code=code,
        attempt=attempt, expected_reason=expected,
    )  # fmt: skip


def test_launch_failure_needs_every_rank_of_the_first_attempt_with_one_code() -> None:
    assert launch_failure([_exit(0, 2)], attempt=1, world_size=2) == ""
    assert "exit code 2" in launch_failure([_exit(0, 2), _exit(1, 2)], attempt=1, world_size=2)
    assert launch_failure([_exit(0, 2), _exit(1, 1)], attempt=1, world_size=2) == ""
    assert launch_failure([_exit(0, 0), _exit(1, 0)], attempt=1, world_size=2) == ""
    assert launch_failure([_exit(0, None), _exit(1, None)], attempt=1, world_size=2) == ""
    assert launch_failure([_exit(0, 2), _exit(1, 2, expected="stop")], 1, 2) == ""
    assert launch_failure([_exit(0, 2, attempt=1), _exit(1, 2, attempt=2)], 1, 2)  # restarted
    assert launch_failure([_exit(0, 2, attempt=1), _exit(1, 2, attempt=1)], 2, 2) == ""
    assert launch_failure([_exit(0, 2)], attempt=0, world_size=0) == ""
