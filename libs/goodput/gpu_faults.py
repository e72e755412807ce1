"""The GPU fault table: what each GPU fault asks of the job and the node (pure, no NVML).

A host monitor reports GPU faults as canonical names (``gpu_xid:<code>``, ``ecc_uncorrected``,
``gpu_lost``, ``thermal``) and per-GPU records (:class:`goodput.schemas.GpuHealth`) that carry
the XIDs seen and, on drivers that report one, the driver's own recovery action
(``nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)``, named by
:data:`DRIVER_ACTIONS`). Every fault maps to one :data:`Action`, mildest first:

* ``none`` — nothing to do: a side effect or a corrected error (XID 45, the cleanup after an
  application was killed — our own restarts cause it; 92, single-bit ECC errors, corrected;
  a thermal slowdown, which the straggler detector weighs by the steps it slows, debounced);
* ``restart`` — the application's fault: restart the job, keep the node (13, 31, 43, 68, 109:
  an illegal memory access, a bad launch, a killed kernel; 94, a *contained* ECC error: the
  driver killed the one application that touched the bad row, the GPU is fine). NVIDIA's
  device plugin ignores these XIDs for the same reason: they say nothing about the hardware;
* ``reset_gpu`` — a GPU reset clears it (46, 48, 63, 95, 119, 120 ...; uncorrected volatile ECC
  counts, since the reset clears the count and activates the remapped rows);
* ``replace_node`` — reboot or service the node: the job moves off it (79, fallen off the bus;
  64, row remapping failed; a lost GPU).

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


#: NVIDIA's Xid catalogue, the codes a training job meets: code -> (action, what it means)
XIDS: dict[int, Verdict] = {
    13: Verdict("restart", "graphics engine exception: the application's illegal access"),
    31: Verdict("restart", "GPU memory page fault: the application's illegal address"),
    32: Verdict("reset_gpu", "corrupted push buffer stream: driver or bus error"),
    38: Verdict("reset_gpu", "driver firmware error"),
    43: Verdict("restart", "a channel stopped by the application's fault"),
    45: Verdict("none", "preemptive cleanup after the application ended"),
    46: Verdict("reset_gpu", "GPU stopped processing"),
    48: Verdict("reset_gpu", "double-bit ECC error (rows remapped at the reset)"),
    61: Verdict("reset_gpu", "internal micro-controller breakpoint"),
    62: Verdict("reset_gpu", "internal micro-controller halt"),
    63: Verdict("reset_gpu", "row remapping pending: a reset activates it"),
    64: Verdict("replace_node", "row remapping failed: the memory is bad, service the board"),
    68: Verdict("restart", "video processor exception in the application"),
    69: Verdict("reset_gpu", "graphics engine class error"),
    74: Verdict("reset_gpu", "NVLink error (a link that fails again is replaced)"),
    79: Verdict("replace_node", "GPU fell off the bus: reboot the node"),
    92: Verdict("none", "high single-bit ECC error rate: corrected, the data is intact"),
    94: Verdict("restart", "contained ECC error: the application was killed, the GPU is fine"),
    95: Verdict("reset_gpu", "uncontained ECC error"),
    109: Verdict("restart", "context switch timeout in the application"),
    119: Verdict("reset_gpu", "GSP RPC timeout"),
    120: Verdict("reset_gpu", "GSP error"),
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
    judged = {gpu.index: gpu_verdict(gpu) for gpu in gpus}
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


def reset_targets(faults: Sequence[str], gpus: Sequence[schemas.GpuHealth]) -> list[int] | None:
    """The GPU indexes to reset when a reset is the node's remedy ([]: every GPU), else None."""
    remedy = node_remedy(faults, gpus)
    return remedy.gpus if remedy is not None and remedy.action == "reset_gpu" else None
