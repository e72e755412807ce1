"""In-process restart: a surviving rank re-enters its training step instead of being replaced.

A cold restart kills every rank and starts new processes, which import torch, rebuild the
model and optimizer and form a process group again; most of a recovery goes there. Here the
training loop is the shim's (:func:`run_in_process`), so the shim can unwind a step:

1. a collective fails because a peer died, or a ``Rejoin`` command arrives (or an injected
   hang is woken by one): the step is abandoned with whatever it half did;
2. the process group is *aborted* (:mod:`goodput.shim.group_abort`: closing its connections
   makes every peer blocked on this rank fail at once; a graceful destroy could wait on a dead
   peer). The ``Rejoin`` itself starts the abort, from the bus link's thread: a rank blocked
   in an NCCL collective whose peer died never fails on its own, the abort frees it. The
   abort is bounded: one that does not return within its timeout (a wedged
   communicator) answers the Rejoin with that reason and exits, never half-rejoined, and the
   controller decides a cold restart naming it;
3. the rank waits for the actuator's ``Rejoin`` (bounded: without one it re-raises and exits,
   the cold path), answers ``RankRejoined`` (it is out of the old group and joining), joins
   the fresh rendezvous the command names (a new TCPStore port per attempt), lets the job
   rebuild what holds the group (DDP), restores the step every rank agrees on and trains on
   — same process, same model and optimizer objects.

A rank stuck in a native call that the abort does not end never gets here; the actuator's
deadline then fails the warm restart and the controller's policy decides a cold one. The
killed rank itself is started cold by the actuator and joins the same rendezvous.

A step that failed on CUDA itself is read first (:mod:`goodput.shim.step_faults`): a sticky
error leaves the process at once, never answering a Rejoin it could not honour; an OOM is
retried warm once, after the caches are freed, and a second one before the failed step is
passed leaves too; each with the exit code that names it, for the policy.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist

from goodput import schemas
from goodput.checkpoint.engine import CheckpointEngine
from goodput.shim.group_abort import GroupAbort
from goodput.shim.group_sockets import opened_by
from goodput.shim.numerics import NumericsMonitor, replicated
from goodput.shim.rescale import BatchPlan
from goodput.shim.step_faults import LeaveCold, OomRetry, classify, free_cuda_caches, leave_cold
from goodput.shim.step_protocol import RestartRequested, StepHooks, end_step
from goodput.shim.stop_vote import StopVote
from goodput.warm_path import WARM_PATH, WarmPathTimeouts

if TYPE_CHECKING:
    from goodput.checkpoint.engine.torch_save import TorchSaveCheckpointer
    from goodput.shim.config import ShimConfig
    from goodput.shim.link import BusLink
    from goodput.shim.restore_result import RestoreResult

log = logging.getLogger(__name__)


class ResumableJob(Protocol):
    """What :func:`run_in_process` drives: one rank's training state and its step.

    ``release_group`` drops whatever holds the process group (a DDP wrapper) and any
    half-accumulated gradients; ``regroup`` rebuilds it on the new default group (and, under
    :func:`goodput.shim.run_job`, first wraps a job built before any group existed). Both keep the
    model and optimizer objects: the state is restored into them after ``regroup``. An FSDP2
    job's ``regroup`` calls :func:`goodput.shim.fsdp_regroup.regroup_fsdp` (its mesh and
    DTensors hold the old group; it re-points them in place). ``plan`` is
    the batch plan in force; a restore hands ``load_state_dict`` the checkpoint's, as the
    rescale callbacks left it (the same typed restore as a cold start's).

    Each step's loss goes to the numerics monitor (``TrainerShim.numerics``), with the job's
    ``last_grad_norm`` and its ``model``'s replicated parameters where it has them.
    """

    step: int
    last_compute_time_s: float

    # read, never set, by the shim: a job may compute them
    @property
    def tokens_per_step(self) -> int: ...

    @property
    def plan(self) -> BatchPlan | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], plan: BatchPlan | None = None) -> None: ...

    def train_step(self, slowdown: float = 1.0) -> float: ...

    def skip_step(self) -> None:
        """Advance past the next step's batch without training on it (a loss spike's)."""
        ...

    def release_group(self) -> None: ...

    def regroup(self) -> None: ...


class LoopShim(StepHooks, Protocol):
    """What :func:`run_in_process` uses of the shim (``TrainerShim`` is it): declared here, so
    the shim's ``run`` calls this loop without the loop importing the shim back."""

    @property
    def config(self) -> ShimConfig: ...

    @property
    def engine(self) -> CheckpointEngine | TorchSaveCheckpointer: ...

    @property
    def link(self) -> BusLink | None: ...

    @property
    def numerics(self) -> NumericsMonitor: ...

    def restore(
        self, template_state: dict[str, Any], plan: BatchPlan | None = None
    ) -> RestoreResult | None: ...

    def finish(self, state: dict[str, Any], step: int) -> None: ...

    def skips_data(self, step: int) -> bool: ...

    def compute_slowdown(self) -> float: ...

    def set_busy(self, what: str) -> None: ...

    def bus_ports(self) -> frozenset[int]: ...

    def enable_in_process_restart(self) -> RejoinMailbox: ...

    def rejoin_pending(self) -> bool: ...

    def answer_rejoin(
        self, command: schemas.Rejoin, *, ok: bool, detail: str = "", regroup_s: float = 0.0
    ) -> None: ...


class RejoinMailbox:
    """The newest ``Rejoin`` for this rank. Commands arrive on the bus link's thread; one for
    an attempt this rank has already reached is an old attempt's and is ignored (logged)."""

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self._cond = threading.Condition()
        self._pending: schemas.Rejoin | None = None
        self._abort: GroupAbort | None = None

    def arm(self, abort: GroupAbort) -> GroupAbort:
        """Start ``abort`` when a Rejoin is accepted: the command frees a loop blocked in a
        collective on a dead peer (an NCCL kernel spins until its communicator is aborted)."""
        with self._cond:
            self._abort = abort
        return abort

    def offer(self, command: schemas.Rejoin) -> bool:
        with self._cond:
            newest = max(self.attempt, self._pending.attempt if self._pending else 0)
            if command.attempt <= newest:
                log.warning(
                    "ignoring Rejoin for attempt %d: this rank is at attempt %d",
                    command.attempt,
                    newest,
                )
                return False
            self._pending = command
            self._cond.notify_all()
            if self._abort is not None:
                self._abort.start()
            return True

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def wait(self, timeout_s: float | None) -> schemas.Rejoin | None:
        """The pending command (taken), waiting up to ``timeout_s`` for one (None: forever)."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is not None, timeout_s)
            command, self._pending = self._pending, None
            if command is not None:
                self.attempt = command.attempt
            return command


@dataclass
class RunOutcome:
    first_step: int  # the step this process started from (after its first restore)
    step: int  # completed steps when the loop ended
    stopped: bool  # ended early on a stop request
    losses: list[tuple[int, float]] = field(default_factory=list)
    step_time_s: float = 0.0
    #: in-process restarts this process went through
    restarts: int = 0
    #: steps whose batch was skipped (a loss spike's window), as the loop passed them
    skipped: list[int] = field(default_factory=list)


def run_in_process(
    shim: LoopShim,
    job: ResumableJob,
    total_steps: int,
    *,
    stop_at: int | None = None,
    timeouts: WarmPathTimeouts = WARM_PATH,
    group_sockets: frozenset[int] = frozenset(),
) -> RunOutcome:
    """Restore, train to ``total_steps`` (or a stop), checkpoint as agreed, finish; a failed
    step is unwound and resumed in this process after a Rejoin (see the module docstring).
    ``group_sockets``: the current group's connections, cut by its abort
    (:mod:`goodput.shim.group_sockets`; ``run_job`` knows them, a script's own group not).
    A CUDA failure this process cannot go on from (from a step, a restore or a rejoin) ends
    it with :class:`~goodput.shim.step_faults.LeaveCold`, whose exit code names it."""
    cause: BaseException
    try:
        return _run(shim, job, total_steps, stop_at, timeouts, group_sockets)
    except LeaveCold as leaving:
        fault, cause = leaving.fault, leaving
    except Exception as exc:
        fault = classify(exc)
        if fault.kind == "recoverable":
            raise
        cause = exc
    _settle_checkpoint(shim)
    raise leave_cold(fault) from cause


#: how long a rank leaving cold waits for the checkpoint it is persisting (host memory to disk:
#: the poisoned context is not involved) before it leaves anyway
SETTLE_S = 30.0


def _settle_checkpoint(shim: LoopShim) -> None:
    """Let a checkpoint in flight end (durable, or failed) before the rank leaves, so its
    progress is kept and the reason, logged next, is the rank log's last line (torch-save
    mode saves synchronously: nothing is in flight)."""
    if not isinstance(shim.engine, CheckpointEngine):
        return
    waiter = threading.Thread(target=shim.engine.wait_until_idle, daemon=True)
    waiter.start()
    waiter.join(SETTLE_S)


def _run(
    shim: LoopShim,
    job: ResumableJob,
    total_steps: int,
    stop_at: int | None,
    timeouts: WarmPathTimeouts,
    group_sockets: frozenset[int],
) -> RunOutcome:
    mailbox = shim.enable_in_process_restart()
    backend = dist.get_backend() if dist.is_initialized() else None
    if not _restore(shim, job):
        # a fresh start is checkpointed: a rank restarted in process must be able to go back
        # to where a cold start of every rank would begin, and it cannot rebuild that state
        shim.save(job.state_dict(), job.step)
    outcome = RunOutcome(first_step=job.step, step=job.step, stopped=False)
    abort = mailbox.arm(GroupAbort(sockets=group_sockets))
    oom = OomRetry()
    while True:
        try:
            _train(shim, job, total_steps, stop_at, outcome)
            break
        except Exception as exc:
            fault = classify(exc)
            if fault.kind == "context" or (fault.kind == "oom" and not oom.allows(job.step)):
                raise  # run_in_process leaves cold, saying why
            if backend is None or shim.link is None:
                raise  # no group to rejoin, or no supervisor to send a Rejoin
            log.warning("training step abandoned (%s); leaving the process group", exc)
            shim.set_busy("restarting")
            stuck = _abandon_step(job, exc, abort, timeouts.abort_s)
            if fault.kind == "oom":
                # after the step's frames and the job's group went: what they held is free
                free_cuda_caches()
                log.warning("%s at step %d: retrying once, warm", fault.reason, job.step + 1)
            command = mailbox.wait(timeouts.rejoin_wait_s)
            if command is None:
                log.error(
                    "no Rejoin within %.0f s; exiting for a cold restart", timeouts.rejoin_wait_s
                )
                raise
            if stuck:
                # out of the old group it is not, so it must not join the new one: the actuator
                # fails the warm restart with this reason and the controller goes cold
                log.error("cannot rejoin attempt %d: %s", command.attempt, stuck)
                shim.answer_rejoin(command, ok=False, detail=stuck)
                raise RuntimeError(f"cannot rejoin: {stuck}") from exc
            sockets = _rejoin(shim, job, command, backend, timeouts.group_s)
            abort = mailbox.arm(GroupAbort(sockets=sockets))
            outcome.restarts += 1
    abort.release()  # the job destroys its groups itself at its end, not the interpreter's exit
    shim.finish(job.state_dict(), job.step)
    return outcome


def _train(
    shim: LoopShim,
    job: ResumableJob,
    total_steps: int,
    stop_at: int | None,
    outcome: RunOutcome,
) -> None:
    vote = StopVote()  # one per group: a ballot in flight on the group left behind is lost
    parameters = replicated(getattr(job, "model", None))
    can_skip = callable(getattr(job, "skip_step", None))
    if shim.config.skip_steps and not can_skip:
        log.error("the job has no skip_step(): it trains on the batches it was to skip")
    while job.step < total_steps:
        if shim.rejoin_pending():
            raise RestartRequested("a Rejoin command arrived")
        if stop_at is not None and job.step >= stop_at:
            outcome.stopped = True
            return
        if can_skip and shim.skips_data(job.step + 1):
            job.skip_step()
            outcome.skipped.append(job.step)
            continue
        started = time.perf_counter()
        loss = job.train_step(slowdown=shim.compute_slowdown())
        step_time_s = time.perf_counter() - started
        outcome.step_time_s += step_time_s
        outcome.step = step = job.step
        outcome.losses.append((step, loss))
        shim.numerics.observe(step, loss, getattr(job, "last_grad_norm", None), parameters)
        stop = end_step(
            shim,
            step,
            step_time_s=step_time_s,
            tokens=job.tokens_per_step,
            loss=loss,
            state=job.state_dict,
            vote=vote,
            final=step >= total_steps,
            compute_time_s=job.last_compute_time_s,
            restart_pending=shim.rejoin_pending,
        )
        if stop and step < total_steps:
            outcome.stopped = True
            return


def _restore(shim: LoopShim, job: ResumableJob) -> bool:
    """The cold path's restore (``RestoreResult``, rescale callbacks, ``TrainingPlan``); after
    a Rejoin its bytes come from host memory when the engine's buffer still holds them."""
    restored = shim.restore(job.state_dict(), plan=job.plan)
    if restored is not None:
        job.load_state_dict(restored.state, restored.plan)
    return restored is not None


def _abandon_step(
    job: ResumableJob, failure: BaseException, abort: GroupAbort, timeout_s: float
) -> str:
    """Leave the group a failed step was using (``_leave_group``'s answer). The traceback's
    frames (a collective's locals) hold that group: cleared, the group is freed once aborted
    and its gloo connections close, so a peer blocked on this rank fails now; kept, the peer
    hangs until this process exits (gloo's abort closes nothing)."""
    traceback.clear_frames(failure.__traceback__)
    return _leave_group(job, abort, timeout_s)


def _leave_group(job: ResumableJob, abort: GroupAbort, timeout_s: float) -> str:
    """Abort, never destroy: closing this rank's connections makes peers blocked on it fail
    now, and nothing here waits on a peer that may be dead. The groups are freed by
    ``abort.release`` (off this thread, without the GIL), never by the job's DDP reducer, which
    frees them holding the GIL and deadlocks on a collective still in flight
    (:mod:`goodput.shim.group_abort`). Returns "" once out of the group, else why not (the
    abort did not return within ``timeout_s`` of its start, or failed)."""
    abort.start()
    job.release_group()
    stuck = abort.wait(timeout_s)
    gc.collect()  # the job's last holders of the groups (reference cycles) go first
    abort.release()
    return stuck


def _rejoin(
    shim: LoopShim,
    job: ResumableJob,
    command: schemas.Rejoin,
    backend: str,
    group_timeout_s: float,
) -> frozenset[int]:
    """Join the Rejoin's rendezvous and resume; returns the new group's connections."""
    started = time.perf_counter()
    rank, world_size = shim.config.rank, shim.config.world_size
    if command.world_size != world_size:
        shim.answer_rejoin(command, ok=False, detail="the world size changed: restart cold")
        raise RuntimeError(f"Rejoin for {command.world_size} ranks; this group had {world_size}")
    # the same variables a cold start reads, so env:// rendezvous meets the respawned ranks
    os.environ.update(
        MASTER_ADDR=command.master_addr,
        MASTER_PORT=str(command.master_port),
        GOODPUT_ATTEMPT=str(command.attempt),
        TORCHELASTIC_RESTART_COUNT=str(command.attempt - 1),
    )
    # answered before the rendezvous: the ranks started again may take long to import torch
    # on a busy host, which is no reason to give up on this one; a rendezvous that never
    # completes ends in the group timeout, and this process's exit is a crash like any other
    shim.answer_rejoin(command, ok=True, regroup_s=time.perf_counter() - started)
    _, sockets = opened_by(
        lambda: dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=group_timeout_s)
        ),
        sparing=shim.bus_ports(),
    )
    job.regroup()
    if not _restore(shim, job):
        # the ranks started again begin from scratch; this process cannot go back there
        raise RuntimeError("no checkpoint every rank holds: this rank cannot resume in step")
    shim.set_busy("")
    log.info("rejoined attempt %d in process; resuming at step %d", command.attempt, job.step)
    return sockets
