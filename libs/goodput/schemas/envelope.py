"""The envelope every bus message shares: the schema version, the bounds of times and
durations, ids and the process clock, the ``Message`` base and the ``SchemaError`` a bad
payload raises. The event and command families (``events``, ``commands``) build on it."""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import Annotated

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
#: 4: a rank declares what it supports in its step reports (``StepDone.in_process_restart``),
#: so the policy sends no rung the job's ranks would refuse
#: 5: the actuator declares what its backend can do in every ``JobStatus``
#: (``JobStatus.capabilities``, ``BackendCapabilities``): the policy skips a rung the backend
#: would refuse instead of learning it from the refusal
#: 6: node agents (``AgentRecord`` in ``gp_agents``; ``LaunchRanks`` and ``SignalRanks`` to
#: ``agent-<node>``), driven by the actuator's ``agent`` backend
#: 7: a straggler signal carries its measured ratio (``Signal.ratio``), so the policy prices
#: tolerating it against evicting it
#: 8: standby ranks on node agents (``KeepStandbys`` to ``agent-<node>``,
#: ``RankLaunch.standby``, ``AgentRecord.standbys``): the agent backend keeps them as the
#: local one does
#: 9: a service's health record names the node it serves (``ServiceHealth.node``) and is
#: kept per replica (its key ends with the instance), so replicas no longer overwrite one
#: record and `goodput status` reads any stack from the bus alone
#: 10: the actuator names the nodes it places no rank on until they are replaced
#: (``JobStatus.suspect_nodes``: a pod deletion they never confirmed), so the policy replaces
#: such a node after a refused launch instead of leaving the job restarting
#: 11: a GPU record carries the driver's recovery action (``GpuHealth.recovery_action``)
#: 12: a crash signal names its CUDA cause (``Signal.rank_fault``: a poisoned context, an OOM
#: after its warm retry), so the policy restarts that rank cold and tells a job-wide OOM; a
#: restore reports the pinned memory its GPU copies went through
#: (``CheckpointRestored.pinned_bytes``)
#: 13: ``RestoreToNode`` names the part of a checkpoint sharded across nodes the node holds in
#: the new membership, and the new part count (``part``, ``parts``)
#: 14: trainer-side numerics (``Numerics``: a window's loss and gradient norm, the replicas'
#: parameter fingerprints) and the signals judged from them (``nonfinite``, ``loss_spike``,
#: ``replica_mismatch``, with ``Signal.first_bad_step``) and the rollback they lead to
#: (``restore_before_step`` on ``Restart``, ``HotSwap``, ``ScaleTo``)
#: 15: a loss spike's rollback skips the data of the window it was seen in
#: (``Signal.last_bad_step``, ``Restart.skip_steps``, ``StepWindow``); a rollback's launch
#: fills a node's volume with the checkpoint its ranks restore (``RestoreToNode.before_step``)
#: 16: a node's step reports rolled up into one event (``StepsDone``, ``RankStep``), published
#: by its first local rank; a rank's own ``StepDone`` stays valid (``schemas.expand_steps``)
#: 17: a restore from torch-save's shared directory is reported as read from there
#: (``CheckpointRestored.tier`` "shared", the tier ``RestoreResult`` names), not as "local"
SCHEMA_VERSION = 17

#: the longest duration a message may carry (about 31 years): rejects an infinite or absurd value
MAX_DURATION_S = 1e9

#: epoch nanoseconds: not before 1970, and within a signed 64-bit integer (msgpack, other
#: languages' clients), so arithmetic on it never overflows a fixed-width type
EpochNs = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: a duration in seconds: never negative, always finite
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_DURATION_S)]

#: the longest training step a message may report: a day. A step reported as longer is a
#: broken clock or a bug, not a measurement, and is refused at decoding (dead-lettered).
#: Narrowing this from ``MAX_DURATION_S`` needs no new ``SCHEMA_VERSION``: the version marks
#: a change in what a valid message means, and no valid message changes meaning; every step
#: time a build now sends was valid before, and an older sender's absurd value is refused
#: with a reason instead of steering a checkpoint interval.
MAX_STEP_TIME_S = 86_400.0
#: a training step's duration in seconds (``StepDone``)
StepSeconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_STEP_TIME_S)]

#: the one rule for a name that becomes a NATS subject token, a KV key part or a path part
#: (job, node, service, run id…): no dot, space, wildcard or separator can reach a
#: subject. ``goodput.subjects.check_token`` applies it to names typed by a person; the types
#: below apply it at decoding, so a forged name is dead-lettered, never acted on. Narrowing a
#: ``str`` to it needs no new ``SCHEMA_VERSION``: every name a build sends was a token already.
_TOKEN_CHARS = "A-Za-z0-9_-"
TOKEN_PATTERN = f"^[{_TOKEN_CHARS}]+$"
TOKEN_RE = re.compile(TOKEN_PATTERN)
#: a subject token (never empty)
Token = Annotated[str, msgspec.Meta(pattern=TOKEN_PATTERN)]
#: a subject token, or ``""`` where the field is optional (a signal about no node, no run yet)
TokenOrEmpty = Annotated[str, msgspec.Meta(pattern=f"^[{_TOKEN_CHARS}]*$")]
#: a command id: a KV key token in ``gp_done`` (never a subject token), so ``/`` and ``=``
#: are allowed as NATS allows them in keys
CommandId = Annotated[str, msgspec.Meta(pattern="^[-/_=A-Za-z0-9]+$", max_length=256)]


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

    job: Token
    ts: EpochNs = msgspec.field(default_factory=now_ns)
    schema: int = SCHEMA_VERSION


class Event(Message, kw_only=True):
    """A fact, published to ``subjects.event_for(fact)`` (the family: ``events``, ``steps``)."""
