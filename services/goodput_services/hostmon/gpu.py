"""GPU health through NVML (the ``pynvml`` module of nvidia-ml-py), where a GPU and driver exist.

What is read, per GPU: critical XID errors (an NVML event set, drained without blocking),
volatile uncorrected ECC errors, temperature, clock throttle reasons, the driver's recovery
action where the driver reports one (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``), and whether
the GPU is still there (the device count dropping, or a call failing with "GPU is lost").

An XID is kept until what clears it: a GPU reset (:meth:`GpuProbe.forget`), a reboot (the
host monitor starts afresh), or, for an XID the fault table (``goodput.gpu_faults``) says
needs no reset (the application's, XID 45), ``xid_healthy_interval_s`` without it recurring.

A machine without a driver or GPU is not an error: :meth:`GpuProbe.sample` then reports
``available=False`` with the reason, so the host monitor runs on CPU-only hosts too.
The NVML module is a constructor argument (anything with pynvml's functions and constants) so
that tests can hand in a stand-in; nothing here talks to NVML except through it.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from goodput import schemas
from goodput.gpu_faults import DRIVER_ACTIONS, expires

log = logging.getLogger(__name__)

#: where GKE installs the NVIDIA driver on a node, and where its device plugin mounts it into a
#: GPU container (libraries in lib64/): the host monitor's DaemonSet mounts it the same way
GKE_DRIVER_HOST_DIR = "/home/kubernetes/bin/nvidia"
GKE_DRIVER_MOUNT_DIR = "/usr/local/nvidia"
#: nvidia-smi in that mount (the slim service image has none on its PATH)
GKE_NVIDIA_SMI = f"{GKE_DRIVER_MOUNT_DIR}/bin/nvidia-smi"

#: throttle-reason bits worth naming (NVML constant name → our short name)
THROTTLE_REASONS = {
    "nvmlClocksThrottleReasonHwThermalSlowdown": "hw_thermal",
    "nvmlClocksThrottleReasonSwThermalSlowdown": "sw_thermal",
    "nvmlClocksThrottleReasonHwSlowdown": "hw_slowdown",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "hw_power_brake",
    "nvmlClocksThrottleReasonSwPowerCap": "sw_power_cap",
}
#: throttle reasons that make the GPU unfit to train at speed
THERMAL_REASONS = frozenset({"hw_thermal", "sw_thermal", "hw_power_brake"})


@dataclass
class GpuSample:
    """One look at every GPU: what the HostHealth report carries about them."""

    available: bool
    gpus: list[schemas.GpuHealth] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    detail: str = ""


def load_nvml(spec: str = "pynvml") -> ModuleType | Any | None:
    """The NVML binding ``spec`` names, or None when it is not installed.

    ``spec`` is a module (``pynvml``, from nvidia-ml-py) or ``module:attribute`` for an object
    with pynvml's functions and constants (tests name a fake GPU node this way).
    """
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, attribute) if attribute else module


class GpuProbe:
    """Keeps the NVML session, device handles and XID event set between samples."""

    def __init__(
        self,
        nvml: Any,
        *,
        max_temperature_c: float = 90.0,
        xid_healthy_interval_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.nvml = nvml
        self.max_temperature_c = max_temperature_c
        self.xid_healthy_interval_s = xid_healthy_interval_s
        self.clock = clock
        self._started = False
        self._unavailable = ""
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._event_set: Any = None
        #: critical XIDs seen per GPU index, each with when it was last seen (``clock``)
        self._xids: dict[int, dict[int, float]] = {}
        self._lost: set[int] = set()

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML, take every device handle and register for critical XID events."""
        self._started = True
        nvml = self.nvml
        if nvml is None:
            self._unavailable = "NVML unavailable: nvidia-ml-py (pynvml) is not installed"
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self._unavailable = f"NVML unavailable ({exc}): no NVIDIA driver or GPU on this host"
            if getattr(exc, "value", None) == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                # in a container the host's driver libraries must be mounted and on the path
                self._unavailable += (
                    f", or its libnvidia-ml.so.1 is not in LD_LIBRARY_PATH="
                    f"{os.environ.get('LD_LIBRARY_PATH', '')!r} (on GKE: mount "
                    f"{GKE_DRIVER_HOST_DIR} at {GKE_DRIVER_MOUNT_DIR}, deploy/k8s/README.md)"
                )
            return
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        except nvml.NVMLError as exc:
            self._unavailable = f"NVML could not enumerate GPUs: {exc}"
            return
        if not self._handles:
            self._unavailable = "NVML reports no GPU on this host"
            return
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        nvml = self.nvml
        assert nvml is not None
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("no NVML event set, XID errors will not be seen: %s", exc)
            return
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nvml.NVMLError as exc:
                log.warning("GPU %d: XID events not supported: %s", index, exc)

    def close(self) -> None:
        nvml = self.nvml
        if nvml is None or not self._handles:
            return
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)

    # ---- reset --------------------------------------------------------------------------------

    def indexes(self) -> list[int]:
        """The GPUs NVML showed at start (none where NVML is unavailable)."""
        if not self._started:
            self.start()
        return [] if self._unavailable else list(range(len(self._handles)))

    def holders(self, indexes: list[int]) -> dict[int, list[int] | None]:
        """The pids NVML sees running compute work on each of ``indexes`` (None: NVML cannot
        say, e.g. a lost GPU; ``nvidia-smi --gpu-reset`` still refuses a GPU in use).

        The driver knows no PID namespace: the pids are the host's (or translated into this
        process's namespace, by newer drivers, for what it can see), so the host monitor's pod
        runs with ``hostPID`` to name every holder.
        """
        nvml = self.nvml
        assert nvml is not None and set(indexes) <= set(self.indexes())
        found: dict[int, list[int] | None] = {}
        for index in indexes:
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[index])
            except nvml.NVMLError as exc:
                log.warning("GPU %d: compute processes unreadable: %s", index, exc)
                found[index] = None
                continue
            found[index] = sorted({int(p.pid) for p in processes})
        return found

    def forget(self, indexes: list[int]) -> None:
        """These GPUs were reset: their XIDs and a lost state belong to before the reset."""
        for index in indexes:
            self._xids.pop(index, None)
            self._lost.discard(index)

    # ---- sampling ----------------------------------------------------------------------------

    def sample(self) -> GpuSample:
        if not self._started:
            self.start()
        if self._unavailable:
            return GpuSample(available=False, detail=self._unavailable)
        nvml = self.nvml
        assert nvml is not None
        self._drain_xid_events()
        self._expire_xids()
        details = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            count = len(self._handles)
            details.append(f"device count unreadable: {exc}")
        if count < len(self._handles):
            details.append(f"{len(self._handles) - count} GPU(s) fell off the bus")
        gpus = [self._sample_gpu(index, handle) for index, handle in enumerate(self._handles)]
        faults: set[str] = set()
        for gpu in gpus:
            faults.update(f"gpu_xid:{xid}" for xid in gpu.xid_errors)
            if gpu.ecc_uncorrected:
                faults.add("ecc_uncorrected")
            if not gpu.present:
                faults.add("gpu_lost")
            if THERMAL_REASONS & set(gpu.throttle_reasons) or (
                gpu.temperature_c is not None and gpu.temperature_c >= self.max_temperature_c
            ):
                faults.add("thermal")
        if count < len(self._handles):
            faults.add("gpu_lost")
        return GpuSample(
            available=True, gpus=gpus, faults=sorted(faults), detail="; ".join(details)
        )

    def _drain_xid_events(self) -> None:
        """Take every pending XID event without waiting (timeout 0 ms)."""
        nvml = self.nvml
        assert nvml is not None
        if self._event_set is None:
            return
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_TIMEOUT:
                    log.warning("reading NVML events failed: %s", exc)
                return
            index = self._index_of(event.device)
            self._xids.setdefault(index, {})[int(event.eventData)] = self.clock()
            log.error("GPU %d: XID %d", index, event.eventData)

    def _expire_xids(self) -> None:
        """Forget the XIDs that need no reset once they did not recur for the healthy interval."""
        now = self.clock()
        for index, xids in self._xids.items():
            for xid, seen in list(xids.items()):
                if expires(xid) and now - seen >= self.xid_healthy_interval_s:
                    log.info("GPU %d: XID %d did not recur, forgotten", index, xid)
                    del xids[xid]

    def _index_of(self, handle: Any) -> int:
        nvml = self.nvml
        assert nvml is not None
        try:
            return int(nvml.nvmlDeviceGetIndex(handle))
        except nvml.NVMLError:
            return -1  # the event names a device that no longer answers

    def _sample_gpu(self, index: int, handle: Any) -> schemas.GpuHealth:
        nvml = self.nvml
        assert nvml is not None
        health = schemas.GpuHealth(
            index=index, uuid=self._uuids[index], xid_errors=list(self._xids.get(index, {}))
        )
        if index in self._lost:
            health.present = False
            return health
        try:
            health.temperature_c = float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
            health.ecc_uncorrected = self._optional(
                lambda: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                ),
                0,
            )
            mask = self._optional(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle), 0)
            health.throttle_reasons = [
                name
                for constant, name in THROTTLE_REASONS.items()
                if mask & getattr(nvml, constant, 0)
            ]
            health.recovery_action = self._recovery_action(handle)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                # a lost GPU does not come back without a reset: remember it
                log.error("GPU %d is lost: %s", index, exc)
                self._lost.add(index)
                health.present = False
            else:
                log.warning("GPU %d: NVML query failed: %s", index, exc)
        return health

    def _recovery_action(self, handle: Any) -> str:
        """The driver's recovery action for the GPU ("" where the driver or binding has none)."""
        nvml = self.nvml
        assert nvml is not None
        field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            return ""
        try:
            (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return ""  # an older driver: NOT_SUPPORTED, FUNCTION_NOT_FOUND
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            return ""
        code = int(value.value.uiVal)
        return next(
            (
                name
                for name in DRIVER_ACTIONS
                if getattr(nvml, f"NVML_GPU_RECOVERY_ACTION_{name.upper()}", None) == code
            ),
            "",
        )

    def _optional(self, query: Any, default: int) -> int:
        """A query some GPUs do not support (ECC on consumer boards): NOT_SUPPORTED → default."""
        nvml = self.nvml
        assert nvml is not None
        try:
            return int(query())
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return default
            raise


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
