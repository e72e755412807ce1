"""The detector's per-rank and per-node records (mutable, owned by one :class:`Detector`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from goodput.supervisor.detect.intervals import RecentIntervals


@dataclass(slots=True)
class RankRecord:
    """What the detector knows of one rank (process) of the current run."""

    node: str
    attempt: int = 0
    alive: bool = True
    last_heartbeat_ns: int = 0
    #: smoothed longest gap between heartbeats (ns)
    heartbeat_gap_ns: float = 0.0
    #: newest step seen in a heartbeat (None: no heartbeat since the start, no baseline yet)
    heartbeat_step: int | None = None
    #: newest step reported done
    done_step: int = -1
    last_progress_ns: int = 0
    #: progress observations since the rank (re)started; 0 means "first step allowance"
    progress_seen: int = 0
    #: the rank's recent intervals between progress observations (a checkpoint save or load
    #: and the first interval after a (re)start excluded)
    step_intervals: RecentIntervals = field(default_factory=RecentIntervals)
    #: their ``hang_quantile`` (ns), kept up to date as intervals arrive
    step_gap_ns: float = 0.0
    busy: str = ""
    busy_since_ns: int = 0
    hang_reported: bool = False


@dataclass(slots=True)
class NodeRecord:
    """What the detector knows of one node: its ranks, its host monitor's reports."""

    ranks: set[int] = field(default_factory=set)
    #: host monitor reports fewer live ranks than expected, since (ns); 0 = not missing
    missing_since_ns: int = 0
    missing_detail: str = ""
    #: when its host monitor last reported (ns); 0 = never
    last_health_ns: int = 0
    #: faults last reported as a degraded_host signal
    faults: tuple[str, ...] = ()
