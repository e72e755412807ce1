"""The fleet's failures: a seeded trace of faults on physical nodes, the same for every strategy.

Faults are Poisson per node: the job's nodes draw from one pooled stream (the job-wide rate
spread uniformly over them), and each spare from a stream of its own at the same per-node rate
(a spare can break too). The streams are seeded apart (common random numbers): the job's nodes
see the same faults whatever the number of spares, and spare *k* the same whatever the number
after it, so a sweep over spares compares strategies, not traces. Each interrupting fault has a kind, and each
kind reaches the sensor by its own path (see :mod:`goodput.tools.simulate.world`):

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
* ``sdc`` — silent data corruption: a bit flips in one replica's parameters and training
  goes on; the replicas' fingerprints disagree at the next fingerprint step
  (``JobSpec.fingerprint_every_steps``), where the sensor hears of it (a ``Numerics`` event)
  and the policy rolls back; a relaunch reloads the parameters (a transient flip);
* ``straggler`` — a node computes slower by a factor for a while.

A broken node is repaired after a log-normal time and returns to the spare pool.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from goodput.gpu_faults import xid_verdict
from goodput.tools.simulate.profile import FailureModel, JobSpec

FaultKind = Literal[
    "crash", "hang", "gpu_xid", "correctable", "lost_host", "node_down", "straggler", "sdc"
]
INTERRUPTING: tuple[FaultKind, ...] = (
    "crash",
    "hang",
    "gpu_xid",
    "correctable",
    "lost_host",
    "sdc",
)
#: what the host monitor reports for each GPU fault kind
XIDS: dict[str, int] = {"gpu_xid": 79, "correctable": 48}
#: GPU kinds a GPU reset clears, and kinds that leave the node broken until it is repaired (or,
#: the former, reset): as the fault table (``goodput.gpu_faults``) judges their XIDs
RESET_CLEARS = frozenset(k for k, xid in XIDS.items() if xid_verdict(xid).action == "reset_gpu")
BREAKING = frozenset(
    {"lost_host", "node_down"}
    | RESET_CLEARS
    | {k for k, xid in XIDS.items() if xid_verdict(xid).action == "replace_node"}
)


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    node: str
    kind: FaultKind
    #: broken kinds: repaired after this long; straggler: how long it lasts
    duration_s: float = 0.0
    #: straggler: how much slower its compute is (what the sensor sees), and the job's steps
    #: (0: as much; a replay measures it), and a replay's measured slowdown step by step and
    #: step time once it ended
    factor: float = 1.0
    slowdown: float = 0.0
    slowed_steps: tuple[float, ...] = ()
    after_step_s: float | None = None


@dataclass(frozen=True, slots=True)
class StepFault:
    """A fault that fires when training reaches a step (a replayed run's faults)."""

    at_step: int
    node: str
    kind: FaultKind
    #: straggler: how long it lasts (s), its compute factor and the job's measured slowdown,
    #: as a mean and step by step, and its step time once it ended
    duration_s: float = 0.0
    factor: float = 1.0
    slowdown: float = 0.0
    slowed_steps: tuple[float, ...] = ()
    after_step_s: float | None = None
    #: broken kinds: repaired when training reaches this step (None: by ``duration_s``)
    repair_at_step: int | None = None
    #: it strikes this long after the step is done (and saved, if it is a checkpoint step)
    delay_s: float = 0.0


def node_names(job: JobSpec) -> list[str]:
    """Every node of the fleet: the job's nodes first, then its spares."""
    return [f"node-{i}" for i in range(job.nodes + job.spares)]


def make_trace(job: JobSpec, model: FailureModel, seed: int) -> list[Fault]:
    """The faults of one fleet over the job's hours, in time order: the job's nodes from one
    stream, each spare from its own (so the spare count moves no fault of the job's nodes)."""
    nodes = node_names(job)
    faults = _faults(random.Random(f"{seed}/job"), nodes[: job.nodes], model, job)
    for spare in nodes[job.nodes :]:
        faults += _faults(random.Random(f"{seed}/{spare}"), [spare], model, job)
    faults.sort(key=lambda f: f.at_s)
    return faults


def _faults(rng: random.Random, nodes: list[str], model: FailureModel, job: JobSpec) -> list[Fault]:
    """One stream's faults on ``nodes``: at the job's per-node rates, pooled over them."""
    horizon = job.hours * 3600.0
    weights = [getattr(model, kind) for kind in INTERRUPTING]
    faults: list[Fault] = []
    # the failure model's rates are the job's (its nodes); a spare breaks at the same per node
    share = len(nodes) / job.nodes
    rate = model.interruptions_per_day * share / 86_400.0
    if rate > 0 and sum(weights) > 0:
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
    straggler_rate = model.stragglers_per_day * share / 86_400.0
    if straggler_rate > 0:
        t = rng.expovariate(straggler_rate)
        while t < horizon:
            duration = rng.expovariate(1 / model.straggler_mean_s)
            faults.append(
                Fault(t, rng.choice(nodes), "straggler", duration, model.straggler_factor)
            )
            t += rng.expovariate(straggler_rate)
    return faults
