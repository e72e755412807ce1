"""One job's events, read in one pass and kept compact enough for millions of events.

Every rank reports every step (a node's ranks in one rollup, taken apart here by
``schemas.expand_steps``: the calculator sees the same ``StepDone`` records either way), but
the calculator follows one reference rank (the lowest
that reports steps). The other ranks' steps only widen the accounting window and tell the
largest world size, so they are folded into a few numbers as they stream by instead of being
kept: memory grows with the reference rank's steps, not with the world size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from goodput import schemas

_EVENT_TYPES = frozenset(schemas.EVENT_TYPES)
_ts = attrgetter("ts")


def earliest_ns(event: schemas.Event) -> int:
    """When the event's story began (a step began before it was reported done)."""
    if type(event) is schemas.StepDone:
        return event.ts - int(max(event.step_time_s, 0.0) * 1e9)
    if type(event) is schemas.CheckpointRestored:
        return event.ts - int(max(event.duration_s, 0.0) * 1e9)
    if type(event) is schemas.CheckpointSaved:
        return event.ts - int(max(event.stall_s, 0.0) * 1e9)
    if type(event) is schemas.Signal and event.observed_ts:
        return min(event.ts, event.observed_ts)
    return event.ts


@dataclass(slots=True)
class SelectedJob:
    """A job's events, oldest first, with the steps of ranks above ``step_rank`` folded."""

    job: str
    events: list[schemas.Event] = field(default_factory=list)
    #: the lowest rank that reported a step (None: no steps)
    step_rank: int | None = None
    #: over every rank's steps: the earliest start, the latest report, the largest world size
    steps_from_ns: int | None = None
    steps_to_ns: int | None = None
    steps_world_size: int = 0

    def add(self, event: schemas.Event) -> None:
        if type(event) is not schemas.StepDone:
            if not (type(event) is schemas.CheckpointRestored and event.rank < 0):
                self.events.append(event)  # a tier filling a node's volume is not training
            return
        start = earliest_ns(event)
        if self.steps_from_ns is None or start < self.steps_from_ns:
            self.steps_from_ns = start
        if self.steps_to_ns is None or event.ts > self.steps_to_ns:
            self.steps_to_ns = event.ts
        if event.world_size > self.steps_world_size:
            self.steps_world_size = event.world_size
        if self.step_rank is None or event.rank < self.step_rank:
            if self.step_rank is not None:  # a lower rank: the steps kept so far are not its
                self.events = [e for e in self.events if type(e) is not schemas.StepDone]
            self.step_rank = event.rank
        if event.rank == self.step_rank:
            self.events.append(event)

    def sort(self) -> None:
        """Oldest first; ties in ts are broken by content, so arrival order never matters."""
        events = self.events
        events.sort(key=_ts)
        start = 0
        for index in range(1, len(events) + 1):
            if index == len(events) or events[index].ts != events[start].ts:
                if index - start > 1:
                    events[start:index] = sorted(events[start:index], key=schemas.encode)
                start = index


def select_job(events: Iterable[schemas.Event], job: str | None) -> SelectedJob:
    """The events of ``job`` (or of the only job present), in one pass over ``events``."""
    by_job: dict[str, SelectedJob] = {}
    seen: set[str] = set()
    for event in events:
        if type(event) not in _EVENT_TYPES:
            raise ValueError("mixed goodput events and resiliency-calculator records")
        name = event.job
        if job is not None and name != job:
            seen.add(name)
            continue
        chosen = by_job.get(name)
        if chosen is None:
            chosen = by_job[name] = SelectedJob(name)
        for each in schemas.expand_steps(event):  # a node's rollup: its ranks' steps
            chosen.add(each)
    jobs = sorted(seen | set(by_job))
    if job is None and len(by_job) > 1:
        raise ValueError(f"events of several jobs ({', '.join(jobs)}): choose one with job=")
    selected = by_job.get(job if job is not None else (jobs[0] if jobs else ""))
    if selected is None or not (selected.events or selected.step_rank is not None):
        name = job if job is not None else ""
        raise ValueError(
            f"no events for job {name!r}" + (f" (found: {', '.join(jobs)})" if jobs else "")
        )
    selected.sort()
    return selected
