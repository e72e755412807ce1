"""Node agents' records in ``gp_agents`` (``schemas.AgentRecord`` at ``<job>.<node>``).

An entry lapses :data:`~goodput.subjects.AGENT_TTL_S` after its last refresh, so "present"
means a live agent holds the node name. A starting agent *creates* its key — the server
refuses a create over a live entry, so two agents can never both hold a name — and then
refreshes it (``put``) every second and on every change of its ranks.
"""

from __future__ import annotations

import nats.js.errors
from nats.js.kv import KeyValue

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.kv_scan import current_entries


class NodeHeld(RuntimeError):
    """The node name is held by a live agent; the message says which."""


def agent_key(job: str, node: str) -> str:
    return subjects.kv_key(job, node)


async def bucket(bus: Bus) -> KeyValue:
    return await bus.kv(subjects.AGENTS_BUCKET)


async def claim(bus: Bus, record: schemas.AgentRecord) -> None:
    """Take the node name for ``record``'s agent, or raise :class:`NodeHeld`."""
    kv = await bucket(bus)
    key = agent_key(record.job, record.node)
    try:
        await kv.create(key, schemas.encode(record))
    except nats.js.errors.KeyWrongLastSequenceError:
        holder = await read(bus, record.job, record.node)
        who = (
            f"agent pid {holder.pid} at {holder.address}" if holder is not None else "another agent"
        )
        raise NodeHeld(
            f"node {record.node} of job {record.job} is held by a live {who}; stop it, or "
            f"wait {subjects.AGENT_TTL_S:g} s after it died, or pick another --node"
        ) from None


async def refresh(bus: Bus, record: schemas.AgentRecord) -> None:
    kv = await bucket(bus)
    await kv.put(agent_key(record.job, record.node), schemas.encode(record))


async def release(bus: Bus, job: str, node: str) -> None:
    """A stopping agent frees its name at once (a killed one: after the lapse)."""
    kv = await bucket(bus)
    await kv.delete(agent_key(job, node))


async def read(bus: Bus, job: str, node: str) -> schemas.AgentRecord | None:
    kv = await bucket(bus)
    try:
        entry = await kv.get(agent_key(job, node))
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None
    return decode(entry.value)


def decode(value: bytes | None) -> schemas.AgentRecord | None:
    """A record, or None for a deleted entry or one that does not decode (logged by none:
    a record another build wrote is not this build's agent)."""
    if not value:
        return None
    try:
        return schemas.decode_agent(value)
    except schemas.SchemaError:
        return None


async def live_agents(bus: Bus, job: str) -> dict[str, schemas.AgentRecord]:
    """Every live agent of ``job`` by node name, read in one complete pass."""
    entries = await current_entries(bus, subjects.AGENTS_BUCKET, f"{job}.*")
    agents: dict[str, schemas.AgentRecord] = {}
    for key, value in entries.items():
        record = decode(value)
        # a record stored under another node's key is forged or misfiled: not that node's agent
        if record is not None and key == agent_key(job, record.node) and record.job == job:
            agents[record.node] = record
    return agents
