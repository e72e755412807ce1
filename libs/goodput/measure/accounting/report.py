"""The goodput report: what the calculator returns and `goodput report --json` prints.

Times are seconds from the start of the job's accounting window (``start_ts_ns``); badput is
keyed by the stable names in :mod:`goodput.measure.accounting.categories`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from goodput.measure.accounting import categories as c

# A report's timeline is for plots and people: it is bounded whatever the log's length, so a
# million-event log gives a JSON report under a megabyte. The figures never come from it.
#: at most this many points in the step series
MAX_STEP_POINTS = 2000
#: at most this many markers (the many of one kind aggregated, with a count)
MAX_MARKERS = 400
#: at most this many spans (stretches shorter than the plot can show merged into a neighbour)
MAX_SPANS = 2000

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
    #: the words the plot writes at the marker (:mod:`goodput.measure.accounting.labels`): a
    #: fault's (``crash rank 1``), a decision's rule (``hot-swap``); "" for none
    label: str = ""
    #: more than 1: this marker stands for ``count`` markers of its kind from ``t_s`` to
    #: ``until_s``, ``detail`` names the first and the last, ``label`` is the first's
    count: int = 1
    until_s: float | None = None


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
    #: the fault in words, as its marker is labelled (the signal the controller acted on)
    fault: str = ""
    #: the rules of the decisions that remedied it, in order (``in-process-restart → hot-swap``)
    remedy: str = ""
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
    # summed, not ``total - job_down``: that difference cancels to rounding noise when the job
    # was down nearly all the time, and ETTR came out above 1 (1.0000000068 for 119 ns up)
    scheduled = productive + sum(v for k, v in badput.items() if k != c.JOB_DOWN)
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
    """At most ``limit`` points: the first and the last, the points where the series turns
    (a step that does not advance — a restart or rollback —, a change between productive and
    wasted, a world-size change; evenly sampled if there are too many of those) and every
    k-th point in between."""
    count = len(points)
    if count <= limit:
        return points
    turning: set[int] = set()
    for index in range(count - 1):
        a, b = points[index], points[index + 1]
        if b.step <= a.step or a.productive != b.productive or a.world_size != b.world_size:
            turning.update((index, index + 1))
    turns = sorted(turning)
    budget = limit // 2
    if len(turns) > budget:
        turns = turns[:: -(-len(turns) // budget)]
    room = limit - len(turns) - 2
    stride = -(-count // room)
    kept = set(range(0, count, stride)) | set(turns) | {count - 1}
    return [points[index] for index in sorted(kept)]


def bound_markers(markers: list[Marker], limit: int = MAX_MARKERS) -> list[Marker]:
    """At most ``limit`` markers, sorted by time. Rare kinds (failures, restarts) are kept
    whole; a kind with more than its share keeps its first and last marker and aggregates
    the runs in between into markers with a count."""
    markers = sorted(markers, key=lambda m: m.t_s)
    if len(markers) <= limit:
        return markers
    by_kind: dict[str, list[Marker]] = {}
    for marker in markers:
        by_kind.setdefault(marker.kind, []).append(marker)
    kept: list[Marker] = []
    room = limit
    for position, group in enumerate(sorted(by_kind.values(), key=len)):
        share = room // (len(by_kind) - position)
        if len(group) > share:
            group = _aggregate(group, max(share, 3))
        kept += group
        room -= len(group)
    return sorted(kept, key=lambda m: m.t_s)


def _aggregate(group: list[Marker], limit: int) -> list[Marker]:
    """The first and last marker, and the ones between in ``limit - 2`` aggregated runs."""
    middle = group[1:-1]
    size = -(-len(middle) // (limit - 2))
    aggregated = []
    for start in range(0, len(middle), size):
        run = middle[start : start + size]
        first, last = run[0], run[-1]
        aggregated.append(
            first
            if len(run) == 1
            else Marker(
                t_s=first.t_s,
                kind=first.kind,
                detail=f"{first.detail} … {last.detail}" if first.detail else "",
                label=first.label,
                count=sum(m.count for m in run),
                until_s=last.until_s if last.until_s is not None else last.t_s,
            )
        )
    return [group[0], *aggregated, group[-1]]


def series_markers(
    kind: MarkerKind,
    times: list[float],
    detail: Callable[[int], str],
    limit: int = MAX_MARKERS // 2,
) -> list[Marker]:
    """Markers of one kind at ``times`` (sorted), ``detail(i)`` naming the i-th, as
    :func:`bound_markers` would keep them, without making a marker for each of millions."""
    count = len(times)
    if count <= limit:
        return [Marker(t_s=t, kind=kind, detail=detail(i)) for i, t in enumerate(times)]
    size = -(-(count - 2) // (limit - 2))
    markers = [Marker(t_s=times[0], kind=kind, detail=detail(0))]
    for start in range(1, count - 1, size):
        last = min(start + size, count - 1) - 1
        if last == start:
            markers.append(Marker(t_s=times[start], kind=kind, detail=detail(start)))
            continue
        markers.append(
            Marker(
                t_s=times[start],
                kind=kind,
                detail=f"{detail(start)} … {detail(last)}",
                count=last - start + 1,
                until_s=times[last],
            )
        )
    markers.append(Marker(t_s=times[-1], kind=kind, detail=detail(count - 1)))
    return markers


def bound_spans(spans: list[Span], limit: int = MAX_SPANS) -> list[Span]:
    """At most ``limit`` spans covering the same window: a span shorter than
    1/``limit`` of the window is merged into the span before it (or after, for the first),
    and neighbours of one category are joined."""
    if len(spans) <= limit:
        return spans
    resolution = (spans[-1].end_s - spans[0].start_s) / (limit - 1)
    merged: list[Span] = []
    for span in spans:
        if merged and (
            merged[-1].category == span.category or span.end_s - span.start_s < resolution
        ):
            merged[-1] = Span(
                start_s=merged[-1].start_s, end_s=span.end_s, category=merged[-1].category
            )
        elif merged and merged[-1].end_s - merged[-1].start_s < resolution:
            merged[-1] = Span(start_s=merged[-1].start_s, end_s=span.end_s, category=span.category)
        else:
            merged.append(span)
    return merged
