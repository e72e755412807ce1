"""The command family: kept in GP_CMDS, executed once by id, acked after execution.

Each command is a tagged ``Command`` struct (the ``kind`` tag names it) that declares, as class
attributes, who executes it and what it does to the job (``Command.executor``,
``restarts_group``, ``issuable``). ``register`` makes a struct a command: it checks those
declarations and adds it to ``COMMAND_TYPES``, the one registry. The codec decodes exactly that
union, and every subset of the commands (what goes to the actuator, what restarts the worker
group, what a policy may issue) is read from the declarations, never listed again.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, TypeVar, get_args

import msgspec

from goodput.schemas.envelope import CommandId, Message, Seconds, Token, TokenOrEmpty, new_id
from goodput.warm_path import WARM_PATH

#: the most standby ranks a job may keep per node (``StartJob.standbys``)
MAX_STANDBYS_PER_NODE = 8


class StepWindow(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """Steps ``first`` to ``last``, both included: the window a numerical fault was seen in."""

    first: Annotated[int, msgspec.Meta(ge=1)]
    last: Annotated[int, msgspec.Meta(ge=1)]

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"a step window ends at or after it begins: {self.first}-{self.last}")

    def __contains__(self, step: int) -> bool:
        return self.first <= step <= self.last


#: who executes a command: the service (or, "trainer", the job's ranks) whose command target
#: it is sent to (``subjects.command_target``)
Executor = Literal["actuator", "trainer", "sensor", "hostmon", "replicator", "agent"]
EXECUTORS: frozenset[Executor] = frozenset(get_args(Executor))
#: executors with one instance per node: a command to one names its ``node``, whose
#: instance executes it
PER_NODE_EXECUTORS: frozenset[Executor] = frozenset({"hostmon", "replicator", "agent"})


class Command(Message, kw_only=True):
    """Base of every command. A command type declares its partitions as class attributes
    (``ClassVar``: not fields, so nothing of them is on the wire), and ``register`` checks them.
    """

    #: who executes it; the controller sends what it issues there, and waits for the
    #: ``ActionResult`` of what it sends to the actuator (``JobState.pending``)
    executor: ClassVar[Executor]
    #: it stops the worker group and launches it again (in process or not): the job state
    #: counts it as a restart (crash loops) and times its downtime to the next step, and a
    #: refused one has its signal decided again
    restarts_group: ClassVar[bool] = False
    #: a remediation policy may issue it (``goodput.supervisor.policy.ALLOWED_COMMANDS``)
    issuable: ClassVar[bool] = False

    command_id: CommandId = msgspec.field(default_factory=new_id)
    #: the decision that caused it, for tracing a remediation end to end
    decision_id: str = ""
    reason: str = ""


#: every registered command type, in registration order (``register``)
COMMAND_TYPES: tuple[type[Command], ...] = ()

C = TypeVar("C", bound=type[Command])


def register(command_type: C) -> C:
    """Make ``command_type`` a command, the one step that adds one: the codec decodes it, and
    every subset of the commands holds it as it declares. A class decorator; raises
    ``TypeError`` on a type without a tag, with a tag already taken, or with declarations that
    contradict each other (for the commands here: at import)."""
    global COMMAND_TYPES
    name = command_type.__name__
    kind = command_type.__struct_config__.tag
    if not isinstance(kind, str):
        raise TypeError(f"command {name} has no tag")
    if any(kind == t.__struct_config__.tag for t in COMMAND_TYPES):
        raise TypeError(f"command {name}: kind {kind!r} is taken")
    executor = getattr(command_type, "executor", None)
    if executor not in EXECUTORS:
        raise TypeError(f"command {name} declares no executor of {sorted(EXECUTORS)}")
    if command_type.restarts_group and executor != "actuator":
        raise TypeError(f"command {name}: only the actuator restarts the worker group")
    if executor in PER_NODE_EXECUTORS and "node" not in command_type.__struct_fields__:
        raise TypeError(f"command {name} to a per-node {executor} names no node")
    COMMAND_TYPES = (*COMMAND_TYPES, command_type)
    return command_type


@register
class CheckpointNow(Command, tag="checkpoint_now", kw_only=True):
    executor = "trainer"
    issuable = True


@register
class Stop(Command, tag="stop", kw_only=True):
    """Save a checkpoint and exit cleanly."""

    executor = "actuator"
    issuable = True

    nodes: list[Token] = msgspec.field(default_factory=list)


@register
class StartJob(Command, tag="start_job", kw_only=True):
    executor = "actuator"

    argv: list[str]
    nodes: int
    procs_per_node: int
    spares: int = 0
    num_nodes_per_dp: int = 1
    env: dict[str, str] = msgspec.field(default_factory=dict)
    workdir: str = ""
    #: names this run of the job: a second StartJob of the same job name is a new run
    run_id: Token = msgspec.field(default_factory=new_id)
    #: container backends (kubernetes): the image the ranks run, and the GPUs each rank's pod
    #: requests; "" / None: the actuator's defaults (``kubernetes.image``, ``gpus_per_rank``).
    #: The local backend refuses both: its ranks are processes on its own machine.
    image: str = ""
    gpus_per_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None
    #: standby rank processes the actuator keeps per node, spares included (0: none). Each runs
    #: ``argv`` and must be served by ``goodput.shim.run_job``, which builds the job's state
    #: and waits for an assignment; a script that does not would train on its own.
    standbys: Annotated[int, msgspec.Meta(ge=0, le=MAX_STANDBYS_PER_NODE)] = 0


@register
class Restart(Command, tag="restart", kw_only=True):
    """In-job restart: restart the worker group (all ranks) from the newest checkpoint."""

    executor = "actuator"
    restarts_group = True
    issuable = True

    nodes: list[Token] = msgspec.field(default_factory=list)
    #: GPUs to reset (node → GPU indexes, ``[]``: all of the node's) once the ranks are
    #: stopped and before they are launched again; a reset that fails fails the restart
    reset_gpus: dict[Token, list[int]] = msgspec.field(default_factory=dict)
    #: take the ranks from the nodes' ready standbys (those of a node with none start cold)
    standbys: bool = False
    #: a numerical rollback: the relaunched ranks restore the newest checkpoint before this
    #: step (the first one a numerical fault may have touched), not the newest (schema 14)
    restore_before_step: int | None = None
    #: a loss spike's rollback: the ranks of this launch and every later one train on no batch
    #: of these steps (the window the spike was seen in: a poisoned batch is in it; schema 15)
    skip_steps: StepWindow | None = None


@register
class RestartInProcess(Command, tag="restart_in_process", kw_only=True):
    """Warm in-job restart (to the actuator): surviving ranks leave their broken process group
    and join a fresh rendezvous in process; only dead ranks are started again. A survivor
    that has not rejoined within ``deadline_s`` fails the command (then a cold restart)."""

    executor = "actuator"
    restarts_group = True
    issuable = True

    deadline_s: Seconds = WARM_PATH.rejoin_deadline_s
    #: the dead ranks are taken from their nodes' ready standbys (cold where none is ready)
    standbys: bool = False


@register
class Rejoin(Command, tag="rejoin", kw_only=True):
    """To the trainers: abort the process group and join the rendezvous of ``attempt``
    (``master_addr:master_port``, ``world_size`` ranks), restore the agreed step, go on.
    A rank at ``attempt`` or later ignores it (an old attempt's command)."""

    executor = "trainer"

    attempt: int
    master_addr: str
    master_port: int
    world_size: int


@register
class HotSwap(Command, tag="hot_swap", kw_only=True):
    executor = "actuator"
    restarts_group = True
    issuable = True

    failed_node: Token
    spare_node: TokenOrEmpty = ""
    #: take the ranks from the nodes' ready standbys, the spare's included
    standbys: bool = False
    #: a numerical rollback: the relaunched ranks restore the newest checkpoint before this
    #: step (the first one a numerical fault may have touched), not the newest (schema 14)
    restore_before_step: int | None = None


@register
class ScaleTo(Command, tag="scale_to", kw_only=True):
    """Change the data-parallel dimension: run on exactly these nodes (scale down or up)."""

    executor = "actuator"
    restarts_group = True
    issuable = True

    num_dp_replicas: int
    nodes: list[Token] = msgspec.field(default_factory=list)
    drop_nodes: list[Token] = msgspec.field(default_factory=list)
    #: take the ranks from the nodes' ready standbys
    standbys: bool = False
    #: a numerical rollback: the relaunched ranks restore the newest checkpoint before this
    #: step (the first one a numerical fault may have touched), not the newest (schema 14)
    restore_before_step: int | None = None


@register
class Rescale(Command, tag="rescale", kw_only=True):
    """Told to the trainer: the world size changes; apply the rescale callbacks."""

    executor = "trainer"

    old_world_size: int
    new_world_size: int


@register
class SetCheckpointInterval(Command, tag="set_ckpt_interval", kw_only=True):
    executor = "trainer"
    issuable = True

    every_steps: int
    rationale: str = ""


@register
class SetThresholds(Command, tag="set_thresholds", kw_only=True):
    executor = "sensor"

    values: dict[str, float]


@register
class InjectFault(Command, tag="inject_fault", kw_only=True):
    """A chaos fault, executed by the ranks; a host fault (``goodput chaos``) is sent to the
    node's host monitor instead, which its sender names."""

    executor = "trainer"

    node: Token
    fault: str
    detail: str = ""
    clear: bool = False
    #: fault "slow": the rank's compute takes this many times as long (a straggler)
    factor: Annotated[float, msgspec.Meta(ge=1.0, le=1000.0)] = 1.0
    #: fault "slow": for this long, then back to normal (0: until cleared)
    duration_s: Seconds = 0.0


@register
class RestoreToNode(Command, tag="restore_to_node", kw_only=True):
    """Fill a node's local checkpoint volume from the nearest tier before its ranks start.

    For a checkpoint sharded across nodes, ``part`` is the part the node holds in the new
    membership (its index in the launch order) and ``parts`` the new node count: the node
    gets that part, and when the count differs from the checkpoint's (a reshard) every other
    part staged beside it (schema 12). None: a whole checkpoint, or the part already there."""

    executor = "replicator"

    node: Token
    #: the checkpoint step to restore; None: the newest complete one
    step: int | None = None
    part: Annotated[int, msgspec.Meta(ge=0)] | None = None
    parts: Annotated[int, msgspec.Meta(ge=1)] | None = None
    #: a numerical rollback's launch: the newest complete step before this one, which the
    #: ranks will restore (the newest holds the fault; schema 15)
    before_step: int | None = None

    def __post_init__(self) -> None:
        if (self.part is None) != (self.parts is None):
            raise ValueError("part and parts come together")
        if self.part is not None and self.parts is not None and self.part >= self.parts:
            raise ValueError(f"part {self.part} of {self.parts} parts")


@register
class ResetGpu(Command, tag="reset_gpu", kw_only=True):
    """Told to a node's host monitor by the actuator, whose ranks no longer use the GPUs."""

    executor = "hostmon"

    node: Token
    #: GPU indexes (empty: every GPU of the node)
    gpus: list[int] = msgspec.field(default_factory=list)
    #: the attempt whose ranks were stopped: a newer attempt's ranks may use the GPU again
    attempt: int
    #: the run of that attempt (attempts count from 1 again in every run)
    run_id: TokenOrEmpty = ""


@register
class ReturnNode(Command, tag="return_node", kw_only=True):
    """A previously failed node is healthy again and rejoins the spare pool."""

    executor = "actuator"
    issuable = True

    node: Token


class RankLaunch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One rank a node agent starts: its number and its whole environment (``RankEnv``, the
    job's env, the bus settings), written by the actuator as for a local rank."""

    rank: int
    local_rank: int
    env: dict[str, str]
    #: take a ready standby of the agent's host for it (``KeepStandbys``), handed the rank's
    #: ``RankEnv`` from ``env``; with none ready the rank starts cold (schema 8)
    standby: bool = False


@register
class LaunchRanks(Command, tag="launch_ranks", kw_only=True):
    """To a node agent (``gp.<job>.cmd.agent-<node>``): start these ranks of ``attempt``.
    A rank of that attempt the agent already runs is not started twice."""

    executor = "agent"

    node: Token
    run_id: TokenOrEmpty = ""
    attempt: int
    argv: list[str]
    workdir: str = ""
    ranks: list[RankLaunch]


@register
class KeepStandbys(Command, tag="keep_standbys", kw_only=True):
    """To a node agent: keep ``count`` ready standby ranks of run ``run_id`` on its host
    (``argv`` in ``workdir`` with ``env`` and ``GOODPUT_STANDBY=1``), made up after the job's
    next step whenever one is taken or dies; ``count`` 0 stops them (schema 8)."""

    executor = "agent"

    node: Token
    run_id: TokenOrEmpty = ""
    count: int
    argv: list[str] = msgspec.field(default_factory=list)
    workdir: str = ""
    #: a rank's environment but the rank's own variables (its assignment brings those)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    #: stop the present ones (a GPU reset needs the GPU idle); made up after the next step
    release: bool = False
    #: start what the host lacks now, not after the next step (a scale-up waits for them)
    at_once: bool = False


#: what ``SignalRanks`` tells a node's ranks: ``term`` (save and exit) or ``kill``
RankSignal = Literal["term", "kill"]


@register
class SignalRanks(Command, tag="signal_ranks", kw_only=True):
    """To a node agent: signal its ranks of ``attempt`` and older (``ranks`` empty: every one)
    — ``term`` (save and exit) or ``kill``. Their exits are reported as ``RankExited`` with
    ``expected_reason``, as the local backend reports those it stops."""

    executor = "agent"

    node: Token
    attempt: int
    signal: RankSignal
    ranks: list[int] = msgspec.field(default_factory=list)
    expected_reason: str = ""


class CommandClaim(Message, tag="command_claim", kw_only=True):
    """Stored in ``gp_done`` by an executor before it runs a command (never published).

    A redelivered command with a claim and no recorded result was begun by a delivery that
    never recorded its outcome (its executor died): ``fence`` is what the executor's state
    was then (e.g. the actuator's run and attempt), so the next delivery can tell whether the
    command took effect (the state moved: not run again) or not (the same: run it).
    """

    command_id: CommandId
    #: the executor instance and runner that began it
    claimant: str
    fence: str = ""
