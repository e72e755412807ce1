"""What the bus stores and how much of it: the JetStream streams and KV buckets every
service provisions (:meth:`goodput.bus.client.Bus.provision`), each with its byte limit from
:mod:`goodput.bus.store_sizing`. One owner for the layout, read by the client, the tests and
the benchmarks."""

from __future__ import annotations

from nats.js.api import DiscardPolicy, KeyValueConfig, StorageType, StreamConfig

from goodput import subjects
from goodput.bus.store_sizing import DONE_TTL_S, StoreLimits

DAY_S = 24 * 3600.0


def stream_configs(limits: StoreLimits) -> tuple[StreamConfig, ...]:
    """The streams, each with its byte limit; past it the oldest messages are discarded (a
    full stream refusing new ones would stop the control plane: ``store_sizing`` keeps the
    history recovery and `goodput report` need under the limit)."""
    bytes_of = limits.streams
    return (
        StreamConfig(
            name=subjects.EVENTS_STREAM,
            subjects=[subjects.EVENTS_WILDCARD],
            storage=StorageType.FILE,
            max_age=14 * DAY_S,
            max_bytes=bytes_of[subjects.EVENTS_STREAM],
            discard=DiscardPolicy.OLD,
            duplicate_window=300.0,
            description="goodput facts, replayed by the goodput calculator",
        ),
        StreamConfig(
            name=subjects.COMMANDS_STREAM,
            subjects=[subjects.COMMANDS_WILDCARD],
            storage=StorageType.FILE,
            max_age=14 * DAY_S,
            max_bytes=bytes_of[subjects.COMMANDS_STREAM],
            discard=DiscardPolicy.OLD,
            # long enough to absorb retries through a server restart without a duplicate
            duplicate_window=900.0,
            # a rank reads the newest trainer command with one direct get on (re)connecting
            # (``shim.command_feed``): answered by any replica, no consumer, no API leader
            allow_direct=True,
            description="goodput commands; durable consumers ack after execution",
        ),
        StreamConfig(
            name=subjects.DEAD_LETTER_STREAM,
            subjects=[subjects.DEAD_LETTER_WILDCARD],
            storage=StorageType.FILE,
            max_age=14 * DAY_S,
            max_bytes=bytes_of[subjects.DEAD_LETTER_STREAM],
            discard=DiscardPolicy.OLD,
            description="input a goodput service could not decode, with the reason",
        ),
    )


#: buckets that drop their oldest records past their limit: ``gp_done``'s keys grow with the
#: commands executed, and a full bucket refusing a result would hold every executor at its
#: next command (a redelivery finds its result: only commands in flight redeliver, the newest)
OLDEST_DROPPED = frozenset({subjects.DONE_BUCKET})


def bucket_configs(limits: StoreLimits) -> tuple[KeyValueConfig, ...]:
    """The KV buckets, each with its byte limit. Past it JetStream refuses a write, except to
    :data:`OLDEST_DROPPED`: the others' keys are bounded by the fleet, and ``store_sizing``
    leaves twice their live records."""
    bytes_of = limits.buckets

    def bucket(name: str, history: int = 1, ttl: float | None = None) -> KeyValueConfig:
        return KeyValueConfig(
            bucket=name,
            history=history,
            ttl=ttl,
            max_bytes=bytes_of[name],
            storage=StorageType.FILE,
        )

    return (
        bucket(subjects.SERVICES_BUCKET),
        bucket(subjects.STATE_BUCKET, history=5),
        bucket(subjects.CKPT_INDEX_BUCKET),
        bucket(subjects.LEASES_BUCKET),
        bucket(subjects.AGENTS_BUCKET, ttl=subjects.AGENT_TTL_S),
        bucket(subjects.DONE_BUCKET, ttl=DONE_TTL_S),
    )
