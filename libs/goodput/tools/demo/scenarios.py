"""The demo's fault scenarios: which fault hits which rank, at which point of training.

A fault fires once training has done ``at`` of its steps *and* the job has played out the
fault before it (restarted and stepping again; a straggler once the sensor has flagged it, or
its slowing ended unflagged: it runs on alongside what follows), so
every run of a scenario meets the same faults at the same training progress, however quickly
it recovers — which is what makes goodput's remediation and the baseline comparable. Node
faults (and an SDC, which corrupts a node's replica) name the node that runs ``rank`` when
they fire.

A failed node comes back on the clock that matters to the job. A job that went on without it
gets it back once training reached ``repair_at`` of its steps, so whether a spare is free when
a later fault fires depends on training progress, never on how fast this machine runs (on a
wall clock, a loaded machine saw the first lost node back before the second loss, and hot
swapped where the scenario means to scale down). A job that waits for the node (the baseline)
cannot progress without it: it gets it back ``repair_after_s`` wall seconds after the loss, the
time a repair takes, which is what waiting costs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: the sensor's straggler threshold in the demo (the replay sets the same). A dozen processes
#: share this machine's cores: for ten steps a healthy rank is often 1.4× its peer, and once
#: 1.81× (a quiet full demo, before the sensor's 20 s hold, whose false eviction took the spare
#: its node loss then lacked), while the scenario's 3× straggler measures about 2.6×
STRAGGLER_RATIO = 2.0
#: the sensor's hang margin in the demo: no progress for 4 × a rank's own p95 step (the default
#: 3). The 3× straggler's first slowed steps take about 3 × the p95 of the steps before them,
#: and more under load: a clean-clone CI baseline took it for hung (2.4 s without progress past
#: a 2.3 s timeout, 3 × p95 0.77 s), restarted the job, which ended the straggler, and never
#: saw one. The demo's hang is still found within about 3 s at its step times
HANG_SAFETY_FACTOR = 4.0
#: and the floor under it: at the baseline's 0.3 s steps 4 × p95 is under the default 1.5 s
#: floor, and a 3× straggler's slowed step, 0.9 s on a quiet machine, took 1.6 s under load:
#: ci14's baseline took it for a hang at the floor. 3 s is twice that, and the demo's hang is
#: found in 3 s
HANG_MIN_TIMEOUT_S = 3.0
#: the demo job's numerics window (the shim's default) and how often it compares its
#: replicas' parameters: every 20 steps, not the default 100, as its failures are compressed
#: into minutes. An SDC is found at the first fingerprint after it: the full scenario's, 48
#: steps before the straggler's at 800 steps and 24 at 400, within 20 steps (the straggler
#: waits for its rollback all the same), with an agreed fingerprint, and so a checkpoint
#: known clean, behind it at any number of steps from 80. One fingerprint of the example
#: model takes about 0.6 ms (docs/BENCHMARKS.md): about 0.01 % of its step, one every 20
NUMERICS_EVERY = 10
FINGERPRINT_EVERY = 20

DemoAction = Literal["kill-rank", "hang-rank", "slow-rank", "fail-node", "terminate-node", "sdc"]


@dataclass(frozen=True)
class DemoFault:
    at: float
    action: DemoAction
    rank: int
    #: fail-node: the node is healthy again this many seconds after it failed (None: never)
    repair_after_s: float | None = None
    #: fail-node: for a job that went on without the node, it is back at this fraction of the
    #: steps instead (None: on the wall clock too)
    repair_at: float | None = None
    #: slow-rank: how much slower, and for how long: ``duration_s`` and ``min_slow_steps``
    #: training steps, whichever ends later (a straggler is judged over steps: on a loaded
    #: machine 60 s can be too few of them to judge at all), then on until the sensor has
    #: flagged it, for ``unflagged_cap_s`` in all at most (on a loaded machine the peer a
    #: straggler is measured against is slowed too, and its ratio can take longer to hold)
    factor: float = 3.0
    duration_s: float = 60.0
    min_slow_steps: int = 30
    unflagged_cap_s: float = 300.0

    def describe(self) -> str:
        what = {
            "kill-rank": f"crash: kill -9 of rank {self.rank}",
            "hang-rank": f"hang: the training loop of rank {self.rank} stops, heartbeats go on",
            "slow-rank": f"straggler: rank {self.rank} at 1/{self.factor:g} speed for "
            f"{self.duration_s:g} s and {self.min_slow_steps} steps, whichever ends later, and "
            f"until flagged (at most {self.unflagged_cap_s:g} s)",
            "fail-node": f"node loss: the node of rank {self.rank} goes down"
            + (f", repaired {self.repair_after_s:g} s later" if self.repair_after_s else "")
            + (
                f" (at {self.repair_at:.0%} of the steps if the job goes on without it)"
                if self.repair_at and self.repair_after_s
                else ""
            ),
            "terminate-node": f"node taken away: SIGTERM to every rank on rank {self.rank}'s node",
            "sdc": f"silent data corruption: one bit of one parameter flipped in the replica "
            f"on rank {self.rank}'s node (goodput finds it at the replicas' next fingerprint and "
            "rolls back to the newest checkpoint known clean, both replicas where 2 hold no "
            "majority to tell the bad one; a job without goodput trains on with it)",
        }[self.action]
        return f"at {self.at:.0%} of the steps, {what}"

    def slow_played(self, slowed_s: float, slowed_steps: int, flagged: bool) -> bool:
        """Whether a slow-rank fault has lasted its seconds and its steps (both: the pace can
        change while it lasts, and a straggler is judged over steps) and the sensor has
        ``flagged`` it, or it has lasted its cap unflagged."""
        played = slowed_s >= self.duration_s and slowed_steps >= self.min_slow_steps
        return played and (flagged or slowed_s >= self.unflagged_cap_s)

    def repair_due(self, *, down_s: float, step: int, steps: int, job_waits: bool) -> bool:
        """Whether the node this fault took down is back, ``down_s`` wall seconds after it failed.

        ``step`` of ``steps``: the training progress now; ``job_waits``: the job cannot train
        without the node (the baseline).
        """
        if self.repair_after_s is None:
            return False
        if job_waits or self.repair_at is None:
            return down_s >= self.repair_after_s
        return step >= self.repair_at * steps


@dataclass(frozen=True)
class DemoScenario:
    description: str
    faults: tuple[DemoFault, ...]
    spares: int

    @property
    def comparable(self) -> bool:
        """The baseline can finish it: every node it takes away comes back."""
        return all(
            f.action != "terminate-node" and (f.action != "fail-node" or f.repair_after_s)
            for f in self.faults
        )


SCENARIOS: dict[str, DemoScenario] = {
    "full": DemoScenario(
        "a crash, a hang, a bit flipped in one replica's parameters (SDC), a straggler, a node "
        "lost while a spare is free, another lost with none left, then repaired (goodput "
        "answers with every remediation: in-job restart, restart, numerical rollback, "
        "eviction, hot swap, scale down, scale up; 2 replicas' fingerprints cannot tell which "
        "one the SDC hit: both roll back)",
        (
            DemoFault(0.10, "kill-rank", rank=1),
            DemoFault(0.22, "hang-rank", rank=0),
            # while the job holds both replicas (the scale-down comes later), on rank 0's
            # node, whose replica the baseline's checkpoints are saved from
            DemoFault(0.28, "sdc", rank=0),
            DemoFault(0.34, "slow-rank", rank=1, factor=3.0, duration_s=60.0),
            # back after the next loss found no spare free, and after the scale-up it causes
            DemoFault(0.50, "fail-node", rank=0, repair_after_s=45.0, repair_at=0.80),
            DemoFault(0.62, "fail-node", rank=1, repair_after_s=20.0, repair_at=0.70),
        ),
        spares=2,
    ),
    "none": DemoScenario("no fault: the reference run", (), spares=1),
    "kill-twice": DemoScenario(
        "kill -9 of a rank (in-job restart), then SIGTERM of a node (hot swap to the spare)",
        (DemoFault(0.25, "kill-rank", rank=1), DemoFault(0.55, "terminate-node", rank=0)),
        spares=1,
    ),
    "hot-swap": DemoScenario(
        "a node fails while a spare exists: swapped, same world size",
        (DemoFault(0.35, "fail-node", rank=1),),
        spares=1,
    ),
    "sdc": DemoScenario(
        "a bit flipped in one replica's parameters (SDC): found at the replicas' next "
        "fingerprint, rolled back to the newest checkpoint known clean (2 replicas cannot tell "
        "which one is bad: both roll back)",
        (DemoFault(0.5, "sdc", rank=0),),
        spares=0,
    ),
    "scale-down-up": DemoScenario(
        "a node fails with no spare (scale down), is repaired 8 s later, once the job has "
        "trained on without it (scale up)",
        (DemoFault(0.25, "fail-node", rank=1, repair_after_s=8.0, repair_at=0.40),),
        spares=0,
    ),
}
