"""The host monitor's GPU probe on the real NVML (nvidia-ml-py) and driver of this machine:
every GPU read, the XID event set polled without blocking, and the GPU's holders named."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from goodput_services.hostmon.gpu import THROTTLE_REASONS, GpuProbe, load_nvml
from tests.gpu.kit import GPU

pytestmark = GPU


@pytest.fixture
def nvml() -> Any:
    module = load_nvml()
    if module is None:
        pytest.skip("nvidia-ml-py (pynvml) is not installed: pip install nvidia-ml-py")
    return module


def test_probe_reads_every_gpu(nvml: Any) -> None:
    probe = GpuProbe(nvml)
    try:
        first = probe.sample()
        assert first.available, first.detail
        count = nvml.nvmlDeviceGetCount()
        assert probe.indexes() == list(range(count))
        for gpu in first.gpus:
            assert gpu.present and gpu.uuid.startswith("GPU-"), gpu
            assert gpu.temperature_c is not None and 0 < gpu.temperature_c < 110, gpu
            assert gpu.ecc_uncorrected >= 0
            assert set(gpu.throttle_reasons) <= set(THROTTLE_REASONS.values())
        assert "gpu_lost" not in first.faults, first
        started = time.monotonic()
        again = probe.sample()  # drains the XID event set again: nothing pending, no wait
        assert time.monotonic() - started < 5
        assert again.available and [g.uuid for g in again.gpus] == [g.uuid for g in first.gpus]
    finally:
        probe.close()


def test_xid_event_set_is_polled_without_blocking(nvml: Any) -> None:
    """The calls the probe makes for XIDs, as this driver answers them: registration for
    critical XID events succeeds and a 0 ms wait with nothing pending times out at once."""
    nvml.nvmlInit()
    try:
        events = nvml.nvmlEventSetCreate()
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            started = time.monotonic()
            with pytest.raises(nvml.NVMLError) as raised:
                nvml.nvmlEventSetWait_v2(events, 0)
            assert raised.value.value == nvml.NVML_ERROR_TIMEOUT
            assert time.monotonic() - started < 1
        finally:
            nvml.nvmlEventSetFree(events)
    finally:
        nvml.nvmlShutdown()


def test_holders_name_a_process_while_one_holds_the_gpu(nvml: Any) -> None:
    """The check before a GPU reset: with this process holding a CUDA context, the driver
    names a holder (its own pid, or the host's for it where the PID namespace differs)."""
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    probe = GpuProbe(nvml)
    try:
        holders = probe.holders(probe.indexes())
    finally:
        probe.close()
    assert None not in holders.values(), holders
    assert any(holders.values()), holders
