"""A cost profile at the pace a run met: the machine's load, read from the run's step time.

A profile is measured at one load; a run on the same machine may meet another. Beside a test
suite a demo's steps took 0.45 s against 0.20-0.26 s on a quiet machine, and its start-ups,
saves and exit about twice the quiet profile's. What the machine's own CPUs do slows with
its steps alike: starting ranks, walking and copying the state, writing it to the node's
volume and to a peer, the bus hops, the ranks' exit. What happens elsewhere does not: the
object store, a scheduler's provisioning, a GPU reset, the host monitor's probe period.

The run's step time is what a user knows before it runs; its median's ratio to the median step
of the same setup while the profile was measured (:class:`~.profile.Pace`, taken while the
bench's job stepped undisturbed) is the factor. A median, because the job's own bursts (a
standby built beside it, the first steps after a restart) say nothing of the machine's load.
A profile without a pace (one of another machine, as ``large-gpu``) is taken as it is.
"""

from __future__ import annotations

import msgspec

from goodput.tools.simulate.profile import CostProfile

#: seconds the machine's CPUs spend, by the profile's section: these grow with the load
SECONDS = {
    "checkpoint": ("latency_s", "snapshot_latency_s"),
    "restart": (
        "stop_s",
        "launch_s",
        "startup_s",
        "rejoin_s",
        "warm_startup_s",
        "standby_ready_s",
        "shutdown_s",
    ),
    "detection": ("event_latency_s", "decision_s"),
}
#: bandwidths of the node's own copies and disks (and its peer's, as loaded): these shrink
BANDWIDTHS = {
    "checkpoint": (
        "snapshot_gbps",
        "local_write_gbps",
        "local_read_gbps",
        "peer_gbps",
        "peer_read_gbps",
    ),
}


def pace_factor(profile: CostProfile, setup: str, median_step_s: float | None) -> float:
    """How much slower the run's machine was than the profile's: the run's median step time
    over the profile's for the same ``setup`` ("goodput": with standbys; else the baseline's,
    without); 1 where the profile has no pace or the run no median (a run of before)."""
    if profile.pace is None or not median_step_s:
        return 1.0
    reference = (
        profile.pace.warm_median_step_s if setup == "goodput" else profile.pace.cold_median_step_s
    )
    return median_step_s / reference


def at_pace(profile: CostProfile, factor: float) -> CostProfile:
    """``profile`` with its machine-bound costs ``factor`` times dearer; the rest as it is."""
    if factor == 1.0:
        return profile
    sections = {}
    for section in SECONDS:  # every section with a paced cost: BANDWIDTHS' is among them
        costs = getattr(profile, section)
        changes = {key: getattr(costs, key) * factor for key in SECONDS[section]}
        changes |= {key: getattr(costs, key) / factor for key in BANDWIDTHS.get(section, ())}
        sections[section] = msgspec.structs.replace(costs, **changes)
    return msgspec.structs.replace(profile, **sections)
