"""The failure detector: see the package docstring for what it detects and why.

The detector folds events into what it knows of the run (:mod:`.run_state`); the deadline
checks (:mod:`.deadline_checks`) say what a deadline that came due means, and the incidents
(:mod:`.incidents`) decide which conclusions become signals.
"""

from __future__ import annotations

from signal import SIGTERM

import msgspec

from goodput import schemas
from goodput.launch.rank_env import EXIT_TERMINATED, rank_fault
from goodput.supervisor.detect.deadline_checks import (
    check_hang,
    check_heartbeat,
    check_job_down,
    check_missing,
)
from goodput.supervisor.detect.host_faults import fault_change, host_faults
from goodput.supervisor.detect.incidents import Incidents
from goodput.supervisor.detect.numerics import NumericsJudge
from goodput.supervisor.detect.records import NodeRecord, RankRecord
from goodput.supervisor.detect.run_state import RunState
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.supervisor.detect.timeouts import (
    NS,
    hang_deadline,
    hang_timeout,
    heartbeat_deadline,
    heartbeat_timeout,
    missing_deadline,
)

#: ``RankExited.expected_reason`` values after which nothing is expected to come back
FINISHING_REASONS = frozenset({"", "stop"})
#: what a crash of a rank whose CUDA context was poisoned adds to the signal's detail
CONTEXT_LOST = "its CUDA context cannot continue (a sticky CUDA error): only a new process can"


#: the event kinds the detector learns from; any other (signals, decisions, results: the
#: supervisor's own output) says nothing of the job, and ``on_event`` ignores it. The sensor
#: service hands it every event of the job's stream, the simulator every event it makes.
OBSERVED_EVENTS = (
    schemas.Heartbeat,
    schemas.RankStarted,
    schemas.RankRejoined,
    schemas.RankExited,
    schemas.StepDone,
    schemas.CheckpointSaved,
    schemas.CheckpointRestored,
    schemas.HostHealth,
    schemas.RunStarted,
    schemas.Numerics,
)


class Detector:
    """One job's failure detector. Every ``on_*`` returns the signals it concludes at once."""

    def __init__(self, job: str, thresholds: Thresholds | None = None):
        self.job = job
        self._thresholds = thresholds or Thresholds()
        self._heartbeat_floor_ns = int(self._thresholds.heartbeat_timeout_s * NS)
        self._forget_run()

    def _forget_run(self) -> None:
        """Know nothing of any rank or node: the state of one run of the job."""
        self._run = RunState(self._thresholds)
        self._incidents = Incidents(self.job)
        self._numerics = NumericsJudge()

    # ---- thresholds ----------------------------------------------------------------------------

    @property
    def thresholds(self) -> Thresholds:
        return self._thresholds

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Apply new thresholds (from ``thresholds.updated``); every deadline is recomputed."""
        self._thresholds = thresholds
        self._heartbeat_floor_ns = int(thresholds.heartbeat_timeout_s * NS)
        self._run.rearm(thresholds)

    # ---- events --------------------------------------------------------------------------------

    def on_event(self, event: schemas.Event, now: int) -> list[schemas.Signal]:
        """Fold in an event of the job: one of ``OBSERVED_EVENTS``; others are ignored."""
        if not isinstance(event, OBSERVED_EVENTS):
            return []
        if now > self._run.last_heard_ns:
            self._run.last_heard_ns = now
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
            case schemas.Numerics():
                return self.on_numerics(event, now)
            case schemas.RunStarted():
                # a new run counts attempts from 1 again: the old run's ranks would make its
                # first attempt look stale, and its silence look like the new run hanging
                self._forget_run()
        return []

    def on_rank_started(self, event: schemas.RankStarted, now: int) -> list[schemas.Signal]:
        rank = self._run.ranks.get(event.rank)
        if rank is not None and event.attempt < rank.attempt:
            return []  # a late report of an older generation
        if rank is None:
            rank = self._run.ranks[event.rank] = RankRecord(node=event.node, alive=False)
        elif rank.node != event.node:
            self._run.node(rank.node).ranks.discard(event.rank)
        if not rank.alive:
            self._run.alive_ranks += 1
        self._attempt_begins(event.attempt, now)
        if event.attempt > self._run.oom_attempt:
            self._run.take_oom_exits()  # a relaunch after them covers the OOMs gathered
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
        self._run.starting.add(event.rank)
        node = self._run.node(event.node)
        node.ranks.add(event.rank)
        # a host count taken before this process existed says nothing about it
        node.missing_since_ns = 0
        self._run.missing_deadlines.disarm(event.node)
        self._incidents.rank_restarted(event.node, event.attempt)
        self._incidents.straggler_nodes.discard(event.node)
        self._run.stragglers.forget(event.rank)
        self._run.mark_job_progress(now)
        self._run.heartbeat_deadlines.arm(event.rank, heartbeat_deadline(rank, self._thresholds))
        self._run.hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        return []

    def on_rank_rejoined(self, event: schemas.RankRejoined, now: int) -> None:
        """A live rank restarted in process: it begins ``event.attempt`` as a started rank
        would (its step allowance, hang watch and the incident start over), same process."""
        rank = self._run.ranks.get(event.rank)
        if rank is None or not rank.alive or event.attempt < rank.attempt:
            return
        self._attempt_begins(event.attempt, now)
        rank.attempt = event.attempt
        rank.last_heartbeat_ns = now
        self._start_over(event.rank, rank, now)
        self._incidents.rank_restarted(rank.node, event.attempt)
        self._run.heartbeat_deadlines.arm(event.rank, heartbeat_deadline(rank, self._thresholds))

    def _attempt_begins(self, attempt: int, now: int) -> None:
        """The first start or in-process rejoin of ``attempt``: every live rank of an older
        attempt is restarting in process (its own ``RankRejoined`` may come much later: it
        waits in a collective until its peers leave the old group) or is being stopped (its
        exit report follows). Either way its progress says nothing about the new attempt: a
        waiting rank's hang deadline must not run on through the restart, nor may its finished
        steps make a rank that restarted look like the laggard of a second hang."""
        if attempt <= self._run.attempt:
            return
        self._run.attempt = attempt
        for rank_id, rank in self._run.ranks.items():
            if rank.alive and rank.attempt < attempt:
                self._start_over(rank_id, rank, now)

    def _start_over(self, rank_id: int, rank: RankRecord, now: int) -> None:
        """A live rank's progress starts over (an in-process restart): the first-step allowance
        again, its earlier steps and any hang report forgotten — it goes back to the restored
        step. Its learnt step intervals stay: same process, same model."""
        rank.progress_seen, rank.hang_reported = 0, False
        rank.last_progress_ns = now
        rank.done_step, rank.heartbeat_step = -1, None
        self._run.starting.add(rank_id)
        self._run.mark_job_progress(now)
        self._run.hang_deadlines.arm(rank_id, hang_deadline(rank, self._thresholds))

    def on_rank_exited(self, event: schemas.RankExited, now: int) -> list[schemas.Signal]:
        rank = self._run.ranks.get(event.rank)
        if rank is not None and event.attempt < rank.attempt:
            return []
        if rank is None:
            rank = self._run.ranks[event.rank] = RankRecord(node=event.node, alive=False)
            self._run.node(event.node).ranks.add(event.rank)
        elif rank.alive:
            rank.alive = False
            self._run.alive_ranks -= 1
        self._run.starting.discard(event.rank)
        self._run.heartbeat_deadlines.disarm(event.rank)
        self._run.hang_deadlines.disarm(event.rank)
        self._run.stragglers.forget(event.rank)
        node = self._run.node(event.node)
        if node.missing_since_ns:
            node.missing_since_ns = 0  # the exit report explains the missing process
            self._run.missing_deadlines.disarm(event.node)
        failed = event.expected_reason == "" and (event.exit_code != 0 or event.signal is not None)
        if self._run.alive_ranks == 0 and not failed and event.expected_reason in FINISHING_REASONS:
            self._run.running = False
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
        fault = rank_fault(event.exit_code) if event.signal is None else ""
        if fault == "cuda-oom":
            return self._gather_oom(event, now)
        detail = (
            f"rank {event.rank} on {event.node} exited with {how} (attempt {event.attempt})"
            + ("; the node is being terminated" if terminated else "")
            + (f": {CONTEXT_LOST}" if fault == "cuda-context" else "")
        )
        signals = self._incidents.failure(
            "crash",
            event.node,
            event.rank,
            "uncorrectable" if terminated else "correctable",
            detail,
            observed_ns=now,
            now=now,
        )
        return [msgspec.structs.replace(s, rank_fault=fault) for s in signals]

    def _gather_oom(self, event: schemas.RankExited, now: int) -> list[schemas.Signal]:
        """A rank out of GPU memory is reported once its peers had ``oom_gather_s`` to follow:
        when every rank of the job ran out, it is the job's memory (one signal naming no node,
        which the policy restarts without blaming one); else the first rank's node's."""
        run = self._run
        if event.attempt != run.oom_attempt:
            run.take_oom_exits()
            run.oom_attempt = event.attempt
        if not run.oom_since_ns:
            run.oom_since_ns = now
        run.oom_exits[event.rank] = event.node
        if run.alive_ranks or not run.ranks.keys() <= run.oom_exits.keys():
            return []
        run.take_oom_exits()
        signals = self._incidents.failure(
            "crash",
            "",
            None,
            "correctable",
            f"every rank ({len(run.ranks)}) ran out of GPU memory in attempt {event.attempt}, "
            "after its warm retry: the job's memory, not a node's",
            observed_ns=now,
            now=now,
        )
        return [msgspec.structs.replace(s, rank_fault="cuda-oom") for s in signals]

    def _oom_due(self, now: int) -> list[schemas.Signal]:
        """The gathered OOM exits whose peers did not all follow: the first rank's node."""
        run = self._run
        deadline = run.oom_deadline(self._thresholds)
        if deadline is None or now < deadline:
            return []
        observed = run.oom_since_ns
        exits = run.take_oom_exits()
        rank, node = next(iter(exits.items()))
        signals = self._incidents.failure(
            "crash",
            node,
            rank,
            "correctable",
            f"rank {rank} on {node} ran out of GPU memory after its warm retry "
            f"(attempt {run.oom_attempt}; {len(exits)} of {len(run.ranks)} rank(s) did)",
            observed_ns=observed,
            now=now,
        )
        return [msgspec.structs.replace(s, rank_fault="cuda-oom") for s in signals]

    def on_heartbeat(self, event: schemas.Heartbeat, now: int) -> list[schemas.Signal]:
        if now > self._run.last_heard_ns:
            self._run.last_heard_ns = now
        rank = self._run.ranks.get(event.rank)
        if rank is None:
            rank = self._run.adopt(event.rank, event.node, now)
            self._run.mark_job_progress(now)
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
        # whether the hang deadline's inputs (progress, busy) changed: a plain beat moves
        # neither, so its hang entry stands as it is
        moved = False
        if event.busy:
            if rank.busy != event.busy:
                moved = True
                if not rank.busy:
                    rank.busy_since_ns = now
                rank.busy = event.busy
            self._run.mark_job_progress(now)
        elif rank.busy:
            moved = True
            self._run.end_busy(rank, now)
        # the first heartbeat only sets the baseline: whether it names the step in progress or
        # the last one done, a change of it is progress — unless the step report came first
        # (one step is one progress interval, however many messages tell of it)
        if rank.heartbeat_step is None:
            rank.heartbeat_step = event.step
        elif event.step > rank.heartbeat_step:
            rank.heartbeat_step = event.step
            if event.step > rank.done_step:
                moved = True
                self._run.progress(event.rank, rank, now, self._thresholds)
        # re-armed lazily: no heartbeat timeout is shorter than the floor, so the beat's time
        # plus the floor is the earliest this rank can fall silent; the queue keeps the
        # earliest entry (a later one costs a dict look-up), and when it comes due
        # ``check_heartbeat`` recomputes the real deadline and re-arms at it
        self._run.heartbeat_deadlines.arm(event.rank, now + self._heartbeat_floor_ns)
        if not rank.hang_reported and (moved or event.rank not in self._run.hang_deadlines):
            self._run.hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        return []

    def on_step(self, event: schemas.StepDone, now: int) -> list[schemas.Signal]:
        rank = self._run.ranks.get(event.rank)
        if rank is None:
            rank = self._run.adopt(event.rank, event.node, now)
            self._run.heartbeat_deadlines.arm(
                event.rank, heartbeat_deadline(rank, self._thresholds)
            )
        if not rank.alive:
            return []
        if rank.busy:
            self._run.end_busy(rank, now)
        if event.step > rank.done_step:
            # a heartbeat may have told of this step already (heartbeats overtake reports)
            told = rank.heartbeat_step is not None and event.step <= rank.heartbeat_step
            rank.done_step = event.step
            if not told:
                self._run.progress(event.rank, rank, now, self._thresholds)
            if not rank.hang_reported:
                self._run.hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        signals = []
        # without a world size in the report, the ranks known alive are the peers to wait for
        expected = event.world_size if event.world_size > 1 else self._run.alive_ranks
        for slow_rank, ratio in self._run.stragglers.observe(
            event.rank, event.step, event.compute_time_s or event.step_time_s, expected, now
        ):
            signals += self._incidents.straggler(
                slow_rank, self._run.ranks[slow_rank].node, ratio, self._thresholds, now
            )
        return signals

    def on_numerics(self, event: schemas.Numerics, now: int) -> list[schemas.Signal]:
        """A window of the trainer's numerics: non-finite values, a loss spike, replicas that
        disagree (:mod:`.numerics`); each finding a signal through the open incident."""
        nodes = {rank: record.node for rank, record in self._run.ranks.items()}
        signals = []
        for finding in self._numerics.observe(event, nodes):
            for signal in self._incidents.failure(
                finding.kind,
                finding.node,
                finding.rank,
                finding.severity,
                finding.reason,
                observed_ns=event.ts,
                now=now,
            ):
                signals.append(
                    msgspec.structs.replace(
                        signal, first_bad_step=finding.first_bad_step, last_bad_step=finding.step
                    )
                )
        return signals

    def on_checkpoint(
        self, event: schemas.CheckpointSaved | schemas.CheckpointRestored, now: int
    ) -> list[schemas.Signal]:
        """A finished save snapshot or restore: the rank is past it, so its step clock restarts."""
        rank = self._run.ranks.get(event.rank)
        if rank is None or not rank.alive:
            return []
        if rank.busy:
            self._run.end_busy(rank, now)
        else:
            rank.last_progress_ns = now
        self._run.mark_job_progress(now)
        if not rank.hang_reported:
            self._run.hang_deadlines.arm(event.rank, hang_deadline(rank, self._thresholds))
        return []

    def on_host_health(self, event: schemas.HostHealth, now: int) -> list[schemas.Signal]:
        node = self._run.node(event.node)
        node.last_health_ns = now
        signals = self._check_host_faults(event, node, now)
        # only ranks this detector believes alive can vanish: one whose exit was reported is
        # explained, whatever a host report taken from an older job status still expects
        believed = sum(
            1
            for r in node.ranks
            if self._run.ranks[r].alive
            and self._run.ranks[r].busy != schemas.BUSY_EXITING
            # a count against an older attempt's pids cannot see a newer attempt's process
            and self._run.ranks[r].attempt <= event.attempt
        )
        missing = min(event.ranks_expected, believed) - event.ranks_alive
        if missing > 0:
            if not node.missing_since_ns:
                node.missing_since_ns = now
                self._run.missing_deadlines.arm(
                    event.node, missing_deadline(node, self._thresholds)
                )
            node.missing_detail = (
                f"host monitor of {event.node} sees {event.ranks_alive} of "
                f"{event.ranks_expected} ranks alive"
            )
        elif node.missing_since_ns:
            node.missing_since_ns = 0
            self._run.missing_deadlines.disarm(event.node)
        return signals

    # ---- deadlines -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When :meth:`poll` may next have something to say (epoch ns), if anything is armed."""
        run = self._run
        # while an OOM exit awaits its peers' (``_gather_oom``), the ranks blocked on it are
        # not hung: their hang checks wait for its report, which opens the incident
        queues = (run.heartbeat_deadlines, run.missing_deadlines) + (
            () if run.oom_since_ns else (run.hang_deadlines,)
        )
        candidates = [queue.next_deadline() for queue in queues]
        if run.running and not run.job_down_reported:
            candidates.append(run.job_down_deadline(self._thresholds))
        candidates.append(run.oom_deadline(self._thresholds))
        return min((c for c in candidates if c is not None), default=None)

    def poll(self, now: int) -> list[schemas.Signal]:
        """Signals whose deadline passed by ``now``; touches only keys that came due."""
        run, incidents, t = self._run, self._incidents, self._thresholds
        signals: list[schemas.Signal] = self._oom_due(now)
        for rank_id in run.heartbeat_deadlines.due(now):
            signals += check_heartbeat(run, incidents, t, rank_id, now)
        for rank_id in [] if run.oom_since_ns else run.hang_deadlines.due(now):
            signals += check_hang(run, incidents, t, rank_id, now)
        for node_name in run.missing_deadlines.due(now):
            signals += check_missing(run, incidents, node_name, now)
        signals += check_job_down(run, incidents, t, now)
        return signals

    def hang_timeout_s(self, rank_id: int) -> float:
        """The hang timeout in force for a rank now (seconds), for reports and tests."""
        return hang_timeout(self._run.ranks[rank_id], self._thresholds) / NS

    # ---- host faults ---------------------------------------------------------------------------

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
            self._incidents.signal(
                kind, event.node, None, severity, detail, observed_ns=now, now=now, host=event
            )
        ]
