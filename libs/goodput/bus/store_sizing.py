"""How many bytes each stream, each KV bucket and the server's JetStream store may hold.

The one owner of the sizing formula. A stream without a byte limit grows until the server's
store is full, and then nothing can be stored, commands included; so every stream and bucket
gets a limit derived from the job's scale (:class:`StoreScale`), and the server's store is
sized to hold their sum, so no stream can starve another.

The bytes a message takes in a stream are measured here from the project's own messages:
each kind is encoded (msgpack, :func:`goodput.schemas.encode`) with values as wide as the
scale makes them (node ``node-2047``, rank 16383), plus what JetStream's file store adds to
every record (``22 + subject + 4 + headers + payload + 8``: its record header, the headers'
length and its hash) and the headers goodput publishes with (``Nats-Msg-Id`` and a W3C
``traceparent``, present only inside a span: counted always). `goodput bench store` checks
these figures against a real nats-server and prints them; ``tests/bus/test_store_sizing.py``
holds them to the byte.

Events (``GP_EVENTS``, oldest discarded past the limit) are the traffic::

    per second  = ranks / step_s            x StepDone
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

import msgspec

from goodput import schemas, subjects

#: the environment variable that carries the scale to every process that provisions the bus
#: (services, node agents, `goodput up`): ``nodes=2048,ranks_per_node=8,keep_h=24``
SCALE_ENV = "GOODPUT_STORE_SCALE"

MIB = 1 << 20
#: what JetStream's file store adds to each message: record header (22) and hash (8), and
#: the length of the header block (4) when the message has headers
RECORD_OVERHEAD = 22 + 8
HEADERS_LENGTH = 4
#: the header block of a goodput publication: ``Nats-Msg-Id`` (a 32-hex id) and the trace's
#: ``traceparent`` (55 characters), as nats-py writes them
PUBLISH_HEADERS = len(
    b"NATS/1.0\r\nNats-Msg-Id: " + b"0" * 32 + b"\r\ntraceparent: " + b"0" * 55 + b"\r\n\r\n"
)
#: the events the formula does not count (signals, decisions, action results, GPU resets)
EVENTS_MARGIN = 1.25
#: no stream or bucket smaller than this: a small job still keeps weeks of its rare events
MIN_STREAM_BYTES = 64 * MIB
MIN_BUCKET_BYTES = 8 * MIB
#: dead letters are input errors, not traffic: this many letters of NATS's 1 MiB max payload
DEAD_LETTERS_KEPT = 256
#: room above the sum of the limits in the server's store (its own metadata, Raft logs)
SERVER_HEADROOM = 1.10
#: a KV record of a bucket whose values are not one of the schemas' messages (the checkpoint
#: index's copy record lists its files: a rank's shards and the metadata), per file listed
INDEX_BYTES_PER_FILE = 96
#: checkpoint copies the index keeps per node: local, peer and object-store copies of the
#: last few checkpoints (retention keeps three; a fourth is being written)
INDEX_COPIES_PER_NODE = 3 * 4
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
    #: seconds per training step (every rank publishes a StepDone per step)
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


def _widest(scale: StoreScale) -> tuple[str, str, int]:
    """The job name, node name and rank as wide as the scale makes them."""
    return "j" * scale.job_name_chars, f"node-{scale.nodes - 1}", scale.ranks - 1


def stored_bytes(subject: str, payload: bytes) -> int:
    """What one published message takes in a file stream (and counts against max_bytes)."""
    return RECORD_OVERHEAD + len(subject) + HEADERS_LENGTH + PUBLISH_HEADERS + len(payload)


def event_bytes(event: schemas.Event) -> int:
    return stored_bytes(subjects.event_for(event), schemas.encode(event))


def sample_events(scale: StoreScale) -> dict[str, schemas.Event]:
    """One event of each counted kind, every field as wide as the scale makes it."""
    job, node, rank = _widest(scale)
    ts, world, big = 2**62, scale.ranks, 2**40
    gpus = [
        schemas.GpuHealth(
            index=i,
            uuid=f"GPU-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}",
            temperature_c=71.5,
        )
        for i in range(scale.ranks_per_node)
    ]
    common = {"job": job, "ts": ts}
    return {
        "step": schemas.StepDone(
            **common,
            node=node,
            rank=rank,
            step=big,
            step_time_s=1.234567,
            tokens=big,
            loss=2.345678,
            world_size=world,
            compute_time_s=1.0123,
        ),
        "host_health": schemas.HostHealth(
            **common,
            node=node,
            healthy=True,
            gpu_available=True,
            gpus=gpus,
            disk_free_bytes=big,
            disk_total_bytes=big,
            mem_available_bytes=big,
            mem_total_bytes=big,
            ranks_alive=scale.ranks_per_node,
            ranks_expected=scale.ranks_per_node,
            attempt=1000,
        ),
        "ckpt_saved": schemas.CheckpointSaved(
            **common, node=node, rank=rank, step=big, stall_s=0.25, bytes=big
        ),
        "ckpt_persisted": schemas.CheckpointPersisted(
            **common,
            node=node,
            rank=rank,
            step=big,
            bytes=big,
            duration_s=1.5,
            path=f"/ckpt/{job}/step-{big:010d}/rank-{rank:05d}",
        ),
        "ckpt_replicated": schemas.CheckpointReplicated(
            **common,
            node=node,
            peer=node,
            step=big,
            bytes_sent=big,
            bytes_deduplicated=big,
            duration_s=2.5,
        ),
        "ckpt_backed_up": schemas.CheckpointBackedUp(
            **common,
            node=node,
            step=big,
            uri=f"gs://{job}-checkpoints/{job}/{node}/{big:010d}",
            bytes_uploaded=big,
            bytes_deduplicated=big,
            duration_s=9.5,
        ),
        "rank_exited": schemas.RankExited(
            **common,
            node=node,
            rank=rank,
            pid=2**22,
            exit_code=-9,
            signal=9,
            attempt=1000,
            expected_reason="restart",
        ),
        "rank_started": schemas.RankStarted(
            **common,
            node=node,
            rank=rank,
            local_rank=scale.ranks_per_node - 1,
            world_size=world,
            pid=2**22,
            attempt=1000,
        ),
        "ckpt_restored": schemas.CheckpointRestored(
            **common,
            node=node,
            rank=rank,
            step=big,
            tier="peer",
            duration_s=3.5,
            bytes=big,
        ),
        "training_plan": schemas.TrainingPlan(
            **common,
            node=node,
            rank=rank,
            step=big,
            world_size=world,
            dp_size=world,
            global_batch=2**20,
            micro_batch=64,
            accumulation_steps=64,
            lr=3.0e-4,
        ),
        "run_started": schemas.RunStarted(
            **common,
            run_id=schemas.new_id(),
            command_id=schemas.new_id(),
            argv=["python", "-m", "train", "--config", f"/configs/{job}.yaml"],
            nodes=scale.nodes,
            procs_per_node=scale.ranks_per_node,
        ),
    }


#: a rank's environment in a ``LaunchRanks`` (its ``RankEnv``, the job's env, the bus
#: settings): this many variables of the widths below, an allowance above what the actuator
#: writes today (about 25)
RANK_ENV_VARIABLES = 40
RANK_ENV_KEY_CHARS = 28
RANK_ENV_VALUE_CHARS = 64


def sample_commands(scale: StoreScale) -> dict[str, tuple[str, schemas.Command]]:
    """Target and command of each kind a restart sends every node (the bulk of GP_CMDS)."""
    job, node, rank = _widest(scale)
    env = {
        f"GOODPUT_{i:0{RANK_ENV_KEY_CHARS - 8}d}": "v" * RANK_ENV_VALUE_CHARS
        for i in range(RANK_ENV_VARIABLES)
    }
    argv = ["python", "-m", "train", "--config", f"/configs/{job}.yaml"]
    common = {"job": job, "ts": 2**62, "decision_id": schemas.new_id(), "reason": "r" * 64}
    target = subjects.node_target(subjects.AGENT, node)
    launch = schemas.LaunchRanks(
        **common,
        node=node,
        run_id=schemas.new_id(),
        attempt=1000,
        argv=argv,
        workdir=f"/workspace/{job}",
        ranks=[
            schemas.RankLaunch(rank=rank, local_rank=local, env=env, standby=True)
            for local in range(scale.ranks_per_node)
        ],
    )
    signal = schemas.SignalRanks(
        **common,
        node=node,
        attempt=1000,
        signal="term",
        ranks=[rank] * scale.ranks_per_node,
        expected_reason="restart",
    )
    standbys = schemas.KeepStandbys(
        **common,
        node=node,
        run_id=schemas.new_id(),
        count=scale.ranks_per_node,
        argv=argv,
        workdir=f"/workspace/{job}",
        env=env,
    )
    return {
        "launch_ranks": (target, launch),
        "signal_ranks": (target, signal),
        "keep_standbys": (target, standbys),
    }


def command_bytes(target: str, command: schemas.Command) -> int:
    return stored_bytes(subjects.command(command.job, target), schemas.encode(command))


def _kv_bytes(bucket: str, key: str, value: bytes) -> int:
    """A KV record: a message on ``$KV.<bucket>.<key>`` (a put carries no headers)."""
    return RECORD_OVERHEAD + len(f"$KV.{bucket}.{key}") + len(value)


def _bucket_bytes(scale: StoreScale) -> dict[str, int]:
    job, node, rank = _widest(scale)
    ns = 2**62
    health = schemas.ServiceHealth(
        job=job,
        ts=ns,
        service="replicator",
        instance=f"replicator-{node}",
        pid=2**22,
        healthy=True,
        started_ts=ns,
        detail="d" * 128,
    )
    agent = schemas.AgentRecord(
        job=job,
        ts=ns,
        node=node,
        address="255.255.255.255",
        pid=2**22,
        instance=schemas.new_id(),
        started_ts=ns,
        state_dir=f"/var/lib/goodput/{job}",
        gpus=list(range(scale.ranks_per_node)),
        free_ports=[65535] * 8,
        run_id=schemas.new_id(),
        ranks=[
            schemas.AgentRank(rank=rank, local_rank=local, attempt=1000, pid=2**22)
            for local in range(scale.ranks_per_node)
        ],
        standbys=[2**22] * scale.ranks_per_node,
    )
    result = schemas.ActionResult(
        job=job,
        ts=ns,
        command_id=schemas.new_id(),
        action="launch_ranks",
        ok=True,
        detail="d" * 256,
        duration_s=1.5,
    )
    claim = schemas.CommandClaim(
        job=job,
        ts=ns,
        command_id=schemas.new_id(),
        claimant=f"agent-{node}-{'i' * 32}",
        fence="f" * 64,
    )
    executor, command_id = f"agent-{node}", "c" * 32
    done_key = subjects.kv_key(job, executor, command_id)
    per_command = _kv_bytes(subjects.DONE_BUCKET, done_key, schemas.encode(result))
    per_command += _kv_bytes(subjects.DONE_BUCKET, done_key + ".claim", schemas.encode(claim))
    commands_in_ttl = scale.restarts_per_hour * DONE_TTL_S / 3600 * scale.nodes * 3
    index_record = 256 + INDEX_BYTES_PER_FILE * (scale.ranks_per_node + 2)
    raw = {
        subjects.SERVICES_BUCKET: (CENTRAL_SERVICES + PER_NODE_SERVICES * scale.nodes)
        * _kv_bytes(
            subjects.SERVICES_BUCKET, subjects.kv_key(job, health.instance), schemas.encode(health)
        ),
        # history 5 of each record
        subjects.STATE_BUCKET: 5 * scale.nodes * STATE_BYTES_PER_NODE,
        subjects.CKPT_INDEX_BUCKET: scale.nodes * INDEX_COPIES_PER_NODE * index_record,
        subjects.LEASES_BUCKET: LEASES * 512,
        subjects.AGENTS_BUCKET: scale.nodes
        * _kv_bytes(subjects.AGENTS_BUCKET, subjects.kv_key(job, node), schemas.encode(agent)),
        subjects.DONE_BUCKET: commands_in_ttl * per_command,
    }
    # twice the live records: a deleted key's marker and a record being replaced both count
    return {name: max(MIN_BUCKET_BYTES, _mib(2 * size)) for name, size in raw.items()}


def _mib(size: float) -> int:
    """``size`` rounded up to whole MiB."""
    return math.ceil(size / MIB) * MIB


def events_rate(scale: StoreScale) -> float:
    """Bytes per second the job adds to GP_EVENTS (the formula of the module's docstring)."""
    size = {kind: event_bytes(event) for kind, event in sample_events(scale).items()}
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
        scale.ranks / scale.step_s * size["step"]
        + scale.nodes / scale.host_report_s * size["host_health"]
        + checkpoint / scale.checkpoint_s
        + scale.restarts_per_hour / 3600 * restart
    )


def store_limits(scale: StoreScale) -> StoreLimits:
    """The byte limit of every stream and bucket at ``scale``, and the server store for all."""
    keep_s = scale.keep_h * 3600
    per_second = events_rate(scale)
    restart_commands = scale.nodes * sum(
        command_bytes(target, command) for target, command in sample_commands(scale).values()
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
