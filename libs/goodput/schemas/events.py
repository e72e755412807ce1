"""The event family: facts, kept in GP_EVENTS and published to ``gp.<job>.evt.<kind>`` (a step's
or checkpoint's with its rank: ``subjects.event_for``).

Each event is a tagged ``Event`` struct (the ``kind`` tag names it); ``EVENT_TYPES`` lists
every one, and the codec decodes exactly that union.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from goodput.schemas.envelope import (
    CommandId,
    EpochNs,
    Event,
    Seconds,
    Token,
    TokenOrEmpty,
    new_id,
)
from goodput.schemas.steps import StepDone, StepsDone
from goodput.schemas.tiers import RestoredFrom


class RankStarted(Event, tag="rank_started", kw_only=True):
    node: Token
    rank: int
    local_rank: int
    world_size: int
    pid: int
    attempt: int = 0


class RankExited(Event, tag="rank_exited", kw_only=True):
    node: Token
    rank: int
    pid: int
    exit_code: int | None
    signal: int | None = None
    attempt: int = 0
    #: why the runner expected it (stop command, restart) or not (``""`` = unexpected)
    expected_reason: str = ""

    @classmethod
    def from_returncode(cls, returncode: int, **fields: Any) -> RankExited:
        """A process's ``returncode`` as the event says it: an exit code, or the signal that
        ended the process (a negative returncode), never both."""
        code, sig = (returncode, None) if returncode >= 0 else (None, -returncode)
        return cls(exit_code=code, signal=sig, **fields)


#: ``Heartbeat.busy`` of a rank's last beat: it finished (or was told to stop) and is leaving;
#: its silence until the exit report is expected, not a missed heartbeat
BUSY_EXITING = "exiting"


class Heartbeat(Event, tag="heartbeat", kw_only=True):
    node: Token
    rank: int
    pid: int
    step: int
    #: the rank is inside a checkpoint save/load (silence is expected, not a hang), or
    #: ``BUSY_EXITING``
    busy: str = ""


class CheckpointSaved(Event, tag="ckpt_saved", kw_only=True):
    """The state was snapshotted into host memory; training resumed after ``stall_s``."""

    node: Token
    rank: int
    step: int
    stall_s: Seconds
    bytes: int


class CheckpointPersisted(Event, tag="ckpt_persisted", kw_only=True):
    node: Token
    rank: int
    step: int
    path: str
    bytes: int
    duration_s: Seconds


class CheckpointFailed(Event, tag="ckpt_failed", kw_only=True):
    node: Token
    rank: int
    step: int
    error: str


class CheckpointDropped(Event, tag="ckpt_dropped", kw_only=True):
    """A pending snapshot was superseded by a newer one before it was persisted."""

    node: Token
    rank: int
    step: int
    superseded_by: int


class CheckpointReplicated(Event, tag="ckpt_replicated", kw_only=True):
    node: Token
    peer: Token
    step: int
    bytes_sent: int
    bytes_deduplicated: int
    duration_s: Seconds


class CheckpointBackedUp(Event, tag="ckpt_backed_up", kw_only=True):
    node: Token
    step: int
    uri: str
    bytes_uploaded: int
    bytes_deduplicated: int
    duration_s: Seconds


class CheckpointRestored(Event, tag="ckpt_restored", kw_only=True):
    node: Token
    rank: int
    step: int
    #: where the bytes were read (``schemas.tiers``; "host": a survivor of an in-process
    #: restart, from the engine's host buffers; "shared": torch-save's shared directory, schema
    #: 17); "none": nothing to restore
    tier: RestoredFrom
    duration_s: Seconds
    bytes: int = 0
    fallbacks: list[str] = msgspec.field(default_factory=list)
    #: page-locked host memory the restore's copies to the GPU went through, released since
    #: (bounded by ``GOODPUT_RESTORE_PINNED_MB``; 0: none staged; schema 12)
    pinned_bytes: int = 0


class TrainingPlan(Event, tag="training_plan", kw_only=True):
    """The batch and learning rate the ranks train with from ``step`` on, published by rank 0
    at every restore that knows its plan; after a change of data-parallel size it says which
    rescale callbacks made it."""

    node: Token
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
    #: the driver's recovery action for this GPU (``NVML_GPU_RECOVERY_ACTION_<NAME>`` in lower
    #: case: ``none``, ``gpu_reset``, ``node_reboot``...; "": not reported), which
    #: ``goodput.gpu_faults`` prefers to its table (schema 10). A name it does not know is
    #: ignored, so a forged one can only fall back to the table.
    recovery_action: TokenOrEmpty = ""


class HostHealth(Event, tag="host_health", kw_only=True):
    node: Token
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
    "crash",
    "hang",
    "missed_heartbeat",
    "straggler",
    "degraded_host",
    "job_down",
    "node_returned",
    "nonfinite",
    "loss_spike",
    "replica_mismatch",
]
#: how bad a signal's fault is (``Signal.severity``)
Severity = Literal["correctable", "uncorrectable", "info"]
#: the signals of a numerical fault (``supervisor/detect/numerics.py``), which a rollback cures
NUMERICAL_SIGNALS: frozenset[str] = frozenset({"nonfinite", "loss_spike", "replica_mismatch"})


class ReplicaSplit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The data-parallel replicas of one model-parallel slot that disagreed, grouped by the
    fingerprint they hold (each group: ranks, ascending; groups: largest first)."""

    slot: int
    groups: list[list[int]]


class Numerics(Event, tag="numerics", kw_only=True):
    """Trainer-side numerics of a window of steps, reduced over every rank and published by
    rank 0 (schema 14): read from device accumulators once per window, never per step."""

    node: Token
    rank: int
    #: the window's last step, and how many steps it holds
    step: int
    steps: int
    loss_mean: float
    loss_max: float
    #: 0.0 when the loop reports no gradient norm
    grad_norm_mean: float = 0.0
    grad_norm_max: float = 0.0
    #: steps of the window whose loss or gradient norm was NaN or infinite (on any rank)
    nonfinite_steps: int = 0
    #: the step whose parameters were fingerprinted (-1: none in this window)
    fingerprint_step: int = -1
    #: the fingerprint every replica agreed on (0 with disagreements or none taken)
    fingerprint: int = 0
    #: the slots whose replicas disagreed (empty: all agreed)
    splits: list[ReplicaSplit] = msgspec.field(default_factory=list)


#: why a rank's process could not go on, as its exit code says (``goodput.launch.rank_env``):
#: ``cuda-context`` — a sticky CUDA error (device-side assert, illegal address, uncorrectable
#: ECC) poisoned its CUDA context, so only a new process can use the GPU; ``cuda-oom`` — it
#: ran out of GPU memory again after its one warm retry; ``""`` — neither (or not known)
RankFault = Literal["", "cuda-context", "cuda-oom"]


class Signal(Event, tag="signal", kw_only=True):
    """Something is wrong (or a spare came back): the sensor's conclusion, with its evidence."""

    signal_id: str = msgspec.field(default_factory=new_id)
    signal: SignalKind
    node: TokenOrEmpty = ""
    rank: int | None = None
    #: ``correctable`` faults (a rank crash) allow an in-job restart; ``uncorrectable`` (a lost
    #: host, a GPU XID) need the node replaced or dropped.
    severity: Severity = "correctable"
    detail: str = ""
    #: when the fault is believed to have happened (epoch ns), for detection-latency accounting
    observed_ts: EpochNs = 0
    #: a host fault's evidence: the host report's fault names and its unhealthy GPUs, which
    #: tell the policy whether a GPU reset can clear it (``goodput.gpu_faults``)
    host_faults: list[str] = msgspec.field(default_factory=list)
    gpus: list[GpuHealth] = msgspec.field(default_factory=list)
    #: a straggler: its compute time over its peers' median (what the job steps slower by;
    #: 0: not a straggler), which the policy weighs against evicting it (schema 7)
    ratio: float = 0.0
    #: a crash's CUDA cause, from the rank's exit code; on a signal with no node, every rank
    #: of the attempt exited with it (a job-wide OOM: the job's memory, not a node's; schema 12)
    rank_fault: RankFault = ""
    #: a numerical fault (``nonfinite``, ``loss_spike``, ``replica_mismatch``): the first step
    #: it may have touched; a rollback goes to a clean checkpoint before it (schema 14)
    first_bad_step: int = -1
    #: the last step of the window it was seen in (-1: none; schema 15)
    last_bad_step: int = -1


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
    command_id: CommandId
    action: str
    ok: bool
    detail: str = ""
    duration_s: Seconds = 0.0
    #: the command was already executed before (redelivery); nothing was done again
    duplicate: bool = False


#: what became of a GPU reset (``GpuReset.outcome``); ``ignored``: meant for an older attempt,
#: or the GPU was still in use, so nothing was reset
GpuResetOutcome = Literal["succeeded", "failed", "timed_out", "ignored"]


class GpuReset(Event, tag="gpu_reset", kw_only=True):
    """A host monitor's answer to ``ResetGpu``: what became of the reset, and how long it took."""

    node: Token
    command_id: CommandId
    #: the GPU indexes the command named (empty: every GPU of the node)
    gpus: list[int] = msgspec.field(default_factory=list)
    #: the attempt whose ranks were stopped for it
    attempt: int = 0
    outcome: GpuResetOutcome
    duration_s: Seconds = 0.0
    detail: str = ""


class BackendCapabilities(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the actuator's backend can do, declared in every ``JobStatus`` (schema 5) so the
    policy sends no rung it would refuse. What the job's ranks can do is theirs to say
    (``StepDone.in_process_restart``); a rung runs only where both can."""

    #: the backend's name (``ActuatorOptions.backend``)
    backend: str
    #: surviving ranks can rejoin a fresh rendezvous in their processes (``RestartInProcess``)
    in_process_restart: bool
    #: where ready standby ranks are kept: on every node of the job (``"all"``), on the spare
    #: nodes only (``"spares"``: a hot swap's ranks come from them, a restart in place is cold)
    #: or nowhere (``"none"``); ``JobStatus.standbys`` says how many are ready now
    standbys: Literal["none", "spares", "all"]
    #: the node's host monitor can reset GPUs between stopping and relaunching the ranks
    #: (``Restart.reset_gpus``)
    gpu_reset: bool
    #: a failed node can be replaced by a spare (``HotSwap``)
    hot_swap: bool
    #: the job can run on fewer or more nodes than it started on (``ScaleTo``)
    scale: bool


#: the state of a job's run, as the actuator reports it (``JobStatus.state``)
JobStateName = Literal["starting", "running", "restarting", "finished", "failed", "stopped"]
#: the run goes on: its ranks run or are being (re)started, and a new run of the job is refused
LIVE_JOB_STATES: frozenset[JobStateName] = frozenset({"starting", "running", "restarting"})
#: the run is over (or none was started yet: "stopped"); nothing more will happen in it
ENDED_JOB_STATES: frozenset[JobStateName] = frozenset(get_args(JobStateName)) - LIVE_JOB_STATES
if not LIVE_JOB_STATES.issubset(get_args(JobStateName)) or not ENDED_JOB_STATES:
    raise AssertionError("the live and ended job states do not partition JobStateName")


class JobStatus(Event, tag="job_status", kw_only=True):
    """The actuator's view of the job after every membership or lifecycle change."""

    state: JobStateName
    attempt: int
    world_size: int
    procs_per_node: int
    active_nodes: list[Token] = msgspec.field(default_factory=list)
    spare_nodes: list[Token] = msgspec.field(default_factory=list)
    failed_nodes: list[Token] = msgspec.field(default_factory=list)
    #: rank process ids per node (in rank order), for operators and the chaos tool
    pids: dict[Token, list[int]] = msgspec.field(default_factory=dict)
    detail: str = ""
    #: the run this status belongs to (``StartJob.run_id``; empty before any run)
    run_id: TokenOrEmpty = ""
    #: process ids of the ready standby ranks per node (torch imported, the job's state built,
    #: waiting for an assignment); not ranks: absent from ``pids``
    standbys: dict[Token, list[int]] = msgspec.field(default_factory=dict)
    #: what the backend can do (None: an actuator that does not say; every rung is tried)
    capabilities: BackendCapabilities | None = None
    #: nodes that never confirmed the deletion of a pod of the job: the backend places no rank
    #: there (its GPU may still be held) until they are replaced or confirm it (schema 10)
    suspect_nodes: list[Token] = msgspec.field(default_factory=list)


class RankRejoined(Event, tag="rank_rejoined", kw_only=True):
    """A surviving rank restarts in process: it left the broken process group and is joining
    the fresh rendezvous of ``attempt`` (same process, model and optimizer kept)."""

    node: Token
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

    run_id: Token
    #: the StartJob that began it
    command_id: CommandId
    argv: list[str] = msgspec.field(default_factory=list)
    nodes: int = 0
    procs_per_node: int = 0


class ServiceHealth(Event, tag="service_health", kw_only=True):
    """One replica's health, refreshed every ``period_s`` under
    ``subjects.health_key(job, service, node, instance)``."""

    service: Token
    instance: str
    pid: int
    healthy: bool
    started_ts: EpochNs
    #: how often the record is refreshed; a record older than a few periods means "not running"
    period_s: Seconds = 1.0
    detail: str = ""
    #: the node a per-node service serves (host monitor, checkpoint tier); "" for the others
    node: str = ""


class DeadLetter(Event, tag="dead_letter", kw_only=True):
    """Input a service could not use. ``payload`` is cut to fit the server's max payload; ``size``
    is the original's length and ``stream_seq`` its sequence in its stream (0: core NATS)."""

    service: Token
    subject: str
    reason: str
    payload: bytes
    size: int = 0
    stream_seq: int = 0


EVENT_TYPES: tuple[type[Event], ...] = (
    RankStarted,
    RankExited,
    Heartbeat,
    StepDone,
    StepsDone,
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
    Numerics,
    JobStatus,
    RankRejoined,
    RunStarted,
    ServiceHealth,
    DeadLetter,
)
