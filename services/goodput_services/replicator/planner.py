"""The replicator's decisions: what to push to which peer, when to back up, what to index.

Pure functions: the index snapshot, what this node holds, what the replicator remembers and
the time (monotonic seconds) come in; actions with the reason for each come out. The
service (:mod:`goodput_services.replicator.service`) only carries them out and records the
results in its :class:`Memory`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from goodput.checkpoint.index.index import IndexSnapshot
from goodput.checkpoint.index.records import CopyRecord
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, TIERS
from goodput_services.replicator.options import ReplicatorOptions
from goodput_services.replicator.topology import choose_peers, reachable


@dataclass
class Memory:
    """What the replicator remembers between rounds (times are monotonic seconds)."""

    #: recent pushes (step, peer) -> when; counted as copies until the holder has indexed
    #: them (or withdrawn them: a copy that later fails its scrub is then replicated again)
    pushed: dict[tuple[int, str], float] = field(default_factory=dict)
    #: peer -> until when it is not chosen again after a failed push
    cooldown_until: dict[str, float] = field(default_factory=dict)
    #: (step, when) of this node's last backup known to this process
    last_backup: tuple[int, float] | None = None
    #: no backup attempt before this time (after a failed one)
    backup_retry_at: float = 0.0
    #: every step this node has seen on its own volume
    local_steps_seen: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Held:
    """This node's newest own checkpoint, and since when (monotonic) it has been on disk."""

    node: str
    newest_own: CopyRecord | None
    first_seen: float = 0.0


@dataclass(frozen=True)
class Push:
    step: int
    peer: str
    reason: str


@dataclass(frozen=True)
class BackUp:
    step: int
    reason: str


@dataclass(frozen=True)
class Wait:
    """Nothing to do for ``what`` now, and why (for logs and tests)."""

    what: str
    reason: str


Action = Push | BackUp | Wait


def index_lag_s(options: ReplicatorOptions) -> float:
    """How long a holder may take to hash and index a copy it just received."""
    return max(5.0, 5 * options.poll_s)


def identical_holders(snapshot: IndexSnapshot, mine: CopyRecord) -> set[str]:
    """Live nodes whose own checkpoint of this step has exactly our files (for a part: the
    same part of the same commit; no other part is ever identical)."""
    return {
        c.holder
        for c in snapshot.copies
        if c.tier == LOCAL and c.step == mine.step and c.same_data(mine)
    }


def plan_replication(
    snapshot: IndexSnapshot,
    held: Held,
    now: float,
    options: ReplicatorOptions,
    memory: Memory,
) -> list[Push] | Wait:
    """Which peers get the newest own checkpoint now (a close and a distant one first)."""
    mine = held.newest_own
    me = snapshot.nodes.get(held.node)
    if mine is None or me is None:
        return Wait("replicate", "no own checkpoint indexed yet")
    live = {n.node for n in snapshot.live_nodes()}
    done = {
        c.holder
        for c in snapshot.copies
        if c.tier == PEER and c.owner == held.node and c.step == mine.step
    } | {
        peer
        for (step, peer), at in memory.pushed.items()
        if step == mine.step and now - at < index_lag_s(options)
    }
    done &= live
    missing = options.replicas - len(done)
    if missing <= 0:
        return Wait("replicate", f"step {mine.step} has {len(done)} peer copies")
    candidates = [
        n
        for n in snapshot.live_nodes()
        if n.node not in done and memory.cooldown_until.get(n.node, 0.0) <= now and reachable(me, n)
    ]
    # peers that already hold these exact files (their own checkpoint, or a copy of an
    # identical node's): replicating to them is verification, not transfer
    identical = {
        c.holder
        for c in snapshot.copies
        if TIERS[c.tier].on_node and c.step == mine.step and c.same_data(mine)
    } - {held.node}
    chosen = choose_peers(
        me, candidates, identical=identical, count=missing, block_label=options.block_label
    )
    if not chosen:
        return Wait("replicate", f"step {mine.step}: no live peer to push to")
    # Give peers with identical shards time to commit theirs (then no byte moves); of
    # nodes with identical data, the lowest-named sends first and the others wait longer,
    # so a peer that needs a real copy receives it once and links it for the rest.
    # A part has no identical data on other nodes (it holds other ranks' shards): no wait.
    leader = min(identical_holders(snapshot, mine) | {held.node}) == held.node
    patience = 0.0 if mine.is_part else options.dedup_wait_s * (1 if leader else 2)
    if now - held.first_seen < patience and not set(chosen) <= identical:
        return Wait("replicate", f"step {mine.step}: waiting for peers with identical data")
    return [
        Push(
            mine.step,
            peer,
            "holds identical data: verify and link" if peer in identical else "needs a copy",
        )
        for peer in chosen
    ]


def recall_last_backup(
    snapshot: IndexSnapshot, node: str, now: float, memory: Memory
) -> tuple[int, float] | None:
    """The last backup to count from: remembered, or (after a restart) the newest indexed."""
    if memory.last_backup is not None:
        return memory.last_backup
    ours = [c.step for c in snapshot.all_copies if c.tier == OBJECT_STORE and c.owner == node]
    return (max(ours), now) if ours else None


def _backup_due(
    mine: CopyRecord,
    last_backup: tuple[int, float] | None,
    now: float,
    options: ReplicatorOptions,
    memory: Memory,
) -> str | None:
    """Why ``mine`` should be backed up now, or None."""
    if last_backup is None:
        return "no backup yet"
    last_step, last_time = last_backup
    if mine.step <= last_step:
        return None
    since = len([s for s in memory.local_steps_seen if s > last_step])
    if since >= options.backup_every:
        return f"{since} checkpoints since the last backup"
    if now - last_time >= options.backup_interval_s:
        return f"{now - last_time:.0f} s since the last backup"
    return None


def _should_wait_for_leader(
    snapshot: IndexSnapshot, held: Held, mine: CopyRecord, now: float, options: ReplicatorOptions
) -> bool:
    """Nodes with identical data back up after the lowest-named of them (the leader) has
    stored the shards, so each unique shard is uploaded once. Lower-named live nodes that
    have not indexed this step yet may still turn out identical: they are waited for too,
    at most ``backup_wait_s``. A part of a checkpoint sharded across nodes has no identical
    data elsewhere (each part holds other ranks' shards): it never waits."""
    if mine.is_part or now - held.first_seen >= options.backup_wait_s:
        return False
    if any(
        c.tier == OBJECT_STORE and c.step == mine.step and c.same_data(mine)
        for c in snapshot.all_copies
    ):
        return False
    leader = min(identical_holders(snapshot, mine) | {held.node})
    indexed = {c.holder for c in snapshot.copies if c.tier == LOCAL and c.step == mine.step}
    undecided = [n.node for n in snapshot.live_nodes() if n.node not in indexed]
    return leader != held.node or any(n < held.node for n in undecided)


def plan_backup(
    snapshot: IndexSnapshot,
    held: Held,
    now: float,
    options: ReplicatorOptions,
    memory: Memory,
) -> BackUp | Wait:
    """Whether to back up the newest own checkpoint now: every ``backup_every`` checkpoints
    or ``backup_interval_s``, after the leader of an identical-data group."""
    mine = held.newest_own
    if mine is None:
        return Wait("back up", "no own checkpoint indexed yet")
    if now < memory.backup_retry_at:
        return Wait("back up", "retrying later after a failed backup")
    last_backup = recall_last_backup(snapshot, held.node, now, memory)
    why = _backup_due(mine, last_backup, now, options, memory)
    if why is None:
        return Wait("back up", f"step {mine.step} is not due")
    if _should_wait_for_leader(snapshot, held, mine, now, options):
        return Wait("back up", f"step {mine.step}: the identical-data group's leader goes first")
    return BackUp(mine.step, why)


def plan(
    snapshot: IndexSnapshot,
    held: Held,
    now: float,
    options: ReplicatorOptions,
    memory: Memory,
) -> list[Action]:
    """Every decision for one snapshot: pushes (or why not) and a backup (or why not)."""
    replication = plan_replication(snapshot, held, now, options, memory)
    actions: list[Action] = list(replication) if isinstance(replication, list) else [replication]
    actions.append(plan_backup(snapshot, held, now, options, memory))
    return actions


def plan_index_sync(
    held: dict[str, CopyRecord], indexed: dict[str, CopyRecord]
) -> tuple[list[CopyRecord], list[CopyRecord]]:
    """(records to put, records to delete) so the index shows exactly the verified copies
    this node holds (keys: index keys)."""
    puts = [r for key, r in held.items() if key not in indexed or indexed[key].files != r.files]
    deletes = [r for key, r in indexed.items() if key not in held]
    return puts, deletes


def sweeps_store(snapshot: IndexSnapshot, node: str) -> bool:
    """One sweeper for the shared object store: the lowest-named live node."""
    live = [n.node for n in snapshot.live_nodes()]
    return bool(live) and min(live) == node
