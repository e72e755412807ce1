"""What-if sweeps: goodput against spares, checkpoint interval or cluster size, per strategy.

Each point is a full simulation on the same seed. Spares and interval use common random
numbers: the job's nodes see the very same faults at every value (each spare draws its own
from a stream of its own, :func:`goodput.tools.simulate.fleet.make_trace`), so a difference between
points is the strategy's, not the trace's. The size changes the job's nodes, so its trace
changes with it. Sizes keep
the per-node failure rate of the preset, so a bigger job fails proportionally more often.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import msgspec

from goodput.tools.simulate.profile import CostProfile, Preset, SimulateError
from goodput.tools.simulate.run import simulate, with_job
from goodput.tools.simulate.strategies import Strategy

AXES = {
    "spares": "spare nodes",
    "interval": "checkpoint interval (minutes, fixed)",
    "size": "GPUs",
}


def sweep(
    preset: Preset,
    profile: CostProfile,
    axis: str,
    values: list[float],
    strategies: list[Strategy],
    *,
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict:
    if axis not in AXES:
        raise SimulateError(f"unknown sweep {axis!r}; known: {', '.join(AXES)}")
    points = []
    for value in values:
        varied, chosen = _vary(preset, axis, value), strategies
        if axis == "interval":
            chosen = [dataclasses.replace(s, interval_tuning=False) for s in strategies]
        if progress:
            progress(f"{axis}={value:g}")
        result = simulate(varied, profile, chosen, seed=seed)
        for name, summary in result["strategies"].items():
            points.append(
                {
                    "value": value,
                    "gpus": result["gpus"],
                    "strategy": name,
                    "goodput_pct": summary["goodput_pct"],
                    "final_checkpoint_interval_steps": summary["final_checkpoint_interval_steps"],
                }
            )
    return {"preset": preset.name, "axis": axis, "seed": seed, "points": points}


def _vary(preset: Preset, axis: str, value: float) -> Preset:
    job = preset.job
    if axis == "spares":
        if value < 0 or value != int(value):
            raise SimulateError(f"spares must be whole and ≥ 0, not {value:g}")
        return with_job(preset, spares=int(value))
    if axis == "interval":
        if value <= 0:
            raise SimulateError(f"a checkpoint interval must be > 0 minutes, not {value:g}")
        return with_job(preset, checkpoint_interval_s=value * 60)
    nodes = int(value) // job.gpus_per_node
    if value % job.gpus_per_node or nodes < job.num_nodes_per_dp or nodes % job.num_nodes_per_dp:
        raise SimulateError(
            f"{value:g} GPUs are not whole replicas of {job.num_nodes_per_dp} nodes × "
            f"{job.gpus_per_node} GPUs"
        )
    failures = msgspec.structs.replace(
        preset.failures,
        interruptions_per_day=preset.failures.interruptions_per_day * nodes / job.nodes,
    )
    return msgspec.structs.replace(with_job(preset, nodes=nodes), failures=failures)


def recommendation(spares: dict, step_time_s: float, hours: float) -> str:
    """One line from a spares sweep: the fewest spares within 0.1 point of the best goodput."""
    points = [p for p in spares["points"] if p["strategy"] == "goodput"] or spares["points"]
    best = max(p["goodput_pct"] for p in points)
    pick = min((p for p in points if p["goodput_pct"] >= best - 0.1), key=lambda p: p["value"])
    minutes = pick["final_checkpoint_interval_steps"] * step_time_s / 60
    return (
        f"with {int(pick['value'])} spare node(s) and a {minutes:.0f}-minute checkpoint interval "
        f"this job loses {100 - pick['goodput_pct']:.1f} % of its {hours:g} h (simulated)"
    )


def plot(result: dict, path: Path) -> Path:
    """goodput against the swept value, one line per strategy, as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    strategies = dict.fromkeys(p["strategy"] for p in result["points"])
    for name in strategies:
        mine = [p for p in result["points"] if p["strategy"] == name]
        xs = [p["gpus"] if result["axis"] == "size" else p["value"] for p in mine]
        axes.plot(xs, [p["goodput_pct"] for p in mine], marker="o", label=name)
    axes.set_xlabel(AXES[result["axis"]])
    axes.set_ylabel("goodput (%)")
    axes.set_title(f"{result['preset']}: goodput vs {AXES[result['axis']]} (simulated)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path
