"""The fleet's failures: a seeded trace of faults on physical nodes, the same for every strategy.

Faults are Poisson per node (pooled: one job-wide rate spread uniformly over every node of the
fleet, spares included: a spare can break too). Each interrupting fault has a kind, and each
kind reaches the sensor by its own path (see :mod:`goodput.simulate.world`):

* ``crash`` — a rank's process dies (software bug, NCCL error): its exit is reported;
* ``hang`` — a rank stops stepping but keeps heartbeating (a stuck collective);
* ``gpu_xid`` — a GPU fails (XID 79, fallen off the bus): the host monitor reports it; the
  node is broken until repaired;
* ``correctable`` — a GPU fault that a GPU reset clears (XID 48, a double-bit ECC error:
  :mod:`goodput.gpu_faults`): the host monitor reports it; the node is broken until its GPUs
  are reset (the built-in policy's ``gpu-reset`` rung) or it is repaired;
* ``lost_host`` — the node disappears (power, kernel panic, network): silence; broken until
  repaired;
* ``node_down`` — the demo's node loss (replays only): its ranks are killed and its host
  monitor reports the node down; broken until repaired;
* ``straggler`` — a node computes slower by a factor for a while.

A broken node is repaired after a log-normal time and returns to the spare pool.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from goodput.simulate.profile import FailureModel, JobSpec

FaultKind = Literal[
    "crash", "hang", "gpu_xid", "correctable", "lost_host", "node_down", "straggler"
]
INTERRUPTING: tuple[FaultKind, ...] = ("crash", "hang", "gpu_xid", "correctable", "lost_host")
#: kinds that leave the node broken until it is repaired (a correctable one: or reset)
BREAKING = frozenset({"gpu_xid", "correctable", "lost_host", "node_down"})
#: what the host monitor reports for each GPU fault kind (``goodput.gpu_faults``' catalogue)
XIDS: dict[str, int] = {"gpu_xid": 79, "correctable": 48}


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    node: str
    kind: FaultKind
    #: broken kinds: repaired after this long; straggler: how long it lasts
    duration_s: float = 0.0
    #: straggler: how much slower its compute is (what the sensor sees), and the job's steps
    #: (0: as much; a replay measures it)
    factor: float = 1.0
    slowdown: float = 0.0


@dataclass(frozen=True, slots=True)
class StepFault:
    """A fault that fires when training reaches a step (a replayed run's faults)."""

    at_step: int
    node: str
    kind: FaultKind
    #: straggler: how long it lasts (s), its compute factor and the job's measured slowdown
    duration_s: float = 0.0
    factor: float = 1.0
    slowdown: float = 0.0
    #: broken kinds: repaired when training reaches this step (None: by ``duration_s``)
    repair_at_step: int | None = None
    #: it strikes this long after the step is done (and saved, if it is a checkpoint step)
    delay_s: float = 0.0


def node_names(job: JobSpec) -> list[str]:
    """Every node of the fleet: the job's nodes first, then its spares."""
    return [f"node-{i}" for i in range(job.nodes + job.spares)]


def make_trace(job: JobSpec, model: FailureModel, seed: int) -> list[Fault]:
    """The faults of one fleet over the job's hours, in time order."""
    rng = random.Random(seed)
    nodes = node_names(job)
    horizon = job.hours * 3600.0
    weights = [getattr(model, kind) for kind in INTERRUPTING]
    total_weight = sum(weights)
    faults: list[Fault] = []
    # the rate is the job's (its nodes); spares break at the same per-node rate
    per_node_day = model.interruptions_per_day / job.nodes
    rate = per_node_day * len(nodes) / 86_400.0
    if rate > 0 and total_weight > 0:
        t = rng.expovariate(rate)
        while t < horizon:
            kind = rng.choices(INTERRUPTING, weights)[0]
            repair = (
                model.repair_median_s * math.exp(rng.gauss(0, model.repair_sigma))
                if kind in BREAKING
                else 0.0
            )
            faults.append(Fault(t, rng.choice(nodes), kind, repair))
            t += rng.expovariate(rate)
    straggler_rate = model.stragglers_per_day / 86_400.0
    if straggler_rate > 0:
        t = rng.expovariate(straggler_rate)
        while t < horizon:
            duration = rng.expovariate(1 / model.straggler_mean_s)
            faults.append(
                Fault(t, rng.choice(nodes), "straggler", duration, model.straggler_factor)
            )
            t += rng.expovariate(straggler_rate)
    faults.sort(key=lambda f: f.at_s)
    return faults
