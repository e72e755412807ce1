"""Subject, stream and bucket names: the one place they are spelled.

- ``gp.<job>.evt.<kind>``            facts, stream GP_EVENTS (replayed by the goodput calculator)
- ``gp.<job>.evt.<kind>.<rank>``     the facts every rank reports per step or checkpoint
                                     (``RANKED_KINDS``), so a consumer filters to one rank's;
                                     a node's rolled-up steps under its first rank's
- ``gp.<job>.cmd.<target>``          commands, stream GP_CMDS, durable consumers, acked after execution
- ``gp.<job>.hb.<node>.<rank>``      heartbeats, core NATS (high rate, not stored)
- ``gp.<job>.dlq.<service>``         input a service could not decode, stream GP_DLQ
- ``gp.<job>.standby.<name>``        a pod standby's assignment, core NATS request/reply
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from goodput import schemas

EVENTS_STREAM = "GP_EVENTS"
COMMANDS_STREAM = "GP_CMDS"
DEAD_LETTER_STREAM = "GP_DLQ"

EVENTS_WILDCARD = "gp.*.evt.>"
COMMANDS_WILDCARD = "gp.*.cmd.>"
DEAD_LETTER_WILDCARD = "gp.*.dlq.>"

#: KV buckets (keys inside are prefixed with the job name)
SERVICES_BUCKET = "gp_services"  # service health records
STATE_BUCKET = "gp_state"  # job membership and controller state
CKPT_INDEX_BUCKET = "gp_ckpt_index"  # which checkpoint shard lives where
LEASES_BUCKET = "gp_leases"  # leader leases (short TTL)
DONE_BUCKET = "gp_done"  # ids of commands already executed, per executor
AGENTS_BUCKET = "gp_agents"  # node agents' records (schemas.AgentRecord), lapsing

#: a node agent's record lapses this long after its last refresh (it refreshes every second):
#: then the node name is free again, and the agent believed gone
AGENT_TTL_S = 5.0

#: command targets: the executors' (``schemas.Executor``, which a command declares)
ACTUATOR: schemas.Executor = "actuator"
SENSOR: schemas.Executor = "sensor"
TRAINER: schemas.Executor = "trainer"
HOST_MONITOR: schemas.Executor = "hostmon"
AGENT: schemas.Executor = "agent"
REPLICATOR: schemas.Executor = "replicator"
if {ACTUATOR, SENSOR, TRAINER, HOST_MONITOR, AGENT, REPLICATOR} != schemas.EXECUTORS:
    raise AssertionError("an executor of schemas.Executor has no command target here")

#: the job a command, service or rank serves when none is named
DEFAULT_JOB = "default"


def check_token(value: str, what: str = "name") -> str:
    """Job, node and service names become subject tokens: no dots, spaces or wildcards
    (the rule is ``schemas.TOKEN_PATTERN``, which decoding applies to messages' names)."""
    if not schemas.TOKEN_RE.match(value):
        raise ValueError(
            f"invalid {what} {value!r}: use letters, digits, '-' and '_' only (it is a NATS subject token)"
        )
    return value


def node_target(service: str, node: str) -> str:
    """Command target of a per-node service instance (host monitor, checkpoint tier)."""
    return f"{service}-{node}"


def command_target(command: schemas.Command) -> str:
    """Where ``command`` goes (``command(job, target)``): to its executor, which it declares
    (``Command.executor``); to the instance on the node it names for a per-node one."""
    executor = command.executor
    if executor not in schemas.PER_NODE_EXECUTORS:
        return executor
    node = getattr(command, "node", "")
    if not node:
        raise ValueError(f"{schemas.kind_of(type(command))} to a {executor} names no node")
    return node_target(executor, node)


#: the events every rank reports, many times a run: their subject names the rank, so a
#: consumer that needs one rank's (the controller: rank 0's) has the server filter the rest out.
#: A node's rollup (``StepsDone``) names the rank that sent it, its first: rank 0's steps are
#: in rank 0's rollup, or in its own ``StepDone``
RANKED_EVENTS = (
    schemas.StepDone,
    schemas.StepsDone,
    schemas.CheckpointSaved,
    schemas.CheckpointPersisted,
)
RANKED_KINDS = frozenset(schemas.kind_of(t) for t in RANKED_EVENTS)


def event(job: str, kind: str, rank: int | None = None) -> str:
    """Where ``kind`` events of ``job`` are published; of a ranked kind, ``rank``'s. Without a
    rank, a ranked kind's subject is the one used before ranks were named, which stored
    history still holds (GP_EVENTS keeps 14 days): readers of every rank take
    ``events_of_kind``."""
    if rank is None or kind not in RANKED_KINDS:
        return f"gp.{job}.evt.{kind}"
    return f"gp.{job}.evt.{kind}.{rank}"


def event_for(message: schemas.Event) -> str:
    rank = message.rank if isinstance(message, RANKED_EVENTS) else None
    return event(message.job, schemas.kind_of(type(message)), rank)


def events_of(job: str) -> str:
    return f"gp.{job}.evt.>"


def events_of_kind(job: str, kind: str) -> tuple[str, ...]:
    """Subject filters for every ``kind`` event of ``job``: of a ranked kind, every rank's and
    those stored before ranks were named."""
    if kind in RANKED_KINDS:
        return (f"gp.{job}.evt.{kind}.*", event(job, kind))
    return (event(job, kind),)


def events_read(job: str, reads: Mapping[str, int | None]) -> list[str]:
    """Subject filters for a consumer reading ``reads`` of ``job``: each kind it reads, mapped
    to the one rank it needs of a ranked kind (None: every rank). Non-overlapping, as a
    JetStream consumer's ``filter_subjects`` must be; the form stored before ranks were
    named is included, so its reader still checks the rank of what it gets."""
    filters: list[str] = []
    for kind, rank in sorted(reads.items()):
        if rank is None or kind not in RANKED_KINDS:
            filters.extend(events_of_kind(job, kind))
        else:
            filters.extend((event(job, kind, rank), event(job, kind)))
    return filters


def command(job: str, target: str) -> str:
    return f"gp.{job}.cmd.{target}"


def standby(job: str, name: str) -> str:
    """Where the pod standby ``name`` takes its assignment (``goodput.launch.standby_channel``)."""
    return f"gp.{job}.standby.{name}"


def heartbeat(job: str, node: str, rank: int) -> str:
    return f"gp.{job}.hb.{node}.{rank}"


def heartbeats_of(job: str) -> str:
    return f"gp.{job}.hb.>"


def dead_letter(job: str, service: str) -> str:
    return f"gp.{job}.dlq.{service}"


def kv_key(job: str, *parts: str) -> str:
    return ".".join((job, *parts))


def health_key(job: str, service: str, node: str, instance: str) -> str:
    """A service replica's health record in SERVICES_BUCKET: ``<job>.<service>[.<node>].<id>``,
    one per process (two controller replicas once wrote one key, so each hid the other)."""
    token = re.sub(r"[^A-Za-z0-9_-]", "_", instance) or "_"
    return kv_key(job, service, *([node] if node else []), token)


def health_keys_of(job: str, service: str = "", node: str = "") -> str:
    """Every health record of ``job`` (of one ``service``, and ``node``, if named): a KV key
    filter. A central service's and a per-node service's names differ, so no filter mixes them."""
    return ".".join((job, *([service] if service else []), *([node] if node else []), ">"))


def mismatch(subject: str, message: schemas.Message) -> str:
    """Why ``message`` cannot have come on ``subject`` (``""``: it can).

    Subscriptions filter by subject, and handlers trust the message's fields: a message whose
    job (or, on an event or heartbeat subject, whose kind, node or rank) differs from its
    subject's would be acted on for a job or node it was not routed as. String compares only:
    this runs for every message, heartbeats included.
    """
    prefix = f"gp.{message.job}."
    if not subject.startswith(prefix):
        return f"job {message.job!r} is not the job of its subject {subject}"
    rest = subject[len(prefix) :]
    if rest.startswith("evt.") and isinstance(message, schemas.Event):
        expected = event_for(message)
        if isinstance(message, RANKED_EVENTS) and subject == event(
            message.job, schemas.kind_of(type(message))
        ):
            return ""
    elif rest.startswith("hb.") and isinstance(message, schemas.Heartbeat):
        expected = heartbeat(message.job, message.node, message.rank)
    else:
        return ""
    if subject != expected:
        return f"a {schemas.kind_of(type(message))} message belongs on {expected}, not {subject}"
    return ""
