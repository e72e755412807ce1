"""The messages the simulated ranks, host monitors and trainers send, as the real ones would.

One constructor per kind keeps the event loop (:mod:`goodput.tools.simulate.world`) about *when*
things are sent; every message is a real ``goodput.schemas`` event for job ``sim``. A rank's
pid is its rank + 1 (any unique number serves the sensor).
"""

from __future__ import annotations

import msgspec

from goodput import schemas
from goodput.gpu_faults import XID_FAULT_PREFIX
from goodput.schemas.tiers import RestoredFrom

JOB = "sim"


def heartbeat(node: str, rank: int, now: int, busy: str = "") -> schemas.Heartbeat:
    # step 0 always: a lazily sent beat would report a step as progress at the beat's time,
    # seconds after the step (its StepDone already said it, on time)
    return schemas.Heartbeat(job=JOB, ts=now, node=node, rank=rank, pid=rank + 1, step=0, busy=busy)


def step_done(
    node: str, rank: int, now: int, step: int, step_time_s: float, compute_s: float, world: int
) -> schemas.StepDone:
    # the simulated job runs the shim's loop, as the demo's example does: it restarts in process
    return schemas.StepDone(
        job=JOB, ts=now, node=node, rank=rank, step=step, step_time_s=step_time_s, tokens=0,
        loss=0.0, world_size=world, compute_time_s=compute_s, in_process_restart=True,
    )  # fmt: skip


def rank_started(node: str, rank: int, now: int, world: int, attempt: int) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB, ts=now, node=node, rank=rank, local_rank=0, world_size=world, pid=rank + 1,
        attempt=attempt,
    )  # fmt: skip


def rank_exited(
    node: str,
    rank: int,
    now: int,
    attempt: int,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    reason: str = "",
) -> schemas.RankExited:
    return schemas.RankExited(
        job=JOB, ts=now, node=node, rank=rank, pid=rank + 1, exit_code=exit_code, signal=signal,
        attempt=attempt, expected_reason=reason,
    )  # fmt: skip


def host_report(
    node: str, now: int, attempt: int, *, xid: int | None = None, faults: tuple[str, ...] = ()
) -> schemas.HostHealth:
    """A host monitor's report: healthy, a GPU XID on GPU 0 (named as the host monitor names
    it), or named faults."""
    gpus = []
    if xid is not None:
        gpus = [schemas.GpuHealth(index=0, uuid=f"{node}-gpu0", xid_errors=[xid])]
        faults = (*faults, f"{XID_FAULT_PREFIX}{xid}")
    return schemas.HostHealth(
        job=JOB, ts=now, node=node, healthy=not faults, gpu_available=True, gpus=gpus,
        faults=list(faults), attempt=attempt,
    )  # fmt: skip


def checkpoint_saved(node: str, now: int, step: int, stall_s: float, size_gb: float):
    return schemas.CheckpointSaved(
        job=JOB, ts=now, node=node, rank=0, step=step, stall_s=stall_s, bytes=int(size_gb * 1e9)
    )


def slowest_saved(
    active: list[str], gpus_per_node: int, saved: schemas.CheckpointSaved, waited_s: float
) -> schemas.CheckpointSaved:
    """The job's last rank's part of ``saved``, rank 0's save: in a replay, the union of every
    rank's stalls, ``waited_s``, which the job waited for and ``goodput report`` charges
    beyond rank 0's own (the controller reads rank 0's alone)."""
    position = len(active) - 1
    return msgspec.structs.replace(
        saved, node=active[position], rank=position * gpus_per_node, stall_s=waited_s
    )


def checkpoint_persisted(node: str, now: int, step: int, duration_s: float):
    return schemas.CheckpointPersisted(
        job=JOB, ts=now, node=node, rank=0, step=step, path="", bytes=0, duration_s=duration_s
    )


def checkpoint_restored(node: str, now: int, step: int, tier: RestoredFrom, duration_s: float):
    return schemas.CheckpointRestored(
        job=JOB, ts=now, node=node, rank=0, step=step, tier=tier, duration_s=duration_s,
    )  # fmt: skip


def replicas_split(node: str, now: int, step: int, good: list[int], bad: list[int]):
    """Rank 0's numerics window at a fingerprint step whose replicas disagreed."""
    split = schemas.ReplicaSplit(
        slot=0, groups=[good, bad] if len(good) >= len(bad) else [bad, good]
    )
    return schemas.Numerics(
        job=JOB, ts=now, node=node, rank=0, step=step, steps=1, loss_mean=0.0, loss_max=0.0,
        fingerprint_step=step, splits=[split],
    )  # fmt: skip


def replicas_agree(node: str, now: int, step: int) -> schemas.Numerics:
    """Rank 0's numerics window at a fingerprint step where every replica agreed."""
    return schemas.Numerics(
        job=JOB, ts=now, node=node, rank=0, step=step, steps=1, loss_mean=0.0, loss_max=0.0,
        fingerprint_step=step, fingerprint=1,
    )  # fmt: skip
