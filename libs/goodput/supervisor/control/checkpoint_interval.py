"""How often to checkpoint: Young's interval from the observed failure rate and save cost.

Young (1974): the interval minimising lost work plus checkpoint overhead is
``sqrt(2 × C × MTBF)`` for a checkpoint costing ``C`` seconds of training. The MTBF is
estimated from the interruptions seen so far with a prior of one failure per
``prior_mtbf_s`` (so the first hours, with no failure yet, do not suggest "never"), and the
interval is never shorter than the time a checkpoint takes to become durable (a newer save
would only supersede it).
"""

from __future__ import annotations

import math

import msgspec

from goodput import schemas
from goodput.supervisor.jobstate.model import PRIOR_MTBF_S, JobState

NS = 1_000_000_000


class IntervalSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: recommend intervals at all (off: the job keeps the interval it was started with)
    enabled: bool = True
    #: assumed mean time between failures before any is observed (one a day)
    prior_mtbf_s: float = PRIOR_MTBF_S
    #: recommend a new interval only when it differs from the current one by this fraction
    min_change: float = 0.2


def young_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval, ``sqrt(2 × save cost × MTBF)`` seconds."""
    if save_cost_s < 0 or mtbf_s <= 0:
        raise ValueError("save cost must be ≥ 0 and MTBF > 0")
    return math.sqrt(2 * save_cost_s * mtbf_s)


def observed_mtbf_s(state: JobState, now: int, prior_mtbf_s: float) -> float:
    """(time run + one prior interval) / (failures seen + 1): :meth:`JobState.mtbf_s`."""
    return state.mtbf_s(now, prior_mtbf_s)


def recommend(
    state: JobState, now: int, settings: IntervalSettings
) -> schemas.SetCheckpointInterval | None:
    """A new interval (in steps) when it differs enough from the current one, else None."""
    cost = state.checkpoint_cost_s
    if not settings.enabled or cost is None or state.step_time_s <= 0:
        return None
    mtbf = observed_mtbf_s(state, now, settings.prior_mtbf_s)
    interval_s = young_interval_s(cost, mtbf)
    persist_s = max((c.persist_s for c in state.checkpoints), default=0.0)
    floor = ""
    if interval_s < persist_s:
        interval_s, floor = persist_s, f", raised to the {persist_s:.1f} s a save takes to persist"
    steps = max(1, round(interval_s / state.step_time_s))
    current = state.checkpoint_interval_steps
    if current and abs(steps - current) <= settings.min_change * current:
        return None
    return schemas.SetCheckpointInterval(
        job=state.job,
        ts=now,
        every_steps=steps,
        rationale=(
            f"Young: sqrt(2 × save cost {cost:.2f} s × MTBF {mtbf:.0f} s "
            f"({len(state.interruptions)} interruption(s) observed)) = {interval_s:.0f} s{floor}"
            f" ≈ {steps} steps of {state.step_time_s:.2f} s"
        ),
    )
