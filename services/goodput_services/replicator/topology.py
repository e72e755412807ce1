"""Peer selection: one close peer (same block: fast, but may fail with us), one distant peer
(another block: survives a correlated failure), peers holding identical data first.

A peer that already holds the same data-parallel shards turns replication into
verification: its data plane finds the content by checksum and links it, so nothing is sent.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from goodput.checkpoint.index.records import NodeAddressRecord


def block_of(record: NodeAddressRecord, label: str) -> str:
    return record.labels.get(label, "")


def reachable(me: NodeAddressRecord, peer: NodeAddressRecord) -> bool:
    """Whether ``peer``'s announced address can name another node, as seen from ``me``.

    A record read from the bus may be stale (a replicator of an older release announced
    loopback) or forged: an address equal to mine is mine, and a loopback one names this very
    host unless I announce loopback too (one machine). Pushing there would put the "replica"
    on the node it is meant to outlive.
    """
    if (peer.host, peer.port) == (me.host, me.port):
        return False
    return not _loopback(peer.host) or _loopback(me.host)


def _loopback(host: str) -> bool:
    """By the address alone (no name lookup: the planner is pure)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def rotated(names: list[str], after: str) -> list[str]:
    """``names`` in order starting after ``after``: nodes spread their choices around the ring."""
    ordered = sorted(names)
    later = [n for n in ordered if n > after]
    return later + [n for n in ordered if n <= after]


def choose_peers(
    me: NodeAddressRecord,
    candidates: Iterable[NodeAddressRecord],
    *,
    identical: set[str],
    count: int,
    block_label: str = "block",
) -> list[str]:
    """Up to ``count`` peer names: a close one and a distant one first, when they exist."""
    others = {c.node: c for c in candidates if c.node != me.node}
    ring = rotated(list(others), me.node)
    ranked = sorted(ring, key=lambda n: (n not in identical, ring.index(n)))
    my_block = block_of(me, block_label)
    close = [n for n in ranked if block_of(others[n], block_label) == my_block]
    distant = [n for n in ranked if block_of(others[n], block_label) != my_block]
    chosen = [group[0] for group in (close, distant) if group][:count]
    chosen += [n for n in ranked if n not in chosen][: max(count - len(chosen), 0)]
    return chosen
