"""Which GPU faults a GPU reset corrects: the one place that says so (pure, no NVML).

A host monitor reports GPU faults as canonical names (``gpu_xid:<code>``, ``ecc_uncorrected``,
``gpu_lost``, ``thermal``) and per-GPU records (:class:`goodput.schemas.GpuHealth`). The
built-in policy asks :func:`reset_targets` whether every fault of a node is one a reset of
its GPUs clears, and which GPUs to reset; only then is the GPU-reset rung worth trying before
the node is replaced.

Sources (NVIDIA's Xid catalogue, "Resolution Bucket (Immediate Action)",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html; NVIDIA Health
Validation's Xid checks, https://docs.nvidia.com/health-validation/reference/checks/xid.md,
"drain: reset_gpu → service_required"; A100 memory error management, "row remapping fixes
the memory in hardware" at the next GPU reset,
https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/):

* 46  GPU stopped processing                   drain, reset the GPU
* 48  double-bit ECC error                     drain, reset the GPU (row remapping applies at reset)
* 63  row remapping / page retirement pending  "reset gpu to activate"
* 95  uncontained ECC error                    reset the GPU
* 119 GSP RPC timeout, 120 GSP error           reset the GPU

Not reset-correctable here: 79 (fell off the bus: the catalogue says reboot the node, and a
GPU that left the bus cannot be reset through the driver), 64 (row remapping failed: the
memory is bad, service the board), a lost GPU, a thermal fault, and every fault that is not
the GPU's (disk, memory, a node down). Uncorrected volatile ECC errors (``ecc_uncorrected``)
are reset-correctable: the reset clears the volatile count and activates the remapped rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from goodput import schemas

#: XIDs whose catalogue resolution is a GPU reset
RESET_CORRECTABLE_XIDS = frozenset({46, 48, 63, 95, 119, 120})
XID_FAULT_PREFIX = "gpu_xid:"
ECC_FAULT = "ecc_uncorrected"


def is_reset_correctable(fault: str) -> bool:
    """A host fault name (``gpu_xid:48``, ``ecc_uncorrected``, ``disk_full``...) a reset clears."""
    if fault == ECC_FAULT:
        return True
    if fault.startswith(XID_FAULT_PREFIX):
        code = fault[len(XID_FAULT_PREFIX) :]
        return code.isdigit() and int(code) in RESET_CORRECTABLE_XIDS
    return False


def reset_targets(faults: Sequence[str], gpus: Sequence[schemas.GpuHealth]) -> list[int] | None:
    """The GPU indexes to reset when every fault is reset-correctable, else None.

    ``faults`` are the host report's fault names, ``gpus`` its GPU records. GPUs named by
    their records (an XID or ECC errors on that index) are the targets; a fault reported
    without a GPU record (an injected one, or a host without NVML) gives ``[]``: every GPU
    of the node.
    """
    if not faults or not all(is_reset_correctable(f) for f in faults):
        return None
    # the probe names every XID and a lost GPU in ``faults`` too, so these records hold only
    # reset-correctable faults by now
    return sorted({gpu.index for gpu in gpus if gpu.xid_errors or gpu.ecc_uncorrected})
