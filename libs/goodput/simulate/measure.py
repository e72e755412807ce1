"""What a real run's events say its checkpoints and remediations cost: the input of a replay.

``goodput demo --json`` carries this (``replay.costs``) so that ``goodput simulate replay`` can
price the same faults with what this machine measured, instead of a profile's guesses.
Means over the reference rank's (rank 0) reports; seconds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from goodput import schemas

RELAUNCHING = ("restart", "restart_in_process", "hot_swap", "scale_to")


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 4) if values else 0.0


def measured_costs(events: Iterable[schemas.Event]) -> dict:
    steps: list[schemas.StepDone] = []
    stalls, persists = [], []
    restores: dict[str, list[float]] = defaultdict(list)
    relaunch: dict[str, list[float]] = defaultdict(list)
    signals: dict[str, int] = {}
    decisions: list[float] = []
    startups: list[float] = []
    started_ns: int | None = None
    restored_s = 0.0
    for event in sorted(events, key=lambda e: e.ts):
        match event:
            case schemas.StepDone(rank=0):
                steps.append(event)
                if started_ns is not None:
                    startups.append((event.ts - started_ns) / 1e9 - restored_s - event.step_time_s)
                    started_ns = None
            case schemas.RankStarted(rank=0):
                started_ns, restored_s = event.ts, 0.0
            case schemas.CheckpointRestored(rank=0):
                restores[event.tier].append(event.duration_s)
                restored_s = event.duration_s
            case schemas.CheckpointSaved(rank=0):
                stalls.append(event.stall_s)
            case schemas.CheckpointPersisted(rank=0):
                persists.append(event.duration_s)
            case schemas.ActionResult(ok=True) if event.action in RELAUNCHING:
                relaunch[event.action].append(event.duration_s)
            case schemas.Signal():
                signals.setdefault(event.signal_id, event.ts)
            case schemas.Decision() if event.signal_id in signals:
                decisions.append((event.ts - signals[event.signal_id]) / 1e9)
    times = sorted(s.step_time_s for s in steps)
    return {
        "step_time_s": round(statistics.median(times), 4) if times else 0.0,
        "checkpoint_stall_s": _mean(stalls),
        "checkpoint_persist_s": _mean(persists),
        "restore_s": {tier: _mean(v) for tier, v in sorted(restores.items())},
        "relaunch_s": {action: _mean(v) for action, v in sorted(relaunch.items())},
        "startup_s": _mean([max(0.0, s) for s in startups]),
        "decision_s": _mean(decisions),
    }
