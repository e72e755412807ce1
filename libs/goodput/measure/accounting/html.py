"""A self-contained HTML report (images inlined as base64) plus the PNG files beside it."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

import msgspec

from goodput.measure.accounting.plots import breakdown_png, timeline_png
from goodput.measure.accounting.report import GoodputReport
from goodput.measure.accounting.table import breakdown_rows, duration, summary_rows

HTML_NAME = "report.html"
TIMELINE_NAME = "timeline.png"
BREAKDOWN_NAME = "badput.png"
JSON_NAME = "report.json"

#: the report pages' style sheet, shared by every HTML page goodput writes
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 0.3em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; }
.note { color: #8a6d3b; }
"""


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _image(png: bytes, alt: str) -> str:
    encoded = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def render_html(report: GoodputReport, timeline: bytes, breakdown: bytes) -> str:
    e = html.escape
    summary = "".join(
        f'<tr><th>{e(name)}</th><td class="num">{e(value)}</td></tr>'
        for name, value in summary_rows(report)
    )
    rows = "".join(
        f"<tr><td>{e(title)}</td><td><code>{e(key)}</code></td>"
        f'<td class="num">{e(duration(seconds))}</td>'
        f'<td class="num">{100.0 * seconds / report.total_s if report.total_s else 0.0:.1f} %</td>'
        f"<td>{e(google)}</td></tr>"
        for key, title, seconds, google in breakdown_rows(report)
    )
    # fault and remediation in the words the timeline's labels use (Interruption.fault, .remedy)
    failures = "".join(
        f'<tr><td class="num">{e(duration(f.fault_s))}</td><td>{e(f.fault)}</td>'
        f"<td>{e(f.remedy)}</td><td><code>{e(f.cause)}</code></td>"
        f'<td class="num">{e(duration(f.repair_s))}</td></tr>'
        for f in report.failures
    )
    failures_table = (
        "<h2>Interruptions</h2><table><tr><th>at</th><th>fault</th><th>remediation</th>"
        f"<th>signals</th><th>time to repair</th></tr>{failures}</table>"
        if report.failures
        else ""
    )
    notes = "".join(f'<p class="note">{e(note)}</p>' for note in report.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>goodput report — {e(report.job)}</title>
<style>{STYLE}</style></head>
<body>
<h1>Goodput report — job {e(report.job)}</h1>
<table>{summary}</table>
{notes}
<h2>Timeline</h2>
{_image(timeline, "steps over wall time, faults and remediations labelled")}
<h2>Where the time went</h2>
{_image(breakdown, "badput breakdown")}
<table><tr><th>category</th><th>key</th><th>time</th><th>share</th>
<th>ml-goodput-measurement</th></tr>{rows}</table>
{failures_table}
<p>Definitions: docs/GOODPUT.md. Source: {e(report.source)} log.</p>
</body></html>
"""


def write_html_report(report: GoodputReport, directory: str | os.PathLike[str]) -> Path:
    """Write report.html (self-contained), timeline.png, badput.png and report.json; return
    the HTML file's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    timeline = timeline_png(report)
    breakdown = breakdown_png(report)
    _write(out / TIMELINE_NAME, timeline)
    _write(out / BREAKDOWN_NAME, breakdown)
    _write(out / JSON_NAME, msgspec.json.format(msgspec.json.encode(report)))
    _write(out / HTML_NAME, render_html(report, timeline, breakdown).encode())
    return out / HTML_NAME
