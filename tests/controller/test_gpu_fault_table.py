"""The GPU fault table (``goodput.gpu_faults``) and the built-in policy's GPU rules that read it."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.gpu_faults import (
    XIDS,
    fault_verdict,
    gpu_verdict,
    node_remedy,
    xid_verdict,
    xids_with,
)
from goodput.supervisor.control.engine import Controller

from .helpers import at, job, signal

#: the XIDs the table covers, with the action of NVIDIA's "Resolution Bucket (Immediate
#: Action)" in the Xid catalogue (Ampere and newer; docs.nvidia.com/deploy/xid-errors/
#: analyzing-xid-catalog.html): IGNORE -> none, RESTART_APP -> restart, RESET_GPU -> reset_gpu,
#: RESTART_BM -> replace_node; a WORKFLOW_ bucket by its first step (48, 74: reset; 45 beside
#: another XID: ignore)
CATALOGUE = {
    13: "restart",  # ROBUST_CHANNEL_GR_EXCEPTION: RESTART_APP
    31: "restart",  # ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT: RESTART_APP
    32: "restart",  # ROBUST_CHANNEL_PBDMA_ERROR: RESTART_APP
    38: "none",  # ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT: IGNORE
    43: "none",  # ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR: IGNORE
    45: "none",  # ROBUST_CHANNEL_PREEMPTIVE_REMOVAL: WORKFLOW_XID_45
    46: "reset_gpu",  # ROBUST_CHANNEL_GPU_TIMEOUT_ERROR: RESET_GPU
    48: "reset_gpu",  # ROBUST_CHANNEL_GPU_ECC_DBE: WORKFLOW_XID_48
    61: "reset_gpu",  # PMU_BREAKPOINT: unused on Ampere and newer
    62: "reset_gpu",  # PMU_HALT_ERROR: RESET_GPU
    63: "none",  # INFOROM_DRAM_RETIREMENT_EVENT: IGNORE
    64: "reset_gpu",  # INFOROM_DRAM_RETIREMENT_FAILURE: RESET_GPU
    68: "restart",  # ROBUST_CHANNEL_NVDEC0_ERROR: RESTART_APP
    69: "restart",  # ROBUST_CHANNEL_GR_CLASS_ERROR: RESTART_APP
    74: "reset_gpu",  # NVLINK_ERROR: WORKFLOW_NVLINK_ERR
    79: "replace_node",  # ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: RESTART_BM
    92: "none",  # EXCESSIVE_SBE_INTERRUPTS: IGNORE
    94: "restart",  # ROBUST_CHANNEL_CONTAINED_ERROR: RESTART_APP
    95: "reset_gpu",  # ROBUST_CHANNEL_UNCONTAINED_ERROR: RESET_GPU
    109: "reset_gpu",  # ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR: RESET_GPU
    119: "reset_gpu",  # GSP_RPC_TIMEOUT: RESET_GPU
    120: "reset_gpu",  # GSP_ERROR: RESET_GPU
    140: "reset_gpu",  # UNRECOVERABLE_ECC_ERROR_ESCAPE: RESET_GPU
}


def gpu(index: int, *xids: int, recovery: str = "", **fields) -> schemas.GpuHealth:
    return schemas.GpuHealth(
        index=index, uuid=f"GPU-{index}", xid_errors=list(xids), recovery_action=recovery, **fields
    )


def host_fault(node: str, *faults: str, gpus: list[schemas.GpuHealth] | None = None):
    return signal("degraded_host", node, "uncorrectable", host_faults=list(faults), gpus=gpus or [])


def test_every_catalogued_xid_has_its_action_and_a_reason() -> None:
    assert set(CATALOGUE) == set(XIDS)
    for xid, action in CATALOGUE.items():
        verdict = xid_verdict(xid)
        assert verdict.action == action, xid
        assert verdict.reason.startswith(f"XID {xid}: ") and len(verdict.reason) > 12
    assert xid_verdict(4242).action == "reset_gpu"
    assert "not in the fault table" in xid_verdict(4242).reason
    assert xids_with("replace_node") == [79]


def test_fault_names_ecc_thermal_and_what_is_not_the_gpus() -> None:
    assert fault_verdict("ecc_uncorrected").action == "reset_gpu"
    assert fault_verdict("gpu_lost").action == "replace_node"
    assert fault_verdict("thermal").action == "none"
    assert fault_verdict("gpu_xid:94").action == "restart"  # contained ECC
    assert fault_verdict("gpu_xid:95").action == "reset_gpu"  # uncontained ECC
    assert fault_verdict("disk_full") is None and fault_verdict("gpu_xid:x") is None


@pytest.mark.parametrize(
    ("record", "action"),
    [
        (gpu(0, 13), "restart"),
        (gpu(0, 13, recovery="none"), "restart"),
        # the driver knows the GPU's state: an application XID on a GPU it wants rebooted
        (gpu(0, 13, recovery="node_reboot"), "replace_node"),
        (gpu(0, 48, recovery="none"), "restart"),  # the driver says the GPU needs nothing
        (gpu(0, 48, recovery="drain_and_reset"), "reset_gpu"),
        (gpu(0, recovery="gpu_reset"), "reset_gpu"),  # no XID seen, the driver asks anyway
        (gpu(0, 48, recovery="forged-name"), "reset_gpu"),  # unknown: the table decides
        (gpu(0, 45), "none"),
        (gpu(0, ecc_uncorrected=2), "reset_gpu"),
        (gpu(0, 13, present=False), "replace_node"),
    ],
)
def test_a_gpus_verdict_prefers_the_drivers_recovery_action(record, action) -> None:
    assert gpu_verdict(record).action == action


def test_a_nodes_remedy_is_its_worst_fault_with_the_gpus_to_reset() -> None:
    remedy = node_remedy(["gpu_xid:13", "gpu_xid:48"], [gpu(0, 13), gpu(3, 48)])
    assert remedy is not None and (remedy.action, remedy.gpus) == ("reset_gpu", [3])
    assert "XID 48" in remedy.reason
    # a name without a record (injected) resets every GPU
    assert node_remedy(["gpu_xid:95"], []).gpus == []  # type: ignore[union-attr]
    # a record's driver action overrides the name's table verdict
    assert node_remedy(["gpu_xid:48"], [gpu(1, 48, recovery="none")]).action == "restart"  # type: ignore[union-attr]
    assert node_remedy(["thermal"], []).action == "none"  # type: ignore[union-attr]
    assert node_remedy(["gpu_xid:13", "disk_full"], [gpu(0, 13)]) is None
    assert node_remedy([], []) is None


def test_an_application_xid_restarts_the_job_and_keeps_the_node() -> None:
    for xid in xids_with("restart"):
        outcome = Controller().handle(
            job(spares=1), host_fault("n3", f"gpu_xid:{xid}", gpus=[gpu(2, xid)]), at(1)
        )
        assert outcome.decision is not None and outcome.decision.rule == "gpu-app-fault", xid
        (restart,) = outcome.commands
        assert isinstance(restart, schemas.Restart) and not restart.reset_gpus
        assert f"XID {xid}" in outcome.decision.reason and "n3 kept" in outcome.decision.reason
        assert outcome.state.role_of("n3") == "active" and outcome.state.spares == ["s0"]


def test_a_job_wide_illegal_memory_access_evicts_no_node() -> None:
    controller, state = Controller(), job(active=6, spares=0)
    for i, node in enumerate(state.active):
        outcome = controller.handle(
            state, host_fault(node, "gpu_xid:31", gpus=[gpu(0, 31)]), at(1 + i)
        )
        state = outcome.state
        # restarts, until the crash-loop guard backs off: never a node dropped
        assert outcome.decision is not None
        assert outcome.decision.rule in ("gpu-app-fault", "crash-loop-backoff")
        assert all(isinstance(c, schemas.Restart) for c in outcome.commands)
    assert state.active == [f"n{i}" for i in range(6)] and state.num_dp_replicas == 3


def test_xid_79_replaces_the_node() -> None:
    outcome = Controller().handle(
        job(spares=1), host_fault("n3", "gpu_xid:79", gpus=[gpu(2, 79)]), at(1)
    )
    assert outcome.decision is not None and outcome.decision.rule == "hot-swap"
    (swap,) = outcome.commands
    assert isinstance(swap, schemas.HotSwap) and (swap.failed_node, swap.spare_node) == ("n3", "s0")


def test_the_drivers_reboot_request_replaces_a_node_with_an_application_xid() -> None:
    record = gpu(2, 13, recovery="node_reboot")
    outcome = Controller().handle(
        job(spares=1), host_fault("n3", "gpu_xid:13", gpus=[record]), at(1)
    )
    assert outcome.decision is not None and outcome.decision.rule == "hot-swap"


def test_a_fault_that_asks_for_nothing_sends_no_command() -> None:
    outcome = Controller().handle(
        job(spares=1), host_fault("n3", "gpu_xid:45", gpus=[gpu(2, 45)]), at(1)
    )
    assert outcome.decision is not None and outcome.decision.rule == "gpu-no-action"
    assert outcome.commands == [] and outcome.state.role_of("n3") == "active"
