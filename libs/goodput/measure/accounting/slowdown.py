"""Step-time deviation: which kept steps ran slow, and by how much (docs/GOODPUT.md).

A step is slow when its kept time exceeds the healthy median by more than the tolerance:
:data:`SLOW_TOLERANCE` of the median, or :data:`NOISE_MADS` robust standard deviations
(1.4826 × the median absolute deviation) of the steps judged against it when they scatter
more (a shared machine's jitter is not a straggler: the replayed demo's baseline was charged
its noise), but never more than :data:`MAX_TOLERANCE` (a pace that changed within a run
scatters its steps widely, and would hide a straggler in the scatter); its excess over the
median is straggler slowdown. The healthy median is
that of the step's run (the steps between two restarts) at its world size when the run has
:data:`MIN_RUN_STEPS` of them, else that of every run at its world size: a job whose pace
drifts from one restart to the next (a shared machine's load) is not charged the drift. No signal is
consulted: the steps a straggler slowed while the sensor was making sure, those of a
straggler evicted the moment it was flagged, and those of a run nobody watched (the
baseline) cost the same. (The excess used to be charged only after a ``straggler`` flag: the
demo's 3× straggler lost ~17 s and was charged 0.)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

#: a step slower than the healthy median by more than this share is slow
SLOW_TOLERANCE = 0.10
#: a step this many robust standard deviations over the median is past the noise
NOISE_MADS = 3.0
#: a step this share over the median is slow however widely the steps scatter
MAX_TOLERANCE = 0.5
#: a normal distribution's standard deviation is about this × its median absolute deviation
MAD_TO_SIGMA = 1.4826
#: a run with this many steps at a world size is its own reference
MIN_RUN_STEPS = 20
#: a median this share of a world size's steps undercut by the tolerance may be slow itself
SUSPECT_FAST_SHARE = 0.30


@dataclass(frozen=True, slots=True)
class KeptStep:
    """What one step execution kept after stronger claims, at its world size."""

    kept_s: float
    world_size: int
    run: int


@dataclass(slots=True)
class Slowdown:
    #: excess seconds per index into the steps given, only for slow steps
    excess: dict[int, float] = field(default_factory=dict)
    #: the healthy median step time per world size, over every run
    medians: dict[int, float] = field(default_factory=dict)
    #: why a figure may mislead, one line each
    notes: list[str] = field(default_factory=list)


def step_time_deviation(steps: Sequence[KeptStep]) -> Slowdown:
    """The slow steps of ``steps`` and their excess over their reference median kept time.

    A median is robust while fewer than half of its steps are slow; when more
    were, the median is a slow step and the healthy ones undercut it: past
    :data:`SUSPECT_FAST_SHARE` of them a note says so (the slowdown is then undercounted,
    never overcounted)."""
    by_size: dict[int, list[float]] = defaultdict(list)
    by_run: dict[tuple[int, int], list[float]] = defaultdict(list)
    for step in steps:
        if step.kept_s > 0:
            by_size[step.world_size].append(step.kept_s)
            by_run[step.run, step.world_size].append(step.kept_s)
    result = Slowdown(medians={size: statistics.median(t) for size, t in by_size.items()})
    size_limits = {size: _limit(result.medians[size], t) for size, t in by_size.items()}
    run_refs = {
        key: (run_median := statistics.median(times), _limit(run_median, times))
        for key, times in by_run.items()
        if len(times) >= MIN_RUN_STEPS
    }
    judged: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # reference: [fast, steps]
    for index, step in enumerate(steps):
        own = run_refs.get((step.run, step.world_size))
        median, limit = own or (
            result.medians.get(step.world_size),
            size_limits.get(step.world_size, 0.0),
        )
        if median is None or step.kept_s <= 0:
            continue
        reference = f"world size {step.world_size}" + (
            f", run {step.run}" if own is not None else ""
        )
        counts = judged[f"{reference}: their median {median:.3f} s"]
        counts[0] += step.kept_s * (1 + SLOW_TOLERANCE) < median
        counts[1] += 1
        if step.kept_s > limit:
            result.excess[index] = step.kept_s - median
    for reference, (fast, total) in judged.items():
        if fast > SUSPECT_FAST_SHARE * total:
            result.notes.append(
                f"{fast} of {total} steps ran well under their median ({reference}): most "
                "steps may have run slow, the median with them, and the straggler slowdown is "
                "undercounted"
            )
    return result


def _limit(median: float, times: list[float]) -> float:
    """The slowest a step of ``times`` may be and still count as healthy."""
    mad = statistics.median(abs(t - median) for t in times)
    noise = min(NOISE_MADS * MAD_TO_SIGMA * mad, MAX_TOLERANCE * median)
    return median + max(SLOW_TOLERANCE * median, noise)
