"""The GPU-reset rung of the built-in policy, through the controller's pure engine."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.gpu_faults import reset_targets
from goodput.supervisor.control.engine import Controller

from .helpers import JOB, at, job, signal


def gpu_fault(node: str, *faults: str, gpus: list[schemas.GpuHealth] | None = None):
    return signal("degraded_host", node, "uncorrectable", host_faults=list(faults), gpus=gpus or [])


def xid_gpu(index: int, *xids: int) -> schemas.GpuHealth:
    return schemas.GpuHealth(index=index, uuid=f"GPU-{index}", xid_errors=list(xids))


@pytest.mark.parametrize(
    ("faults", "gpus", "targets"),
    [
        (["gpu_xid:48"], [xid_gpu(3, 48)], [3]),
        (["gpu_xid:119", "gpu_xid:140"], [xid_gpu(0, 119), xid_gpu(5, 140)], [0, 5]),
        # a row remapping pending (63) waits for the next reset: it asks for none itself
        (["gpu_xid:119", "gpu_xid:63"], [xid_gpu(0, 119), xid_gpu(5, 63)], [0]),
        (["ecc_uncorrected"], [schemas.GpuHealth(index=2, uuid="g", ecc_uncorrected=4)], [2]),
        (["gpu_xid:95"], [], []),  # injected: no GPU record, reset them all
        (["gpu_xid:79"], [xid_gpu(1, 79)], None),  # off the bus: reboot, not reset
        (["gpu_xid:48", "disk_full"], [xid_gpu(1, 48)], None),  # not only the GPU
        (["gpu_lost"], [schemas.GpuHealth(index=1, uuid="g", present=False)], None),
        (["thermal"], [], None),
        ([], [], None),
    ],
)
def test_which_faults_a_reset_corrects(faults, gpus, targets) -> None:
    assert reset_targets(faults, gpus) == targets


def test_a_reset_correctable_xid_restarts_with_the_gpu_reset() -> None:
    outcome = Controller().handle(
        job(spares=1), gpu_fault("n3", "gpu_xid:48", gpus=[xid_gpu(2, 48)]), at(1)
    )
    assert outcome.decision is not None and outcome.decision.rule == "gpu-reset"
    (restart,) = outcome.commands
    assert isinstance(restart, schemas.Restart) and restart.reset_gpus == {"n3": [2]}
    assert "reset GPU(s) 2 of n3" in outcome.decision.reason
    assert outcome.state.role_of("n3") == "active" and outcome.state.spares == ["s0"]


def test_a_failed_reset_goes_to_the_next_rung_hot_swap_then_scale_down() -> None:
    controller = Controller()
    for spares, rule in ((1, "hot-swap"), (0, "scale-down")):
        first = controller.handle(job(spares=spares), gpu_fault("n3", "gpu_xid:95"), at(1))
        (restart,) = first.commands
        assert restart.reset_gpus == {"n3": []}
        failed = schemas.ActionResult(
            job=JOB,
            command_id=restart.command_id,
            action="restart",
            ok=False,
            detail="GPU reset of n3 timed_out after 60.0 s",
        )
        again = controller.settle(first.state, failed, at(70))
        assert again.decision is not None and again.decision.rule == rule
        assert "GPU reset failed: GPU reset of n3 timed_out" in again.decision.reason
        assert again.state.node("n3").gpu_reset_failed
        # the same node faulting again is not reset a second time before it returns
        later = controller.handle(again.state, gpu_fault("n4", "gpu_xid:48"), at(80))
        assert later.decision.rule == "gpu-reset"


def test_a_node_that_returns_may_be_reset_again_and_its_return_needs_nothing() -> None:
    controller = Controller()
    first = controller.handle(job(), gpu_fault("n1", "ecc_uncorrected"), at(1))
    (restart,) = first.commands
    done = schemas.ActionResult(job=JOB, command_id=restart.command_id, action="restart", ok=True)
    state = controller.settle(first.state, done, at(5)).state
    back = controller.handle(state, signal("node_returned", "n1", "info"), at(6))
    assert back.decision.rule == "node-healthy" and back.commands == []
    assert controller.handle(back.state, gpu_fault("n1", "gpu_xid:48"), at(600)).decision.rule == (
        "gpu-reset"
    )


def test_a_repeat_offender_is_replaced_not_reset() -> None:
    controller = Controller()
    state = job(spares=1)
    for i in range(2):  # the GPU fault is its third failure
        state = controller.handle(state, signal("crash", "n2"), at(1000 * (i + 1))).state
    outcome = controller.handle(state, gpu_fault("n2", "gpu_xid:48"), at(5000))
    assert outcome.decision.rule == "hot-swap"


def test_a_policy_cannot_reset_gpus_of_a_node_outside_the_job() -> None:
    from goodput.policy import PolicyError, validate

    state = job(spares=1)
    with pytest.raises(PolicyError, match="not in the job: s0"):
        validate([schemas.Restart(job=JOB, reset_gpus={"s0": [0]})], state, default_rule="x")
