"""The sensor's detection thresholds, changeable while the job runs (a SetThresholds command)."""

from __future__ import annotations

import msgspec


class Thresholds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: how often heartbeats are checked
    heartbeat_polling_period_s: float = 0.5
    #: silence after which a rank's heartbeat counts as missed
    heartbeat_timeout_s: float = 5.0
    #: a rank's process gone this long without an exit report counts as crashed
    pod_termination_threshold_s: float = 2.0
    #: no step progress from any rank for this long means the job is down
    jobset_downtime_threshold_s: float = 60.0
    #: a hang is declared after this factor × the longest recent step interval
    hang_safety_factor: float = 4.0
    #: floor for the adaptive hang timeout (the first steps have no history)
    hang_min_timeout_s: float = 10.0
    #: a rank slower than this × the median step time of its peers is a straggler candidate
    straggler_ratio: float = 1.3
    #: steps in the straggler window
    straggler_window: int = 10


def updated(current: Thresholds, values: dict[str, float]) -> Thresholds:
    """A copy of ``current`` with ``values`` applied; unknown names or bad values raise ValueError."""
    unknown = sorted(set(values) - set(current.__struct_fields__))
    if unknown:
        raise ValueError(
            f"unknown threshold(s) {', '.join(unknown)}; known: {', '.join(current.__struct_fields__)}"
        )
    merged = {**msgspec.structs.asdict(current), **values}
    try:
        result = msgspec.convert(merged, Thresholds)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from exc
    negative = [name for name, value in msgspec.structs.asdict(result).items() if value <= 0]
    if negative:
        raise ValueError(f"threshold(s) must be positive: {', '.join(negative)}")
    return result
