"""The failure detector: see the package docstring for what it detects and why."""

from __future__ import annotations

from signal import SIGTERM

from goodput import schemas
from goodput.detect.deadlines import DeadlineQueue
from goodput.detect.host_faults import fault_change, host_faults
from goodput.detect.records import NodeRecord, RankRecord
from goodput.detect.signals import make_signal
from goodput.detect.straggler import StragglerTracker
from goodput.detect.thresholds import Thresholds
from goodput.detect.timeouts import (
    NS,
    hang_deadline,
    hang_timeout,
    heartbeat_deadline,
    heartbeat_timeout,
    missing_deadline,
)
from goodput.rank_env import EXIT_TERMINATED

#: ``RankExited.expected_reason`` values after which nothing is expected to come back
FINISHING_REASONS = frozenset({"", "stop"})
#: the fault a node lost to silence keeps until its host monitor reports healthy again
LOST_NODE = "node lost (no heartbeat, no host report)"


class Detector:
    """One job's failure detector. Every ``on_*`` returns the signals it concludes at once."""

    def __init__(self, job: str, thresholds: Thresholds | None = None):
        self.job = job
        self._thresholds = thresholds or Thresholds()
        self._forget_run()

    def _forget_run(self) -> None:
        """Know nothing of any rank or node: the state of one run of the job."""
        self._ranks: dict[int, RankRecord] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._heartbeat_deadlines: DeadlineQueue[int] = DeadlineQueue()
        self._hang_deadlines: DeadlineQueue[int] = DeadlineQueue()
        self._missing_deadlines: DeadlineQueue[str] = DeadlineQueue()
        self._stragglers = StragglerTracker(
            self._thresholds.straggler_ratio, self._thresholds.straggler_window
        )
        self._straggler_nodes: set[str] = set()
        self._incident_open = False
        self._reported_nodes: set[str] = set()
        self._alive_ranks = 0
        #: ranks started but without progress yet: the job is starting, not down
        self._starting: set[int] = set()
        self._running = False
        self._last_job_progress_ns = 0
        self._job_down_reported = False
        self._epoch = 0

    # ---- thresholds ----------------------------------------------------------------------------

    @property
    def thresholds(self) -> Thresholds:
        return self._thresholds

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Apply new thresholds (from ``thresholds.updated``); every deadline is recomputed."""
        self._thresholds = thresholds
        self._stragglers.configure(thresholds.straggler_ratio, thresholds.straggler_window)
        self._heartbeat_deadlines.clear()
        self._hang_deadlines.clear()
        for rank_id, rank in self._ranks.items():
            if rank.alive:
                self._heartbeat_deadlines.arm(rank_id, heartbeat_deadline(rank, self._thresholds))
                if not rank.hang_reported:
                    self._hang_deadlines.arm(rank_id, hang_deadline(rank, self._thresholds))
        self._missing_deadlines.clear()
        for name, node in self._nodes.items():
            if node.missing_since_ns:
                self._missing_deadlines.arm(name, missing_deadline(node, self._thresholds))

    # ---- events --------------------------------------------------------------------------------

    def on_event(self, event: schemas.Event, now: int) -> list[schemas.Signal]:
        """Dispatch any event the sensor cares about; others are ignored."""
        match event:
            case schemas.Heartbeat():
                return self.on_heartbeat(event, now)
            case schemas.StepDone():
                return self.on_step(event, now)
            case schemas.RankStarted():
                return self.on_rank_started(event, now)
            case schemas.RankRejoined(ok=True):
                self.on_rank_rejoined(event, now)
            case schemas.RankExited():
                return self.on_rank_exited(event, now)
            case schemas.HostHealth():
                return self.on_host_health(event, now)
            case schemas.CheckpointSaved() | schemas.CheckpointRestored():
                return self.on_checkpoint(event, now)
            case schemas.RunStarted():
                # a new run counts attempts from 1 again: the old run's ranks would make its
                # first attempt look stale, and its silence look like the new run hanging
                self._forget_run()
        return []

    def on_rank_started(self, event: schemas.RankStarted, now: int) -> list[schemas.Signal]:
        rank = self._ranks.get(event.rank)
        if rank is not None and event.attempt < rank.attempt:
            return []  # a late report of an older generation
        if rank is None:
            rank = self._ranks[event.rank] = RankRecord(node=event.node, alive=False)
        elif rank.node != event.node:
            self._node(rank.node).ranks.discard(event.rank)
        if not rank.alive:
            self._alive_ranks += 1
        rank.node = event.node
        rank.attempt = event.attempt
        rank.alive = True
        rank.last_heartbeat_ns = now
        rank.last_progress_ns = now
        rank.progress_seen = 0
        rank.heartbeat_step = None
        rank.heartbeat_gap_ns = 0  # a new process: what the old one's heartbeats did is moot
        rank.done_step = -1
        rank.busy = ""
        rank.hang_reported = False
        self._starting.add(event.rank)
        node = self._node(event.node)
        node.ranks.add(event.rank)
        # a host count taken before this process existed says nothing about it
        node.missing_since_ns = 0
        self._missing_deadlines.disarm(event.node)
        self._epoch = max(self._epoch, event.attempt)
        self._incident_open = False
        self._reported_nodes.discard(event.node)
        self._straggler_nodes.discard(event.node)
        self._stragglers.forget(event.rank)
        self._mark_job_progress(now)
        self._heartbeat_deadlines.arm(event.rank, heartbeat_deadline(rank, self._thresholds))
        self._hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        return []

    def on_rank_rejoined(self, event: schemas.RankRejoined, now: int) -> None:
        """A live rank restarted in process: it begins ``event.attempt`` as a started rank
        would (its step allowance, hang watch and the incident start over), same process."""
        rank = self._ranks.get(event.rank)
        if rank is None or not rank.alive or event.attempt < rank.attempt:
            return
        rank.attempt, rank.progress_seen, rank.hang_reported = event.attempt, 0, False
        rank.last_progress_ns = rank.last_heartbeat_ns = now
        # it goes back to the restored step: its steps before say nothing about who lags now
        rank.done_step, rank.heartbeat_step = -1, None
        self._starting.add(event.rank)
        self._epoch = max(self._epoch, event.attempt)
        self._incident_open = False
        self._reported_nodes.discard(rank.node)
        self._mark_job_progress(now)
        self._heartbeat_deadlines.arm(event.rank, heartbeat_deadline(rank, self._thresholds))
        self._hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))

    def on_rank_exited(self, event: schemas.RankExited, now: int) -> list[schemas.Signal]:
        rank = self._ranks.get(event.rank)
        if rank is not None and event.attempt < rank.attempt:
            return []
        if rank is None:
            rank = self._ranks[event.rank] = RankRecord(node=event.node, alive=False)
            self._node(event.node).ranks.add(event.rank)
        elif rank.alive:
            rank.alive = False
            self._alive_ranks -= 1
        self._starting.discard(event.rank)
        self._heartbeat_deadlines.disarm(event.rank)
        self._hang_deadlines.disarm(event.rank)
        self._stragglers.forget(event.rank)
        node = self._node(event.node)
        if node.missing_since_ns:
            node.missing_since_ns = 0  # the exit report explains the missing process
            self._missing_deadlines.disarm(event.node)
        failed = event.expected_reason == "" and (event.exit_code != 0 or event.signal is not None)
        if self._alive_ranks == 0 and not failed and event.expected_reason in FINISHING_REASONS:
            self._running = False
        if not failed:
            return []
        how = (
            f"signal {event.signal}"
            if event.signal is not None
            else f"exit code {event.exit_code}"
            if event.exit_code is not None
            else "an unknown status"
        )
        # SIGTERM (or the 143 a trainer exits with after saving on it) means the node is being
        # taken away (preemption, drain): restarting in place would land on a leaving node
        terminated = event.signal == SIGTERM or event.exit_code == EXIT_TERMINATED
        return self._failure(
            "crash",
            event.node,
            event.rank,
            "uncorrectable" if terminated else "correctable",
            f"rank {event.rank} on {event.node} exited with {how} (attempt {event.attempt})"
            + ("; the node is being terminated" if terminated else ""),
            observed_ns=now,
            now=now,
        )

    def on_heartbeat(self, event: schemas.Heartbeat, now: int) -> list[schemas.Signal]:
        rank = self._ranks.get(event.rank)
        if rank is None:
            # the sensor (re)started while the job runs: adopt the rank as it is now
            rank = self._ranks[event.rank] = RankRecord(
                node=event.node, last_heartbeat_ns=now, last_progress_ns=now
            )
            self._node(event.node).ranks.add(event.rank)
            self._alive_ranks += 1
            self._mark_job_progress(now)
        elif not rank.alive:
            return []  # a heartbeat in flight when the rank exited
        else:
            gap = now - rank.last_heartbeat_ns
            # the first beat of a new process comes after its start-up, not after a beat
            if rank.heartbeat_step is not None and gap < heartbeat_timeout(rank, self._thresholds):
                rank.heartbeat_gap_ns = max(
                    gap, rank.heartbeat_gap_ns * self._thresholds.interval_decay
                )
            rank.last_heartbeat_ns = now
        if event.busy:
            if not rank.busy:
                rank.busy_since_ns = now
            rank.busy = event.busy
            self._mark_job_progress(now)
        elif rank.busy:
            self._end_busy(rank, now)
        # the first heartbeat only sets the baseline: whether it names the step in progress or
        # the last one done, a change of it is progress
        if rank.heartbeat_step is None:
            rank.heartbeat_step = event.step
        elif event.step > rank.heartbeat_step:
            rank.heartbeat_step = event.step
            self._progress(event.rank, rank, now)
        self._heartbeat_deadlines.arm(event.rank, heartbeat_deadline(rank, self._thresholds))
        if not rank.hang_reported:
            self._hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        return []

    def on_step(self, event: schemas.StepDone, now: int) -> list[schemas.Signal]:
        rank = self._ranks.get(event.rank)
        if rank is None:
            rank = self._ranks[event.rank] = RankRecord(
                node=event.node, last_heartbeat_ns=now, last_progress_ns=now
            )
            self._node(event.node).ranks.add(event.rank)
            self._alive_ranks += 1
            self._heartbeat_deadlines.arm(event.rank, heartbeat_deadline(rank, self._thresholds))
        if not rank.alive:
            return []
        if rank.busy:
            self._end_busy(rank, now)
        if event.step > rank.done_step:
            rank.done_step = event.step
            self._progress(event.rank, rank, now)
            if not rank.hang_reported:
                self._hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        signals = []
        # without a world size in the report, the ranks known alive are the peers to wait for
        expected = event.world_size if event.world_size > 1 else self._alive_ranks
        for slow_rank, ratio in self._stragglers.observe(
            event.rank, event.step, event.compute_time_s or event.step_time_s, expected
        ):
            signals += self._straggler(slow_rank, ratio, now)
        return signals

    def on_checkpoint(
        self, event: schemas.CheckpointSaved | schemas.CheckpointRestored, now: int
    ) -> list[schemas.Signal]:
        """A finished save snapshot or restore: the rank is past it, so its step clock restarts."""
        rank = self._ranks.get(event.rank)
        if rank is None or not rank.alive:
            return []
        if rank.busy:
            self._end_busy(rank, now)
        else:
            rank.last_progress_ns = now
        self._mark_job_progress(now)
        if not rank.hang_reported:
            self._hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        return []

    def on_host_health(self, event: schemas.HostHealth, now: int) -> list[schemas.Signal]:
        node = self._node(event.node)
        node.last_health_ns = now
        signals = self._check_host_faults(event, node, now)
        # only ranks this detector believes alive can vanish: one whose exit was reported is
        # explained, whatever a host report taken from an older job status still expects
        believed = sum(
            1
            for r in node.ranks
            if self._ranks[r].alive
            and self._ranks[r].busy != schemas.BUSY_EXITING
            # a count against an older attempt's pids cannot see a newer attempt's process
            and self._ranks[r].attempt <= event.attempt
        )
        missing = min(event.ranks_expected, believed) - event.ranks_alive
        if missing > 0:
            if not node.missing_since_ns:
                node.missing_since_ns = now
                self._missing_deadlines.arm(event.node, missing_deadline(node, self._thresholds))
            node.missing_detail = (
                f"host monitor of {event.node} sees {event.ranks_alive} of "
                f"{event.ranks_expected} ranks alive"
            )
        elif node.missing_since_ns:
            node.missing_since_ns = 0
            self._missing_deadlines.disarm(event.node)
        return signals

    # ---- deadlines -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When :meth:`poll` may next have something to say (epoch ns), if anything is armed."""
        candidates = [
            queue.next_deadline()
            for queue in (self._heartbeat_deadlines, self._hang_deadlines, self._missing_deadlines)
        ]
        if self._running and not self._job_down_reported:
            candidates.append(self._job_down_deadline())
        return min((c for c in candidates if c is not None), default=None)

    def poll(self, now: int) -> list[schemas.Signal]:
        """Signals whose deadline passed by ``now``; touches only keys that came due."""
        signals: list[schemas.Signal] = []
        for rank_id in self._heartbeat_deadlines.due(now):
            signals += self._check_heartbeat(rank_id, now)
        for rank_id in self._hang_deadlines.due(now):
            signals += self._check_hang(rank_id, now)
        for node_name in self._missing_deadlines.due(now):
            signals += self._check_missing(node_name, now)
        if self._running and not self._job_down_reported and now >= self._job_down_deadline():
            self._job_down_reported = True
            silent_s = (now - self._last_job_progress_ns) / NS
            signals += [
                self._signal(
                    "job_down",
                    "",
                    None,
                    "uncorrectable",
                    f"no rank made progress for {silent_s:.1f} s "
                    f"(jobset_downtime_threshold_s={self._thresholds.jobset_downtime_threshold_s})",
                    observed_ns=self._last_job_progress_ns,
                    now=now,
                )
            ]
        return signals

    def _check_heartbeat(self, rank_id: int, now: int) -> list[schemas.Signal]:
        rank = self._ranks[rank_id]
        if not rank.alive:
            return []
        deadline = heartbeat_deadline(rank, self._thresholds)
        if now < deadline:
            self._heartbeat_deadlines.arm(rank_id, deadline)
            return []
        node = self._nodes[rank.node]
        floor_ns = self._thresholds.heartbeat_timeout_s * NS / 2
        alive = [self._ranks[r] for r in node.ranks if self._ranks[r].alive]
        silent = [r for r in alive if now - r.last_heartbeat_ns >= floor_ns]
        silent_s = (now - rank.last_heartbeat_ns) / NS
        host_reports = (
            node.last_health_ns > 0
            and now - node.last_health_ns < self._thresholds.heartbeat_timeout_s * NS
        )
        if len(silent) == len(alive) and not host_reports:
            # remembered as the node's fault, so its host reporting healthy again returns it
            node.faults = (LOST_NODE,)
            return self._failure(
                "missed_heartbeat",
                rank.node,
                None,
                "uncorrectable",
                f"all {len(alive)} rank(s) of {rank.node} silent and no host report: "
                f"node lost ({silent_s:.1f} s)",
                observed_ns=max(r.last_heartbeat_ns for r in alive),
                now=now,
            )
        return self._failure(
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

    def _check_hang(self, rank_id: int, now: int) -> list[schemas.Signal]:
        rank = self._ranks[rank_id]
        if not rank.alive or rank.hang_reported:
            return []
        deadline = hang_deadline(rank, self._thresholds)
        if now < deadline:
            self._hang_deadlines.arm(rank_id, deadline)
            return []
        if now - rank.last_heartbeat_ns >= heartbeat_timeout(rank, self._thresholds):
            return []  # silent altogether: a missed heartbeat, reported by that check
        rank.hang_reported = True
        waiting = ""
        laggard = self._laggard(rank)
        if laggard is not None:
            # in synchronous training the ranks that finished a step wait in the next
            # collective for the one that did not: that one hangs, the others only wait
            waiting = f"; rank {rank_id} on {rank.node} finished step {rank.done_step} and waits"
            rank_id, rank = laggard, self._ranks[laggard]
            rank.hang_reported = True
            self._hang_deadlines.disarm(rank_id)
            deadline = hang_deadline(rank, self._thresholds)
        if rank.busy:
            stuck_s = (now - rank.busy_since_ns) / NS
            detail = f"rank {rank_id} on {rank.node} stuck in {rank.busy} for {stuck_s:.1f} s"
            observed = rank.busy_since_ns
        else:
            stuck_s = (now - rank.last_progress_ns) / NS
            timeout_s = (deadline - rank.last_progress_ns) / NS
            detail = (
                f"rank {rank_id} on {rank.node} heartbeats but made no progress past step "
                f"{max(rank.done_step, rank.heartbeat_step or 0)} for {stuck_s:.1f} s "
                f"(timeout {timeout_s:.1f} s)"
            )
            observed = rank.last_progress_ns
        return self._failure(
            "hang",
            rank.node,
            rank_id,
            "correctable",
            detail + waiting,
            observed_ns=observed,
            now=now,
        )

    def _laggard(self, rank: RankRecord) -> int | None:
        """The live rank furthest behind ``rank`` in finished steps, if one is behind it."""
        behind = [
            (other.done_step, rank_id)
            for rank_id, other in self._ranks.items()
            if other.alive and not other.hang_reported and other.done_step < rank.done_step
        ]
        return min(behind)[1] if behind else None

    def _check_missing(self, node_name: str, now: int) -> list[schemas.Signal]:
        node = self._nodes[node_name]
        if not node.missing_since_ns:
            return []
        gone_s = (now - node.missing_since_ns) / NS
        detail = f"{node.missing_detail}; no exit report for {gone_s:.1f} s"
        return self._failure(
            "crash",
            node_name,
            None,
            "correctable",
            detail,
            observed_ns=node.missing_since_ns,
            now=now,
        )

    def hang_timeout_s(self, rank_id: int) -> float:
        """The hang timeout in force for a rank now (seconds), for reports and tests."""
        return hang_timeout(self._ranks[rank_id], self._thresholds) / NS

    def _job_down_deadline(self) -> int:
        t = self._thresholds
        allowed = t.jobset_downtime_threshold_s
        if self._starting:
            allowed = max(allowed, t.first_step_timeout_s)
        return self._last_job_progress_ns + int(allowed * NS)

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _node(self, name: str) -> NodeRecord:
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = NodeRecord()
        return node

    def _progress(self, rank_id: int, rank: RankRecord, now: int) -> None:
        if rank.progress_seen and not rank.hang_reported:
            gap = now - rank.last_progress_ns
            rank.step_gap_ns = max(gap, rank.step_gap_ns * self._thresholds.interval_decay)
        rank.last_progress_ns = now
        if not rank.progress_seen:
            self._starting.discard(rank_id)
        rank.progress_seen += 1
        rank.hang_reported = False
        self._mark_job_progress(now)

    def _end_busy(self, rank: RankRecord, now: int) -> None:
        """Leaving a checkpoint save/load: the time inside it is not a step interval."""
        rank.busy = ""
        rank.last_progress_ns = now
        self._mark_job_progress(now)

    def _mark_job_progress(self, now: int) -> None:
        self._running = True
        self._last_job_progress_ns = max(self._last_job_progress_ns, now)
        self._job_down_reported = False

    def _check_host_faults(
        self, event: schemas.HostHealth, node: NodeRecord, now: int
    ) -> list[schemas.Signal]:
        current = host_faults(event)
        change = fault_change(event, node.faults, current)
        node.faults = current
        if change is None:
            return []
        kind, severity, detail = change
        return [
            self._signal(
                kind, event.node, None, severity, detail, observed_ns=now, now=now, host=event
            )
        ]

    def _straggler(self, rank_id: int, ratio: float, now: int) -> list[schemas.Signal]:
        rank = self._ranks[rank_id]
        if rank.node in self._straggler_nodes:
            return []
        self._straggler_nodes.add(rank.node)
        t = self._thresholds
        return [
            self._signal(
                "straggler",
                rank.node,
                rank_id,
                "info",
                f"rank {rank_id} on {rank.node}: compute time {ratio:.2f}× its peers' in most of "
                f"the last {t.straggler_window} steps (threshold {t.straggler_ratio}×)",
                observed_ns=now,
                now=now,
            )
        ]

    def _failure(
        self,
        kind: schemas.SignalKind,
        node: str,
        rank: int | None,
        severity: str,
        detail: str,
        *,
        observed_ns: int,
        now: int,
    ) -> list[schemas.Signal]:
        if node in self._reported_nodes:
            return []
        if severity == "correctable":
            if self._incident_open:
                return []  # collateral of the open incident
            self._incident_open = True
        self._reported_nodes.add(node)
        return [self._signal(kind, node, rank, severity, detail, observed_ns=observed_ns, now=now)]

    def _signal(
        self,
        kind: schemas.SignalKind,
        node: str,
        rank: int | None,
        severity: str,
        detail: str,
        *,
        observed_ns: int,
        now: int,
        host: schemas.HostHealth | None = None,
    ) -> schemas.Signal:
        return make_signal(
            self.job,
            kind,
            node,
            rank,
            severity,
            detail,
            epoch=self._epoch,
            observed_ns=observed_ns,
            now=now,
            host=host,
        )
