"""The report's charts as PNG bytes (matplotlib, Agg canvas: no display, no global backend)."""

from __future__ import annotations

import io
from typing import NamedTuple

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.textpath import TextToPath
from matplotlib.typing import LineStyleType

from goodput.measure.accounting import categories as c
from goodput.measure.accounting.label_layout import place_labels, with_count
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

#: each marker kind's line (colour, style) and its words in the legend
MARKER_STYLES: dict[str, tuple[str, LineStyleType, str]] = {
    "failure": ("#d62728", "-", "fault"),
    "detected": ("#ff7f0e", ":", "fault detected"),
    "decision": ("#8e1b6b", "-", "remediation (the rule chosen)"),
    "restart": ("#8c564b", "--", "restart"),
    "checkpoint": ("#1f77b4", ":", "checkpoint"),
    "restore": ("#17becf", "-.", "restore"),
    "scale": ("#ff7f0e", "-", "scale"),
    "straggler": ("#9467bd", "--", "straggler"),
}

_DPI = 100
#: the labels' size (points) and lanes; at most one label per lane in two text lines' width
#: (a rotated label is one line wide, the second is air)
_LABEL_POINTS = 7.5
_LABEL_LANES = 2
LABEL_GAP_PX = 2 * 1.3 * _LABEL_POINTS * _DPI / 72
#: the room between a lane's longest label and the next lane (points)
_LANE_PAD_POINTS = 12.0
#: measures a label's length in its font, so that each lane is as tall as its longest label
_TEXT = TextToPath()


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


class PlotLabel(NamedTuple):
    """A label as the timeline draws it."""

    t_s: float
    kind: str
    #: the marker's label, with ``+others`` when it stands for more
    text: str
    lane: int
    others: int


def plot_labels(report: GoodputReport, width_px: float) -> tuple[list[PlotLabel], list[float]]:
    """The faults' and remediations' labels that are drawn (thinned by
    :func:`goodput.measure.accounting.label_layout.place_labels` over ``width_px``), and each
    lane's height in points: its longest label's, and some air."""
    labelled = [m for m in report.timeline.markers if m.label and m.kind in MARKER_STYLES]
    span = report.total_s or 1.0
    placed = place_labels(
        [m.t_s / span * width_px for m in labelled],
        gap_px=LABEL_GAP_PX,
        lanes=_LABEL_LANES,
        counts=[m.count for m in labelled],
    )
    labels = [
        PlotLabel(
            t_s=labelled[p.position].t_s,
            kind=labelled[p.position].kind,
            text=with_count(labelled[p.position].label, p.others),
            lane=p.lane,
            others=p.others,
        )
        for p in placed
    ]
    font = FontProperties(size=_LABEL_POINTS)
    heights = []
    for lane in range(_LABEL_LANES):
        longest = max(
            (
                _TEXT.get_text_width_height_descent(label.text, font, ismath=False)[0]
                for label in labels
                if label.lane == lane
            ),
            default=0.0,
        )
        if longest:
            heights.append(longest + _LANE_PAD_POINTS)
    return labels, heights


def _draw_labels(axis: Axes, labels: list[PlotLabel], heights: list[float], scale: float) -> None:
    """The labels above ``axis``: upright, each lane on the one below, each label on a stem
    from its marker's line at the top of the plot."""
    for label in labels:
        color = MARKER_STYLES[label.kind][0]
        axis.annotate(
            label.text,
            xy=(label.t_s / scale, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, _LANE_PAD_POINTS / 2 + sum(heights[: label.lane])),
            textcoords="offset points",
            rotation=90,
            ha="center",
            va="bottom",
            fontsize=_LABEL_POINTS,
            color=color,
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.6, "alpha": 0.6},
            parse_math=False,  # words from the bus: a "$" is a dollar, never TeX
        )


def timeline_png(report: GoodputReport) -> bytes:
    """Steps over wall time (kept and thrown-away executions), events marked, faults and
    remediations labelled above them, and a band showing which category owned each stretch."""
    scale, unit = _time_unit(report.total_s)
    figure = Figure(figsize=(12, 6))
    steps_axis, band_axis = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [5, 1]}
    )
    labels, heights = plot_labels(
        report, steps_axis.get_position().width * figure.get_figwidth() * _DPI
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
        color, style, words = MARKER_STYLES[marker.kind]
        steps_axis.axvline(
            marker.t_s / scale, color=color, linestyle=style, linewidth=0.9, alpha=0.8
        )
        if marker.kind not in shown:
            shown.add(marker.kind)
            handles.append(Line2D([], [], color=color, linestyle=style, label=words))
    steps_axis.set_ylabel("step")
    # the labels stand between the plot and its title (the saved image grows to hold them)
    steps_axis.set_title(
        f"job {report.job}: goodput {report.goodput_pct:.1f} %", pad=6 + sum(heights)
    )
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
    _draw_labels(steps_axis, labels, heights, scale)
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
