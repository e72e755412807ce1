"""The sensor's detection thresholds, changeable while the job runs (a SetThresholds command).

A ``Thresholds`` is valid by construction: ``__post_init__`` runs on every construction,
decode, ``msgspec.convert`` and ``structs.replace``, so a NaN, an infinity or a non-positive
value is refused wherever thresholds come from (options, a command, a test), and a refused
update never replaces the thresholds in force.
"""

from __future__ import annotations

import math

import msgspec

from goodput.schemas.envelope import MAX_DURATION_S


class Thresholds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    #: how often heartbeats are checked
    heartbeat_polling_period_s: float = 0.5
    #: silence after which a rank's heartbeat counts as missed (a floor: see the safety factor)
    heartbeat_timeout_s: float = 5.0
    #: the missed-heartbeat timeout grows to this factor × the longest heartbeat gap seen
    #: (smoothed), so a rank that heartbeats slowly is not declared missing by a guessed number
    heartbeat_safety_factor: float = 3.0
    #: allowance between a rank's start and its first heartbeat (interpreter start, imports)
    first_heartbeat_timeout_s: float = 60.0
    #: a rank's process gone this long without an exit report counts as crashed
    pod_termination_threshold_s: float = 2.0
    #: no step progress from any rank for this long means the job is down
    jobset_downtime_threshold_s: float = 60.0
    #: a hang is declared after this factor × the ``hang_quantile`` of the rank's last
    #: ``hang_window`` progress intervals (its own step-time distribution, as the sensor sees it).
    #: A rank that suddenly steps more than this × its p95 slower is taken for hung before its
    #: window learns the new pace (a 4× straggler was, in a loaded demo); 5 kept that one a
    #: straggler but found a hang on 0.45 s steps at load 9 in 3.65 s, past the 3 s aim
    hang_safety_factor: float = 3.0
    hang_quantile: float = 0.95
    hang_window: int = 50
    #: floor for the adaptive hang timeout
    hang_min_timeout_s: float = 1.5
    #: the hang timeout's floor until the window holds ``hang_min_samples`` intervals (a
    #: rank's first steps: warm-up, compilation, cold caches)
    hang_warmup_timeout_s: float = 10.0
    hang_min_samples: int = 10
    #: allowance for a rank's first step after a (re)start: compilation, warm-up, data loading
    first_step_timeout_s: float = 300.0
    #: longest a rank may stay inside a checkpoint save/load without progress before it hangs
    checkpoint_timeout_s: float = 600.0
    #: a rank whose last heartbeat said it is leaving may be silent this long before its exit
    #: report (interpreter and process-group teardown on a loaded host)
    exit_timeout_s: float = 60.0
    #: per observation, the remembered longest heartbeat gap shrinks by this factor (forgets
    #: old peaks)
    interval_decay: float = 0.98
    #: a rank whose compute time is this × its peers' median, step by step, is a straggler
    straggler_ratio: float = 1.25
    #: steps in the straggler window: more than half of them must reach the ratio (a load burst
    #: shorter than half the window never does; a persistent straggler after window // 2 + 1)
    straggler_window: int = 20
    #: seconds the window must stay at the ratio before a rank is flagged: longer than the
    #: bursts of contention a shared host gives a healthy rank (2-8 s seen), far shorter than
    #: a straggler worth evicting (see goodput.supervisor.detect.straggler)
    straggler_hold_s: float = 20.0
    #: after a rank exits out of GPU memory, how long its peers' exits are awaited before it
    #: is reported: ranks stepping together run out together when the job's memory is the
    #: cause (a job-wide OOM, reported once, blaming no node), within about a step
    oom_gather_s: float = 5.0

    def __post_init__(self) -> None:
        # NaN compares false with everything: without this check a NaN timeout is installed
        # and turns its detection off
        bad = [
            name
            for name in self.__struct_fields__
            if not (math.isfinite(value := getattr(self, name)) and 0 < value <= MAX_DURATION_S)
        ]
        if bad:
            raise ValueError(
                f"threshold(s) must be positive and finite (at most {MAX_DURATION_S:g}): "
                + ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            )
        if self.interval_decay > 1:
            raise ValueError(f"interval_decay must be at most 1, not {self.interval_decay!r}")
        if self.hang_quantile > 1:
            raise ValueError(f"hang_quantile must be at most 1, not {self.hang_quantile!r}")
        if self.hang_min_samples > self.hang_window:
            raise ValueError(
                f"hang_min_samples ({self.hang_min_samples}) must be at most hang_window "
                f"({self.hang_window})"
            )


def updated(current: Thresholds, values: dict[str, float]) -> Thresholds:
    """A copy of ``current`` with ``values`` applied; unknown names or bad values raise ValueError
    (``current`` is left as it was).

    Values arrive as floats (``SetThresholds.values``); integral floats are accepted for integer
    thresholds such as ``straggler_window``.
    """
    unknown = sorted(set(values) - set(current.__struct_fields__))
    if unknown:
        raise ValueError(
            f"unknown threshold(s) {', '.join(unknown)}; known: {', '.join(current.__struct_fields__)}"
        )
    merged = {**msgspec.structs.asdict(current), **values}
    try:
        return msgspec.convert(merged, Thresholds, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from exc
