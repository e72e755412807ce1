"""`goodput simulate --html DIR`: result.json, goodput.png (badput by cause per strategy) and a
self-contained simulation.html in the look of `goodput report`'s page."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from goodput.measure.accounting.categories import BADPUT_KEYS, TITLES
from goodput.measure.accounting.html import STYLE
from goodput.measure.accounting.plots import COLORS


def strategies_png(result: dict) -> bytes:
    """One stacked bar per strategy: productive, then each cause of badput (% of wall time)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(result["strategies"])
    figure = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    bottoms = [0.0] * len(names)
    for key in ("productive", *BADPUT_KEYS):
        values = [
            result["strategies"][n]["goodput_pct"]
            if key == "productive"
            else result["strategies"][n]["badput_pct"][key]
            for n in names
        ]
        if not any(values):
            continue
        axes.bar(names, values, bottom=bottoms, label=TITLES[key], color=COLORS.get(key))
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    axes.set_ylabel("% of the job's wall time")
    axes.set_title(f"{result['preset']}: goodput and badput by cause (simulated)")
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def write_html(result: dict, directory: str) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    png = strategies_png(result)
    (out / "goodput.png").write_bytes(png)
    (out / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    e = html.escape
    keys = [k for k in BADPUT_KEYS if any(s["badput"][k] for s in result["strategies"].values())]
    head = "".join(f"<th>{e(TITLES[k])}</th>" for k in keys)
    rows = "".join(
        f"<tr><th>{e(name)}</th><td class='num'>{s['goodput_pct']:.2f} %</td>"
        + "".join(f"<td class='num'>{s['badput_pct'][k]:.2f} %</td>" for k in keys)
        + "</tr>"
        for name, s in result["strategies"].items()
    )
    image = base64.b64encode(png).decode("ascii")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>goodput simulate — {e(result["preset"])}</title><style>{STYLE}</style></head>
<body><h1>goodput simulate — {e(result["preset"])}</h1>
<p class="note">A simulation, not a measurement: seeded failures (seed {result["seed"]}) priced
by the cost profile <b>{e(result["profile"])}</b>, decided by goodput's real sensor, controller
and policy.</p>
<p>{result["gpus"]:,} GPUs, {result["hours"]:g} h, {result["interruptions"]} interruptions,
{result["stragglers"]} stragglers; {result["wall_s"]:.1f} s to simulate.</p>
<table><tr><th>strategy</th><th>goodput</th>{head}</tr>{rows}</table>
<img alt="goodput and badput per strategy" src="data:image/png;base64,{image}">
</body></html>
"""
    path = out / "simulation.html"
    path.write_text(page, encoding="utf-8")
    return path
