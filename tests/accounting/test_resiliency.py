"""Logs of the public resiliency goodput calculator (gpu-recipes resiliency_metrics)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from goodput.measure.accounting import ResiliencyEvent, compute_goodput, load_event_log

START = datetime(2025, 9, 27, 4, 0, 0)


def line(minutes: float, event_type: str, step: int | None = None, job: str = "llama") -> str:
    record: dict = {
        "timestamp": (START + timedelta(minutes=minutes)).isoformat(),
        "job_name": job,
        "event_type": event_type,
    }
    if step is not None:
        record["step"] = step
    else:
        record["node_rank"] = 0  # the launcher adds fields the calculator does not need
    return json.dumps(record)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


# The worked example of the resiliency library's guide, in minutes: 200 minutes in all,
# 2 min/step ideal, a crash at 100 that loses the work since the step-50 save at 60.
PRIMER = [
    line(0, "job_started"),
    line(0.5, "job_started"),  # a second node starting: the last start counts
    line(5, "checkpoint_loaded", 25),
    line(60, "checkpoint_saved", 50),
    line(100, "job_terminated"),
    line(115, "job_started"),
    line(120, "checkpoint_loaded", 50),
    line(200, "checkpoint_saved", 75),
    line(200, "job_terminated"),
]


def test_primer_example_with_reference_step_time(tmp_path: Path) -> None:
    events = load_event_log(write(tmp_path / "goodput.log", PRIMER))
    assert all(isinstance(e, ResiliencyEvent) for e in events)
    report = compute_goodput(events, reference_step_time_s=120.0)
    minute = 60.0
    assert report.source == "resiliency"
    assert report.total_s == pytest.approx(200 * minute)
    assert report.productive_s == pytest.approx(100 * minute)  # 50 steps × 2 min
    assert report.goodput_pct == pytest.approx(50.0)
    assert report.badput["wasted_progress"] == pytest.approx(40 * minute)
    assert report.badput["restart_reprovision"] == pytest.approx(15 * minute)
    # job start → checkpoint loaded, twice (the guide's "checkpoint loading")
    assert report.badput["checkpoint_restore"] == pytest.approx(9.5 * minute)
    assert report.badput["program_startup"] == pytest.approx(0.5 * minute)  # nodes coming up
    # work time above the ideal: the guide's slowdown (25) plus inline saves (5 + 5)
    assert report.badput["straggler_slowdown"] == pytest.approx(35 * minute)
    assert report.productive_s + sum(report.badput.values()) == pytest.approx(report.total_s)
    assert report.steps_productive == 50 and report.steps_wasted == 0
    assert report.interruptions == 1
    assert report.failures[0].repair_s == pytest.approx(20 * minute)


def test_without_reference_step_time_kept_work_is_productive(tmp_path: Path) -> None:
    report = compute_goodput(load_event_log(write(tmp_path / "g.log", PRIMER)))
    assert report.productive_s == pytest.approx((55 + 80) * 60.0)
    assert report.badput["straggler_slowdown"] == 0
    assert any("reference step time" in note for note in report.notes)


def test_saved_work_rolled_back_is_wasted(tmp_path: Path) -> None:
    lines = [
        line(-10, "user_scheduled"),
        line(0, "job_started"),
        line(1, "checkpoint_loaded", 0),
        line(11, "checkpoint_saved", 10),
        line(21, "checkpoint_saved", 20),
        line(25, "job_terminated"),
        line(30, "job_started"),
        line(31, "checkpoint_loaded", 10),  # step 20's checkpoint was lost: back to 10
        line(41, "checkpoint_saved", 20),
        line(42, "user_terminated"),
        line(43, "job_terminated"),
        line(50, "job_started"),
        line(51, "checkpoint_loaded", 20),
        line(61, "checkpoint_saved", 30),
        line(61, "job_terminated"),
    ]
    report = compute_goodput(load_event_log(write(tmp_path / "g.log", lines)))
    m = 60.0
    assert report.total_s == pytest.approx(71 * m)
    assert report.productive_s == pytest.approx(30 * m)  # 0→10, 10→20 (rerun), 20→30
    # 11→21 (rolled back), 21→25 and 41→43 (never saved)
    assert report.badput["wasted_progress"] == pytest.approx((10 + 4 + 2) * m)
    assert report.badput["restart_reprovision"] == pytest.approx(5 * m)  # only the crash
    # queued before the first start, and stopped by the user between 43 and 50
    assert report.badput["job_down"] == pytest.approx((10 + 7) * m)
    assert report.badput["checkpoint_restore"] == pytest.approx(3 * m)
    assert report.steps_productive == 30 and report.steps_wasted == 10
    assert report.interruptions == 1  # the user's stop is no failure
    assert report.ettr == pytest.approx(30 / (71 - 17))


def test_jobs_are_kept_apart_and_zones_respected(tmp_path: Path) -> None:
    lines = [
        line(0, "job_started", job="a"),
        line(0, "job_started", job="b"),
        '{"timestamp": "2025-09-27T04:10:00+00:00", "job_name": "a", "event_type": "checkpoint_saved", "step": 5}',
        '{"timestamp": "2025-09-27T06:20:00+02:00", "job_name": "a", "event_type": "job_terminated"}',
        line(30, "job_terminated", job="b"),
    ]
    events = load_event_log(write(tmp_path / "g.log", lines))
    with pytest.raises(ValueError, match="several jobs"):
        compute_goodput(events)
    report = compute_goodput(events, job="a")
    assert report.total_s == pytest.approx(20 * 60.0)
    assert report.start_ts_ns == int(START.replace(tzinfo=UTC).timestamp()) * 10**9


def test_unknown_event_type_is_rejected(tmp_path: Path) -> None:
    from goodput.measure.accounting import EventLogError

    path = write(tmp_path / "g.log", [line(0, "job_started"), line(1, "job_exploded")])
    with pytest.raises(EventLogError, match=r"g\.log:2"):
        load_event_log(path)
    assert len(load_event_log(path, strict=False)) == 1
