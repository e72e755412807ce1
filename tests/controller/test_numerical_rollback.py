"""The numerical rungs of the built-in policy, through the controller as the service uses it."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.supervisor.control.engine import Controller

from .helpers import at, job, signal


def handle(state, sig, seconds: float = 1.0):
    outcome = Controller().handle(state, sig, at(seconds))
    assert outcome.decision is not None
    return outcome


@pytest.mark.parametrize("kind", ["nonfinite", "loss_spike", "replica_mismatch"])
def test_a_numerical_fault_rolls_back_before_its_first_step(kind: str) -> None:
    node = "n1" if kind == "replica_mismatch" else ""
    outcome = handle(job(spares=1), signal(kind, node, first_bad_step=41))
    assert outcome.decision.rule == "numerical-rollback"
    (command,) = outcome.commands
    assert isinstance(command, schemas.Restart) and command.restore_before_step == 41
    assert (
        "before step 41" in outcome.decision.reason and f"{kind} (test)" in outcome.decision.reason
    )
    assert outcome.state.active == job(spares=1).active  # nobody replaced on a first fault


@pytest.mark.parametrize("kind", ["nonfinite", "loss_spike", "replica_mismatch"])
def test_only_a_loss_spikes_rollback_skips_the_batches_it_was_seen_in(kind: str) -> None:
    """A poisoned batch would spike again; a diverging step or a flipped bit is no batch's."""
    node = "n1" if kind == "replica_mismatch" else ""
    sig = signal(kind, node, first_bad_step=41, last_bad_step=45)
    (command,) = handle(job(spares=1), sig).commands
    assert isinstance(command, schemas.Restart) and command.restore_before_step == 41
    if kind == "loss_spike":
        assert command.skip_steps == schemas.StepWindow(41, 45)
        assert "skip the batches of steps 41-45" in handle(job(spares=1), sig).decision.reason
    else:
        assert command.skip_steps is None
    # a window the signal does not give (a sensor of schema 14) skips nothing
    old = signal("loss_spike", "", first_bad_step=41)
    assert handle(job(spares=1), old).commands[0].skip_steps is None


def test_a_replica_that_disagrees_again_is_quarantined_and_rolled_back() -> None:
    sig = signal("replica_mismatch", "n3", "uncorrectable", first_bad_step=101)
    swapped = handle(job(spares=1), sig)
    assert swapped.decision.rule == "numerical-quarantine"
    (swap,) = swapped.commands
    assert isinstance(swap, schemas.HotSwap) and swap.failed_node == "n3"
    assert swap.restore_before_step == 101
    dropped = handle(job(), sig)  # no spare: the job is scaled down without it
    (scale,) = dropped.commands
    assert isinstance(scale, schemas.ScaleTo) and "n3" in scale.drop_nodes
    assert scale.restore_before_step == 101 and dropped.decision.rule == "numerical-quarantine"


def test_a_fault_that_recurs_after_each_rollback_backs_off() -> None:
    """A deterministic NaN (a batch that always diverges) comes back after every rollback: the
    crash-loop rules count the rollbacks as restarts and back off the fourth."""
    controller = Controller()
    state, rules = job(), []
    for t in (20.0, 40.0, 60.0, 80.0):
        outcome = controller.handle(state, signal("nonfinite", first_bad_step=41), at(t))
        state = outcome.state
        rules.append(outcome.decision.rule)
    assert rules == ["numerical-rollback"] * 3 + ["crash-loop-backoff"]
