"""Subject, stream and bucket names: the one place they are spelled.

- ``gp.<job>.evt.<kind>``            facts, stream GP_EVENTS (replayed by the goodput calculator)
- ``gp.<job>.cmd.<target>``          commands, stream GP_CMDS, durable consumers, acked after execution
- ``gp.<job>.hb.<node>.<rank>``      heartbeats, core NATS (high rate, not stored)
- ``gp.<job>.dlq.<service>``         input a service could not decode, stream GP_DLQ
- ``gp.<job>.standby.<name>``        a pod standby's assignment, core NATS request/reply
"""

from __future__ import annotations

import re

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

#: command targets
ACTUATOR = "actuator"
CONTROLLER = "controller"
SENSOR = "sensor"
TRAINER = "trainer"
HOST_MONITOR = "hostmon"
AGENT = "agent"
REPLICATOR = "replicator"

#: the job a command, service or rank serves when none is named
DEFAULT_JOB = "default"

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def check_token(value: str, what: str = "name") -> str:
    """Job, node and service names become subject tokens: no dots, spaces or wildcards."""
    if not _TOKEN.match(value):
        raise ValueError(
            f"invalid {what} {value!r}: use letters, digits, '-' and '_' only (it is a NATS subject token)"
        )
    return value


def node_target(service: str, node: str) -> str:
    """Command target of a per-node service instance (host monitor, checkpoint tier)."""
    return f"{service}-{node}"


def event(job: str, kind: str) -> str:
    return f"gp.{job}.evt.{kind}"


def event_for(message: schemas.Event) -> str:
    return event(message.job, schemas.kind_of(type(message)))


def events_of(job: str) -> str:
    return f"gp.{job}.evt.>"


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


def health_keys_of(job: str) -> str:
    """Every health record of ``job`` (a KV key filter)."""
    return f"{job}.>"
