"""Terminal rendering of a simulation: the case study's table, goodput and the gain per technique."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from goodput.measure.accounting.categories import BADPUT_KEYS, TITLES


def table(result: dict) -> Table:
    keys = [
        k for k in BADPUT_KEYS if any(s["badput"][k] > 0 for s in result["strategies"].values())
    ]
    title = (
        f"{escape(result['preset'])}: {result['gpus']:,} GPUs, {result['hours']:g} h, "
        f"{result['interruptions']} interruptions (seed {result['seed']}, "
        f"profile {escape(result['profile'])}) — simulated"
    )
    out = Table(title=title)
    out.add_column("strategy")
    out.add_column("goodput", justify="right")
    out.add_column("gain", justify="right")
    for key in keys:
        out.add_column(TITLES[key], justify="right")
    previous = None
    for name, s in result["strategies"].items():
        gain = "" if previous is None else f"{s['goodput_pct'] - previous:+.1f}"
        previous = s["goodput_pct"]
        out.add_row(
            escape(name),
            f"{s['goodput_pct']:.1f} %",
            gain,
            *(f"{s['badput_pct'][k]:.2f} %" for k in keys),
        )
    return out


def print_result(result: dict, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 180))
    console.print(table(result))
    console.print(
        f"{result['sensor_events']:,} sensor events in {result['wall_s']:.1f} s "
        f"({result['events_per_s']:,}/s); badput as % of the job's wall time"
    )


def print_prediction(result: dict, console: Console | None = None) -> None:
    """Predicted against measured, per setup: goodput, then each badput category in seconds
    (the term a miss comes from)."""
    setups = [s for s in ("goodput", "baseline") if s in result]
    out = Table(title=f"forward prediction (profile {escape(result['profile'])}) vs the run")
    out.add_column("")
    for setup in setups:
        out.add_column(f"{setup} predicted", justify="right")
        out.add_column(f"{setup} measured", justify="right")
    out.add_row(
        "goodput",
        *(f"{result[s][k]:.1f} %" for s in setups for k in ("predicted", "actual")),
    )
    for key in BADPUT_KEYS:
        seconds = [
            (
                result[s]["predicted_badput_s"].get(key, 0.0),
                result[s]["actual_badput_s"].get(key),
            )
            for s in setups
        ]
        if any(p or a for p, a in seconds):
            # a run measured before the category existed has none: "n/a", not a measured 0
            cells = (f"{v:.1f}" if v is not None else "n/a" for pair in seconds for v in pair)
            out.add_row(TITLES[key] + " (s)", *cells)
    console = console or Console(width=max(Console().width, 120))
    console.print(out)
    for setup in setups:
        r = result[setup]
        pace = r.get("pace", 1.0)
        console.print(
            f"{setup}: predicted {r['predicted']:.1f} %, measured {r['actual']:.1f} % "
            f"(error {r['error']:.1f} points)"
            + (
                f"; this machine's costs at {pace:.2f}x the profile's (the run's median step "
                "over the profile's)"
                if pace != 1.0
                else ""
            )
        )
