"""Bad operator input fails at start-up with one line on stderr, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.config import default_state_dir
from tests.conftest import refused_in_one_line


def goodput(
    *args: str, cwd: Path | None = None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "goodput.tools.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--nodes", "0", ("--nodes", "at least 1")),
        ("--procs-per-node", "0", ("--procs-per-node", "at least 1")),
        ("--spares", "-1", ("--spares", "at least 0")),
        ("--nodes-per-dp", "0", ("--nodes-per-dp", "at least 1")),
        ("--job", "my.job", ("--job", "invalid job name 'my.job'")),
    ],
)
def test_run_refuses_bad_flags(tmp_path: Path, flag: str, value: str, words: tuple) -> None:
    state = tmp_path / "state"
    result = goodput("run", "--state-dir", str(state), flag, value, "--", "python", "-c", "0")
    refused_in_one_line(result, *words)
    assert not state.exists()  # nothing was started


def test_up_refuses_an_invalid_job_name(tmp_path: Path) -> None:
    state = tmp_path / "state"
    refused_in_one_line(
        goodput("up", "--state-dir", str(state), "--job", "a b"), "invalid job name"
    )
    # 0 nodes is the central services only (node agents run the rest): below it is refused
    refused_in_one_line(
        goodput("up", "--state-dir", str(state), "--nodes", "-1"), "--nodes", "at least 0"
    )
    assert not state.exists()


@pytest.mark.parametrize("command", ["up", "run"])
def test_a_missing_policy_script_is_refused_before_anything_starts(
    tmp_path: Path, command: str
) -> None:
    state = tmp_path / "state"
    missing = tmp_path / "nope.py"
    result = goodput(
        command,
        "--state-dir",
        str(state),
        "--service-set",
        f'controller:policy="{missing}"',
        *(["--", "python", "-c", "0"] if command == "run" else []),
    )
    refused_in_one_line(result, f"policy script {missing} not found")
    assert not state.exists()


def test_the_default_state_dir_is_per_user_not_per_folder(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    env = {"XDG_STATE_HOME": str(xdg), "GOODPUT_STATE_DIR": ""}
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        result = goodput("down", cwd=folder, **env)
        assert result.returncode == 0, result.stderr
        assert f"stack state: {xdg / 'goodput'}" in result.stderr
    assert not (tmp_path / "a" / ".goodput").exists()


def test_goodput_state_dir_overrides_the_default(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GOODPUT_STATE_DIR", str(tmp_path / "mine"))
    assert default_state_dir() == tmp_path / "mine"
    monkeypatch.setenv("GOODPUT_STATE_DIR", "")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "goodput"
