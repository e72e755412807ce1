"""The detector's host signals, against synthetic event sequences: a degraded host once per
fault set, what is not one (a thermal slowdown), and the evidence a signal carries."""

from __future__ import annotations

import msgspec

from goodput import schemas
from goodput.supervisor.detect.detector import Detector

from .synthetic import (
    JOB,
    at,
    host,
)


def test_degraded_host_once_per_fault_set_then_returned() -> None:
    detector = Detector(JOB)
    xid = schemas.GpuHealth(index=3, uuid="GPU-3", xid_errors=[79])
    first = detector.on_event(host("node1", healthy=False, gpus=[xid]), at(1))
    again = detector.on_event(host("node1", healthy=False, gpus=[xid]), at(2))
    disk = detector.on_event(
        host("node1", healthy=False, gpus=[xid], faults=["disk full: /ckpt"]), at(3)
    )
    back = detector.on_event(host("node1"), at(4))
    assert [(s.signal, s.severity) for s in first] == [("degraded_host", "uncorrectable")]
    assert "gpu3 xid 79" in first[0].detail
    assert again == []
    assert [s.signal for s in disk] == ["degraded_host"] and "disk full" in disk[0].detail
    assert [(s.signal, s.node, s.severity) for s in back] == [("node_returned", "node1", "info")]
    assert detector.on_event(host("node1"), at(5)) == []


def test_a_thermal_slowdown_is_not_a_degraded_host() -> None:
    """Throttling slows the GPU, it does not lose the host: the straggler detector judges it by
    the steps it slows (debounced by its window and hold), the host report raises nothing."""
    detector = Detector(JOB)
    hot = schemas.GpuHealth(
        index=0, uuid="GPU-0", temperature_c=93, throttle_reasons=["sw_thermal"]
    )
    assert (
        detector.on_event(host("node1", healthy=False, gpus=[hot], faults=["thermal"]), at(1)) == []
    )
    # XID 45 is the cleanup after an application ended: nothing either
    cleanup = schemas.GpuHealth(index=1, uuid="GPU-1", xid_errors=[45])
    assert (
        detector.on_event(
            host("node1", healthy=False, gpus=[cleanup], faults=["gpu_xid:45"]), at(2)
        )
        == []
    )
    assert detector.on_event(host("node1"), at(3)) == []


def test_the_drivers_recovery_request_is_news_even_with_the_same_xids() -> None:
    detector = Detector(JOB)
    app = schemas.GpuHealth(index=1, uuid="GPU-1", xid_errors=[13])
    first = detector.on_event(
        host("node1", healthy=False, gpus=[app], faults=["gpu_xid:13"]), at(1)
    )
    assert [s.signal for s in first] == ["degraded_host"]
    reboot = msgspec.structs.replace(app, recovery_action="node_reboot")
    (again,) = detector.on_event(
        host("node1", healthy=False, gpus=[reboot], faults=["gpu_xid:13"]), at(2)
    )
    assert again.gpus == [reboot] and "gpu1 recovery node_reboot" in again.detail


def test_a_host_signal_carries_the_faults_and_unhealthy_gpus_as_evidence() -> None:
    detector = Detector(JOB)
    healthy = schemas.GpuHealth(index=0, uuid="GPU-0")
    xid = schemas.GpuHealth(index=1, uuid="GPU-1", xid_errors=[48])
    (signal,) = detector.on_event(
        host("node1", healthy=False, gpus=[healthy, xid], faults=["gpu_xid:48"]), at(1)
    )
    assert signal.host_faults == ["gpu_xid:48"] and signal.gpus == [xid]
