"""A rank from a builder: what lets the actuator keep pre-warmed standby ranks.

Starting a rank costs a Python interpreter, ``import torch`` and building the model and the
optimizer before it can join its peers — most of a recovery when one rank dies. With
:func:`run_job` the user hands the shim a function that builds the job (model, optimizer,
data: a :class:`~goodput.shim.inprocess.ResumableJob`, no process group yet), so the shim can
call it ahead of time. Under the actuator a job started with ``StartJob.standbys`` then has
standby processes on every node: each builds its job and waits for an assignment
(:mod:`goodput.launch.standby_channel`, a socket pair locally, the bus for a pod: the RankEnv a
rank started cold would find in its
environment). Assigned, it is a rank like any other: it joins the rendezvous, restores the
agreed checkpoint and trains, in the shim's own loop (in-process restart included).

    def build_state() -> MyJob: ...          # imports done; model and optimizer built
    run = run_job(build_state, total_steps)  # a rank, or a standby until it is assigned one
    sys.exit(run.shim.exit_code)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from goodput.launch.capacity import DeviceSharingError, rank_device
from goodput.launch.rank_env import VARIABLES, RankEnv, nccl_error_handling
from goodput.launch.standby_channel import StandbyReleased, receive_assignment
from goodput.shim.group_sockets import opened_by
from goodput.shim.inprocess import ResumableJob, RunOutcome
from goodput.shim.rescale import RescaleCallback
from goodput.shim.trainer import TrainerShim
from goodput.warm_path import WARM_PATH, WarmPathTimeouts

log = logging.getLogger(__name__)


@dataclass
class JobRun:
    shim: TrainerShim
    job: ResumableJob
    outcome: RunOutcome


def run_job(
    build_state: Callable[[], ResumableJob],
    total_steps: int,
    *,
    rescale: Iterable[RescaleCallback] = (),
    backend: str | None = None,
    timeouts: WarmPathTimeouts = WARM_PATH,
    stop_at: int | None = None,
    **shim_options: Any,
) -> JobRun:
    """Build the job, become a rank (a standby first waits for its assignment), join the
    process group (``backend``: nccl where CUDA is, else gloo), then :meth:`TrainerShim.run`.

    An NCCL group is created with :data:`goodput.launch.rank_env.NCCL_ERROR_HANDLING` (a value already
    in the environment wins): a peer's death must fail this rank's collectives, not kill it.
    ``timeouts`` bound the group's collectives and the in-process restart
    (:mod:`goodput.warm_path`; their order is checked when they are built).

    ``shim_options`` override :class:`~goodput.shim.trainer.ShimConfig` fields read from the
    environment. A standby the actuator releases without an assignment exits 0.
    """
    standby = bool(RankEnv.from_env().standby)
    started = time.perf_counter()
    if not standby:
        bind_rank_device(RankEnv.from_env())
    job = build_state()
    if standby:
        log.info("standby: state built in %.2f s; waiting for an assignment", _since(started))
        try:
            assignment = receive_assignment()
        except StandbyReleased:
            log.info("standby released without an assignment")
            raise SystemExit(0) from None
        os.environ.pop(VARIABLES["standby"], None)
        os.environ.update(assignment.to_env())
        bind_rank_device(assignment)
        log.info("standby assigned rank %d of %d", assignment.rank, assignment.world_size)
    shim = TrainerShim.from_env(**shim_options)
    for callback in rescale:
        shim.on_rescale(callback)
    sockets: frozenset[int] = frozenset()
    if shim.config.world_size > 1 and not dist.is_initialized():
        chosen = group_backend(backend)
        # its connections are known, so that an abort can cut them (gloo: group_sockets)
        _, sockets = opened_by(
            lambda: dist.init_process_group(
                chosen,
                rank=shim.config.rank,
                world_size=shim.config.world_size,
                timeout=timedelta(seconds=timeouts.group_s),
            ),
            sparing=shim.bus_ports(),
        )
    job.regroup()
    outcome = shim.run(
        job,
        total_steps,
        stop_at=stop_at,
        timeouts=timeouts,
        group_sockets=sockets,
    )
    return JobRun(shim=shim, job=job, outcome=outcome)


def bind_rank_device(env: RankEnv) -> torch.device | None:
    """Make this rank's GPU the current CUDA device (none without CUDA): with eight ranks on a
    node, every rank left on device 0 would put its model, its NCCL communicator and the
    shim's collectives (:mod:`goodput.shim.collectives`) on one GPU. The device is a GPU no
    other rank of the host binds (:func:`goodput.launch.capacity.rank_device`); one that
    would be shared ends the process with that one line.

    A standby builds its job before it knows its rank, so its builder must leave the state
    on the CPU and move it in ``regroup`` (called once the rank's device is bound)."""
    if not torch.cuda.is_available():
        return None
    try:
        index = rank_device(
            env.local_rank, env.local_world_size, torch.cuda.device_count(), env.device
        )
    except DeviceSharingError as exc:
        raise SystemExit(f"goodput: {exc}") from None
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def group_backend(backend: str | None) -> str:
    """The backend of the group :func:`run_job` creates: ``backend``, else nccl where CUDA is,
    else gloo. For nccl the NCCL error handling goes into this process's environment first (a
    value already there wins): torch reads it when the group is created, and the groups of
    in-process restarts inherit it."""
    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if chosen == "nccl":
        os.environ.update(nccl_error_handling(os.environ))
    return chosen


def _since(started: float) -> float:
    return time.perf_counter() - started
