"""Every complete script in the README runs as shown: on its own, and under `goodput run`
killed (SIGKILL) after a checkpoint and resumed by the supervisor, ending bit-identical to the
uninterrupted run (parameters, optimizer state, RNG: every tensor of the final state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.extras import require
from tests.integrations.harness import assert_identical, run_killed_and_resumed, run_plain
from tests.integrations.readme import readme_scripts, write_script

pytestmark = pytest.mark.slow

#: README script -> the extra (module) it needs, None for torch only
SCRIPTS = {"loop": None, "shim": None, "lightning": "lightning", "hf": "transformers"}


def test_every_readme_script_is_run_here() -> None:
    assert set(readme_scripts()) == set(SCRIPTS)


#: (script, checkpoint interval) pairs run under a whole stack. An epoch is 5 steps: each
#: interval resumes mid-epoch (from step 9, 8 or 7). Every script at 4; the other intervals
#: only for the HF Trainer, whose position no faster harness covers (the plain loop's and
#: Lightning's run at 3, 4 and 7 in test_data_position.py and test_lightning.py)
RUNS = [(name, 4) for name in sorted(SCRIPTS)] + [("hf", 3), ("hf", 7)]


@pytest.mark.timeout(900)  # two runs of a script, one under a whole stack (more on a busy box)
@pytest.mark.parametrize(("name", "ckpt_every"), RUNS)
def test_readme_script_resumes_bit_identically_after_a_kill(
    name: str, ckpt_every: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hf script downloads nothing; CI has no hub
    if SCRIPTS[name] is not None:
        require(SCRIPTS[name])
    script = write_script(name, tmp_path / "script")
    reference = run_plain(script, tmp_path / "plain")
    resumed = run_killed_and_resumed(
        script, tmp_path / "supervised", kill_at_step=12, ckpt_every=ckpt_every
    )
    # attempt 1 started fresh and was killed; the supervisor restarted it (under load a slow
    # restart can be remediated once more) and each later attempt resumed from a checkpoint
    assert resumed.summary["restarts"] >= 1
    assert resumed.restored[0] == (1, 0)
    assert all(step >= ckpt_every for attempt, step in resumed.restored[1:]), resumed.restored
    assert resumed.final["step"] == reference["step"]
    if name == "lightning":
        # Lightning's loop-progress counters count a restart (its "ready" counters run ahead
        # of "completed" after a resume); they are bookkeeping, not training state
        for final in (resumed.final, reference):
            final["state"].pop("loops")
    if name == "hf":
        # train() logs a summary of its own call last (runtime, throughput, the mean loss of
        # the steps it ran): a report of that process, not training state
        for final in (resumed.final, reference):
            history = final["state"]["trainer_state"]["log_history"]
            assert "train_runtime" in history[-1], history
            history.pop()
    assert_identical(resumed.final["state"], reference["state"])


#: the README scripts whose loop is not the shim's: their ranks declare it in their step
#: reports, and the crash of one goes straight to the next rung (two nodes, no standby: cold)
TWO_RANK_CRASHES = [("loop", None), ("lightning", "lightning")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("name", "extra"), TWO_RANK_CRASHES)
def test_a_crash_in_a_two_rank_integration_job_goes_to_the_first_rung_it_supports(
    name: str, extra: str | None, tmp_path: Path
) -> None:
    """The plain loop's and Lightning's ranks declare that their loop is not the shim's
    (``StepDone``): the built-in policy restarts them cold at once, with no in-process restart
    sent and refused, and the job finishes. (Each rank trains alone on its half of the data,
    without a process group: only the recovery and its decisions are checked.)"""
    if extra is not None:
        require(extra)
    script = write_script(name, tmp_path / "script")
    resumed = run_killed_and_resumed(
        script, tmp_path / "supervised", kill_at_step=12, ckpt_every=4, nodes=2
    )
    decisions = resumed.summary["decisions"]
    rules = [d["rule"] for d in decisions if d["rule"] != "checkpoint-interval"]
    assert rules and rules[0] == "in-job-restart", decisions
    assert "in-process-restart" not in rules
    assert not [d for d in decisions if d.get("error")]
    # nothing the controller sent was refused or failed by the actuator
    assert resumed.summary["failed_actions"] == [], resumed.summary["failed_actions"]
    assert resumed.summary["restarts"] >= 1
    assert resumed.restored[0] == (1, 0) and resumed.restored[1][1] >= 4, resumed.restored
