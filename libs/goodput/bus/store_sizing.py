"""How many bytes each stream, each KV bucket and the server's JetStream store may hold.

The one owner of the sizing formula. A stream without a byte limit grows until the server's
store is full, and then nothing can be stored, commands included; so every stream and bucket
gets a limit derived from the job's scale (:class:`StoreScale`), and the server's store is
sized to hold their sum, so no stream can starve another.

The bytes of each message are measured from the project's own messages, as wide as the
scale makes them (:mod:`goodput.bus.message_sizes`, to the byte what nats-server accounts).

Events (``GP_EVENTS``, oldest discarded past the limit) are the traffic::

    per second  = nodes / step_s            x StepsDone (a node's ranks' steps rolled up)
                + nodes / host_report_s     x HostHealth (one GPU record per rank of the node)
                + (ranks x (CheckpointSaved + CheckpointPersisted)
                   + nodes x (CheckpointReplicated + CheckpointBackedUp)) / checkpoint_s
                + restarts_per_hour / 3600 x (ranks x (RankExited + RankStarted
                   + CheckpointRestored + TrainingPlan) + RunStarted)
    GP_EVENTS   = per second x keep_h x 3600 x EVENTS_MARGIN

so the stream holds at least ``keep_h`` hours of the job's history at its scale (the margin
covers the rare events the formula does not count: signals, decisions, action results).
Commands (``GP_CMDS``) are per restart: each node gets a ``LaunchRanks``, a ``SignalRanks``
and a ``KeepStandbys``; the stream keeps ``keep_h`` hours of them, at least
:data:`MIN_STREAM_BYTES`, discarding the oldest (executed long ago) past that. The KV buckets
hold a bounded set of keys (the fleet's services, agents, checkpoint copies), except
``gp_done``, sized for its TTL's worth of command results.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from fractions import Fraction

import msgspec

from goodput import subjects
from goodput.bus.message_sizes import (
    Widths,
    command_bytes,
    event_bytes,
    record_bytes,
    sample_commands,
    sample_events,
)

#: the environment variable that carries the scale to every process that provisions the bus
#: (services, node agents, `goodput up`): ``nodes=2048,ranks_per_node=8,keep_h=24``
SCALE_ENV = "GOODPUT_STORE_SCALE"

MIB = 1 << 20
#: the events the formula does not count (signals, decisions, action results, GPU resets)
EVENTS_MARGIN = 1.25
#: no stream or bucket smaller than this: a small job still keeps weeks of its rare events
MIN_STREAM_BYTES = 64 * MIB
MIN_BUCKET_BYTES = 8 * MIB
#: dead letters are input errors, not traffic: this many letters of NATS's 1 MiB max payload
DEAD_LETTERS_KEPT = 256
#: room above the sum of the limits in the server's store (its own metadata, Raft logs)
SERVER_HEADROOM = Fraction(11, 10)  # exact: 460 MiB x 1.1 in floats rounded up to 507
#: a KV record of a bucket whose values are not one of the schemas' messages (the checkpoint
#: index's copy record lists its files: a rank's shards and the metadata), per file listed
INDEX_BYTES_PER_FILE = 96
#: checkpoint copies the index lists per node: a copy in each of the three tiers (local, peer,
#: object store) of the checkpoints retention keeps (``checkpoint.index.retention.DEFAULT_KEEP``:
#: at most 3 per tier) and of the one being written
INDEX_COPIES_PER_NODE = 3 * (3 + 1)
#: the controller's and actuator's records per node in ``gp_state`` (membership, spares)
STATE_BYTES_PER_NODE = 512
#: the services that are not per node (sensor, controller, actuator, stack launcher)
CENTRAL_SERVICES = 4
#: per-node services with a health record (host monitor, replicator)
PER_NODE_SERVICES = 2
#: holders of a leader lease (controller, actuator and their standbys)
LEASES = 16
#: the TTL of ``gp_done`` (a redelivered command must find its result this long)
DONE_TTL_S = 14 * 24 * 3600.0


class StoreScaleError(ValueError):
    """A scale that does not parse: the message names the field."""


class StoreScale(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """The job the stores are sized for (the largest job the bus serves)."""

    nodes: int = 16
    ranks_per_node: int = 8
    #: seconds per training step (every node publishes its ranks' steps rolled up, a
    #: StepsDone per step)
    step_s: float = 1.0
    #: seconds between checkpoints
    checkpoint_s: float = 600.0
    #: seconds between a node's host reports (the host monitor's and node agent's period)
    host_report_s: float = 2.0
    #: restarts budgeted per hour (each relaunches every rank)
    restarts_per_hour: float = 1.0
    #: hours of history the event and command streams keep at this scale, at least
    keep_h: float = 24.0
    #: the job name's length in subjects and keys
    job_name_chars: int = 16

    def __post_init__(self) -> None:
        for field in ("nodes", "ranks_per_node", "job_name_chars"):
            if getattr(self, field) < 1:
                raise StoreScaleError(f"store scale {field} must be at least 1")
        for field in ("step_s", "checkpoint_s", "host_report_s", "keep_h"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise StoreScaleError(f"store scale {field} must be a positive number of s/h")
        if not (math.isfinite(self.restarts_per_hour) and self.restarts_per_hour >= 0):
            raise StoreScaleError("store scale restarts_per_hour must be 0 or more")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def widths(self) -> Widths:
        return Widths(self.nodes, self.ranks_per_node, self.job_name_chars)


class StoreLimits(msgspec.Struct, kw_only=True, frozen=True):
    """Byte limits of every stream and bucket (by name), and of the server's store."""

    streams: dict[str, int]
    buckets: dict[str, int]
    #: ``max_file_store`` of each server: every stream and bucket's copy fits
    server_bytes: int
    #: the events stream's bytes per second at the scale (for the docs and the bench)
    events_per_s_bytes: float


def parse_scale(text: str, source: str = SCALE_ENV) -> StoreScale:
    """``nodes=2048,ranks_per_node=8,keep_h=24`` (unnamed fields keep their defaults)."""
    values: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise StoreScaleError(f"{source}: expected KEY=VALUE items, got {item!r}")
        values[key.strip()] = value.strip()
    try:
        return msgspec.convert(values, StoreScale, strict=False)
    except msgspec.ValidationError as exc:
        raise StoreScaleError(f"{source}={text!r}: {exc}") from None


def scale_from_env(env: Mapping[str, str] | None = None) -> StoreScale | None:
    """The scale :data:`SCALE_ENV` names; None where it is unset."""
    raw = (os.environ if env is None else env).get(SCALE_ENV, "").strip()
    return parse_scale(raw) if raw else None


def scale_to_env(scale: StoreScale) -> dict[str, str]:
    """The environment that gives a child process ``scale`` (:func:`scale_from_env`)."""
    fields = msgspec.structs.asdict(scale)
    return {SCALE_ENV: ",".join(f"{key}={value}" for key, value in fields.items())}


def _bucket_bytes(scale: StoreScale) -> dict[str, int]:
    record = record_bytes(scale.widths)
    per_restart = scale.nodes * len(sample_commands(scale.widths))
    commands_in_ttl = scale.restarts_per_hour * DONE_TTL_S / 3600 * per_restart
    index_record = 256 + INDEX_BYTES_PER_FILE * (scale.ranks_per_node + 2)
    raw = {
        subjects.SERVICES_BUCKET: (CENTRAL_SERVICES + PER_NODE_SERVICES * scale.nodes)
        * record["service_health"],
        # history 5 of each record
        subjects.STATE_BUCKET: 5 * scale.nodes * STATE_BYTES_PER_NODE,
        subjects.CKPT_INDEX_BUCKET: scale.nodes * INDEX_COPIES_PER_NODE * index_record,
        subjects.LEASES_BUCKET: LEASES * 512,
        subjects.AGENTS_BUCKET: scale.nodes * record["agent_record"],
        subjects.DONE_BUCKET: commands_in_ttl * record["command_done"],
    }
    # twice the live records: a deleted key's marker and a record being replaced both count
    return {name: max(MIN_BUCKET_BYTES, _mib(2 * size)) for name, size in raw.items()}


def _mib(size: float | Fraction) -> int:
    """``size`` rounded up to whole MiB."""
    return math.ceil(size / MIB) * MIB


def events_rate(scale: StoreScale) -> float:
    """Bytes per second the job adds to GP_EVENTS (the formula of the module's docstring)."""
    size = {kind: event_bytes(event) for kind, event in sample_events(scale.widths).items()}
    checkpoint = scale.ranks * (size["ckpt_saved"] + size["ckpt_persisted"]) + scale.nodes * (
        size["ckpt_replicated"] + size["ckpt_backed_up"]
    )
    restart = (
        scale.ranks
        * (
            size["rank_exited"]
            + size["rank_started"]
            + size["ckpt_restored"]
            + size["training_plan"]
        )
        + size["run_started"]
    )
    return (
        scale.nodes / scale.step_s * size["steps"]
        + scale.nodes / scale.host_report_s * size["host_health"]
        + checkpoint / scale.checkpoint_s
        + scale.restarts_per_hour / 3600 * restart
    )


def store_limits(scale: StoreScale) -> StoreLimits:
    """The byte limit of every stream and bucket at ``scale``, and the server store for all."""
    keep_s = scale.keep_h * 3600
    per_second = events_rate(scale)
    restart_commands = scale.nodes * sum(
        command_bytes(target, command) for target, command in sample_commands(scale.widths).values()
    )
    streams = {
        subjects.EVENTS_STREAM: max(MIN_STREAM_BYTES, _mib(per_second * keep_s * EVENTS_MARGIN)),
        subjects.COMMANDS_STREAM: max(
            MIN_STREAM_BYTES, _mib(scale.restarts_per_hour * scale.keep_h * restart_commands)
        ),
        subjects.DEAD_LETTER_STREAM: DEAD_LETTERS_KEPT * MIB,
    }
    buckets = _bucket_bytes(scale)
    total = sum(streams.values()) + sum(buckets.values())
    return StoreLimits(
        streams=streams,
        buckets=buckets,
        server_bytes=_mib(total * SERVER_HEADROOM),
        events_per_s_bytes=per_second,
    )


#: the scale a process that was told none sizes new streams for
DEFAULT_SCALE = StoreScale()


def server_store_bytes(env: Mapping[str, str] | None = None) -> int:
    """The JetStream store a server needs for the scale of ``env`` (default: the default's)."""
    return store_limits(scale_from_env(env) or DEFAULT_SCALE).server_bytes
