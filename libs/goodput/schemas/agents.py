"""A node agent's record: what ``goodput agent`` announces about its host in ``gp_agents``.

Stored (never published as an event) at ``<job>.<node>`` in a KV bucket whose entries lapse
(:data:`goodput.subjects.AGENT_TTL_S`): the agent refreshes it every second and on every
change of its ranks, so a record that is present says a live agent holds the node name, and
one that lapsed says the agent (or its host) is gone.
"""

from __future__ import annotations

import msgspec

from goodput.schemas.envelope import EpochNs, Message, Token, TokenOrEmpty


class AgentRank(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rank process the agent started, running or exited (the current run's)."""

    rank: int
    local_rank: int
    attempt: int
    pid: int
    #: None while it runs
    exit_code: int | None = None
    signal: int | None = None
    running: bool = True


class AgentRecord(Message, tag="agent_record", kw_only=True):
    node: Token
    #: the address other hosts reach this one at (a rendezvous there is never loopback)
    address: str
    #: the agent process (on its host) and this start of it
    pid: int
    instance: str
    started_ts: EpochNs
    #: the agent's state directory on its host: the node's checkpoint volume is under it
    state_dir: str
    #: GPU indexes this host exposes to its ranks
    gpus: list[int] = msgspec.field(default_factory=list)
    #: TCP ports free on the host when the record was written: the next rendezvous binds one
    #: (the actuator takes one no earlier attempt of the run used)
    free_ports: list[int] = msgspec.field(default_factory=list)
    #: the run its ranks belong to (``StartJob.run_id``; "" before the first launch)
    run_id: TokenOrEmpty = ""
    ranks: list[AgentRank] = msgspec.field(default_factory=list)
    #: pids of the ready standby ranks it keeps for the run (``KeepStandbys``; schema 8)
    standbys: list[int] = msgspec.field(default_factory=list)
