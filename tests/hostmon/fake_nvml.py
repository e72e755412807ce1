"""FakeNvml: a stand-in for the pynvml module, because no GPU can run on the test machine.

It has the pynvml functions the host monitor's GPU probe calls, and takes its constants and
error codes from the real pynvml, so the probe is tested against the real names and values.
Tests script it: add an XID event, lose a GPU, set ECC counts, throttle reasons or the
driver's recovery action, or have a process hold a GPU. As the real driver, it lists only processes that still run: a process's
CUDA contexts end with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil
import pynvml


class FakeNvmlError(Exception):
    """Plays pynvml.NVMLError: carries the NVML return code as ``value``."""

    def __init__(self, value: int):
        super().__init__(f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    index: int
    uuid: str
    temperature_c: int = 45
    ecc_uncorrected: int | None = 0  # None: NOT_SUPPORTED
    throttle_mask: int = 0
    #: the driver's recovery action (an ``NVML_GPU_RECOVERY_ACTION_*`` value); None: a driver
    #: too old to report one (the field answers NOT_SUPPORTED)
    recovery_action: int | None = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    lost: bool = False
    #: pids of the processes with a compute context on this GPU (real processes: see live_pids)
    processes: list[int] = field(default_factory=list)


@dataclass
class FakeProcessInfo:
    """Plays pynvml's c_nvmlProcessInfo_t: the fields of one compute process."""

    pid: int
    usedGpuMemory: int = 1 << 30


def live_pids(pids: list[int]) -> list[int]:
    """The pids among ``pids`` whose process still runs (a zombie holds no GPU context)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


@dataclass
class FakeEvent:
    device: FakeGpu
    eventType: int
    eventData: int


@dataclass
class FakeNvml:
    """Scriptable NVML: ``gpus`` present at init; ``driver_missing`` makes nvmlInit fail."""

    gpus: list[FakeGpu] = field(default_factory=list)
    driver_missing: bool = False
    visible_count: int | None = None
    events: list[FakeEvent] = field(default_factory=list)
    registered: list[int] = field(default_factory=list)
    driver_version: str = "580.159.04"

    # pynvml's error type and the constants the probe uses, with their real values
    NVMLError = FakeNvmlError
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlClocksThrottleReasonHwThermalSlowdown = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    nvmlClocksThrottleReasonSwThermalSlowdown = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    nvmlClocksThrottleReasonHwSlowdown = pynvml.nvmlClocksThrottleReasonHwSlowdown
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = (
        pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
    )
    nvmlClocksThrottleReasonSwPowerCap = pynvml.nvmlClocksThrottleReasonSwPowerCap
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

    # ---- scripting -----------------------------------------------------------------------------

    def raise_xid(self, index: int, xid: int) -> None:
        self.events.append(FakeEvent(self.gpus[index], self.nvmlEventTypeXidCriticalError, xid))

    # ---- the pynvml functions ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.driver_missing:
            raise FakeNvmlError(self.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        """As nvidia-ml-py 12+ answers: a str (older bindings gave bytes)."""
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus) if self.visible_count is None else self.visible_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        return gpu.uuid

    def nvmlDeviceGetIndex(self, gpu: FakeGpu) -> int:
        return gpu.index

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, _event_set: str) -> None:
        pass

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, event_types: int, _event_set: str) -> None:
        self.registered.append(gpu.index)

    def nvmlEventSetWait_v2(self, _event_set: str, timeout_ms: int) -> FakeEvent:
        assert timeout_ms == 0, "the probe must never block on NVML events"
        if not self.events:
            raise FakeNvmlError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def _check(self, gpu: FakeGpu) -> None:
        if gpu.lost:
            raise FakeNvmlError(self.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, _sensor: int) -> int:
        self._check(gpu)
        return gpu.temperature_c

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, _error_type: int, _counter: int) -> int:
        self._check(gpu)
        if gpu.ecc_uncorrected is None:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        return gpu.ecc_uncorrected

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[FakeProcessInfo]:
        self._check(gpu)
        return [FakeProcessInfo(pid) for pid in live_pids(gpu.processes)]

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]):
        """As the real call: an array of pynvml's own ``c_nvmlFieldValue_t``, each field with
        its own return code; only the recovery action is known here."""
        self._check(gpu)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            if (
                field_id != pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
                or gpu.recovery_action is None
            ):
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.value.uiVal = gpu.recovery_action
        return values

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        self._check(gpu)
        return gpu.throttle_mask


# the recovery action names the probe looks up, with their real values
for _name in dir(pynvml):
    if _name.startswith("NVML_GPU_RECOVERY_ACTION_"):
        setattr(FakeNvml, _name, getattr(pynvml, _name))


def two_gpus() -> FakeNvml:
    return FakeNvml(gpus=[FakeGpu(0, "GPU-aaaa"), FakeGpu(1, "GPU-bbbb")])
