"""The goodput report: what the calculator returns and `goodput report --json` prints.

Times are seconds from the start of the job's accounting window (``start_ts_ns``); badput is
keyed by the stable names in :mod:`goodput.accounting.categories`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from goodput.accounting import categories as c

#: the step series in a report is thinned to about this many points (plots need no more)
MAX_STEP_POINTS = 5000

MarkerKind = Literal[
    "failure", "detected", "decision", "restart", "checkpoint", "restore", "scale", "straggler"
]


class StepPoint(msgspec.Struct, frozen=True, kw_only=True):
    t_s: float
    step: int
    #: False when this execution of the step was later thrown away (re-run after a restore)
    productive: bool
    world_size: int = 0


class Marker(msgspec.Struct, frozen=True, kw_only=True):
    t_s: float
    kind: MarkerKind
    detail: str = ""


class Span(msgspec.Struct, frozen=True, kw_only=True):
    """A stretch of wall time and the category that owns it (``productive`` for work kept)."""

    start_s: float
    end_s: float
    category: str


class Timeline(msgspec.Struct, kw_only=True):
    steps: list[StepPoint] = msgspec.field(default_factory=list)
    markers: list[Marker] = msgspec.field(default_factory=list)
    spans: list[Span] = msgspec.field(default_factory=list)


class Interruption(msgspec.Struct, frozen=True, kw_only=True):
    """One failure that stopped progress, and its milestones (seconds; None = not observed)."""

    fault_s: float
    cause: str
    detected_s: float | None = None
    decided_s: float | None = None
    restarted_s: float | None = None
    #: when the first step after the failure completed (training resumed)
    resumed_s: float | None = None
    #: ``resumed_s - fault_s``: the time to repair that MTTR averages
    repair_s: float | None = None


class GoodputReport(msgspec.Struct, kw_only=True):
    job: str
    #: "events" (goodput's own events) or "resiliency" (the resiliency calculator's log)
    source: Literal["events", "resiliency"]
    start_ts_ns: int
    end_ts_ns: int
    total_s: float
    productive_s: float
    goodput_pct: float
    badput: dict[str, float]
    #: effective training time ratio: productive / (total − job down)
    ettr: float
    mtbf_s: float | None
    mttr_s: float | None
    interruptions: int
    failures: list[Interruption]
    steps_productive: int
    steps_wasted: int
    nominal_world_size: int
    #: median duration of a healthy step at each world size ("ideal" step time)
    healthy_step_time_s: dict[int, float]
    timeline: Timeline
    notes: list[str] = msgspec.field(default_factory=list)


def summarize(
    *,
    job: str,
    source: Literal["events", "resiliency"],
    start_ts_ns: int,
    end_ts_ns: int,
    totals: dict[str, float],
    failures: list[Interruption],
    uptime_s: float,
    steps_productive: int,
    steps_wasted: int,
    nominal_world_size: int,
    healthy_step_time_s: dict[int, float],
    timeline: Timeline,
    notes: list[str],
) -> GoodputReport:
    """Derive the headline figures from per-category totals (which must cover the window)."""
    productive = totals.get(c.PRODUCTIVE, 0.0)
    badput = {key: totals.get(key, 0.0) for key in c.BADPUT_KEYS}
    total = productive + sum(badput.values())
    scheduled = total - badput[c.JOB_DOWN]
    repairs = [f.repair_s for f in failures if f.repair_s is not None]
    return GoodputReport(
        job=job,
        source=source,
        start_ts_ns=start_ts_ns,
        end_ts_ns=end_ts_ns,
        total_s=total,
        productive_s=productive,
        goodput_pct=100.0 * productive / total if total > 0 else 0.0,
        badput=badput,
        ettr=productive / scheduled if scheduled > 0 else 0.0,
        mtbf_s=uptime_s / len(failures) if failures else None,
        mttr_s=sum(repairs) / len(repairs) if repairs else None,
        interruptions=len(failures),
        failures=failures,
        steps_productive=steps_productive,
        steps_wasted=steps_wasted,
        nominal_world_size=nominal_world_size,
        healthy_step_time_s=healthy_step_time_s,
        timeline=timeline,
        notes=notes,
    )


def thin(points: list[StepPoint], limit: int = MAX_STEP_POINTS) -> list[StepPoint]:
    """Keep about ``limit`` points: every k-th one, plus every point where the series turns
    (a restart, a change from productive to wasted, a world-size change)."""
    if len(points) <= limit:
        return points
    stride = -(-len(points) // limit)
    kept = []
    for index, point in enumerate(points):
        previous = points[index - 1] if index else None
        following = points[index + 1] if index + 1 < len(points) else None
        turning = any(
            other is not None
            and (
                other.productive != point.productive
                or other.world_size != point.world_size
                or abs(other.step - point.step) != 1
            )
            for other in (previous, following)
        )
        if index % stride == 0 or turning or following is None:
            kept.append(point)
    return kept
