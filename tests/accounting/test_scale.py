"""Large logs: the report's timeline stays bounded, and bounding it changes no figure."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import msgspec
import pytest

from goodput.measure.accounting import calculator, compute_goodput, iter_event_log, resiliency
from goodput.measure.accounting.report import (
    MAX_MARKERS,
    MAX_SPANS,
    MAX_STEP_POINTS,
    GoodputReport,
    Marker,
    Span,
    bound_markers,
    bound_spans,
)
from goodput.tools.bench.report import write_logs

#: lines per generated log: enough for every bound to bite, small enough for a unit test
EVENTS = 40_000


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_logs(tmp_path_factory.mktemp("logs"), EVENTS)


def figures(report: GoodputReport) -> dict:
    document = msgspec.to_builtins(report)
    del document["timeline"]
    return document


@pytest.mark.parametrize("source", ["events", "resiliency"])
def test_timeline_is_bounded_and_figures_unchanged(
    logs: dict[str, Path], source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bounded = compute_goodput(iter_event_log(logs[source]))
    timeline = bounded.timeline
    assert len(timeline.steps) <= MAX_STEP_POINTS
    assert len(timeline.markers) <= MAX_MARKERS
    assert len(timeline.spans) <= MAX_SPANS
    assert len(msgspec.json.format(msgspec.json.encode(bounded))) < 1_000_000
    assert {m.kind for m in timeline.markers} >= {"checkpoint", "failure", "restart"}

    # the same report with nothing bounded: the bounding functions replaced by identities
    for module in (calculator, resiliency):
        monkeypatch.setattr(module, "thin", lambda points: points)
        monkeypatch.setattr(
            module, "bound_markers", lambda markers: sorted(markers, key=lambda m: m.t_s)
        )
        monkeypatch.setattr(module, "bound_spans", lambda spans: spans)
    monkeypatch.setattr(
        resiliency,
        "series_markers",
        lambda kind, times, detail: [
            Marker(t_s=t, kind=kind, detail=detail(i)) for i, t in enumerate(times)
        ],
    )
    full = compute_goodput(iter_event_log(logs[source]))
    assert len(full.timeline.steps) > MAX_STEP_POINTS
    assert figures(bounded) == figures(full)
    checkpoints = [m for m in full.timeline.markers if m.kind == "checkpoint"]
    kept = [m for m in timeline.markers if m.kind == "checkpoint"]
    assert sum(m.count for m in kept) == len(checkpoints)  # an aggregate counts what it stands for
    assert kept[0].t_s == checkpoints[0].t_s and kept[-1].t_s == checkpoints[-1].t_s
    assert timeline.spans[0].start_s == full.timeline.spans[0].start_s
    assert timeline.spans[-1].end_s == full.timeline.spans[-1].end_s


def test_rare_markers_are_kept_whole() -> None:
    markers = [Marker(t_s=float(t), kind="checkpoint", detail=f"step {t}") for t in range(5000)]
    markers += [Marker(t_s=t + 0.5, kind="failure") for t in range(0, 5000, 500)]
    kept = bound_markers(markers, limit=100)
    assert len(kept) <= 100
    assert sum(m.kind == "failure" for m in kept) == 10
    assert sum(m.count for m in kept if m.kind == "checkpoint") == 5000
    assert [m.t_s for m in kept] == sorted(m.t_s for m in kept)


def test_spans_keep_covering_the_window() -> None:
    spans = [
        Span(start_s=t, end_s=t + 1.0, category="productive" if t % 3 else "checkpoint_save")
        for t in range(10_000)
    ]
    bounded = bound_spans(spans, limit=50)
    assert len(bounded) <= 50
    assert bounded[0].start_s == 0 and bounded[-1].end_s == 10_000
    assert all(a.end_s == b.start_s for a, b in pairwise(bounded))
