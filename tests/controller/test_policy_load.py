"""A policy script that cannot load: the controller refuses it at start with one line naming
the file and the problem, and exits non-zero promptly (a loop or ``sys.exit`` at import too)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from goodput.supervisor.control.engine import Controller, ControllerSettings
from goodput.supervisor.control.script_policy import ScriptPolicy
from tests.conftest import refused_in_one_line

from .helpers import at, job, signal

#: a script body → the words its one-line refusal must contain
UNLOADABLE = {
    "syntax error": ("def decide(signal, state)\n    return []\n", "SyntaxError at line 1"),
    "no decide": ("def choose(signal, state):\n    return []\n", "defines no function decide"),
    "loop at import": ("while True:\n    pass\n", "did not finish within 1 s"),
    "sys.exit at import": ("import sys\nsys.exit(3)\n", "it called sys.exit(3) at line 2"),
    "KeyboardInterrupt at import": ("raise KeyboardInterrupt\n", "KeyboardInterrupt at line 1"),
    "BaseException at import": (
        "class Odd(BaseException):\n    pass\n\nraise Odd('odd\\nlines')\n",
        "Odd at line 4: odd lines",
    ),
    "missing file": (None, "no such file"),
}


#: in this process, a script's endless import loop sleeps: Python cannot stop the thread it
#: runs in, and a busy one would hold a share of the GIL for the rest of the test worker's
#: life (a later CPU-bound test on the same worker ran 100x slower and timed out). The
#: controller process's test below keeps the busy loop: that process ends.
IN_PROCESS = {
    **UNLOADABLE,
    "loop at import": (
        "import time\nwhile True:\n    time.sleep(1)\n",
        "did not finish within 1 s",
    ),
}


def _script(tmp_path: Path, body: str | None) -> Path:
    path = tmp_path / "policy.py"
    if body is not None:
        path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize("case", sorted(IN_PROCESS))
def test_an_unloadable_script_is_one_line_and_the_builtin_decides(
    tmp_path: Path, case: str
) -> None:
    body, words = IN_PROCESS[case]
    path = _script(tmp_path, body)
    started = time.monotonic()
    script = ScriptPolicy(path, load_timeout_s=1.0)
    assert time.monotonic() - started < 5
    assert script.load_error.startswith(f"policy script {path} failed to load: ")
    assert words in script.load_error and "\n" not in script.load_error
    controller = Controller(str(path), ControllerSettings(policy_load_timeout_s=1.0))
    outcome = controller.handle(job(spares=1), signal("crash", "n1"), at(1))
    assert words in outcome.decision.error
    assert outcome.decision.policy == "builtin (fallback from policy)"


def test_a_script_whose_import_takes_a_moment_loads_and_decides(tmp_path: Path) -> None:
    path = _script(
        tmp_path, "import time\ntime.sleep(0.3)\n\ndef decide(signal, state):\n    return []\n"
    )
    controller = Controller(str(path), ControllerSettings(policy_load_timeout_s=5.0))
    assert controller.script is not None and controller.script.load_error == ""
    outcome = controller.handle(job(), signal("crash", "n1"), at(1))
    assert outcome.decision.rule == "script" and outcome.decision.error == ""


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_the_controller_process_refuses_the_script_with_one_line(tmp_path: Path, case: str) -> None:
    """The real service process: exit ≠ 0 within seconds, one line on stderr, no traceback."""
    body, words = UNLOADABLE[case]
    path = _script(tmp_path, body)
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goodput_services.controller",
            "--job",
            "j1",
            "--state-dir",
            str(tmp_path / "state"),
            "--set",
            f'policy="{path}"',
            "--set",
            "settings={policy_load_timeout_s=1}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    elapsed = time.monotonic() - started
    line = refused_in_one_line(result, words)
    assert line.startswith(f"policy script {path} failed to load: "), line
    # the interpreter's start and goodput's imports dominate; a hang would reach the timeout
    assert elapsed < 60, elapsed
