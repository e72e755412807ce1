"""The job as the controller knows it, and pure functions that move it forward.

``JobState`` is a msgspec Struct so the controller service can keep it in the ``gp_state`` KV
bucket; a standby controller that takes over reads it and carries on. Every function here
returns a new state and never mutates its input. Applying a command is idempotent by
``command_id`` (the ids are recorded), and a signal already handled is recorded too, so a
controller that re-reads a stored state never repeats what was already done.

Node order matters: the active nodes, in list order, form the data-parallel replicas
(``num_nodes_per_dp`` consecutive active nodes per replica).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from goodput import schemas

Role = Literal["active", "spare", "failed"]

#: signal kinds that mean training was interrupted (they count for MTBF and crash loops)
FAILURE_KINDS = frozenset({"crash", "hang", "missed_heartbeat", "degraded_host", "job_down"})
#: commands that restart the worker group
RESTARTING = (schemas.Restart, schemas.HotSwap, schemas.ScaleTo)
#: how many ids / records are remembered (older ones cannot be redelivered any more)
MEMORY = 512
CHECKPOINT_MEMORY = 32


class NodeRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    role: Role
    #: failure signals seen on this node
    failures: int = 0
    #: why it has its role (the last failure, "returned", ...)
    reason: str = ""
    since_ts: int = 0
    #: an uncorrectable fault was reported on it and it has not returned since (a policy
    #: that cannot replace nodes waits for this to clear)
    down: bool = False


class Remediation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A restarting command issued, and the kind of signal that caused it."""

    ts: int
    action: str
    command_id: str
    signal: str = ""


class CheckpointRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    step: int
    ts: int
    #: training time lost to the save (the snapshot stall)
    stall_s: float
    #: time until it was durable (0 until known)
    persist_s: float = 0.0


class DeferredSignal(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A signal whose remediation waits out a crash-loop back-off."""

    signal: schemas.Signal
    until_ts: int


class JobState(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    job: str
    nodes: list[NodeRecord]
    num_dp_replicas: int
    num_nodes_per_dp: int
    #: the size asked for at start: scale-up goes back to it, never beyond
    target_dp_replicas: int
    procs_per_node: int = 1
    started_ts: int = 0
    restarts: list[Remediation] = msgspec.field(default_factory=list)
    #: when failures interrupted training (epoch ns), for the observed MTBF
    interruptions: list[int] = msgspec.field(default_factory=list)
    checkpoints: list[CheckpointRecord] = msgspec.field(default_factory=list)
    last_checkpoint_step: int = -1
    #: smoothed step time (s), 0 until a step was seen
    step_time_s: float = 0.0
    checkpoint_interval_steps: int = 0
    backoff_level: int = 0
    deferred: list[DeferredSignal] = msgspec.field(default_factory=list)
    #: why the controller stopped the job ("" while it runs)
    stopped: str = ""
    applied_command_ids: list[str] = msgspec.field(default_factory=list)
    handled_signal_ids: list[str] = msgspec.field(default_factory=list)
    version: int = 0

    def names(self, role: Role) -> list[str]:
        return [n.name for n in self.nodes if n.role == role]

    @property
    def active(self) -> list[str]:
        return self.names("active")

    @property
    def spares(self) -> list[str]:
        return self.names("spare")

    @property
    def world_size(self) -> int:
        return len(self.active) * self.procs_per_node

    def node(self, name: str) -> NodeRecord | None:
        return next((n for n in self.nodes if n.name == name), None)

    def role_of(self, name: str) -> Role | None:
        record = self.node(name)
        return record.role if record else None

    @property
    def checkpoint_cost_s(self) -> float | None:
        """Mean training time lost per checkpoint over the remembered ones."""
        if not self.checkpoints:
            return None
        return sum(c.stall_s for c in self.checkpoints) / len(self.checkpoints)


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
        started_ts=now,
    )


def _remember(ids: list[str], new: str) -> list[str]:
    return [*ids[-(MEMORY - 1) :], new]


def _with_role(state: JobState, name: str, role: Role, reason: str, now: int) -> list[NodeRecord]:
    return [
        msgspec.structs.replace(n, role=role, reason=reason, since_ts=now) if n.name == name else n
        for n in state.nodes
    ]


def observe_signal(state: JobState, signal: schemas.Signal, now: int) -> JobState:
    """Record the facts a signal carries, before any policy acts on it."""
    nodes = state.nodes
    interruptions = state.interruptions
    record = state.node(signal.node) if signal.node else None
    if signal.signal == "node_returned":
        if record is None:
            nodes = [*nodes, NodeRecord(name=signal.node, role="spare", reason="new", since_ts=now)]
        elif record.role == "failed":
            nodes = _with_role(state, signal.node, "spare", "returned", now)
        nodes = [
            msgspec.structs.replace(n, down=False) if n.name == signal.node else n for n in nodes
        ]
    elif signal.signal in FAILURE_KINDS:
        if record is not None:
            role: Role = "failed" if record.role == "spare" else record.role
            nodes = [
                msgspec.structs.replace(
                    n,
                    failures=n.failures + 1,
                    role=role,
                    down=n.down or signal.severity == "uncorrectable",
                    reason=f"{signal.signal}: {signal.detail}"[:200],
                    since_ts=now if role != n.role else n.since_ts,
                )
                if n.name == signal.node
                else n
                for n in nodes
            ]
        if record is None or record.role == "active":
            interruptions = [*interruptions[-(MEMORY - 1) :], signal.observed_ts or now]
    return msgspec.structs.replace(
        state,
        nodes=nodes,
        interruptions=interruptions,
        handled_signal_ids=_remember(state.handled_signal_ids, signal.signal_id),
        version=state.version + 1,
    )


def apply_command(state: JobState, command: schemas.Command, now: int, cause: str = "") -> JobState:
    """The state after ``command`` took effect; a command applied before changes nothing.

    ``cause`` is the kind of signal behind it, remembered with restarting commands so crash
    loops count only remediations of failures.
    """
    if command.command_id in state.applied_command_ids:
        return state
    changes: dict[str, object] = {}
    if isinstance(command, schemas.HotSwap):
        failed = _with_role(state, command.failed_node, "failed", "swapped out", now)
        swapped = msgspec.structs.replace(state, nodes=failed)
        spare_nodes = _with_role(swapped, command.spare_node, "active", "swapped in", now)
        # the spare takes the failed node's place, so the replicas keep their shape
        position = {n.name: i for i, n in enumerate(spare_nodes)}
        order = spare_nodes[:]
        i, j = position[command.failed_node], position[command.spare_node]
        order[i], order[j] = order[j], order[i]
        changes["nodes"] = order
    elif isinstance(command, schemas.ScaleTo):
        chosen = set(command.nodes)
        dropped = set(command.drop_nodes)
        by_name = {n.name: n for n in state.nodes}
        placed = []
        for name in command.nodes:
            node = by_name[name]
            placed.append(
                node
                if node.role == "active"
                else msgspec.structs.replace(node, role="active", reason="scaled in", since_ts=now)
            )
        rest = []
        for node in state.nodes:
            if node.name in chosen:
                continue
            if node.name in dropped:
                node = msgspec.structs.replace(node, role="failed", reason="dropped", since_ts=now)
            elif node.role == "active":
                node = msgspec.structs.replace(
                    node, role="spare", reason="scaled out", since_ts=now
                )
            rest.append(node)
        changes["nodes"] = placed + rest
        changes["num_dp_replicas"] = command.num_dp_replicas
    elif isinstance(command, schemas.Stop) and not command.nodes:
        changes["stopped"] = command.reason or "stopped"
    elif isinstance(command, schemas.SetCheckpointInterval):
        changes["checkpoint_interval_steps"] = command.every_steps
    if isinstance(command, RESTARTING):
        changes["restarts"] = [
            *state.restarts[-(MEMORY - 1) :],
            Remediation(
                ts=now,
                action=schemas.kind_of(type(command)),
                command_id=command.command_id,
                signal=cause,
            ),
        ]
    return msgspec.structs.replace(
        state,
        **changes,
        applied_command_ids=_remember(state.applied_command_ids, command.command_id),
        version=state.version + 1,
    )


def record_step_time(state: JobState, step_time_s: float, smoothing: float = 0.05) -> JobState:
    """Fold one step time into the smoothed step time (for checkpoint intervals in steps)."""
    if step_time_s <= 0:
        return state
    smoothed = (
        step_time_s
        if state.step_time_s == 0
        else (1 - smoothing) * state.step_time_s + smoothing * step_time_s
    )
    return msgspec.structs.replace(state, step_time_s=smoothed)


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


def encode_state(state: JobState) -> bytes:
    return msgspec.msgpack.encode(state)


def decode_state(payload: bytes) -> JobState:
    """A stored state; raises ``schemas.SchemaError`` on anything that is not one."""
    try:
        return msgspec.msgpack.decode(payload, type=JobState)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise schemas.SchemaError(f"not a JobState: {exc}") from exc
