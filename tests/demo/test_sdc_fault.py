"""The demo's SDC: where the full scenario places it, what it says, and the fingerprint period
each setup's job is given (goodput's finds it; the baseline's never comes, as a job without
goodput compares no replicas)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from goodput.shim.config import ShimConfig
from goodput.state_dir import StateDir
from goodput.tools.demo.scenarios import FINGERPRINT_EVERY, NUMERICS_EVERY, SCENARIOS
from goodput.tools.demo.session import RunPlan, Setup, fingerprint_every, start_command

FULL = SCENARIOS["full"]


def test_the_full_scenario_flips_a_bit_between_the_hang_and_the_straggler() -> None:
    assert [(f.action, f.rank) for f in FULL.faults] == [
        ("kill-rank", 1),
        ("hang-rank", 0),
        ("sdc", 0),
        ("slow-rank", 1),
        ("fail-node", 0),
        ("fail-node", 1),
    ]
    ats = [f.at for f in FULL.faults]
    assert ats == sorted(ats) and len(set(ats)) == len(ats)
    assert FULL.comparable  # the baseline meets it too


@pytest.mark.parametrize("steps", [80, 400, 800])
def test_the_sdc_has_an_agreed_fingerprint_behind_it_and_is_found_before_the_straggler(
    steps: int,
) -> None:
    """After the hang's restart the job passes a fingerprint before the SDC (a checkpoint known
    clean to roll back to), and the first fingerprint after it, a step late (the flip lands at
    the next step boundary), comes before the straggler is due."""
    hang, sdc, straggler = (math.ceil(f.at * steps) for f in FULL.faults[1:4])
    agreed = sdc // FINGERPRINT_EVERY * FINGERPRINT_EVERY
    found = (sdc + 1 + FINGERPRINT_EVERY - 1) // FINGERPRINT_EVERY * FINGERPRINT_EVERY
    assert hang < agreed <= sdc < found, (hang, agreed, sdc, found)
    assert found < straggler or steps < 400, (found, straggler)


def test_the_sdc_says_what_it_flips_and_what_two_replicas_cannot_tell() -> None:
    sdc = next(f for f in FULL.faults if f.action == "sdc")
    assert sdc.describe() == (
        "at 28% of the steps, silent data corruption: one bit of one parameter flipped in the "
        "replica on rank 0's node (goodput finds it at the replicas' next fingerprint and rolls "
        "back to the newest checkpoint known clean, both replicas where 2 hold no majority to "
        "tell the bad one; a job without goodput trains on with it)"
    )
    for name in ("full", "sdc"):
        description = SCENARIOS[name].description
        assert "SDC" in description and "both roll back" in description, description
        assert "cannot tell" in description, description


@pytest.mark.parametrize(
    ("setup", "steps"), [("goodput", 800), ("baseline", 800), ("baseline", 45)]
)
def test_only_goodputs_job_compares_its_replicas(
    setup: Setup, steps: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = RunPlan(setup, "full", FULL, steps, 2, 2, 20, 60.0, "demo")
    for name, value in start_command(plan, "demo", StateDir(tmp_path)).env.items():
        monkeypatch.setenv(name, value)
    config = ShimConfig.from_env()  # what the job's shim reads: a period it refuses fails here
    assert config.numerics_every == NUMERICS_EVERY
    assert config.fingerprint_every == fingerprint_every(plan)
    if setup == "goodput":
        assert config.fingerprint_every == FINGERPRINT_EVERY
    else:  # its first fingerprint would come after its last step
        assert steps < config.fingerprint_every <= steps + NUMERICS_EVERY
