"""How long the detector waits for each rank and node: learnt intervals with floors (pure)."""

from __future__ import annotations

from goodput import schemas
from goodput.detect.records import NodeRecord, RankRecord
from goodput.detect.thresholds import Thresholds

NS = 1_000_000_000


def heartbeat_timeout(rank: RankRecord, t: Thresholds) -> float:
    """Silence (ns) after which a rank has missed its heartbeat."""
    timeout = max(t.heartbeat_timeout_s * NS, t.heartbeat_safety_factor * rank.heartbeat_gap_ns)
    if rank.heartbeat_step is None:
        # started, but its heartbeat thread is not up yet (interpreter start, imports)
        timeout = max(timeout, t.first_heartbeat_timeout_s * NS)
    if rank.busy == schemas.BUSY_EXITING:
        timeout = max(timeout, t.exit_timeout_s * NS)
    return timeout


def heartbeat_deadline(rank: RankRecord, t: Thresholds) -> int:
    return rank.last_heartbeat_ns + int(heartbeat_timeout(rank, t))


def hang_timeout(rank: RankRecord, t: Thresholds) -> float:
    """Time (ns) without step progress after which a heartbeating rank is hung."""
    timeout = max(t.hang_min_timeout_s * NS, t.hang_safety_factor * rank.step_gap_ns)
    if rank.progress_seen == 0:
        timeout = max(timeout, t.first_step_timeout_s * NS)
    return timeout


def hang_deadline(rank: RankRecord, t: Thresholds) -> int:
    """When the rank is hung: leaving and checkpointing ranks get their own allowance."""
    if rank.busy == schemas.BUSY_EXITING:
        return rank.busy_since_ns + int(t.exit_timeout_s * NS)
    if rank.busy:
        return rank.busy_since_ns + int(t.checkpoint_timeout_s * NS)
    return rank.last_progress_ns + int(hang_timeout(rank, t))


def missing_deadline(node: NodeRecord, t: Thresholds) -> int:
    """When ranks the host monitor no longer counts, with no exit report, are a crash."""
    return node.missing_since_ns + int(t.pod_termination_threshold_s * NS)
