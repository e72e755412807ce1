"""The load generator runs and a healthy job at scale raises nothing (speed is not asserted)."""

from __future__ import annotations

from goodput.supervisor.detect.load import measure_detector


def test_healthy_job_at_scale_raises_nothing() -> None:
    result = measure_detector(nodes=2000, ranks_per_node=2, seconds=8)
    assert result.ranks == 4000 and result.signals == 0
    assert result.heartbeat_us > 0 and result.poll_ms_max >= result.poll_ms_mean
