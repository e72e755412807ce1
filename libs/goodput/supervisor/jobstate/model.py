"""The job as a policy sees it: the actuator's facts, plus what the controller still waits on.

``JobState`` is a msgspec Struct so the controller can keep it in the ``gp_state`` KV bucket and
a policy script gets a copy. Membership is owned by the actuator: ``observed`` is what its last
``JobStatus`` reported, ``pending`` the commands sent to it and not yet answered by an
``ActionResult``, ``refused`` the recent ones it refused. ``nodes`` is the view a policy reads:
the observed membership with the pending commands' effects predicted by the same rules the
actuator executes (:mod:`goodput.supervisor.membership`), and with each node's health as the controller
learnt it from signals. A refused command is dropped from ``pending``, so the view falls back to
what the actuator reported.

Node order matters: the active nodes, in list order, form the data-parallel replicas
(``num_nodes_per_dp`` consecutive active nodes per replica).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias, Union

import msgspec

from goodput import schemas
from goodput.supervisor.membership import Membership

Role = Literal["active", "spare", "failed"]
if TYPE_CHECKING:
    # a Union built from a tuple is no type a checker can read: to it, any command is a
    # Command (the fields they all share); msgspec decodes the tagged union
    AnyCommand: TypeAlias = schemas.Command
else:
    # every command registered when this module is imported: all of ``schemas.commands``'
    AnyCommand = Union[schemas.COMMAND_TYPES]  # noqa: UP007

#: how many refusals are remembered
REFUSAL_MEMORY = 32
#: how many restart downtimes are remembered (``JobState.restart_downtimes_s``)
DOWNTIME_MEMORY = 8
#: assumed mean time between failures before any is observed (one a day)
PRIOR_MTBF_S = 86_400.0
NS = 1_000_000_000


class NodeRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    role: Role
    #: failure signals seen on this node
    failures: int = 0
    #: why it has its role (the last failure, "returned", ...)
    reason: str = ""
    since_ts: int = 0
    #: an uncorrectable fault was reported on it and it has not returned since (a policy
    #: that cannot replace nodes waits for this to clear; a spare that is down is not free)
    down: bool = False
    #: why the last GPU reset of this node failed ("" : none failed since it last returned);
    #: the built-in policy then replaces the node instead of resetting again
    gpu_reset_failed: str = ""
    #: the actuator reported it never confirmed a pod's deletion (``JobStatus.suspect_nodes``):
    #: no rank is placed there, so a launch on it is refused until it is replaced
    suspect: bool = False


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


class PendingCommand(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A command sent to the actuator (``Command.executor``) whose ActionResult has not come
    yet."""

    command: AnyCommand
    ts: int
    #: the signal it remediates (None: not a remediation)
    signal: schemas.Signal | None = None
    #: issued by a second decision after the actuator refused the first: not decided again
    redecided: bool = False


class Refusal(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A command the actuator refused or failed (or never answered), and why."""

    command_id: str
    action: str
    reason: str
    ts: int


class JobState(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    job: str
    #: the view: observed membership + pending predictions, with the health learnt per node
    nodes: list[NodeRecord]
    num_dp_replicas: int
    num_nodes_per_dp: int
    #: the size asked for at start: scale-up goes back to it, never beyond
    target_dp_replicas: int
    procs_per_node: int = 1
    #: membership as the actuator last reported it (JobStatus)
    observed: Membership = msgspec.field(default_factory=lambda: Membership(active=[], spares=[]))
    #: the actuator's attempt number as last reported
    attempt: int = 0
    #: ready standby ranks per node as last reported (``JobStatus.standbys``)
    standbys: dict[str, int] = msgspec.field(default_factory=dict)
    #: whether the job's ranks can restart in process, as rank 0 declares it in its step
    #: reports (``StepDone.in_process_restart``); None until a step was reported
    in_process_restart: bool | None = None
    #: what the actuator's backend can do, as its last ``JobStatus`` declared it (None: not
    #: declared; the policy then tries every rung and learns from a refusal)
    backend: schemas.BackendCapabilities | None = None
    pending: list[PendingCommand] = msgspec.field(default_factory=list)
    refused: list[Refusal] = msgspec.field(default_factory=list)
    started_ts: int = 0
    restarts: list[Remediation] = msgspec.field(default_factory=list)
    #: when failures interrupted training (epoch ns), for the observed MTBF
    interruptions: list[int] = msgspec.field(default_factory=list)
    checkpoints: list[CheckpointRecord] = msgspec.field(default_factory=list)
    last_checkpoint_step: int = -1
    #: the job's step time (s): the median of ``recent_step_times_s``, 0 until a step was seen
    step_time_s: float = 0.0
    #: rank 0's latest step times (s), oldest first (``goodput.supervisor.jobstate.folds.STEP_TIME_WINDOW``)
    recent_step_times_s: list[float] = msgspec.field(default_factory=list)
    checkpoint_interval_steps: int = 0
    #: the latest relaunching commands' downtimes (s): from the command to the job's first
    #: step after it, oldest first (what a remedy that restarts the job costs it)
    restart_downtimes_s: list[float] = msgspec.field(default_factory=list)
    #: when the relaunching command whose first step is awaited was sent (0: none awaited)
    resuming_since_ts: int = 0
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

    def membership(self) -> Membership:
        """The view as a :class:`Membership`, to check a command with the actuator's rules."""
        return Membership(
            active=self.active,
            spares=self.spares,
            failed=self.names("failed"),
            procs_per_node=self.procs_per_node,
        )

    def mtbf_s(self, now: int, prior_mtbf_s: float = PRIOR_MTBF_S) -> float:
        """The observed mean time between failures: (time run + one prior interval) /
        (failures seen + 1), so the first hours, with no failure yet, do not say "never"."""
        elapsed_s = max(0.0, (now - self.started_ts) / NS)
        return (elapsed_s + prior_mtbf_s) / (len(self.interruptions) + 1)

    @property
    def checkpoint_cost_s(self) -> float | None:
        """Mean training time lost per checkpoint over the remembered ones."""
        if not self.checkpoints:
            return None
        return sum(c.stall_s for c in self.checkpoints) / len(self.checkpoints)


def encode_state(state: JobState) -> bytes:
    return msgspec.msgpack.encode(state)


def decode_state(payload: bytes) -> JobState:
    """A stored state; raises ``schemas.SchemaError`` on anything that is not one."""
    try:
        return msgspec.msgpack.decode(payload, type=JobState)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise schemas.SchemaError(f"not a JobState: {exc}") from exc
