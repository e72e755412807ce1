"""The report's charts as PNG bytes (matplotlib, Agg canvas: no display, no global backend)."""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.typing import LineStyleType

from goodput.measure.accounting import categories as c
from goodput.measure.accounting.report import GoodputReport

COLORS: dict[str, str] = {
    c.PRODUCTIVE: "#2ca02c",
    c.CHECKPOINT_SAVE: "#1f77b4",
    c.WASTED_PROGRESS: "#d62728",
    c.NUMERICAL_ROLLBACK: "#ff9896",
    c.FAILURE_DETECTION: "#ff7f0e",
    c.DECISION: "#e377c2",
    c.RESTART: "#8c564b",
    c.CHECKPOINT_RESTORE: "#17becf",
    c.PROGRAM_STARTUP: "#bcbd22",
    c.STRAGGLER: "#9467bd",
    c.SCALED_DOWN: "#aec7e8",
    c.JOB_DOWN: "#7f7f7f",
}

MARKER_STYLES: dict[str, tuple[str, LineStyleType]] = {
    "failure": ("#d62728", "-"),
    "restart": ("#8c564b", "--"),
    "checkpoint": ("#1f77b4", ":"),
    "restore": ("#17becf", "-."),
    "scale": ("#ff7f0e", "-"),
    "straggler": ("#9467bd", "--"),
}

_DPI = 100


def _time_unit(total_s: float) -> tuple[float, str]:
    if total_s >= 7200:
        return 3600.0, "hours"
    if total_s >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI, bbox_inches="tight")
    return buffer.getvalue()


def timeline_png(report: GoodputReport) -> bytes:
    """Steps over wall time (kept and thrown-away executions), events marked, and a band
    showing which category owned each stretch of time."""
    scale, unit = _time_unit(report.total_s)
    figure = Figure(figsize=(12, 6))
    steps_axis, band_axis = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [5, 1]}
    )
    kept = [p for p in report.timeline.steps if p.productive]
    lost = [p for p in report.timeline.steps if not p.productive]
    steps_axis.scatter(
        [p.t_s / scale for p in kept],
        [p.step for p in kept],
        s=6,
        color=COLORS[c.PRODUCTIVE],
        label="step kept",
    )
    steps_axis.scatter(
        [p.t_s / scale for p in lost],
        [p.step for p in lost],
        s=6,
        color=COLORS[c.WASTED_PROGRESS],
        label="step thrown away",
    )
    handles: list[Line2D | Patch] = [
        Line2D([], [], marker="o", linestyle="", color=COLORS[c.PRODUCTIVE], label="step kept"),
        Line2D(
            [],
            [],
            marker="o",
            linestyle="",
            color=COLORS[c.WASTED_PROGRESS],
            label="step thrown away",
        ),
    ]
    shown = set()
    for marker in report.timeline.markers:
        if marker.kind not in MARKER_STYLES:
            continue
        color, style = MARKER_STYLES[marker.kind]
        steps_axis.axvline(
            marker.t_s / scale, color=color, linestyle=style, linewidth=0.9, alpha=0.8
        )
        if marker.kind not in shown:
            shown.add(marker.kind)
            handles.append(Line2D([], [], color=color, linestyle=style, label=marker.kind))
    steps_axis.set_ylabel("step")
    steps_axis.set_title(f"job {report.job}: goodput {report.goodput_pct:.1f} %")
    steps_axis.legend(handles=handles, loc="upper left", fontsize="small")
    steps_axis.grid(alpha=0.3)

    for span in report.timeline.spans:
        band_axis.broken_barh(
            [(span.start_s / scale, (span.end_s - span.start_s) / scale)],
            (0, 1),
            color=COLORS.get(span.category, "#000000"),
        )
    present = sorted({span.category for span in report.timeline.spans}, key=list(COLORS).index)
    band_axis.legend(
        handles=[Patch(color=COLORS[key], label=c.TITLES[key]) for key in present],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.6),
        ncol=4,
        fontsize="small",
    )
    band_axis.set_yticks([])
    band_axis.set_xlim(0, report.total_s / scale)
    band_axis.set_xlabel(f"wall time ({unit})")
    return _png(figure)


def breakdown_png(report: GoodputReport) -> bytes:
    """Horizontal bars: productive time and each badput category, in time and share."""
    scale, unit = _time_unit(report.total_s)
    keys = [c.PRODUCTIVE, *c.BADPUT_KEYS]
    values = [report.productive_s, *(report.badput.get(key, 0.0) for key in c.BADPUT_KEYS)]
    figure = Figure(figsize=(10, 5))
    axis = figure.subplots()
    positions = range(len(keys))[::-1]
    bars = axis.barh(
        list(positions), [v / scale for v in values], color=[COLORS[key] for key in keys]
    )
    axis.set_yticks(list(positions), [c.TITLES[key] for key in keys])
    for bar, value in zip(bars, values, strict=True):
        share = 100.0 * value / report.total_s if report.total_s else 0.0
        axis.annotate(
            f" {share:.1f} %",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            va="center",
            fontsize="small",
        )
    axis.set_xlabel(f"time ({unit})")
    axis.set_title(f"where the time went — {report.total_s / scale:.2f} {unit} in all")
    axis.margins(x=0.15)
    axis.grid(axis="x", alpha=0.3)
    return _png(figure)
