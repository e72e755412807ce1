"""The simulator knows silent data corruption: found at the next fingerprint step, rolled back
by the built-in policy to a checkpoint before it, and the job runs on."""

from __future__ import annotations

import msgspec
import pytest

from goodput.tools.simulate.fleet import Fault
from goodput.tools.simulate.profile import load_preset, load_profile
from goodput.tools.simulate.run import with_job
from goodput.tools.simulate.strategies import pick
from goodput.tools.simulate.world import World


def run(trace: list[Fault], strategy: str = "goodput"):
    preset = with_job(load_preset("case-study"), hours=2.0, spares=1)
    job = msgspec.structs.replace(preset.job, fingerprint_every_steps=50)
    (chosen,) = pick([strategy])
    return World(job, load_profile(preset.profile), chosen, trace).run()


def test_an_sdc_is_rolled_back_and_the_job_runs_on() -> None:
    """The flip strikes about step 405 (4 s steps after a 180 s start); the fingerprints
    agreed at step 400 and disagree at 450: the rollback restores the newest checkpoint at or
    before 400, throwing away the steps after it (fewer than the 50 of the fingerprint period
    plus one checkpoint interval, about 66 steps), and the job trains to its horizon."""
    clean = run([])
    hit = run([Fault(1800.0, "node-1", "sdc")])
    assert hit.rules.get("numerical-rollback") == 1 and hit.interruptions == 1
    step_s = clean.seconds["productive"] / clean.steps
    # the steps thrown away and the restore are the rollback's own category (GOODPUT.md)
    rolled_back = hit.badput["numerical_rollback"]
    assert 50 * step_s <= rolled_back <= (50 + 70) * step_s
    assert hit.badput["wasted_progress"] == hit.badput["checkpoint_restore"] == 0
    assert clean.badput["numerical_rollback"] == clean.badput["wasted_progress"] == 0
    # the steps it lost are those thrown away and the relaunch's, nothing more
    lost = rolled_back + hit.badput["restart_reprovision"]
    lost += hit.badput["program_startup"] - clean.badput["program_startup"]
    assert (clean.steps - hit.steps) * step_s == pytest.approx(lost, abs=4 * step_s)


def test_an_sdc_on_a_spare_costs_nothing() -> None:
    assert run([Fault(1800.0, "node-128", "sdc")]).rules.get("numerical-rollback") is None
