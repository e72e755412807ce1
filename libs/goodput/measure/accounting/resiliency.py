"""Goodput from the event log of the public resiliency goodput calculator (gpu-recipes).

That log has one JSON object per line — ``timestamp`` (ISO 8601), ``job_name``,
``event_type`` (``user_scheduled``, ``job_started``, ``checkpoint_loaded``,
``checkpoint_saved``, ``user_terminated``, ``job_terminated``) and ``step`` for checkpoint
events. It has no per-step events, so progress is measured between checkpoints: the work
from one checkpoint to the next is kept unless a later load rolls back past it, and the work
after a run's last checkpoint is lost. The same partition engine as for goodput's own events
makes the categories add up; docs/GOODPUT.md says which category each stretch lands in.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Literal

import msgspec

from goodput.measure.accounting import categories as c
from goodput.measure.accounting.intervals import WORK, Claim, Piece, partition
from goodput.measure.accounting.report import (
    GoodputReport,
    Interruption,
    Marker,
    Span,
    StepPoint,
    Timeline,
    bound_markers,
    bound_spans,
    series_markers,
    summarize,
    thin,
)
from goodput.measure.accounting.rollbacks import Work, kept

USER_SCHEDULED = "user_scheduled"
JOB_STARTED = "job_started"
CHECKPOINT_LOADED = "checkpoint_loaded"
CHECKPOINT_SAVED = "checkpoint_saved"
USER_TERMINATED = "user_terminated"
JOB_TERMINATED = "job_terminated"
#: the words on the plot for a run that ended without the user asking (the log says no more)
TERMINATED_LABEL = "job terminated"

ResiliencyEventType = Literal[
    "user_scheduled",
    "job_started",
    "checkpoint_loaded",
    "checkpoint_saved",
    "user_terminated",
    "job_terminated",
]

#: order of events logged in the same instant (the resiliency calculator's own order)
_SAME_INSTANT_ORDER = {
    USER_SCHEDULED: 0,
    JOB_STARTED: 1,
    CHECKPOINT_LOADED: 2,
    CHECKPOINT_SAVED: 3,
    USER_TERMINATED: 4,
    JOB_TERMINATED: 5,
}


class ResiliencyEvent(msgspec.Struct, kw_only=True):
    """One line of a resiliency-calculator log; other fields (``node_rank``…) are ignored."""

    timestamp: datetime
    event_type: ResiliencyEventType
    job_name: str = ""
    step: int | None = None

    @property
    def ts_ns(self) -> int:
        """Epoch ns; a timestamp without a zone (the tracker writes local time) is read as UTC."""
        moment = self.timestamp
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1_000_000) * 1000


#: a record reduced to what the accounting reads: (ts_ns, same-instant order, event type, step)
_Record = tuple[int, int, str, int | None]
_instant = itemgetter(0, 1)


@dataclass(slots=True)
class _Run:
    #: the first node's start; the run starts when the last node has started
    launched: float
    start: float
    end: float | None = None
    #: (time, step, event type) of the checkpoint loads and saves inside the run
    marks: list[tuple[float, int, str]] = field(default_factory=list)
    user_stopped: bool = False


@dataclass(slots=True)
class _Segment:
    """Work between two checkpoint marks of a run: steps ``(first_step - 1, last_step]``."""

    start: float
    end: float
    first_step: int
    last_step: int
    productive: bool = True
    kept: float = 0.0

    @property
    def steps(self) -> int:
        return max(0, self.last_step - self.first_step + 1)


def _stretches(segments: list[_Segment]) -> list[tuple[int, int]]:
    """(first, last) indices of runs of back-to-back segments that were all kept or all thrown
    away: one work claim each instead of one per segment, for logs of a million checkpoints."""
    stretches: list[tuple[int, int]] = []
    first = 0
    for index in range(1, len(segments) + 1):
        if (
            index == len(segments)
            or segments[index].start != segments[index - 1].end
            or segments[index].productive != segments[first].productive
        ):
            stretches.append((first, index - 1))
            first = index
    return stretches


def _share(segments: list[_Segment], pieces: list[Piece]) -> None:
    """Give each segment of a stretch what the partition left to the stretch inside it."""
    at = 0
    for segment in segments:
        while at < len(pieces) and pieces[at].end <= segment.start:
            at += 1
        index = at
        while index < len(pieces) and pieces[index].start < segment.end:
            piece = pieces[index]
            segment.kept += min(segment.end, piece.end) - max(segment.start, piece.start)
            index += 1


def _prepare(records: Iterable[ResiliencyEvent], job: str | None) -> tuple[str, list[_Record]]:
    """The records of ``job`` (or of the only job present) as compact tuples, in log order,
    read in one pass."""
    by_job: dict[str, list[_Record]] = defaultdict(list)
    seen: set[str] = set()
    for record in records:
        if not isinstance(record, ResiliencyEvent):
            raise ValueError("mixed goodput events and resiliency-calculator records")
        if job is not None and record.job_name != job:
            seen.add(record.job_name)
            continue
        kind = record.event_type
        by_job[record.job_name].append((record.ts_ns, _SAME_INSTANT_ORDER[kind], kind, record.step))
    jobs = sorted(seen | set(by_job))
    if job is None:
        if len(jobs) > 1:
            raise ValueError(f"events of several jobs ({', '.join(jobs)}): choose one with job=")
        job = jobs[0] if jobs else ""
    chosen = by_job.get(job)
    if not chosen:
        raise ValueError(f"no events for job {job!r} (found: {', '.join(jobs)})")
    chosen.sort(key=_instant)
    # several nodes log the same termination: the last one ends the run
    deduplicated: list[_Record] = []
    for entry in chosen:
        if deduplicated and entry[2] == JOB_TERMINATED and deduplicated[-1][2] == JOB_TERMINATED:
            deduplicated.pop()
        deduplicated.append(entry)
    return job, deduplicated


def _runs(records: list[_Record], sec) -> list[_Run]:
    runs: list[_Run] = []
    current: _Run | None = None
    for ts_ns, _, kind, step in records:
        t = sec(ts_ns)
        if kind == JOB_STARTED:
            if current is not None and current.end is None and not current.marks:
                current.start = t  # another node of the same start: up when the last one is
                continue
            if current is not None and current.end is None:
                current.end = t
            current = _Run(launched=t, start=t)
            runs.append(current)
        elif kind in (CHECKPOINT_LOADED, CHECKPOINT_SAVED):
            if current is None or current.end is not None:
                resumed = current.end if current and current.end is not None else 0.0
                current = _Run(launched=resumed, start=resumed)
                runs.append(current)
            current.marks.append((t, step or 0, kind))
        elif kind == USER_TERMINATED and current is not None and current.end is None:
            current.user_stopped = True  # the job_terminated that follows closes the run
        elif kind == JOB_TERMINATED and current is not None and current.end is None:
            current.end = t
    end = sec(records[-1][0])
    for run in runs:
        if run.end is None:
            run.end = end
    return runs


def compute_resiliency_goodput(
    records: Iterable[ResiliencyEvent],
    *,
    job: str | None = None,
    reference_step_time_s: float | None = None,
) -> GoodputReport:
    """Goodput of one job from a resiliency-calculator log.

    Without ``reference_step_time_s`` all checkpointed work that was kept counts as productive;
    with it, only ``steps × reference_step_time_s`` does and the rest of that work time is
    slowdown (this format cannot tell a slow step from an inline checkpoint save).
    """
    job_name, chosen = _prepare(records, job)
    t0 = chosen[0][0]

    def sec(ts_ns: int) -> float:
        return (ts_ns - t0) / 1e9

    end_ts_ns = chosen[-1][0]
    end = sec(end_ts_ns)
    runs = _runs(chosen, sec)
    del chosen  # the runs hold what is needed; a million records need not stay in memory
    claims: list[Claim] = []
    segments: list[_Segment] = []
    rollbacks: list[tuple[float, int]] = []
    failures: list[Interruption] = []
    markers: list[Marker] = []
    saved_so_far = 0
    for index, run in enumerate(runs):
        assert run.end is not None
        if index:
            markers.append(Marker(t_s=run.start, kind="restart"))
        claims.append(Claim(run.launched, run.start, c.PROGRAM_STARTUP, c.PROGRAM_STARTUP))
        last_t, last_step = run.start, saved_so_far
        for t, step, kind in run.marks:
            if kind == CHECKPOINT_LOADED:
                claims.append(Claim(last_t, t, c.CHECKPOINT_RESTORE, c.CHECKPOINT_RESTORE))
                rollbacks.append((t, step + 1))
                markers.append(Marker(t_s=t, kind="restore", detail=f"step {step}"))
            else:
                segments.append(
                    _Segment(start=last_t, end=t, first_step=last_step + 1, last_step=step)
                )
                saved_so_far = max(saved_so_far, step)
            last_t, last_step = t, step
        # work after the run's last checkpoint was never saved: it is lost
        claims.append(Claim(last_t, run.end, c.WASTED_PROGRESS, c.WASTED_PROGRESS))
        following = runs[index + 1] if index + 1 < len(runs) else None
        if following is None:
            continue
        if not run.user_stopped:
            claims.append(Claim(run.end, following.launched, c.RESTART, c.RESTART))
            resumed = next(
                (t for t, _, k in following.marks if k == CHECKPOINT_LOADED), following.start
            )
            failures.append(
                Interruption(
                    fault_s=run.end,
                    cause=JOB_TERMINATED,
                    fault=TERMINATED_LABEL,
                    restarted_s=following.start,
                    resumed_s=resumed,
                    repair_s=resumed - run.end,
                )
            )
            markers.append(
                Marker(t_s=run.end, kind="failure", detail=JOB_TERMINATED, label=TERMINATED_LABEL)
            )
        run.marks = []  # read by the previous run's turn (resumed), not needed any more

    _mark_thrown_away(segments, rollbacks)
    stretches = _stretches(segments)
    claims += [
        Claim(segments[first].start, segments[last].end, WORK, index)
        for index, (first, last) in enumerate(stretches)
    ]
    pieces = partition(claims, 0.0, end)
    totals: dict[str, float] = defaultdict(float)
    worked: list[list[Piece]] = [[] for _ in stretches]
    for piece in pieces:
        if piece.kind == WORK:
            worked[piece.execution].append(piece)
        else:
            totals[piece.kind] += piece.length
    for (first, last), kept_pieces in zip(stretches, worked, strict=True):
        _share(segments[first : last + 1], kept_pieces)
    for segment in segments:
        if not segment.productive:
            totals[c.WASTED_PROGRESS] += segment.kept
            continue
        ideal = segment.kept
        if reference_step_time_s is not None:
            ideal = min(segment.kept, segment.steps * reference_step_time_s)
        totals[c.PRODUCTIVE] += ideal
        totals[c.STRAGGLER] += segment.kept - ideal

    per_step = [s.kept / s.steps for s in segments if s.productive and s.steps]
    step_time = reference_step_time_s or (statistics.median(per_step) if per_step else None)
    notes = ["resiliency-calculator log: progress is measured between checkpoints"]
    if reference_step_time_s is None:
        notes.append(
            "no reference step time: kept checkpoint-to-checkpoint time counts as productive"
        )
    spans: list[Span] = []
    for piece in pieces:
        category = piece.kind
        if piece.kind == WORK:
            kept = segments[stretches[piece.execution][0]].productive
            category = c.PRODUCTIVE if kept else c.WASTED_PROGRESS
        if spans and spans[-1].category == category:
            spans[-1] = Span(start_s=spans[-1].start_s, end_s=piece.end, category=category)
        else:
            spans.append(Span(start_s=piece.start, end_s=piece.end, category=category))
    points = sorted(
        [StepPoint(t_s=s.end, step=s.last_step, productive=s.productive) for s in segments]
        + [StepPoint(t_s=t, step=next_step - 1, productive=True) for t, next_step in rollbacks],
        key=lambda p: p.t_s,
    )
    return summarize(
        job=job_name,
        source="resiliency",
        start_ts_ns=t0,
        end_ts_ns=end_ts_ns,
        totals=dict(totals),
        failures=failures,
        uptime_s=sum(run.end - run.start for run in runs if run.end is not None),
        steps_productive=sum(s.steps for s in segments if s.productive),
        steps_wasted=sum(s.steps for s in segments if not s.productive),
        nominal_world_size=0,
        healthy_step_time_s={0: step_time} if step_time is not None else {},
        timeline=Timeline(
            steps=thin(points),
            markers=bound_markers(
                markers
                + series_markers(
                    "checkpoint",
                    [s.end for s in segments],
                    lambda index: f"step {segments[index].last_step}",
                )
            ),
            spans=bound_spans(spans),
        ),
        notes=notes,
    )


def _mark_thrown_away(segments: list[_Segment], rollbacks: list[tuple[float, int]]) -> None:
    work = [Work(s.end, s.first_step, s.last_step) for s in segments]
    for segment, was_kept in zip(segments, kept(work, rollbacks), strict=True):
        segment.productive = was_kept
