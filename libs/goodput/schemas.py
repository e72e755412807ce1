"""Every message on the bus, as a versioned msgspec Struct (msgpack on the wire).

Messages are tagged unions: the ``kind`` tag says which struct a payload is, so one decoder
handles every event (or every command) and rejects anything else. Decoding is strict:
unknown fields, missing fields, wrong types, an unknown kind or a newer schema version all
raise :class:`SchemaError`; a half-filled object is never returned.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Annotated, Any, Literal, Union

import msgspec

#: 2: a job runs as runs (``StartJob.run_id``, ``RunStarted``, ``JobStatus.run_id``); a build
#: of version 1 would mistake a second run of a job for the first one still going.
#: 3: the GPU-reset rung (``ResetGpu``, ``GpuReset``, ``Restart.reset_gpus``, the host faults
#: and GPU records a ``Signal`` carries); a job for the Kubernetes backend names its rank
#: image and GPUs (``StartJob.image``, ``StartJob.gpus_per_rank``); a slow-rank fault in the
#: rank's compute (``InjectFault.factor``, ``InjectFault.duration_s``); ``TrainingPlan``, the batch and LR
#: a trainer runs with after a restore (and a rescale); the in-process restart
#: (``RestartInProcess``, ``Rejoin``, ``RankRejoined``, ``CheckpointRestored.tier`` "host");
#: pre-warmed standby ranks (``StartJob.standbys``, ``JobStatus.standbys``, and ``standbys`` on
#: the commands that launch ranks: ``Restart``, ``RestartInProcess``, ``HotSwap``, ``ScaleTo``)
SCHEMA_VERSION = 3

#: the longest duration a message may carry (about 31 years): rejects an infinite or absurd value
MAX_DURATION_S = 1e9

#: epoch nanoseconds: not before 1970, and within a signed 64-bit integer (msgpack, other
#: languages' clients), so arithmetic on it never overflows a fixed-width type
EpochNs = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: a duration in seconds: never negative, always finite
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_DURATION_S)]


class SchemaError(ValueError):
    """A payload that is not a valid message of the expected family."""


_clock_lock = threading.Lock()
_last_ts = 0


def now_ns() -> int:
    """Epoch nanoseconds, strictly increasing within this process (ordering survives clock steps)."""
    global _last_ts
    with _clock_lock:
        _last_ts = max(_last_ts + 1, time.time_ns())
        return _last_ts


def new_id() -> str:
    return uuid.uuid4().hex


class Message(
    msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind", omit_defaults=False
):
    """Base of every message: the job it belongs to, when it happened, and its schema version."""

    job: str
    ts: EpochNs = msgspec.field(default_factory=now_ns)
    schema: int = SCHEMA_VERSION


# --------------------------------------------------------------------------------------------
# Events: facts, kept in GP_EVENTS.
# --------------------------------------------------------------------------------------------


class Event(Message, kw_only=True):
    """A fact, published to ``gp.<job>.evt.<kind>``."""


class RankStarted(Event, tag="rank_started", kw_only=True):
    node: str
    rank: int
    local_rank: int
    world_size: int
    pid: int
    attempt: int = 0


class RankExited(Event, tag="rank_exited", kw_only=True):
    node: str
    rank: int
    pid: int
    exit_code: int | None
    signal: int | None = None
    attempt: int = 0
    #: why the runner expected it (stop command, restart) or not (``""`` = unexpected)
    expected_reason: str = ""


#: ``Heartbeat.busy`` of a rank's last beat: it finished (or was told to stop) and is leaving;
#: its silence until the exit report is expected, not a missed heartbeat
BUSY_EXITING = "exiting"


class Heartbeat(Event, tag="heartbeat", kw_only=True):
    node: str
    rank: int
    pid: int
    step: int
    #: the rank is inside a checkpoint save/load (silence is expected, not a hang), or
    #: ``BUSY_EXITING``
    busy: str = ""


class StepDone(Event, tag="step", kw_only=True):
    node: str
    rank: int
    step: int
    step_time_s: Seconds
    tokens: int
    loss: float
    world_size: int = 1
    #: time this rank computed, excluding waiting for peers in collectives (0: not measured).
    #: In synchronous training every rank's step_time_s is the same; this one tells who is slow.
    compute_time_s: Seconds = 0.0


class CheckpointSaved(Event, tag="ckpt_saved", kw_only=True):
    """The state was snapshotted into host memory; training resumed after ``stall_s``."""

    node: str
    rank: int
    step: int
    stall_s: Seconds
    bytes: int


class CheckpointPersisted(Event, tag="ckpt_persisted", kw_only=True):
    node: str
    rank: int
    step: int
    path: str
    bytes: int
    duration_s: Seconds


class CheckpointFailed(Event, tag="ckpt_failed", kw_only=True):
    node: str
    rank: int
    step: int
    error: str


class CheckpointDropped(Event, tag="ckpt_dropped", kw_only=True):
    """A pending snapshot was superseded by a newer one before it was persisted."""

    node: str
    rank: int
    step: int
    superseded_by: int


class CheckpointReplicated(Event, tag="ckpt_replicated", kw_only=True):
    node: str
    peer: str
    step: int
    bytes_sent: int
    bytes_deduplicated: int
    duration_s: Seconds


class CheckpointBackedUp(Event, tag="ckpt_backed_up", kw_only=True):
    node: str
    step: int
    uri: str
    bytes_uploaded: int
    bytes_deduplicated: int
    duration_s: Seconds


class CheckpointRestored(Event, tag="ckpt_restored", kw_only=True):
    node: str
    rank: int
    step: int
    #: "host": a survivor of an in-process restart, from the engine's host buffers
    tier: Literal["local", "peer", "object_store", "host", "none"]
    duration_s: Seconds
    bytes: int = 0
    fallbacks: list[str] = msgspec.field(default_factory=list)


class TrainingPlan(Event, tag="training_plan", kw_only=True):
    """The batch and learning rate the ranks train with from ``step`` on, published by rank 0
    at every restore that knows its plan; after a change of data-parallel size it says which
    rescale callbacks made it."""

    node: str
    rank: int
    step: int
    world_size: int
    dp_size: int
    global_batch: int
    micro_batch: int
    #: micro-batches per rank per optimizer step
    accumulation_steps: int
    lr: float
    #: the data-parallel size the checkpoint was saved under, when it differs (0: no rescale)
    rescaled_from_dp: int = 0
    #: the rescale callbacks that ran, in order
    callbacks: list[str] = msgspec.field(default_factory=list)


class GpuHealth(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    index: int
    uuid: str
    temperature_c: float | None = None
    xid_errors: list[int] = msgspec.field(default_factory=list)
    ecc_uncorrected: int = 0
    throttle_reasons: list[str] = msgspec.field(default_factory=list)
    present: bool = True


class HostHealth(Event, tag="host_health", kw_only=True):
    node: str
    healthy: bool
    gpu_available: bool
    gpus: list[GpuHealth] = msgspec.field(default_factory=list)
    disk_free_bytes: int = 0
    disk_total_bytes: int = 0
    mem_available_bytes: int = 0
    mem_total_bytes: int = 0
    ranks_alive: int = 0
    ranks_expected: int = 0
    #: the attempt of the job status the ranks were counted against (0: none): a count from
    #: an older attempt says nothing about ranks a newer one started
    attempt: int = 0
    faults: list[str] = msgspec.field(default_factory=list)
    detail: str = ""


SignalKind = Literal[
    "crash", "hang", "missed_heartbeat", "straggler", "degraded_host", "job_down", "node_returned"
]


class Signal(Event, tag="signal", kw_only=True):
    """Something is wrong (or a spare came back): the sensor's conclusion, with its evidence."""

    signal_id: str = msgspec.field(default_factory=new_id)
    signal: SignalKind
    node: str = ""
    rank: int | None = None
    #: ``correctable`` faults (a rank crash) allow an in-job restart; ``uncorrectable`` (a lost
    #: host, a GPU XID) need the node replaced or dropped.
    severity: Literal["correctable", "uncorrectable", "info"] = "correctable"
    detail: str = ""
    #: when the fault is believed to have happened (epoch ns), for detection-latency accounting
    observed_ts: EpochNs = 0
    #: a host fault's evidence: the host report's fault names and its unhealthy GPUs, which
    #: tell the policy whether a GPU reset can clear it (``goodput.gpu_faults``)
    host_faults: list[str] = msgspec.field(default_factory=list)
    gpus: list[GpuHealth] = msgspec.field(default_factory=list)


class Decision(Event, tag="decision", kw_only=True):
    """What the controller chose and why: a person can read the reason."""

    decision_id: str = msgspec.field(default_factory=new_id)
    signal_id: str
    policy: str
    rule: str
    reason: str
    command_ids: list[str] = msgspec.field(default_factory=list)
    error: str = ""


class ActionResult(Event, tag="action_result", kw_only=True):
    command_id: str
    action: str
    ok: bool
    detail: str = ""
    duration_s: Seconds = 0.0
    #: the command was already executed before (redelivery); nothing was done again
    duplicate: bool = False


class GpuReset(Event, tag="gpu_reset", kw_only=True):
    """A host monitor's answer to ``ResetGpu``: what became of the reset, and how long it took."""

    node: str
    command_id: str
    #: the GPU indexes the command named (empty: every GPU of the node)
    gpus: list[int] = msgspec.field(default_factory=list)
    #: the attempt whose ranks were stopped for it
    attempt: int = 0
    #: ``ignored``: meant for an older attempt, or the GPU was still in use; nothing was reset
    outcome: Literal["succeeded", "failed", "timed_out", "ignored"]
    duration_s: Seconds = 0.0
    detail: str = ""


class JobStatus(Event, tag="job_status", kw_only=True):
    """The actuator's view of the job after every membership or lifecycle change."""

    state: Literal["starting", "running", "restarting", "finished", "failed", "stopped"]
    attempt: int
    world_size: int
    procs_per_node: int
    active_nodes: list[str] = msgspec.field(default_factory=list)
    spare_nodes: list[str] = msgspec.field(default_factory=list)
    failed_nodes: list[str] = msgspec.field(default_factory=list)
    #: rank process ids per node (in rank order), for operators and the chaos tool
    pids: dict[str, list[int]] = msgspec.field(default_factory=dict)
    detail: str = ""
    #: the run this status belongs to (``StartJob.run_id``; empty before any run)
    run_id: str = ""
    #: process ids of the ready standby ranks per node (torch imported, the job's state built,
    #: waiting for an assignment); not ranks: absent from ``pids``
    standbys: dict[str, list[int]] = msgspec.field(default_factory=dict)


class RankRejoined(Event, tag="rank_rejoined", kw_only=True):
    """A surviving rank restarts in process: it left the broken process group and is joining
    the fresh rendezvous of ``attempt`` (same process, model and optimizer kept)."""

    node: str
    rank: int
    pid: int
    attempt: int
    #: from taking the Rejoin command to this answer
    regroup_s: Seconds = 0.0
    #: False: this rank cannot restart in process (``detail`` says why); the actuator then
    #: fails the command at once instead of waiting out its deadline
    ok: bool = True
    detail: str = ""


class RunStarted(Event, tag="run_started", kw_only=True):
    """A new run of the job begins: its attempts, steps and accounting start here.

    The actuator emits it before the run's first rank starts, so a follower that starts at the
    newest one of these (a stream sequence, see ``goodput.bus.job_events``) sees the whole run
    and nothing of earlier runs of the same job name.
    """

    run_id: str
    #: the StartJob that began it
    command_id: str
    argv: list[str] = msgspec.field(default_factory=list)
    nodes: int = 0
    procs_per_node: int = 0


class ServiceHealth(Event, tag="service_health", kw_only=True):
    service: str
    instance: str
    pid: int
    healthy: bool
    started_ts: EpochNs
    #: how often the record is refreshed; a record older than a few periods means "not running"
    period_s: Seconds = 1.0
    detail: str = ""


class DeadLetter(Event, tag="dead_letter", kw_only=True):
    """Input a service could not use. ``payload`` is cut to fit the server's max payload; ``size``
    is the original's length and ``stream_seq`` its sequence in its stream (0: core NATS)."""

    service: str
    subject: str
    reason: str
    payload: bytes
    size: int = 0
    stream_seq: int = 0


# --------------------------------------------------------------------------------------------
# Commands: kept in GP_CMDS, executed once by id, acked after execution.
# --------------------------------------------------------------------------------------------


class Command(Message, kw_only=True):
    command_id: str = msgspec.field(default_factory=new_id)
    #: the decision that caused it, for tracing a remediation end to end
    decision_id: str = ""
    reason: str = ""


class CheckpointNow(Command, tag="checkpoint_now", kw_only=True):
    pass


class Stop(Command, tag="stop", kw_only=True):
    """Save a checkpoint and exit cleanly."""

    nodes: list[str] = msgspec.field(default_factory=list)


class StartJob(Command, tag="start_job", kw_only=True):
    argv: list[str]
    nodes: int
    procs_per_node: int
    spares: int = 0
    num_nodes_per_dp: int = 1
    env: dict[str, str] = msgspec.field(default_factory=dict)
    workdir: str = ""
    #: names this run of the job: a second StartJob of the same job name is a new run
    run_id: str = msgspec.field(default_factory=new_id)
    #: container backends (kubernetes): the image the ranks run, and the GPUs each rank's pod
    #: requests; "" / None: the actuator's defaults (``kubernetes.image``, ``gpus_per_rank``).
    #: The local backend refuses both: its ranks are processes on its own machine.
    image: str = ""
    gpus_per_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None
    #: standby rank processes the actuator keeps per node, spares included (0: none). Each runs
    #: ``argv`` and must be served by ``goodput.shim.run_job``, which builds the job's state
    #: and waits for an assignment; a script that does not would train on its own.
    standbys: Annotated[int, msgspec.Meta(ge=0, le=8)] = 0


class Restart(Command, tag="restart", kw_only=True):
    """In-job restart: restart the worker group (all ranks) from the newest checkpoint."""

    nodes: list[str] = msgspec.field(default_factory=list)
    #: GPUs to reset (node → GPU indexes, ``[]``: all of the node's) once the ranks are
    #: stopped and before they are launched again; a reset that fails fails the restart
    reset_gpus: dict[str, list[int]] = msgspec.field(default_factory=dict)
    #: take the ranks from the nodes' ready standbys (those of a node with none start cold)
    standbys: bool = False


class RestartInProcess(Command, tag="restart_in_process", kw_only=True):
    """Warm in-job restart (to the actuator): surviving ranks leave their broken process group
    and join a fresh rendezvous in process; only dead ranks are started again. A survivor
    that has not rejoined within ``deadline_s`` fails the command (then a cold restart)."""

    deadline_s: Seconds = 30.0
    #: the dead ranks are taken from their nodes' ready standbys (cold where none is ready)
    standbys: bool = False


class Rejoin(Command, tag="rejoin", kw_only=True):
    """To the trainers: abort the process group and join the rendezvous of ``attempt``
    (``master_addr:master_port``, ``world_size`` ranks), restore the agreed step, go on.
    A rank at ``attempt`` or later ignores it (an old attempt's command)."""

    attempt: int
    master_addr: str
    master_port: int
    world_size: int


class HotSwap(Command, tag="hot_swap", kw_only=True):
    failed_node: str
    spare_node: str = ""
    #: take the ranks from the nodes' ready standbys, the spare's included
    standbys: bool = False


class ScaleTo(Command, tag="scale_to", kw_only=True):
    """Change the data-parallel dimension: run on exactly these nodes (scale down or up)."""

    num_dp_replicas: int
    nodes: list[str] = msgspec.field(default_factory=list)
    drop_nodes: list[str] = msgspec.field(default_factory=list)
    #: take the ranks from the nodes' ready standbys
    standbys: bool = False


class Rescale(Command, tag="rescale", kw_only=True):
    """Told to the trainer: the world size changes; apply the rescale callbacks."""

    old_world_size: int
    new_world_size: int


class SetCheckpointInterval(Command, tag="set_ckpt_interval", kw_only=True):
    every_steps: int
    rationale: str = ""


class SetThresholds(Command, tag="set_thresholds", kw_only=True):
    values: dict[str, float]


class InjectFault(Command, tag="inject_fault", kw_only=True):
    node: str
    fault: str
    detail: str = ""
    clear: bool = False
    #: fault "slow": the rank's compute takes this many times as long (a straggler)
    factor: Annotated[float, msgspec.Meta(ge=1.0, le=1000.0)] = 1.0
    #: fault "slow": for this long, then back to normal (0: until cleared)
    duration_s: Seconds = 0.0


class RestoreToNode(Command, tag="restore_to_node", kw_only=True):
    """Fill a node's local checkpoint volume from the nearest tier before its ranks start."""

    node: str
    #: the checkpoint step to restore; None: the newest complete one
    step: int | None = None


class ResetGpu(Command, tag="reset_gpu", kw_only=True):
    """Told to a node's host monitor by the actuator, whose ranks no longer use the GPUs."""

    node: str
    #: GPU indexes (empty: every GPU of the node)
    gpus: list[int] = msgspec.field(default_factory=list)
    #: the attempt whose ranks were stopped: a newer attempt's ranks may use the GPU again
    attempt: int
    #: the run of that attempt (attempts count from 1 again in every run)
    run_id: str = ""


class ReturnNode(Command, tag="return_node", kw_only=True):
    """A previously failed node is healthy again and rejoins the spare pool."""

    node: str


EVENT_TYPES: tuple[type[Event], ...] = (
    RankStarted,
    RankExited,
    Heartbeat,
    StepDone,
    CheckpointSaved,
    CheckpointPersisted,
    CheckpointFailed,
    CheckpointDropped,
    CheckpointReplicated,
    CheckpointBackedUp,
    CheckpointRestored,
    TrainingPlan,
    HostHealth,
    Signal,
    Decision,
    ActionResult,
    GpuReset,
    JobStatus,
    RankRejoined,
    RunStarted,
    ServiceHealth,
    DeadLetter,
)

COMMAND_TYPES: tuple[type[Command], ...] = (
    CheckpointNow,
    Stop,
    StartJob,
    Restart,
    RestartInProcess,
    Rejoin,
    HotSwap,
    ScaleTo,
    Rescale,
    SetCheckpointInterval,
    SetThresholds,
    InjectFault,
    RestoreToNode,
    ResetGpu,
    ReturnNode,
)

_encoder = msgspec.msgpack.Encoder()
# a Union built from the tuples, so adding a schema to a tuple is the only step
_event_decoder = msgspec.msgpack.Decoder(type=Union[EVENT_TYPES])  # type: ignore[valid-type]  # noqa: UP007
_command_decoder = msgspec.msgpack.Decoder(type=Union[COMMAND_TYPES])  # type: ignore[valid-type]  # noqa: UP007
_any_decoder = msgspec.msgpack.Decoder(type=Union[EVENT_TYPES + COMMAND_TYPES])  # type: ignore[valid-type]  # noqa: UP007


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def _decode(decoder: msgspec.msgpack.Decoder[Any], payload: bytes) -> Any:
    try:
        message = decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(str(exc)) from exc
    except RecursionError as exc:  # msgspec skipping a deeply nested value it will reject anyway
        raise SchemaError("nested too deeply") from exc
    if message.schema > SCHEMA_VERSION:
        raise SchemaError(
            f"schema version {message.schema} is newer than this build understands "
            f"({SCHEMA_VERSION}); upgrade goodput"
        )
    return message


def decode_event(payload: bytes) -> Event:
    return _decode(_event_decoder, payload)


def decode_command(payload: bytes) -> Command:
    return _decode(_command_decoder, payload)


def decode_any(payload: bytes) -> Message:
    return _decode(_any_decoder, payload)


def kind_of(message_type: type[Message]) -> str:
    return message_type.__struct_config__.tag  # type: ignore[return-value]
