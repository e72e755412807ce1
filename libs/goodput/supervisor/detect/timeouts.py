"""How long the detector waits for each rank and node: learnt intervals with floors (pure)."""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.detect.records import NodeRecord, RankRecord
from goodput.supervisor.detect.thresholds import Thresholds

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
    """Time (ns) without step progress after which a heartbeating rank is hung: a margin over
    a high quantile of its own recent intervals, once it has enough of them to trust."""
    timeout = max(t.hang_min_timeout_s * NS, t.hang_safety_factor * rank.step_gap_ns)
    if rank.progress_seen == 0:
        timeout = max(timeout, t.first_step_timeout_s * NS)
    elif rank.step_intervals.count < t.hang_min_samples:
        # the first steps of a rank (warm-up, compilation, cold caches) say little yet
        timeout = max(timeout, t.hang_warmup_timeout_s * NS)
    return timeout


def hang_timeout_basis(rank: RankRecord, t: Thresholds) -> str:
    """What the hang timeout in force for ``rank`` was made of, for the signal's reasons."""
    learnt = t.hang_safety_factor * rank.step_gap_ns / NS
    seen = rank.step_intervals.count
    quantile = (
        f"{t.hang_safety_factor:g} × p{t.hang_quantile * 100:g} {rank.step_gap_ns / NS:.2f} s"
    )
    if rank.progress_seen == 0:
        return f"first-step allowance {t.first_step_timeout_s:g} s"
    if seen < t.hang_min_samples and learnt < t.hang_warmup_timeout_s:
        return f"warm-up floor {t.hang_warmup_timeout_s:g} s, {seen} of {t.hang_min_samples} intervals seen"
    if learnt < t.hang_min_timeout_s:
        return f"floor {t.hang_min_timeout_s:g} s; {quantile} of its last {seen} intervals is less"
    return f"{quantile} of its last {seen} intervals"


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
