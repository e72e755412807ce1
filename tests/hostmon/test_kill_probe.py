"""The host monitor's watch of a process killed on a GPU (`goodput bench gpu`, phase D),
against FakeNvml (no GPU runs here), which, as the driver, lists only processes still
running: the victim is a real process, really killed."""

from __future__ import annotations

import subprocess
import sys

from goodput_services.hostmon.gpu import GpuProbe
from goodput_services.hostmon.kill_probe import describe, watch_kill
from tests.hostmon.fake_nvml import FakeNvml, two_gpus


def test_a_killed_holder_is_timed_off_the_gpu_with_the_xids_that_came() -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    nvml = two_gpus()
    nvml.gpus[1].processes.append(victim.pid)
    nvml.raise_xid(1, 43)  # what a driver reports when it stops a killed kernel
    probe = GpuProbe(nvml)
    try:
        assert describe(probe) == {"driver": "580.159.04"}
        seen = watch_kill(probe, victim.pid, listed_within_s=5.0, settle_s=0.5)
    finally:
        probe.close()
        if victim.poll() is None:
            victim.kill()
        victim.wait()
    assert victim.returncode == -9  # the watch killed it
    assert seen["holders_before_kill"] == [victim.pid]
    assert seen["victim_listed_as_its_pid"]
    assert seen["listed_after_kill_s"] is not None and 0 <= seen["listed_after_kill_s"] < 5
    assert [entry["xid"] for entry in seen["xids"]] == [43]
    assert seen["watched_s"] >= 0.5


def test_describe_says_why_nvml_cannot_be_read() -> None:
    probe = GpuProbe(FakeNvml(driver_missing=True))
    try:
        why = describe(probe)["unavailable"]
    finally:
        probe.close()
    assert why.startswith("NVML unavailable (fake NVML error"), why
