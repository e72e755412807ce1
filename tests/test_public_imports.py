"""The names users import keep working wherever the code behind them lives: the policy API
under ``goodput.policy`` (what a policy script imports), the shim under ``goodput.shim`` and
the integrations under ``goodput.integrations.*`` — the layout of ``libs/goodput`` may change,
these may not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import goodput.policy
import goodput.supervisor.policy
from goodput.supervisor.control.script_policy import ScriptPolicy


def test_the_policy_api_is_the_supervisors_own_under_its_public_name() -> None:
    assert goodput.policy.__all__ == goodput.supervisor.policy.__all__
    for name in goodput.supervisor.policy.__all__:
        assert getattr(goodput.policy, name) is getattr(goodput.supervisor.policy, name), name


def test_a_policy_script_written_against_the_public_name_loads(tmp_path: Path) -> None:
    script = tmp_path / "prefer_default.py"
    script.write_text(
        "from goodput.policy import JobState, Plan, default_policy\n"
        "def decide(signal, state: JobState) -> Plan:\n"
        "    return default_policy(signal, state)\n"
    )
    assert ScriptPolicy(script).load_error == ""


def test_the_shim_and_the_integrations_import_by_their_public_names() -> None:
    code = (
        "from goodput.shim import TrainerShim, run_job, WarmPathTimeouts, RestoreResult\n"
        "from goodput.integrations.loop import SupervisedLoop\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
