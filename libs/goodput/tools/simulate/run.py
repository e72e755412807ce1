"""Run a preset's strategies on one seeded failure trace and summarise them as JSON-ready data."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from goodput.measure.accounting.categories import BADPUT_KEYS
from goodput.tools.simulate.fleet import INTERRUPTING, make_trace
from goodput.tools.simulate.profile import CostProfile, Preset
from goodput.tools.simulate.strategies import Strategy
from goodput.tools.simulate.world import Result, World


def simulate(
    preset: Preset,
    profile: CostProfile,
    strategies: list[Strategy],
    *,
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every strategy on the same trace: the ``goodput simulate --json`` document."""
    started = time.perf_counter()
    trace = make_trace(preset.job, preset.failures, seed)
    results: list[Result] = []
    for strategy in strategies:
        if progress:
            progress(strategy.name)
        results.append(World(preset.job, profile, strategy, trace).run())
    wall = time.perf_counter() - started
    events = sum(r.sensor_events for r in results)
    job = preset.job
    return {
        "preset": preset.name,
        "profile": profile.name,
        "seed": seed,
        "gpus": job.nodes * job.gpus_per_node,
        "nodes": job.nodes,
        "spares": job.spares,
        "hours": job.hours,
        "interruptions": sum(1 for f in trace if f.kind in INTERRUPTING),
        "stragglers": sum(1 for f in trace if f.kind == "straggler"),
        "strategies": {r.strategy: _summary(r) for r in results},
        "wall_s": round(wall, 3),
        "sensor_events": events,
        "events_per_s": round(events / wall) if wall else 0,
    }


def _summary(result: Result) -> dict:
    total = sum(result.seconds.values()) or 1.0
    return {
        "goodput_pct": round(result.goodput_pct, 3),
        "badput": {k: round(result.badput[k], 1) for k in BADPUT_KEYS},
        "badput_pct": {k: round(100 * result.badput[k] / total, 3) for k in BADPUT_KEYS},
        "interruptions_hit": result.interruptions,
        "decisions": result.decisions,
        "rules": dict(sorted(result.rules.items())),
        "final_checkpoint_interval_steps": result.final_interval_steps,
        "sensor_events": result.sensor_events,
        "wall_s": round(result.wall_s, 3),
    }


def with_job(preset: Preset, **changes: object) -> Preset:
    """The preset with some job fields changed (``hours``, ``spares``, ``nodes`` ...)."""
    return msgspec.structs.replace(preset, job=msgspec.structs.replace(preset.job, **changes))
