"""Pure functions that fold what the controller observes and decides into the ``JobState``
(:mod:`goodput.supervisor.jobstate.model`): its start, each signal, status, result and command,
and the view a policy reads (``project``). Membership facts come only
from the actuator: every ``JobStatus`` replaces the observed membership, every ``ActionResult``
settles a pending command (a refusal is recorded with its reason). A command the controller
issues is only a prediction until then (``pending``). Every function returns a new state and
never mutates its input. Applying a command is idempotent by ``command_id`` (the ids are
recorded), and a signal already handled is recorded too, so a controller that re-reads a
stored state never repeats what was already done.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Sequence

import msgspec

from goodput import schemas, subjects
from goodput.supervisor.jobstate.model import (
    DOWNTIME_MEMORY,
    NS,
    REFUSAL_MEMORY,
    CheckpointRecord,
    JobState,
    NodeRecord,
    PendingCommand,
    Refusal,
    Remediation,
    Role,
)
from goodput.supervisor.membership import Membership, MembershipError

#: signal kinds that mean training was interrupted (they count for MTBF and crash loops)
FAILURE_KINDS = (
    frozenset({"crash", "hang", "missed_heartbeat", "degraded_host", "job_down"})
    | schemas.NUMERICAL_SIGNALS  # a rollback restarts too: the crash-loop rules bound repeats
)
#: how many ids / records are remembered (older ones cannot be redelivered any more)
MEMORY = 512
CHECKPOINT_MEMORY = 32
#: how many of rank 0's latest step times the job's step time is the median of
STEP_TIME_WINDOW = 31
#: the events the controller reads, each with the one rank it needs of a kind every rank
#: reports (None: whichever sends it): the statuses, steps and checkpoints ``observe_event``
#: folds, the signals it decides on and the results that settle its commands. Its durable
#: consumer has the server filter to these (``subjects.events_read``): at 16,384 ranks the
#: other ranks' steps were most of what it was sent. A fold of another kind or rank would
#: never be fed in the service: ``tests/controller/test_reads.py`` fails on one.
CONTROLLER_READS: dict[type[schemas.Event], int | None] = {
    schemas.JobStatus: None,
    schemas.Signal: None,
    schemas.ActionResult: None,
    schemas.StepDone: 0,
    schemas.StepsDone: 0,  # rank 0's node's rollup: the service folds its StepDone records
    schemas.CheckpointSaved: 0,
    schemas.CheckpointPersisted: 0,
}


def controller_filters(job: str) -> list[str]:
    """The subject filters of the controller's event consumer: ``CONTROLLER_READS``'s."""
    return subjects.events_read(job, {schemas.kind_of(t): r for t, r in CONTROLLER_READS.items()})


def _remember(ids: list[str], new: str) -> list[str]:
    return [*ids[-(MEMORY - 1) :], new]


def observe_event(state: JobState, event: schemas.Event, now: int) -> JobState:
    """What the controller learns from a job event that is neither a signal nor a result
    (those it decides on and settles): the membership the actuator reports (``JobStatus``),
    rank 0's step time and loop (``StepDone``) and its checkpoints' costs. The controller
    service and the simulator fold events with this one function; others leave ``state``."""
    match event:
        case schemas.JobStatus():
            return observe_status(state, event, now)
        case schemas.StepDone(rank=0):
            return record_step_time(record_capabilities(state, event), event.step_time_s, now)
        case schemas.CheckpointSaved(rank=0) | schemas.CheckpointPersisted(rank=0):
            return record_checkpoint(state, event, now)
    return state


def observe_signal(state: JobState, signal: schemas.Signal, now: int) -> JobState:
    """Record the health facts a signal carries, before any policy acts on it."""
    nodes = state.nodes
    interruptions = state.interruptions
    record = state.node(signal.node) if signal.node else None
    if signal.signal == "node_returned":
        nodes = [
            msgspec.structs.replace(
                n, down=False, gpu_reset_failed="", reason="returned", since_ts=now
            )
            if n.name == signal.node
            else n
            for n in nodes
        ]
    elif signal.signal in FAILURE_KINDS:
        nodes = [
            msgspec.structs.replace(
                n,
                failures=n.failures + 1,
                down=n.down or signal.severity == "uncorrectable",
                reason=f"{signal.signal}: {signal.detail}"[:200],
            )
            if n.name == signal.node
            else n
            for n in nodes
        ]
        if record is None or record.role == "active":
            interruptions = [*interruptions[-(MEMORY - 1) :], signal.observed_ts or now]
    return project(
        msgspec.structs.replace(
            state,
            nodes=nodes,
            interruptions=interruptions,
            handled_signal_ids=_remember(state.handled_signal_ids, signal.signal_id),
            version=state.version + 1,
        ),
        now,
    )


def observe_status(state: JobState, status: schemas.JobStatus, now: int) -> JobState:
    """The actuator's report is the membership: it replaces what was observed before."""
    observed = Membership(
        active=list(status.active_nodes),
        spares=list(status.spare_nodes),
        failed=list(status.failed_nodes),
        procs_per_node=status.procs_per_node or state.procs_per_node,
    )
    known = {n.name for n in state.nodes}
    added = [
        NodeRecord(name=n, role="spare", reason="reported", since_ts=now)
        for n in [*observed.active, *observed.spares, *observed.failed]
        if n not in known
    ]
    suspect = set(status.suspect_nodes)
    nodes = [
        msgspec.structs.replace(n, suspect=n.name in suspect)
        if n.suspect != (n.name in suspect)
        else n
        for n in [*state.nodes, *added]
    ]
    return project(
        msgspec.structs.replace(
            state,
            observed=observed,
            attempt=status.attempt,
            standbys={node: len(pids) for node, pids in status.standbys.items() if pids},
            backend=status.capabilities or state.backend,
            nodes=nodes,
            version=state.version + 1,
        ),
        now,
    )


def observe_result(state: JobState, result: schemas.ActionResult, now: int) -> JobState:
    """Settle the pending command ``result`` answers; a refusal is kept with its reason."""
    if not any(p.command.command_id == result.command_id for p in state.pending):
        return state
    settled = next(p for p in state.pending if p.command.command_id == result.command_id)
    pending = [p for p in state.pending if p.command.command_id != result.command_id]
    refused, restarts, nodes = state.refused, state.restarts, state.nodes
    resuming = state.resuming_since_ts
    if result.ok and settled.command.restarts_group:
        resuming = settled.ts  # its downtime ends at the job's next step
    if not result.ok:
        nodes = _mark_failed_resets(nodes, settled.command, result.detail)
        # nothing restarted: a crash loop counts only remediations that ran
        restarts = [r for r in restarts if r.command_id != result.command_id]
        refusal = Refusal(
            command_id=result.command_id,
            action=result.action,
            reason=result.detail or "refused without a reason",
            ts=now,
        )
        refused = [*refused[-(REFUSAL_MEMORY - 1) :], refusal]
    return project(
        msgspec.structs.replace(
            state,
            pending=pending,
            refused=refused,
            restarts=restarts,
            nodes=nodes,
            resuming_since_ts=resuming,
            version=state.version + 1,
        ),
        now,
    )


def _mark_failed_resets(
    nodes: list[NodeRecord], command: schemas.Command, why: str
) -> list[NodeRecord]:
    """A restart with GPU resets that failed: its nodes' GPUs are still faulty."""
    if not isinstance(command, schemas.Restart) or not command.reset_gpus:
        return nodes
    why = (why or "no reason given")[:200]
    return [
        msgspec.structs.replace(n, gpu_reset_failed=why) if n.name in command.reset_gpus else n
        for n in nodes
    ]


def expire_pending(state: JobState, now: int, timeout_s: float) -> JobState:
    """Pending commands unanswered for ``timeout_s`` are refusals: the actuator never said."""
    limit = now - int(timeout_s * 1e9)
    stale = [p for p in state.pending if p.ts < limit]
    if not stale:
        return state
    for pending in stale:
        result = schemas.ActionResult(
            job=state.job,
            command_id=pending.command.command_id,
            action=schemas.kind_of(type(pending.command)),
            ok=False,
            detail=f"no result from the actuator within {timeout_s:.0f} s",
        )
        state = observe_result(state, result, now)
    return state


def apply_command(
    state: JobState,
    command: schemas.Command,
    now: int,
    cause: str = "",
    *,
    signal: schemas.Signal | None = None,
    redecided: bool = False,
) -> JobState:
    """The state once ``command`` is issued; a command applied before changes nothing.

    Membership changes are only predicted (pending until the actuator answers, with the
    ``signal`` it remediates). ``cause`` is the kind of signal behind it, remembered with
    restarting commands so crash loops count only remediations of failures.
    """
    cause = cause or (signal.signal if signal else "")
    if command.command_id in state.applied_command_ids:
        return state
    changes: dict[str, object] = {}
    if isinstance(command, schemas.Stop) and not command.nodes:
        changes["stopped"] = command.reason or "stopped"
    elif isinstance(command, schemas.SetCheckpointInterval):
        changes["checkpoint_interval_steps"] = command.every_steps
    if command.restarts_group:
        changes["restarts"] = [
            *state.restarts[-(MEMORY - 1) :],
            Remediation(
                ts=now,
                action=schemas.kind_of(type(command)),
                command_id=command.command_id,
                signal=cause,
            ),
        ]
    state = with_pending(state, command, now, signal=signal, redecided=redecided)
    return msgspec.structs.replace(
        state,
        **changes,
        applied_command_ids=_remember(state.applied_command_ids, command.command_id),
        version=state.version + 1,
    )


def record_capabilities(state: JobState, step: schemas.StepDone) -> JobState:
    """What rank 0 declares its job's ranks support (its loop the shim's: in process)."""
    if state.in_process_restart == step.in_process_restart:
        return state
    return msgspec.structs.replace(state, in_process_restart=step.in_process_restart)


def record_step_time(state: JobState, step_time_s: float, now: int = 0) -> JobState:
    """Fold one of rank 0's step times into the job's step time (checkpoint intervals in steps),
    and, the first step after a relaunching command (at ``now``), that command's downtime.

    The step time is the median of the last ``STEP_TIME_WINDOW`` steps, not a running mean:
    one absurd step (a stalled clock, a step that waited out a NATS outage) would move a mean
    by orders of magnitude and set the interval to "every step" for hundreds of steps, while a
    median ignores up to half a window of outliers and follows a real change (a rescale, a
    slower world) within half a window.
    """
    if now and state.resuming_since_ts and now > state.resuming_since_ts:
        downtime = (now - state.resuming_since_ts) / NS
        state = msgspec.structs.replace(
            state,
            resuming_since_ts=0,
            restart_downtimes_s=[*state.restart_downtimes_s[-(DOWNTIME_MEMORY - 1) :], downtime],
        )
    if not 0 < step_time_s < math.inf:
        return state
    window = state.recent_step_times_s
    if len(window) == STEP_TIME_WINDOW and all(t == step_time_s for t in window):
        return state  # a steady job: nothing to fold
    window = [*window[-(STEP_TIME_WINDOW - 1) :], step_time_s]
    return msgspec.structs.replace(
        state, recent_step_times_s=window, step_time_s=statistics.median(window)
    )


def record_checkpoint(
    state: JobState, event: schemas.CheckpointSaved | schemas.CheckpointPersisted, now: int
) -> JobState:
    """Remember a checkpoint's cost: one record per step, whichever rank reports first."""
    if isinstance(event, schemas.CheckpointSaved):
        if event.step <= state.last_checkpoint_step:
            return state
        record = CheckpointRecord(step=event.step, ts=now, stall_s=event.stall_s)
        return msgspec.structs.replace(
            state,
            checkpoints=[*state.checkpoints[-(CHECKPOINT_MEMORY - 1) :], record],
            last_checkpoint_step=event.step,
        )
    checkpoints = [
        msgspec.structs.replace(c, persist_s=max(c.persist_s, event.duration_s))
        if c.step == event.step
        else c
        for c in state.checkpoints
    ]
    return msgspec.structs.replace(state, checkpoints=checkpoints)


def new_job_state(
    job: str,
    active: list[str],
    *,
    num_nodes_per_dp: int,
    spares: Sequence[str] = (),
    procs_per_node: int = 1,
    now: int = 0,
) -> JobState:
    """The state at job start: ``active`` nodes (a multiple of ``num_nodes_per_dp``) + spares."""
    if num_nodes_per_dp < 1 or not active or len(active) % num_nodes_per_dp:
        raise ValueError(
            f"{len(active)} active node(s) do not form whole replicas of {num_nodes_per_dp}"
        )
    names = [*active, *spares]
    if len(set(names)) != len(names):
        raise ValueError("node names must be unique")
    replicas = len(active) // num_nodes_per_dp
    return JobState(
        job=job,
        nodes=[NodeRecord(name=n, role="active", since_ts=now) for n in active]
        + [NodeRecord(name=n, role="spare", since_ts=now) for n in spares],
        num_dp_replicas=replicas,
        num_nodes_per_dp=num_nodes_per_dp,
        target_dp_replicas=replicas,
        procs_per_node=procs_per_node,
        observed=Membership(
            active=list(active), spares=list(spares), procs_per_node=procs_per_node
        ),
        started_ts=now,
    )


def with_pending(
    state: JobState,
    command: schemas.Command,
    now: int,
    *,
    signal: schemas.Signal | None = None,
    redecided: bool = False,
) -> JobState:
    """``state`` once ``command`` is sent: an actuator command waits for its result."""
    if command.executor != "actuator":
        return state
    entry = PendingCommand(command=command, ts=now, signal=signal, redecided=redecided)
    pending = [*state.pending, entry]
    return project(msgspec.structs.replace(state, pending=pending), now)


def project(state: JobState, now: int) -> JobState:
    """Recompute the view (``nodes``, replicas) from ``observed``, ``pending`` and node health.

    A pending command the observed membership no longer admits predicts nothing (the actuator
    will refuse it, and its result says so).
    """
    membership = state.observed
    for pending in state.pending:
        with contextlib.suppress(MembershipError):
            membership = membership.after(pending.command)
    records = {n.name: n for n in state.nodes}
    for name in membership.spares:
        if (record := records.get(name)) is not None and record.down:
            membership = membership.fail_node(name)
    roles: dict[str, Role] = {n: "active" for n in membership.active}
    roles.update({n: "spare" for n in membership.spares})
    roles.update({n: "failed" for n in membership.failed})
    # a set: list membership tests made this quadratic (0.4 s per call at 2,000 nodes)
    active = set(membership.active)
    rest = [n.name for n in state.nodes if n.name in roles and n.name not in active]
    new = [n for n in roles if n not in records and n not in active]
    nodes = []
    for name in [*membership.active, *rest, *new]:
        role = roles[name]
        record = records.get(name) or NodeRecord(name=name, role=role, reason="new", since_ts=now)
        if record.role != role:
            record = msgspec.structs.replace(record, role=role, since_ts=now)
        nodes.append(record)
    return msgspec.structs.replace(
        state,
        nodes=nodes,
        num_dp_replicas=len(membership.active) // state.num_nodes_per_dp,
        procs_per_node=membership.procs_per_node,
    )
