"""Which remedy for a straggler costs the job least: tolerate it, hot swap it, or scale down.

Each is priced in seconds of the whole job's training lost over one horizon: the time until
the job's next natural restart (its observed MTBF), when every rank is started again, the
straggler is judged anew and this choice made again with what is known then.

* **tolerate** — the job steps at its slowest rank, so it loses ``1 - 1/ratio`` of the horizon
  (``ratio``: the straggler's compute time over its peers', as the sensor measured it);
* **hot swap** — one restart's downtime (a spare must be free);
* **scale down** — one restart's downtime, plus the dropped replica's share (``1/replicas``) of
  the job for the horizon (it needs more than one replica).

The downtime is the median of the job's measured ones (from a relaunching command to its next
step, ``JobState.restart_downtimes_s``); before any was measured, a prior. The cheapest wins,
tolerating on a tie; a decision's reason carries every figure. A pure function of the signal
and the state: the clock is the signal's time (when the sensor raised it). A signal without a
ratio counts as slow as the sensor's threshold.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from goodput import schemas
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.supervisor.jobstate.model import JobState

#: a restart's downtime before the job measured one: minutes at scale (a cold relaunch of
#: thousands of ranks, MegaScale NSDI 2024 §4); five minutes, an assumption
PRIOR_DOWNTIME_S = 300.0
TOLERATE, HOT_SWAP, SCALE_DOWN = "tolerate", "hot-swap", "scale-down"


@dataclass(frozen=True, slots=True)
class StragglerCosts:
    """Each remedy's expected cost (s of the job's training; None: not possible now)."""

    ratio: float
    horizon_s: float
    downtime_s: float
    downtime_measured: bool
    replicas: int
    costs: dict[str, float | None]

    @property
    def cheapest(self) -> str:
        possible = [(cost, name) for name, cost in self.costs.items() if cost is not None]
        return min(possible, key=lambda c: c[0])[1]  # dict order breaks a tie: tolerate first

    def reason(self) -> str:
        """The figures behind the choice, in a line a person can check."""

        def minutes(name: str) -> str:
            cost = self.costs[name]
            return f"{name} {cost / 60:.1f} min" if cost is not None else f"{name} impossible"

        source = "measured" if self.downtime_measured else "prior"
        return (
            f"{self.ratio:.2f}× slower; over the {self.horizon_s / 3600:.1f} h to the next "
            f"expected restart (MTBF) the job loses: {', '.join(map(minutes, self.costs))} "
            f"(restart {self.downtime_s:.0f} s, {source}; 1 of {self.replicas} replica(s)) "
            f"-> {self.cheapest}"
        )


def straggler_costs(
    signal: schemas.Signal, state: JobState, ruled_out: frozenset[str] = frozenset()
) -> StragglerCosts:
    """The expected cost of each remedy for the straggler ``signal`` reports; a remedy in
    ``ruled_out`` (the backend cannot run it) is impossible."""
    # a signal without its ratio (an older sensor): at least the ratio it was flagged at
    ratio = max(signal.ratio or Thresholds().straggler_ratio, 1.0)
    horizon = state.mtbf_s(signal.ts)
    measured = bool(state.restart_downtimes_s)
    downtime = statistics.median(state.restart_downtimes_s) if measured else PRIOR_DOWNTIME_S
    replicas = max(state.num_dp_replicas, 1)
    costs: dict[str, float | None] = {
        TOLERATE: horizon * (1 - 1 / ratio),
        HOT_SWAP: downtime if state.spares and HOT_SWAP not in ruled_out else None,
        SCALE_DOWN: (
            downtime + horizon / replicas
            if state.num_dp_replicas > 1 and SCALE_DOWN not in ruled_out
            else None
        ),
    }
    return StragglerCosts(ratio, horizon, downtime, measured, replicas, costs)
