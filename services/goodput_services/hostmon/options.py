"""The host monitor's options (``[options]`` of its config file, ``--set KEY=VALUE``)."""

from __future__ import annotations

import msgspec

from goodput_services.hostmon.host import (
    DEFAULT_DISK_MIN_FREE_BYTES,
    DEFAULT_DISK_MIN_FREE_FRACTION,
    DEFAULT_MEMORY_MIN_AVAILABLE_FRACTION,
)


class HostMonitorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``--set KEY=VALUE`` options of the host monitor."""

    health_interval_s: float = 2.0
    probe_interval_s: float = 0.5
    enable_fault_injection: bool = False
    #: the node's checkpoint volume (default: the local backend's node volume in --state-dir)
    volume: str = ""
    disk_min_free_bytes: int = DEFAULT_DISK_MIN_FREE_BYTES
    disk_min_free_fraction: float = DEFAULT_DISK_MIN_FREE_FRACTION
    memory_min_available_fraction: float = DEFAULT_MEMORY_MIN_AVAILABLE_FRACTION
    gpu_max_temperature_c: float = 90.0
    #: an XID that needs no GPU reset (``goodput.gpu_faults``: the application's, 45) is
    #: forgotten once it did not recur for this long, so the node reports healthy again
    xid_healthy_interval_s: float = 300.0
    #: the NVML binding: a module, or ``module:attribute`` (a stand-in, for tests)
    nvml_module: str = "pynvml"
    #: the nvidia-smi that resets GPUs (NVML's Python binding has no reset call): a name on
    #: PATH or a path; the GKE overlay sets the driver's mount, ``GKE_NVIDIA_SMI`` of ``gpu``.
    #: A reset needs root (CAP_SYS_ADMIN) on the device: the DaemonSet runs this container as uid 0
    nvidia_smi: str = "nvidia-smi"
    #: a GPU reset still running after this long is killed and reported ``timed_out``
    gpu_reset_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.health_interval_s <= 0 or self.probe_interval_s <= 0:
            raise ValueError("health_interval_s and probe_interval_s must be positive")
        if not 0 < self.xid_healthy_interval_s <= 86_400:
            raise ValueError("xid_healthy_interval_s must be in (0, 86400]")
        if not 0 < self.gpu_reset_timeout_s <= 3600:
            raise ValueError("gpu_reset_timeout_s must be in (0, 3600]")
