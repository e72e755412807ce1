"""What a deadline that came due means: a missed heartbeat (one rank's, or its node lost), a
hang (blamed on the rank furthest behind), a process gone without an exit report, or the job
down. Each check re-reads the records, re-arms a deadline that moved, and hands what it found
to the incidents, which decide whether it becomes a signal.
"""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.detect.incidents import Incidents
from goodput.supervisor.detect.records import RankRecord
from goodput.supervisor.detect.run_state import RunState
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.supervisor.detect.timeouts import (
    NS,
    hang_deadline,
    hang_timeout_basis,
    heartbeat_deadline,
    heartbeat_timeout,
)

#: the fault a node lost to silence keeps until its host monitor reports healthy again
LOST_NODE = "node lost (no heartbeat, no host report)"


def check_heartbeat(
    run: RunState, incidents: Incidents, t: Thresholds, rank_id: int, now: int
) -> list[schemas.Signal]:
    rank = run.ranks[rank_id]
    if not rank.alive:
        return []
    deadline = heartbeat_deadline(rank, t)
    if now < deadline:
        run.heartbeat_deadlines.arm(rank_id, deadline)
        return []
    node = run.nodes[rank.node]
    floor_ns = t.heartbeat_timeout_s * NS / 2
    alive = [run.ranks[r] for r in node.ranks if run.ranks[r].alive]
    silent = [r for r in alive if now - r.last_heartbeat_ns >= floor_ns]
    silent_s = (now - rank.last_heartbeat_ns) / NS
    # the host's reports judged as its ranks' heartbeats are (``floor_ns``): a host monitor
    # killed with its ranks may have sent its last report after their last heartbeat, so
    # "within the whole timeout" would still hold when the deadline comes, and a lost node
    # would be judged one silent rank on a reporting host (a restart its node cannot run)
    host_reports = node.last_health_ns > 0 and now - node.last_health_ns < floor_ns
    if len(silent) == len(alive) and not host_reports:
        # remembered as the node's fault, so its host reporting healthy again returns it
        node.faults = (LOST_NODE,)
        return incidents.failure(
            "missed_heartbeat",
            rank.node,
            None,
            "uncorrectable",
            f"all {len(alive)} rank(s) of {rank.node} silent and no host report: "
            f"node lost ({silent_s:.1f} s)",
            observed_ns=max(r.last_heartbeat_ns for r in alive),
            now=now,
        )
    return incidents.failure(
        "missed_heartbeat",
        rank.node,
        rank_id,
        "correctable",
        f"rank {rank_id} on {rank.node} silent for {silent_s:.1f} s "
        f"({len(silent)} of {len(alive)} ranks of the node silent"
        + (", its host still reports)" if host_reports else ")"),
        observed_ns=rank.last_heartbeat_ns,
        now=now,
    )


def check_hang(
    run: RunState, incidents: Incidents, t: Thresholds, rank_id: int, now: int
) -> list[schemas.Signal]:
    rank = run.ranks[rank_id]
    if not rank.alive or rank.hang_reported:
        return []
    deadline = hang_deadline(rank, t)
    if now < deadline:
        run.hang_deadlines.arm(rank_id, deadline)
        return []
    if now - rank.last_heartbeat_ns >= heartbeat_timeout(rank, t):
        return []  # silent altogether: a missed heartbeat, reported by that check
    poll_ns = int(t.heartbeat_polling_period_s * NS)
    if now - run.last_heard_ns > max(2 * poll_ns, 1.5 * rank.heartbeat_gap_ns):
        # nothing at all arrived for a while, though ranks heartbeat: the sensor itself may
        # have stalled (a loaded host, a bus hiccup) with their progress queued unread; a hang
        # timeout of a second or two must not read that as the rank's. Look again once the
        # queue is read (a hang keeps its peers' heartbeats coming)
        run.hang_deadlines.arm(rank_id, now + poll_ns)
        return []
    quiet = quiet_rank_deadline(run, t, now)
    if quiet is not None:
        # a rank frozen whole (SIGSTOP, a process wedged with its heartbeat thread) looks hung,
        # and makes every rank waiting on it look hung, before it looks silent; the laggard
        # rule would then blame a waiting rank. Its missed heartbeat decides first, and this
        # stall is that incident's collateral
        run.hang_deadlines.arm(rank_id, quiet)
        return []
    rank.hang_reported = True
    waiting = ""
    behind = laggard(run, rank)
    if behind is not None:
        # in synchronous training the ranks that finished a step wait in the next
        # collective for the one that did not: that one hangs, the others only wait. The
        # deadline that came due is the waiting rank's: its wait is what crossed a timeout
        # (the laggard's own quiet can still be under its own, when it last reported later)
        waited_s = (now - rank.last_progress_ns) / NS
        waiting = (
            f"; rank {rank_id} on {rank.node} finished step {rank.done_step} and has waited "
            f"{waited_s:.1f} s for it (timeout {(deadline - rank.last_progress_ns) / NS:.1f} s)"
        )
        rank_id, rank = behind, run.ranks[behind]
        rank.hang_reported = True
        run.hang_deadlines.disarm(rank_id)
        deadline = hang_deadline(rank, t)
    if rank.busy:
        stuck_s = (now - rank.busy_since_ns) / NS
        allowed = t.exit_timeout_s if rank.busy == schemas.BUSY_EXITING else t.checkpoint_timeout_s
        detail = (
            f"rank {rank_id} on {rank.node} stuck in {rank.busy} for {stuck_s:.1f} s "
            f"(allowed {allowed:g} s)"
        )
        observed = rank.busy_since_ns
    else:
        stuck_s = (now - rank.last_progress_ns) / NS
        timeout_s = (deadline - rank.last_progress_ns) / NS
        detail = (
            f"rank {rank_id} on {rank.node} heartbeats but made no progress past step "
            f"{max(rank.done_step, rank.heartbeat_step or 0)} for {stuck_s:.1f} s "
            f"(timeout {timeout_s:.1f} s: {hang_timeout_basis(rank, t)})"
        )
        observed = rank.last_progress_ns
    return incidents.failure(
        "hang",
        rank.node,
        rank_id,
        "correctable",
        detail + waiting,
        observed_ns=observed,
        now=now,
    )


def quiet_rank_deadline(run: RunState, t: Thresholds, now: int) -> int | None:
    """The earliest heartbeat deadline still ahead of a live rank whose heartbeats are late
    (silent past two of its own gaps and two polling periods), if any. A rank not
    heartbeating yet (starting) is not late: it has its own allowance."""
    poll_ns = t.heartbeat_polling_period_s * NS
    pending = [
        deadline
        for other in run.ranks.values()
        if other.alive
        and other.heartbeat_step is not None
        and now - other.last_heartbeat_ns > 2 * max(other.heartbeat_gap_ns, poll_ns)
        and (deadline := heartbeat_deadline(other, t)) > now
    ]
    return min(pending) if pending else None


def laggard(run: RunState, rank: RankRecord) -> int | None:
    """The live rank furthest behind ``rank`` in finished steps, if one is behind it."""
    behind = [
        (other.done_step, rank_id)
        for rank_id, other in run.ranks.items()
        if other.alive and not other.hang_reported and other.done_step < rank.done_step
    ]
    return min(behind)[1] if behind else None


def check_missing(
    run: RunState, incidents: Incidents, node_name: str, now: int
) -> list[schemas.Signal]:
    node = run.nodes[node_name]
    if not node.missing_since_ns:
        return []
    gone_s = (now - node.missing_since_ns) / NS
    detail = f"{node.missing_detail}; no exit report for {gone_s:.1f} s"
    return incidents.failure(
        "crash",
        node_name,
        None,
        "correctable",
        detail,
        observed_ns=node.missing_since_ns,
        now=now,
    )


def check_job_down(
    run: RunState, incidents: Incidents, t: Thresholds, now: int
) -> list[schemas.Signal]:
    """The job should be running, but no rank made progress within its allowance: once."""
    if not run.running or run.job_down_reported or now < run.job_down_deadline(t):
        return []
    run.job_down_reported = True
    silent_s = (now - run.last_job_progress_ns) / NS
    return [
        incidents.signal(
            "job_down",
            "",
            None,
            "uncorrectable",
            f"no rank made progress for {silent_s:.1f} s "
            f"(jobset_downtime_threshold_s={t.jobset_downtime_threshold_s})",
            observed_ns=run.last_job_progress_ns,
            now=now,
        )
    ]
