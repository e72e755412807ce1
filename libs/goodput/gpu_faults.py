"""The GPU fault table: what each GPU fault asks of the job and the node (pure, no NVML).

A host monitor reports GPU faults as canonical names (``gpu_xid:<code>``, ``ecc_uncorrected``,
``gpu_lost``, ``thermal``) and per-GPU records (:class:`goodput.schemas.GpuHealth`) that carry
the XIDs seen and, on drivers that report one, the driver's own recovery action
(``nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)``, named by
:data:`DRIVER_ACTIONS`). Every fault maps to one :data:`Action`, mildest first:

* ``none`` — nothing to do: a side effect, a corrected error or an event the driver handled
  (XID 45, the cleanup after an application was killed — our own restarts cause it; 38, 43, a
  firmware or channel event whose application ends by itself, its exit restarting it; 63, a
  row remapping pending for the next reset, which work may run beside; 92, single-bit ECC
  errors, corrected; a thermal slowdown, which the straggler detector weighs by the steps it
  slows, debounced);
* ``restart`` — the application's fault: restart the job, keep the node (13, 31, 32, 68, 69:
  an illegal memory access, a bad push buffer, a bad class; 94, a *contained* ECC error: the
  driver killed the one application that touched the bad row, the GPU is fine). NVIDIA's
  device plugin ignores these XIDs for the same reason: they say nothing about the hardware;
* ``reset_gpu`` — a GPU reset clears it (46, 48, 62, 64, 74, 95, 109, 119, 120, 140 ...;
  uncorrected volatile ECC counts, since the reset clears the count and activates the
  remapped rows);
* ``replace_node`` — reboot or service the node: the job moves off it (79, fallen off the bus:
  NVIDIA's RESTART_BM; a lost GPU).

Each XID's action is NVIDIA's *immediate* resolution bucket in the Xid catalogue (IGNORE:
none, RESTART_APP: restart, RESET_GPU: reset_gpu, RESTART_BM: replace_node; a WORKFLOW_ bucket
by its first step), not its investigatory one (CONTACT_SUPPORT, an RMA): a node is taken out
of the job by the policy's repeat and reset-failed rules when the immediate action does not
hold, not on the first event.

The driver's recovery action is preferred where reported: it knows the GPU's state, the
table only the code. A driver saying ``none`` caps the verdict at ``restart`` (the
application that saw the fault still died). An XID not in the table is taken as
reset-correctable: a reset is cheap, and a GPU that fails again is replaced by the policy's
repeat and reset-failed rules.

Sources: NVIDIA's Xid catalogue, "Resolution Bucket (Immediate Action)"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html); NVIDIA Health
Validation's Xid checks (https://docs.nvidia.com/health-validation/reference/checks/xid.md,
"drain: reset_gpu → service_required"); A100 memory error management, contained and
uncontained ECC errors and row remapping at the next reset
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/); NVML's
``nvmlGpuRecoveryAction_t``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from goodput import schemas

Action = Literal["none", "restart", "reset_gpu", "replace_node"]
#: actions from mildest to most drastic: a node's remedy is the most drastic of its faults'
ACTIONS: tuple[Action, ...] = ("none", "restart", "reset_gpu", "replace_node")

XID_FAULT_PREFIX = "gpu_xid:"
ECC_FAULT = "ecc_uncorrected"
LOST_FAULT = "gpu_lost"
THERMAL_FAULT = "thermal"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reason: str


#: NVIDIA's Xid catalogue, the codes a training job meets: code -> (action, what it means).
#: Each comment is the catalogue's row for Ampere and newer GPUs (mnemonic, "Resolution
#: Bucket (Immediate Action)"; https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
#: read through its spreadsheet of October 2025).
XIDS: dict[int, Verdict] = {
    # ROBUST_CHANNEL_GR_EXCEPTION: RESTART_APP
    13: Verdict("restart", "graphics engine exception: the application's illegal access"),
    # ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT: RESTART_APP
    31: Verdict("restart", "GPU memory page fault: the application's illegal address"),
    # ROBUST_CHANNEL_PBDMA_ERROR: RESTART_APP (investigatory: CHECK_APP/CUDA)
    32: Verdict("restart", "invalid or corrupted push buffer stream from the application"),
    # ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT: IGNORE (investigatory: CONTACT_SUPPORT)
    38: Verdict("none", "driver firmware watchdog timeout: the driver recovers"),
    # ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR: IGNORE — the application's channel is stopped
    # and it ends by itself (its exit restarts it); the GPU stays healthy
    43: Verdict("none", "a channel stopped after the application's fault: the GPU is fine"),
    # ROBUST_CHANNEL_PREEMPTIVE_REMOVAL: WORKFLOW_XID_45 — beside another XID, IGNORE (follow
    # that one); alone, RESTART_FM (NVSwitch systems' fabric manager, not the job's)
    45: Verdict("none", "preemptive cleanup after the application ended"),
    # ROBUST_CHANNEL_GPU_TIMEOUT_ERROR: RESET_GPU
    46: Verdict("reset_gpu", "GPU stopped processing"),
    # ROBUST_CHANNEL_GPU_ECC_DBE: WORKFLOW_XID_48, whose first step is NVIDIA Health
    # Validation's "drain: reset_gpu" (the reset activates the remapped rows; a contained
    # error also reported as XID 94 with the driver's recovery action none is only restarted)
    48: Verdict("reset_gpu", "double-bit ECC error (rows remapped at the reset)"),
    # PMU_BREAKPOINT: unused on Ampere and newer (CONTACT_SUPPORT); older GPUs reset it
    61: Verdict("reset_gpu", "internal micro-controller breakpoint"),
    # PMU_HALT_ERROR: RESET_GPU
    62: Verdict("reset_gpu", "internal micro-controller halt"),
    # INFOROM_DRAM_RETIREMENT_EVENT: IGNORE — the remapping is pending until the next reset,
    # and work may run beside it ("A100 GPU memory error management", row-remapping pending
    # flag); the uncorrectable error behind it comes as XID 48/94/95 with their own actions
    63: Verdict("none", "row remapping pending until the next GPU reset"),
    # INFOROM_DRAM_RETIREMENT_FAILURE: RESET_GPU (investigatory: CONTACT_SUPPORT, an RMA by
    # NVIDIA's row-remapping thresholds: a GPU that fails again is replaced by the policy)
    64: Verdict("reset_gpu", "row remapping failed: reset, and service the board"),
    # ROBUST_CHANNEL_NVDEC0_ERROR: RESTART_APP
    68: Verdict("restart", "video decoder exception in the application"),
    # ROBUST_CHANNEL_GR_CLASS_ERROR: RESTART_APP (investigatory: CHECK_APP/CUDA)
    69: Verdict("restart", "graphics engine class error: the application's"),
    # NVLINK_ERROR: WORKFLOW_NVLINK_ERR, whose first step is NVIDIA Health Validation's
    # "drain, then reset_gpu → restart_os → service_required"
    74: Verdict("reset_gpu", "NVLink error (a link that fails again is replaced)"),
    # ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: RESTART_BM
    79: Verdict("replace_node", "GPU fell off the bus: reboot the node"),
    # EXCESSIVE_SBE_INTERRUPTS: IGNORE
    92: Verdict("none", "high single-bit ECC error rate: corrected, the data is intact"),
    # ROBUST_CHANNEL_CONTAINED_ERROR: RESTART_APP
    94: Verdict("restart", "contained ECC error: the application was killed, the GPU is fine"),
    # ROBUST_CHANNEL_UNCONTAINED_ERROR: RESET_GPU
    95: Verdict("reset_gpu", "uncontained ECC error"),
    # ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR: RESET_GPU
    109: Verdict("reset_gpu", "context switch timeout"),
    # GSP_RPC_TIMEOUT: RESET_GPU
    119: Verdict("reset_gpu", "GSP RPC timeout"),
    # GSP_ERROR: RESET_GPU
    120: Verdict("reset_gpu", "GSP error"),
    # UNRECOVERABLE_ECC_ERROR_ESCAPE: RESET_GPU
    140: Verdict("reset_gpu", "unrecovered ECC error in GPU memory"),
}

#: the driver's recovery actions (``NVML_GPU_RECOVERY_ACTION_<NAME>``, as ``GpuHealth``
#: carries them: the name in lower case) -> what they ask
DRIVER_ACTIONS: dict[str, Action] = {
    "none": "none",
    "gpu_reset": "reset_gpu",
    "drain_p2p": "reset_gpu",
    "drain_and_reset": "reset_gpu",
    "node_reboot": "replace_node",
    "system_reboot": "replace_node",
    "bus_reset": "replace_node",
    "recover_imex_domain": "replace_node",
}

#: host fault names that are the GPU's, apart from ``gpu_xid:<code>``
NAMED_FAULTS: dict[str, Verdict] = {
    ECC_FAULT: Verdict("reset_gpu", "uncorrected ECC errors: a reset clears the count"),
    LOST_FAULT: Verdict("replace_node", "a GPU is lost: reboot the node"),
    THERMAL_FAULT: Verdict("none", "thermal slowdown: a straggler if it slows the steps"),
}


def xid_verdict(xid: int) -> Verdict:
    """The table's verdict on one XID (reset-correctable when not in it)."""
    known = XIDS.get(xid)
    if known is not None:
        return Verdict(known.action, f"XID {xid}: {known.reason}")
    return Verdict("reset_gpu", f"XID {xid}: not in the fault table, a reset is tried")


def fault_verdict(fault: str) -> Verdict | None:
    """The verdict on a host fault name; None for a fault that is not the GPU's (disk_full)."""
    if fault.startswith(XID_FAULT_PREFIX):
        code = fault[len(XID_FAULT_PREFIX) :]
        return xid_verdict(int(code)) if code.isdigit() else None
    return NAMED_FAULTS.get(fault)


def worst(verdicts: Sequence[Verdict]) -> Verdict:
    """The most drastic of ``verdicts`` (``none`` when there are none)."""
    if not verdicts:
        return Verdict("none", "no GPU fault")
    return max(verdicts, key=lambda v: ACTIONS.index(v.action))


def gpu_verdict(gpu: schemas.GpuHealth) -> Verdict:
    """One GPU's verdict: its XIDs and ECC count by the table, the driver's action preferred."""
    if not gpu.present:
        return Verdict("replace_node", f"GPU {gpu.index} is lost: reboot the node")
    found = [xid_verdict(xid) for xid in gpu.xid_errors]
    if gpu.ecc_uncorrected:
        found.append(NAMED_FAULTS[ECC_FAULT])
    table = worst(found)
    driver = DRIVER_ACTIONS.get(gpu.recovery_action)
    if driver is None:
        return table
    said = f"the driver's recovery action: {gpu.recovery_action}"
    if driver == "none":
        capped = min(table.action, "restart", key=ACTIONS.index)
        return Verdict(capped, f"{table.reason}; {said}")
    return Verdict(driver, f"{table.reason}; {said}" if found else said)


def xids_with(action: Action) -> list[int]:
    """The table's XIDs whose verdict is ``action`` (for help texts and the simulator)."""
    return sorted(xid for xid, verdict in XIDS.items() if verdict.action == action)


def expires(xid: int) -> bool:
    """Whether a host monitor forgets this XID after a healthy interval (no reset needed)."""
    return xid_verdict(xid).action in ("none", "restart")


def needs_action(fault: str) -> bool:
    """Whether a host fault name asks for anything (a non-GPU fault always does)."""
    verdict = fault_verdict(fault)
    return verdict is None or verdict.action != "none"


@dataclass(frozen=True, slots=True)
class Remedy:
    """What a node's GPU faults ask: the action, the GPUs to reset ([]: every GPU), why."""

    action: Action
    gpus: list[int]
    reason: str


def node_remedy(faults: Sequence[str], gpus: Sequence[schemas.GpuHealth]) -> Remedy | None:
    """The remedy for a node's reported faults, or None when one is not the GPU's (a full
    disk, a node down): the table does not judge those.

    ``faults`` are the host report's fault names, ``gpus`` its GPU records. A GPU record is
    judged with its driver's recovery action; a fault name without a record (an injected one,
    a host without NVML) by the table alone, on every GPU.
    """
    named = {f: fault_verdict(f) for f in faults}
    if not faults or any(v is None for v in named.values()):
        return None
    # a GPU with nothing to report is not judged: its "no GPU fault" would name the remedy of
    # a node whose fault asks nothing
    judged = {gpu.index: gpu_verdict(gpu) for gpu in gpus if _reports(gpu)}
    # a name a GPU record explains is judged through the record (and its driver's action)
    explained = {f"{XID_FAULT_PREFIX}{xid}" for gpu in gpus for xid in gpu.xid_errors}
    if any(gpu.ecc_uncorrected for gpu in gpus):
        explained.add(ECC_FAULT)
    if any(not gpu.present for gpu in gpus):
        explained.add(LOST_FAULT)
    unexplained = [v for f, v in named.items() if v is not None and f not in explained]
    verdict = worst(unexplained + list(judged.values()))
    targets: list[int] = []
    if verdict.action == "reset_gpu" and not any(v.action == "reset_gpu" for v in unexplained):
        targets = sorted(i for i, v in judged.items() if v.action == "reset_gpu")
    return Remedy(verdict.action, targets, verdict.reason)


def _reports(gpu: schemas.GpuHealth) -> bool:
    """Whether a GPU record says anything the table or its driver judges."""
    if gpu.xid_errors or gpu.ecc_uncorrected or not gpu.present:
        return True
    return DRIVER_ACTIONS.get(gpu.recovery_action, "none") != "none"


def reset_targets(faults: Sequence[str], gpus: Sequence[schemas.GpuHealth]) -> list[int] | None:
    """The GPU indexes to reset when a reset is the node's remedy ([]: every GPU), else None."""
    remedy = node_remedy(faults, gpus)
    return remedy.gpus if remedy is not None and remedy.action == "reset_gpu" else None
