"""What each goodput message takes in a JetStream file stream, measured from the schemas.

Each kind is encoded (msgpack, :func:`goodput.schemas.encode`) with its fields as wide as a
fleet makes them (:class:`Widths`: node ``node-2047``, rank 16383, a 16-character job name),
plus what JetStream's file store adds to every record (``22 + subject + 4 + headers + payload
+ 8``: its record header, the headers' length and its hash) and the headers goodput publishes
with (``Nats-Msg-Id`` and a W3C ``traceparent``, present only inside a span: counted always).
`goodput bench store` checks these figures against a real nats-server;
``tests/bus/test_store_sizing.py`` holds them to the byte. The sizing formula that uses them
is :mod:`goodput.bus.store_sizing`.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict

from goodput import schemas, subjects


class Widths(NamedTuple):
    """How wide a fleet makes the fields of its messages."""

    nodes: int
    ranks_per_node: int
    job_name_chars: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def job(self) -> str:
        return "j" * self.job_name_chars

    @property
    def node(self) -> str:
        return f"node-{self.nodes - 1}"

    @property
    def rank(self) -> int:
        return self.ranks - 1


#: what JetStream's file store adds to each message: record header (22) and hash (8), and
#: the length of the header block (4) when the message has headers
RECORD_OVERHEAD = 22 + 8
HEADERS_LENGTH = 4
#: the header block of a goodput publication: ``Nats-Msg-Id`` (a 32-hex id) and the trace's
#: ``traceparent`` (55 characters), as nats-py writes them
PUBLISH_HEADERS = len(
    b"NATS/1.0\r\nNats-Msg-Id: " + b"0" * 32 + b"\r\ntraceparent: " + b"0" * 55 + b"\r\n\r\n"
)


def stored_bytes(subject: str, payload: bytes) -> int:
    """What one published message takes in a file stream (and counts against max_bytes)."""
    return RECORD_OVERHEAD + len(subject) + HEADERS_LENGTH + PUBLISH_HEADERS + len(payload)


def event_bytes(event: schemas.Event) -> int:
    return stored_bytes(subjects.event_for(event), schemas.encode(event))


class _Common(TypedDict):
    """The fields every sample event shares, typed so each ``**common`` is checked."""

    job: str
    ts: int


class _CommandCommon(_Common):
    decision_id: str
    reason: str


def sample_events(widths: Widths) -> dict[str, schemas.Event]:
    """One event of each counted kind, every field as wide as ``widths`` makes it."""
    job, node, rank = widths.job, widths.node, widths.rank
    ts, world, big = 2**62, widths.ranks, 2**40
    gpus = [
        schemas.GpuHealth(
            index=i,
            uuid=f"GPU-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}",
            temperature_c=71.5,
        )
        for i in range(widths.ranks_per_node)
    ]
    common = _Common(job=job, ts=ts)
    return {
        # a node's ranks' steps, rolled up by its first rank (a rank's own StepDone is the
        # rare fallback of one that cannot reach it)
        "steps": schemas.StepsDone(
            **common,
            node=node,
            rank=rank,
            steps=[
                schemas.RankStep(
                    rank=rank,
                    step=big,
                    ts=ts,
                    step_time_s=1.234567,
                    compute_time_s=1.0123,
                    tokens=big,
                    loss=2.345678,
                    world_size=world,
                    in_process_restart=False,
                )
            ]
            * widths.ranks_per_node,
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
            ranks_alive=widths.ranks_per_node,
            ranks_expected=widths.ranks_per_node,
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
            local_rank=widths.ranks_per_node - 1,
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
            nodes=widths.nodes,
            procs_per_node=widths.ranks_per_node,
        ),
    }


#: a rank's environment in a ``LaunchRanks`` (its ``RankEnv``, the job's env, the bus
#: settings): this many variables of the widths below, an allowance above what the actuator
#: writes today (about 25)
RANK_ENV_VARIABLES = 40
RANK_ENV_KEY_CHARS = 28
RANK_ENV_VALUE_CHARS = 64


def sample_commands(widths: Widths) -> dict[str, tuple[str, schemas.Command]]:
    """Target and command of each kind a restart sends every node (the bulk of GP_CMDS)."""
    job, node, rank = widths.job, widths.node, widths.rank
    env = {
        f"GOODPUT_{i:0{RANK_ENV_KEY_CHARS - 8}d}": "v" * RANK_ENV_VALUE_CHARS
        for i in range(RANK_ENV_VARIABLES)
    }
    argv = ["python", "-m", "train", "--config", f"/configs/{job}.yaml"]
    common = _CommandCommon(job=job, ts=2**62, decision_id=schemas.new_id(), reason="r" * 64)
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
            for local in range(widths.ranks_per_node)
        ],
    )
    signal = schemas.SignalRanks(
        **common,
        node=node,
        attempt=1000,
        signal="term",
        ranks=[rank] * widths.ranks_per_node,
        expected_reason="restart",
    )
    standbys = schemas.KeepStandbys(
        **common,
        node=node,
        run_id=schemas.new_id(),
        count=widths.ranks_per_node,
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


def kv_bytes(bucket: str, key: str, value: bytes) -> int:
    """A KV record: a message on ``$KV.<bucket>.<key>`` (a put carries no headers)."""
    return RECORD_OVERHEAD + len(f"$KV.{bucket}.{key}") + len(value)


def record_bytes(widths: Widths) -> dict[str, int]:
    """What one KV record of each schema-defined kind takes: a service's health record, a
    node agent's record, and a command's result with its claim in ``gp_done``."""
    job, node, rank = widths.job, widths.node, widths.rank
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
        gpus=list(range(widths.ranks_per_node)),
        free_ports=[65535] * 8,
        run_id=schemas.new_id(),
        ranks=[
            schemas.AgentRank(rank=rank, local_rank=local, attempt=1000, pid=2**22)
            for local in range(widths.ranks_per_node)
        ],
        standbys=[2**22] * widths.ranks_per_node,
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
    return {
        "service_health": kv_bytes(
            subjects.SERVICES_BUCKET, subjects.kv_key(job, health.instance), schemas.encode(health)
        ),
        "agent_record": kv_bytes(
            subjects.AGENTS_BUCKET, subjects.kv_key(job, node), schemas.encode(agent)
        ),
        "command_done": kv_bytes(subjects.DONE_BUCKET, done_key, schemas.encode(result))
        + kv_bytes(subjects.DONE_BUCKET, done_key + ".claim", schemas.encode(claim)),
    }
