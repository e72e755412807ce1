"""Every XID of the fault table, raised on the named fake NVML (tests/hostmon/fake_nvml.py: no
GPU here) and read by the host monitor's real probe, is judged as NVIDIA's Xid catalogue says
(``CATALOGUE``: the immediate action of each code), and it lasts as long as that action asks:
what needs nothing or only the application's restart is forgotten after a healthy interval,
what needs a reset stays until the reset, XID 79 until the node reboots."""

from __future__ import annotations

import pytest

from goodput.gpu_faults import node_remedy
from goodput_services.hostmon.gpu import GpuProbe
from tests.controller.test_gpu_fault_table import CATALOGUE
from tests.hostmon.fake_nvml import two_gpus
from tests.hostmon.test_gpu_probe import Clock

HEALTHY_INTERVAL_S = 300.0


@pytest.mark.parametrize(("xid", "action"), sorted(CATALOGUE.items()))
def test_each_xid_on_the_fake_nvml_is_judged_as_nvidia_documents_it(xid: int, action: str) -> None:
    nvml, clock = two_gpus(), Clock()
    for gpu in nvml.gpus:  # a driver too old to report a recovery action: the table decides
        gpu.recovery_action = None
    probe = GpuProbe(nvml, xid_healthy_interval_s=HEALTHY_INTERVAL_S, clock=clock)
    probe.sample()
    nvml.raise_xid(1, xid)
    sample = probe.sample()
    assert sample.faults == [f"gpu_xid:{xid}"] and sample.gpus[1].xid_errors == [xid]
    remedy = node_remedy(sample.faults, sample.gpus)
    assert remedy is not None and remedy.action == action, remedy
    assert remedy.reason.startswith(f"XID {xid}: ")
    # a reset goes to the GPU that met it, not its healthy neighbour
    assert remedy.gpus == ([1] if action == "reset_gpu" else [])
    clock.now += HEALTHY_INTERVAL_S + 1
    later = probe.sample().faults
    if action in ("none", "restart"):
        assert later == [], "the GPU is healthy: the XID is forgotten after the interval"
    else:
        assert later == [f"gpu_xid:{xid}"], "only a reset (or a reboot) clears it"


def test_the_drivers_recovery_action_overrides_the_catalogue_on_the_fake_nvml() -> None:
    """A contained ECC error whose driver asks nothing stays the application's (restart);
    an application's fault on a GPU the driver wants rebooted replaces the node."""
    nvml = two_gpus()
    probe = GpuProbe(nvml)
    probe.sample()
    nvml.raise_xid(0, 48)
    nvml.raise_xid(0, 94)
    sample = probe.sample()  # the fake driver reports NVML_GPU_RECOVERY_ACTION_NONE
    assert node_remedy(sample.faults, sample.gpus).action == "restart"  # type: ignore[union-attr]
    nvml.gpus[1].recovery_action = nvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    nvml.raise_xid(1, 13)
    sample = probe.sample()
    assert node_remedy(sample.faults, sample.gpus).action == "replace_node"  # type: ignore[union-attr]
