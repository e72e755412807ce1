"""The GPU probe's reading of NVML: the real no-GPU path here, the rest through FakeNvml."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pynvml

from goodput_services.hostmon.gpu import (
    GKE_DRIVER_HOST_DIR,
    GKE_DRIVER_MOUNT_DIR,
    GpuProbe,
    load_nvml,
)
from goodput_services.hostmon.gpu_reset import held_refusal
from goodput_services.hostmon.host import process_names
from tests.hostmon.fake_nvml import FakeNvml, two_gpus


def test_this_machine_without_gpu_reports_unavailable_with_the_reason():
    probe = GpuProbe(load_nvml())
    sample = probe.sample()
    assert sample.available is False
    assert sample.gpus == [] and sample.faults == []
    assert "NVML" in sample.detail and "no NVIDIA driver or GPU" in sample.detail
    probe.close()


def test_no_nvml_module_at_all():
    sample = GpuProbe(None).sample()
    assert not sample.available and "not installed" in sample.detail


def test_missing_driver_through_fake():
    sample = GpuProbe(FakeNvml(driver_missing=True)).sample()
    assert not sample.available and str(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) in sample.detail


def test_healthy_gpus_report_temperature_and_no_fault():
    nvml = two_gpus()
    sample = GpuProbe(nvml).sample()
    assert sample.available and sample.faults == []
    assert [g.uuid for g in sample.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert all(g.temperature_c == 45 and g.present for g in sample.gpus)
    assert nvml.registered == [0, 1], "every GPU registered for critical XID events"


def test_xid_event_becomes_a_fault_and_stays():
    nvml = two_gpus()
    probe = GpuProbe(nvml)
    probe.sample()
    nvml.raise_xid(1, 79)
    first = probe.sample()
    assert first.faults == ["gpu_xid:79"]
    assert first.gpus[1].xid_errors == [79] and first.gpus[0].xid_errors == []
    # the event was consumed, but a critical XID needs a reset: it is still reported
    assert probe.sample().faults == ["gpu_xid:79"]


def test_gpu_lost_on_a_call_and_by_count():
    nvml = two_gpus()
    probe = GpuProbe(nvml)
    probe.sample()
    nvml.gpus[0].lost = True
    sample = probe.sample()
    assert sample.faults == ["gpu_lost"] and sample.gpus[0].present is False

    nvml = two_gpus()
    probe = GpuProbe(nvml)
    probe.sample()
    nvml.visible_count = 1
    sample = probe.sample()
    assert "gpu_lost" in sample.faults and "fell off the bus" in sample.detail


def test_uncorrected_ecc_is_a_fault_and_unsupported_ecc_is_not():
    nvml = two_gpus()
    nvml.gpus[0].ecc_uncorrected = 3
    nvml.gpus[1].ecc_uncorrected = None
    sample = GpuProbe(nvml).sample()
    assert sample.faults == ["ecc_uncorrected"]
    assert [g.ecc_uncorrected for g in sample.gpus] == [3, 0]


def test_thermal_throttling_and_overheating():
    nvml = two_gpus()
    nvml.gpus[0].throttle_mask = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    sample = GpuProbe(nvml).sample()
    assert sample.faults == ["thermal"] and sample.gpus[0].throttle_reasons == ["hw_thermal"]

    nvml = two_gpus()
    nvml.gpus[1].temperature_c = 95
    nvml.gpus[1].throttle_mask = pynvml.nvmlClocksThrottleReasonSwPowerCap
    sample = GpuProbe(nvml, max_temperature_c=90).sample()
    assert sample.faults == ["thermal"] and sample.gpus[1].throttle_reasons == ["sw_power_cap"]


class Clock:
    """The probe's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_application_xid_is_forgotten_after_a_healthy_interval_a_reset_one_is_not():
    nvml, clock = two_gpus(), Clock()
    probe = GpuProbe(nvml, xid_healthy_interval_s=300, clock=clock)
    probe.sample()
    nvml.raise_xid(0, 13)  # the application's illegal access: the GPU is fine
    nvml.raise_xid(1, 48)  # a double-bit ECC error: only a reset clears it
    assert probe.sample().faults == ["gpu_xid:13", "gpu_xid:48"]
    clock.now += 299
    assert probe.sample().faults == ["gpu_xid:13", "gpu_xid:48"]
    nvml.raise_xid(0, 13)  # it recurred: the interval starts again
    assert probe.sample().faults == ["gpu_xid:13", "gpu_xid:48"]
    clock.now += 299
    assert probe.sample().faults == ["gpu_xid:13", "gpu_xid:48"]
    clock.now += 1
    sample = probe.sample()
    assert sample.faults == ["gpu_xid:48"] and sample.gpus[0].xid_errors == []
    clock.now += 86_400
    assert probe.sample().faults == ["gpu_xid:48"]
    probe.forget([1])  # the reset
    assert probe.sample().faults == []


def test_xid_79_stays_until_the_node_reboots():
    nvml, clock = two_gpus(), Clock()
    probe = GpuProbe(nvml, xid_healthy_interval_s=1, clock=clock)
    probe.sample()
    nvml.raise_xid(1, 79)
    probe.sample()
    clock.now += 86_400
    assert probe.sample().faults == ["gpu_xid:79"]
    # a reboot starts the host monitor afresh: a new probe knows no XID
    assert GpuProbe(nvml).sample().faults == []


def test_the_drivers_recovery_action_is_read_per_gpu():
    nvml = two_gpus()
    nvml.gpus[1].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    sample = GpuProbe(nvml).sample()
    assert [g.recovery_action for g in sample.gpus] == ["none", "node_reboot"]
    nvml.gpus[1].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    assert GpuProbe(nvml).sample().gpus[1].recovery_action == "drain_and_reset"
    # a driver too old to report one: the field answers NOT_SUPPORTED, the table decides
    nvml.gpus[0].recovery_action = None
    assert GpuProbe(nvml).sample().gpus[0].recovery_action == ""


def test_a_container_without_the_driver_libraries_is_told_where_to_mount_them(monkeypatch):
    """NVML's "library not found" in a pod names the loader path and GKE's driver mount."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    sample = GpuProbe(FakeNvml(driver_missing=True)).sample()
    assert not sample.available
    assert "libnvidia-ml.so.1 is not in LD_LIBRARY_PATH='/opt/elsewhere'" in sample.detail
    assert f"mount {GKE_DRIVER_HOST_DIR} at {GKE_DRIVER_MOUNT_DIR}" in sample.detail


def test_the_processes_on_each_gpu_are_the_running_ones_nvml_lists():
    nvml = two_gpus()
    probe = GpuProbe(nvml)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    nvml.gpus[1].processes = [os.getpid(), ended.pid]
    assert probe.holders([0, 1]) == {0: [], 1: [os.getpid()]}
    # a lost GPU cannot say: None, and nvidia-smi's own refusal remains the check
    nvml.gpus[1].lost = True
    assert probe.holders([1]) == {1: None}


def test_a_held_gpu_is_named_with_its_pid_and_process_name():
    holders = {0: [], 1: None, 3: [1234, 77]}
    assert held_refusal(holders, {1234: "python"}) == (
        "GPU 3 is still held by pid 1234 (python), pid 77"
    )
    assert held_refusal({0: [], 1: None}, {}) == ""
    me = os.getpid()
    assert process_names([me]) == {me: psutil.Process(me).name()}
