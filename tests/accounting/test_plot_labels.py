"""The timeline's labels: each fault named, each remediation by its rule, from the events; the
plot thins them so none overprints; the HTML report's interruptions say the same words."""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import msgspec
import pytest

from goodput import schemas
from goodput.measure.accounting import compute_goodput, write_event_log
from goodput.measure.accounting.label_layout import place_labels, with_count
from goodput.measure.accounting.labels import MAX_LABEL_CHARS, SIGNAL_WORDS, fault_label
from goodput.measure.accounting.plots import LABEL_GAP_PX, plot_labels, timeline_png
from tests.accounting.incidents import (
    DECIDE_S,
    DETECT_S,
    JOB,
    THREE,
    Incident,
    at,
    incident_log,
)
from tests.accounting.test_html import png_size
from tests.conftest import goodput_cli

DECIDED = DETECT_S + DECIDE_S


def labelled(events: list[schemas.Event]) -> list[tuple[str, float, str]]:
    report = compute_goodput(events)
    return [(m.kind, round(m.t_s, 3), m.label) for m in report.timeline.markers if m.label]


def test_each_fault_and_its_remediation_are_labelled_where_they_happened() -> None:
    events = incident_log(THREE, 110.0)
    # the controller's own tuning and a decision to do nothing remedy nothing: no label
    events += [
        schemas.Decision(
            job=JOB,
            ts=at(30),
            signal_id="",
            policy="builtin",
            rule="checkpoint-interval",
            reason="Young's interval moved",
            command_ids=["interval-1"],
        ),
        schemas.Decision(
            job=JOB,
            ts=at(40),
            signal_id="sig-quiet",
            policy="builtin",
            rule="straggler-tolerated",
            reason="slow training costs least",
        ),
    ]
    assert labelled(events) == [
        ("failure", 20.0, "crash rank 1"),
        ("decision", 20.0 + DECIDED, "in-process-restart"),
        ("failure", 50.0, "node lost n1"),
        ("decision", 50.0 + DECIDED, "hot-swap"),
        ("failure", 80.0, "NaN/Inf"),
        ("decision", 80.0 + DECIDED, "numerical-rollback"),
    ]
    report = compute_goodput(events)
    assert [(f.fault_s, f.fault, f.remedy) for f in report.failures] == [
        (20.0, "crash rank 1", "in-process-restart"),
        (50.0, "node lost n1", "hot-swap"),
        (80.0, "NaN/Inf", "numerical-rollback"),
    ]
    # the labels travel in the JSON report
    decoded = msgspec.json.decode(msgspec.json.encode(report))
    assert decoded["failures"][1]["fault"] == "node lost n1"
    assert {"kind": "decision", "label": "hot-swap"}.items() <= next(
        m for m in decoded["timeline"]["markers"] if m.get("label") == "hot-swap"
    ).items()


def test_the_signal_the_controller_answered_names_the_interruption() -> None:
    """A lost node's rank is seen crashing before its node is seen lost; the controller
    answers the loss, and so does the label (the table's signals list both)."""
    lost = Incident(
        30.0, {"signal": "missed_heartbeat", "node": "n1", "severity": "uncorrectable"}, "hot-swap"
    )
    events = incident_log([lost], 60.0)
    events.append(
        schemas.Signal(
            job=JOB,
            ts=at(30.5),
            signal_id="sig-crash-first",
            signal="crash",
            node="n1",
            rank=1,
            observed_ts=at(30.0),
        )
    )
    (failure,) = compute_goodput(events).failures
    assert (failure.fault, failure.remedy) == ("node lost n1", "hot-swap")
    assert failure.cause == "crash, missed_heartbeat"


def test_every_signal_kind_has_words_and_forged_text_stays_one_short_line() -> None:
    assert set(SIGNAL_WORDS) == set(schemas.SignalKind.__args__)  # type: ignore[attr-defined]
    words = {
        kind: fault_label(schemas.Signal(job=JOB, ts=1, signal=kind, node="n7", rank=3))
        for kind in SIGNAL_WORDS
    }
    assert words["crash"] == "crash rank 3" and words["hang"] == "hang rank 3"
    assert words["replica_mismatch"] == "SDC (replica mismatch)"
    assert words["loss_spike"] == "loss spike" and words["straggler"] == "straggler n7"
    oom = schemas.Signal(job=JOB, ts=1, signal="crash", rank_fault="cuda-oom")
    assert fault_label(oom) == "GPU OOM (all ranks)"
    # a rule is free text from the bus: cut to one printable line, and drawn as text, not TeX
    forged = Incident(
        20.0, {"signal": "crash", "node": "n1", "rank": 1}, "$\\frac{1}{$ \x1b[31m\n" + "x" * 90
    )
    report = compute_goodput(incident_log([forged], 40.0))
    (rule,) = [m.label for m in report.timeline.markers if m.kind == "decision"]
    assert len(rule) == MAX_LABEL_CHARS and rule.isprintable() and rule.endswith("…")
    png_size(timeline_png(report))


def test_fifty_close_labels_thin_to_one_per_lane_per_gap_and_count_the_rest() -> None:
    xs = [0.5 * i for i in range(50)]  # 50 markers in 25 pixels
    placed = place_labels(xs, gap_px=10.0, lanes=2)
    assert [(p.position, p.lane, p.others) for p in placed] == [
        (0, 0, 0),
        (1, 1, 18),
        (20, 0, 0),
        (21, 1, 18),
        (40, 0, 0),
        (41, 1, 8),
    ]
    assert with_count("hot-swap", 18) == "hot-swap +18" and with_count("hang", 0) == "hang"


@pytest.mark.parametrize("seed", range(5))
def test_thinning_never_overprints_and_loses_no_marker(seed: int) -> None:
    rng = random.Random(seed)
    xs = sorted(rng.uniform(0, 900) for _ in range(rng.randint(1, 400)))
    counts = [rng.choice((1, 1, 1, 5)) for _ in xs]  # some markers aggregate several
    placed = place_labels(xs, gap_px=19.5, lanes=2, counts=counts)
    for lane in (0, 1):
        drawn = [xs[p.position] for p in placed if p.lane == lane]
        assert all(b - a >= 19.5 for a, b in pairwise(drawn))
    assert sum(1 + p.others for p in placed) == sum(counts)
    assert len(placed) <= 2 * (900 // 19.5 + 1)


def test_a_long_runs_labels_are_thinned_on_the_plot() -> None:
    kinds = [("crash", "in-process-restart"), ("hang", "standby-restart")]
    many = [
        Incident(
            10.0 + 11 * i, {"signal": kinds[i % 2][0], "node": "n1", "rank": 1}, kinds[i % 2][1]
        )
        for i in range(300)
    ]
    report = compute_goodput(incident_log(many, 10.0 + 11 * 300 + 5))
    markers = [m for m in report.timeline.markers if m.label]
    labels, heights = plot_labels(report, 930.0)
    assert len(labels) <= 2 * (930 // LABEL_GAP_PX + 1) < len(markers)
    assert sum(1 + label.others for label in labels) == sum(m.count for m in markers) == 600
    assert len(heights) == 2 and all(label.others for label in labels[1:-1])
    assert all(label.text.endswith(f" +{label.others}") for label in labels if label.others)
    png_size(timeline_png(report))


def test_the_html_report_names_faults_and_remediations_as_the_plot_does(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    write_event_log(log, incident_log(THREE, 110.0))
    goodput_cli("report", "--events", str(log), "--html", str(tmp_path / "html"))
    page = (tmp_path / "html" / "report.html").read_text()
    table = page[page.index("<h2>Interruptions</h2>") :]
    for fault, remedy in (
        ("crash rank 1", "in-process-restart"),
        ("node lost n1", "hot-swap"),
        ("NaN/Inf", "numerical-rollback"),
    ):
        assert f"<td>{fault}</td><td>{remedy}</td>" in table
    labelled_png = (tmp_path / "html" / "timeline.png").read_bytes()
    bare = compute_goodput(incident_log(THREE, 110.0))
    bare.timeline.markers = [msgspec.structs.replace(m, label="") for m in bare.timeline.markers]
    # the labels stand above the plot: the image is taller by them
    assert png_size(labelled_png)[1] > png_size(timeline_png(bare))[1] + 50
