"""Goodput accounting: how much of a job's wall time made progress that was kept, and where
the rest went (docs/GOODPUT.md defines every figure)."""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterable, Iterator

from goodput import schemas
from goodput.measure.accounting.calculator import compute_events_goodput
from goodput.measure.accounting.categories import BADPUT_CATEGORIES, BADPUT_KEYS, PRODUCTIVE
from goodput.measure.accounting.report import (
    GoodputReport,
    Interruption,
    Marker,
    Span,
    StepPoint,
    Timeline,
)
from goodput.measure.accounting.resiliency import ResiliencyEvent, compute_resiliency_goodput
from goodput.measure.accounting.sources import (
    EventLogError,
    iter_event_log,
    load_event_log,
    replay_from_bus,
    write_event_log,
)


def compute_goodput(
    events: Iterable[schemas.Event] | Iterable[ResiliencyEvent],
    *,
    nominal_world_size: int | None = None,
    job: str | None = None,
    reference_step_time_s: float | None = None,
) -> GoodputReport:
    """The goodput report of one job from its events (either format :func:`iter_event_log`
    yields; read in one pass). ``job`` picks one job when the events hold several;
    ``nominal_world_size`` (default: the largest seen) is what "scaled down" is measured against;
    ``reference_step_time_s`` is the ideal step time for resiliency-calculator logs."""
    stream = iter(events)  # read once: a log's events may stream from its file
    first = next(stream, None)
    if first is None:
        raise ValueError("no events")
    items = itertools.chain([first], stream)
    with _collector_paused():
        if isinstance(first, ResiliencyEvent):
            return compute_resiliency_goodput(
                items,  # type: ignore[arg-type]  # a log is one format: its first event's
                job=job,
                reference_step_time_s=reference_step_time_s,
            )
        return compute_events_goodput(items, job=job, nominal_world_size=nominal_world_size)  # type: ignore[arg-type]  # a log is one format: its first event's


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The accounting makes millions of objects without reference cycles; the cyclic garbage
    collector would rescan them again and again (about a fifth of a large report's time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


__all__ = [
    "BADPUT_CATEGORIES",
    "BADPUT_KEYS",
    "PRODUCTIVE",
    "EventLogError",
    "GoodputReport",
    "Interruption",
    "Marker",
    "ResiliencyEvent",
    "Span",
    "StepPoint",
    "Timeline",
    "compute_goodput",
    "iter_event_log",
    "load_event_log",
    "replay_from_bus",
    "write_event_log",
]
