"""The report as terminal tables (rich)."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from goodput.measure.accounting import categories as c
from goodput.measure.accounting.report import GoodputReport


def duration(seconds: float | None) -> str:
    """Seconds for a person: ``42.0 s``, ``12.5 min``, ``3.20 h``, ``—`` when unknown."""
    if seconds is None:
        return "—"
    if abs(seconds) < 120:
        return f"{seconds:.1f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def summary_rows(report: GoodputReport) -> list[tuple[str, str]]:
    """The headline figures, shared by the terminal and HTML reports."""
    return [
        ("goodput", f"{report.goodput_pct:.2f} %"),
        ("total time", duration(report.total_s)),
        ("productive time", duration(report.productive_s)),
        ("ETTR", f"{report.ettr:.3f}"),
        ("interruptions", str(report.interruptions)),
        ("MTBF", duration(report.mtbf_s)),
        ("MTTR", duration(report.mttr_s)),
        ("steps kept / thrown away", f"{report.steps_productive} / {report.steps_wasted}"),
    ]


def breakdown_rows(report: GoodputReport) -> list[tuple[str, str, float, str]]:
    """(key, title, seconds, ml-goodput-measurement name): productive first, then badput."""
    rows = [(c.PRODUCTIVE, c.TITLES[c.PRODUCTIVE], report.productive_s, "goodput")]
    rows += [
        (category.key, category.title, report.badput.get(category.key, 0.0), category.google_name)
        for category in c.BADPUT_CATEGORIES
    ]
    return rows


def render(report: GoodputReport) -> Group:
    summary = Table(
        title=escape(f"goodput — job {report.job} ({report.source})"),
        show_header=False,
        title_justify="left",
    )
    summary.add_column("metric", style="bold")
    summary.add_column("value", justify="right")
    for name, value in summary_rows(report):
        summary.add_row(name, value)

    breakdown = Table(title="where the time went", title_justify="left")
    breakdown.add_column("category")
    breakdown.add_column("time", justify="right")
    breakdown.add_column("share", justify="right")
    breakdown.add_column("key (JSON)", style="dim")
    for key, title, seconds, _ in breakdown_rows(report):
        share = 100.0 * seconds / report.total_s if report.total_s else 0.0
        style = "green" if key == c.PRODUCTIVE else ("dim" if seconds == 0 else "")
        breakdown.add_row(title, duration(seconds), f"{share:.1f} %", key, style=style)
    breakdown.add_row("total", duration(report.total_s), "100.0 %", "", style="bold")
    parts: list[Table | str] = [summary, breakdown]
    if report.failures:
        failures = Table(title="interruptions", title_justify="left")
        # milestones are shown as time after the fault
        for column in ("at", "cause", "+detected", "+decided", "+restarted", "+resumed", "repair"):
            failures.add_column(column, justify="left" if column == "cause" else "right")
        for f in report.failures:
            failures.add_row(
                duration(f.fault_s),
                f.cause,
                *(
                    duration(None if t is None else t - f.fault_s)
                    for t in (f.detected_s, f.decided_s, f.restarted_s, f.resumed_s)
                ),
                duration(f.repair_s),
            )
        parts.append(failures)
    parts += [f"[yellow]note:[/] {escape(note)}" for note in report.notes]
    return Group(*parts)
