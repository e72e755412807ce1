"""When a node writes its address record: on change, not every poll.

Every replicator's index follower receives every node's announcement, so a record rewritten
each poll (a fresh timestamp for the TTL) cost each follower ~100 bytes x N per second and
the fleet N² — 205 kB/s into each follower, 420 MB/s in all at 2,048 nodes, for nothing new.
A node now writes its record when it starts, when what it says changes (host, port, labels,
object store, endpoint), when the index does not hold it as written (withdrawn by the
supervisor while the node lives, or overwritten by someone else), and otherwise once per
``node_ttl_s / REFRESHES_PER_TTL`` as a backstop against a node that dies unseen. The
decision is pure (clock in, reason out); the replicator's sync carries it out.
"""

from __future__ import annotations

from goodput.checkpoint.index.index import REFRESHES_PER_TTL
from goodput.checkpoint.index.records import NodeAddressRecord


def refresh_s(node_ttl_s: float) -> float:
    """How long an unchanged announcement stands before it is written again."""
    return node_ttl_s / REFRESHES_PER_TTL


def announcement_due(
    wanted: NodeAddressRecord,
    indexed: NodeAddressRecord | None,
    *,
    announced: bool,
    now_ns: int,
    node_ttl_s: float,
) -> str | None:
    """Why the node must write ``wanted`` now, or None: ``indexed`` is its record as the
    index holds it (None: absent), ``announced`` whether this process wrote it already."""
    if not announced:
        return "starting"
    if indexed is None:
        return "not in the index (withdrawn)"
    changed = [
        name
        for name in NodeAddressRecord.__struct_fields__
        if name != "ts" and getattr(indexed, name) != getattr(wanted, name)
    ]
    if changed:
        return f"changed: {', '.join(changed)}"
    age_s = (now_ns - indexed.ts) / 1e9
    if age_s < 0:
        return "timestamp ahead of this clock"
    if age_s >= refresh_s(node_ttl_s):
        return f"refresh after {age_s:.0f} s"
    return None
