"""What the detector knows of one run of the job: its ranks and nodes, the deadlines armed for
them, and the job's progress clock, with the bookkeeping the event handlers share.

A new run (``RunStarted``) replaces the whole state: attempts count from 1 again, so nothing
of the old run's ranks may carry over.
"""

from __future__ import annotations

from goodput.supervisor.detect.deadlines import DeadlineQueue
from goodput.supervisor.detect.records import NodeRecord, RankRecord
from goodput.supervisor.detect.straggler import StragglerTracker
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.supervisor.detect.timeouts import (
    NS,
    hang_deadline,
    heartbeat_deadline,
    missing_deadline,
)


class RunState:
    """Ranks, nodes, armed deadlines and job progress of one run (owned by one Detector)."""

    def __init__(self, thresholds: Thresholds):
        self.ranks: dict[int, RankRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.heartbeat_deadlines: DeadlineQueue[int] = DeadlineQueue()
        self.hang_deadlines: DeadlineQueue[int] = DeadlineQueue()
        self.missing_deadlines: DeadlineQueue[str] = DeadlineQueue()
        self.stragglers = StragglerTracker(
            thresholds.straggler_ratio, thresholds.straggler_window, thresholds.straggler_hold_s
        )
        self.alive_ranks = 0
        #: the newest attempt a rank started or rejoined for
        self.attempt = 0
        #: ranks started but without progress yet: the job is starting, not down
        self.starting: set[int] = set()
        self.running = False
        #: when the detector last received anything (event or heartbeat) of this job
        self.last_heard_ns = 0
        self.last_job_progress_ns = 0
        self.job_down_reported = False
        #: ranks of ``oom_attempt`` that exited out of GPU memory (rank -> node), and when the
        #: first of them did (0: no OOM report awaits its peers' exits)
        self.oom_exits: dict[int, str] = {}
        self.oom_attempt = 0
        self.oom_since_ns = 0

    def oom_deadline(self, t: Thresholds) -> int | None:
        """When the gathered OOM exits are reported (None: none gathered)."""
        return self.oom_since_ns + int(t.oom_gather_s * NS) if self.oom_since_ns else None

    def take_oom_exits(self) -> dict[int, str]:
        """The gathered OOM exits, no longer awaited."""
        exits, self.oom_exits, self.oom_since_ns = self.oom_exits, {}, 0
        return exits

    def rearm(self, thresholds: Thresholds) -> None:
        """Recompute every deadline under new thresholds."""
        self.stragglers.configure(
            thresholds.straggler_ratio, thresholds.straggler_window, thresholds.straggler_hold_s
        )
        self.heartbeat_deadlines.clear()
        self.hang_deadlines.clear()
        for rank_id, rank in self.ranks.items():
            rank.step_intervals.trim(thresholds.hang_window)
            rank.step_gap_ns = rank.step_intervals.quantile(thresholds.hang_quantile)
            if rank.alive:
                self.heartbeat_deadlines.arm(rank_id, heartbeat_deadline(rank, thresholds))
                if not rank.hang_reported:
                    self.hang_deadlines.arm(rank_id, hang_deadline(rank, thresholds))
        self.missing_deadlines.clear()
        for name, node in self.nodes.items():
            if node.missing_since_ns:
                self.missing_deadlines.arm(name, missing_deadline(node, thresholds))

    def node(self, name: str) -> NodeRecord:
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = NodeRecord()
        return node

    def adopt(self, rank_id: int, node: str, now: int) -> RankRecord:
        """A rank heard from without a start seen (the sensor (re)started while the job runs):
        taken as it is now, alive on ``node``, its heartbeat and progress clocks starting."""
        rank = self.ranks[rank_id] = RankRecord(
            node=node, last_heartbeat_ns=now, last_progress_ns=now
        )
        self.node(node).ranks.add(rank_id)
        self.alive_ranks += 1
        return rank

    def progress(self, rank_id: int, rank: RankRecord, now: int, t: Thresholds) -> None:
        if rank.progress_seen and not rank.hang_reported:
            rank.step_intervals.add(now - rank.last_progress_ns, t.hang_window)
            rank.step_gap_ns = rank.step_intervals.quantile(t.hang_quantile)
        rank.last_progress_ns = now
        if not rank.progress_seen:
            self.starting.discard(rank_id)
        rank.progress_seen += 1
        rank.hang_reported = False
        self.mark_job_progress(now)

    def end_busy(self, rank: RankRecord, now: int) -> None:
        """Leaving a checkpoint save/load: the time inside it is not a step interval."""
        rank.busy = ""
        rank.last_progress_ns = now
        self.mark_job_progress(now)

    def mark_job_progress(self, now: int) -> None:
        self.running = True
        self.last_job_progress_ns = max(self.last_job_progress_ns, now)
        self.job_down_reported = False

    def job_down_deadline(self, t: Thresholds) -> int:
        allowed = t.jobset_downtime_threshold_s
        if self.starting:
            allowed = max(allowed, t.first_step_timeout_s)
        return self.last_job_progress_ns + int(allowed * NS)
