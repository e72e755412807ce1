"""The state of one job, folded from its events: what `goodput status` shows.

Pure: :meth:`JobModel.apply` takes events in stream order, :meth:`JobModel.snapshot` turns
them into a :class:`JobSnapshot` at a given ``now``. No bus, no clock of its own, so the
view can be tested from a hand-built list of events and replayed from an exported log.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from goodput import schemas
from goodput.measure.accounting import compute_goodput
from goodput.measure.accounting.categories import TITLES
from goodput.measure.jobview.snapshot import (
    TIER_TITLES,
    ActionView,
    CheckpointStage,
    DecisionView,
    GoodputView,
    JobSnapshot,
    NodeRole,
    NodeView,
    PlanView,
    RankView,
    RestoreView,
    SignalView,
    StepProgress,
    TierView,
)

#: how many recent signals, decisions and action results a snapshot keeps
RECENT = 8
#: seconds of reference-rank steps the step rate is measured over
RATE_WINDOW_S = 30.0
#: running goodput is a full replay of the events so far: not more often than this
GOODPUT_EVERY_S = 5.0


@dataclass
class _Copy:
    step: int
    ts: int
    holders: set[str] = field(default_factory=set)


def _age(now_ns: int, ts: int) -> float:
    return round(max(now_ns - ts, 0) / 1e9, 2)


class JobModel:
    """Folds one job's events into the figures an operator watches."""

    def __init__(
        self,
        job: str,
        *,
        known_nodes: list[str] | None = None,
        recent: int = RECENT,
        rate_window_s: float = RATE_WINDOW_S,
        goodput_every_s: float = GOODPUT_EVERY_S,
    ) -> None:
        self.job = job
        self.rate_window_ns = int(rate_window_s * 1e9)
        self.goodput_every_ns = int(goodput_every_s * 1e9)
        self.known_nodes = list(known_nodes or [])
        self.status: schemas.JobStatus | None = None
        self.ranks: dict[int, RankView] = {}
        self.latest_attempt = 0
        self.last_heard: dict[str, int] = {}
        self.hosts: dict[str, schemas.HostHealth] = {}
        self.copies: dict[CheckpointStage, _Copy] = {}
        self.last_restore: schemas.CheckpointRestored | None = None
        self.plan: schemas.TrainingPlan | None = None
        self.last_failure: schemas.CheckpointFailed | None = None
        self.step_ts: deque[int] = deque()  # reference-rank step completions inside the window
        self.last_step: schemas.StepDone | None = None
        self.reference_rank: int | None = None
        self.signals: deque[schemas.Signal] = deque(maxlen=recent)
        self.decisions: deque[schemas.Decision] = deque(maxlen=recent)
        self.actions: deque[schemas.ActionResult] = deque(maxlen=recent)
        self.events = 0
        self.history: list[schemas.Event] = []  # stored events, for the goodput replay
        self._goodput: GoodputView | None = None
        self._goodput_note = "no training events yet"
        self._goodput_at: int | None = None  # when it was computed (now_ns of that snapshot)
        self._goodput_events = -1  # len(history) it was computed from

    # ---------------------------------------------------------------- folding

    def apply(self, event: schemas.Event) -> None:
        """Take one event (stream order); events of other jobs are ignored."""
        if event.job != self.job:
            return
        if not isinstance(event, schemas.Heartbeat):  # heartbeats are not stored on the bus
            self.events += 1
            self.history.append(event)
        match event:
            case schemas.Heartbeat():
                self._heard(event.node, event.ts)
                rank = self.ranks.get(event.rank)
                if rank is not None and rank.node == event.node:
                    rank.busy = event.busy
                    rank.step = max(rank.step or 0, event.step)
            case schemas.RankStarted():
                if event.attempt > self.latest_attempt:
                    # the actuator stops an attempt's group before it starts the next one
                    self.ranks = {r: v for r, v in self.ranks.items() if v.attempt >= event.attempt}
                    self.latest_attempt = event.attempt
                self.ranks[event.rank] = RankView(
                    rank=event.rank, node=event.node, pid=event.pid, attempt=event.attempt
                )
                self._heard(event.node, event.ts)
            case schemas.RankExited():
                rank = self.ranks.get(event.rank)
                if rank is not None and rank.pid == event.pid:
                    rank.running = False
                    rank.exit_code = event.exit_code
                    rank.exit_signal = event.signal
            case schemas.StepDone():
                self._on_step(event)
            case schemas.CheckpointSaved():
                self._copy("saved", event.step, event.ts, f"{event.node}/{event.rank}")
            case schemas.CheckpointPersisted():
                self._copy("persisted", event.step, event.ts, f"{event.node}/{event.rank}")
            case schemas.CheckpointReplicated():
                self._copy("replicated", event.step, event.ts, f"{event.node}→{event.peer}")
            case schemas.CheckpointBackedUp():
                self._copy("backed_up", event.step, event.ts, event.uri)
            case schemas.CheckpointFailed():
                self.last_failure = event
            case schemas.CheckpointRestored() if event.rank >= 0:
                self.last_restore = event  # rank -1 is a tier filling a volume, not training
            case schemas.TrainingPlan():
                self.plan = event
            case schemas.HostHealth():
                self.hosts[event.node] = event
            case schemas.Signal():
                self.signals.append(event)
            case schemas.Decision():
                self.decisions.append(event)
            case schemas.ActionResult():
                self.actions.append(event)
            case schemas.JobStatus():
                self.status = event

    def _heard(self, node: str, ts: int) -> None:
        self.last_heard[node] = max(self.last_heard.get(node, 0), ts)

    def _on_step(self, event: schemas.StepDone) -> None:
        self._heard(event.node, event.ts)
        rank = self.ranks.get(event.rank)
        if rank is not None and rank.node == event.node:
            rank.step = event.step
        # the lowest rank reporting steps is the reference (normally rank 0), as in accounting
        if self.reference_rank is None or event.rank < self.reference_rank:
            self.reference_rank = event.rank
            self.step_ts.clear()
        if event.rank != self.reference_rank:
            return
        self.last_step = event
        self.step_ts.append(event.ts)
        while self.step_ts and self.step_ts[0] < event.ts - self.rate_window_ns:
            self.step_ts.popleft()

    def _copy(self, tier: CheckpointStage, step: int, ts: int, holder: str) -> None:
        current = self.copies.get(tier)
        if current is None or current.step != step:
            # "last" is the newest report: after a rollback an older step is the live one again
            current = self.copies[tier] = _Copy(step=step, ts=ts)
        current.ts = max(current.ts, ts)
        current.holders.add(holder)

    # ---------------------------------------------------------------- reading

    def snapshot(self, now_ns: int) -> JobSnapshot:
        """The view at ``now_ns`` (ages and the step rate depend on it)."""
        status = self.status
        return JobSnapshot(
            job=self.job,
            state=status.state if status else ("running" if self.ranks else "unknown"),
            attempt=status.attempt if status else self.latest_attempt,
            world_size=status.world_size if status else len(self.ranks),
            procs_per_node=status.procs_per_node if status else 0,
            detail=status.detail if status else "",
            events=self.events,
            step=self._step_view(now_ns),
            nodes=self._nodes(now_ns),
            ranks=[self.ranks[r] for r in sorted(self.ranks)],
            checkpoints=[
                TierView(
                    tier=tier,
                    step=self.copies[tier].step,
                    age_s=_age(now_ns, self.copies[tier].ts),
                    holders=sorted(self.copies[tier].holders),
                )
                for tier in TIER_TITLES
                if tier in self.copies
            ],
            last_restore=(
                RestoreView(
                    step=self.last_restore.step,
                    tier=self.last_restore.tier,
                    age_s=_age(now_ns, self.last_restore.ts),
                    node=self.last_restore.node,
                    fallbacks=list(self.last_restore.fallbacks),
                    pinned_bytes=self.last_restore.pinned_bytes,
                )
                if self.last_restore
                else None
            ),
            plan=self._plan_view(now_ns),
            last_checkpoint_failure=(
                f"step {self.last_failure.step} on {self.last_failure.node}/"
                f"{self.last_failure.rank}: {self.last_failure.error}"
                if self.last_failure
                else ""
            ),
            signals=[
                SignalView(
                    age_s=_age(now_ns, s.ts),
                    signal=s.signal,
                    severity=s.severity,
                    node=s.node,
                    rank=s.rank,
                    detail=s.detail,
                )
                for s in reversed(self.signals)
            ],
            decisions=[
                DecisionView(
                    age_s=_age(now_ns, d.ts),
                    policy=d.policy,
                    rule=d.rule,
                    reason=d.reason,
                    commands=len(d.command_ids),
                    error=d.error,
                )
                for d in reversed(self.decisions)
            ],
            actions=[
                ActionView(
                    age_s=_age(now_ns, a.ts),
                    action=a.action,
                    ok=a.ok,
                    detail=a.detail,
                    duration_s=round(a.duration_s, 3),
                )
                for a in reversed(self.actions)
            ],
            goodput=self.goodput(now_ns),
            goodput_note=self._goodput_note,
        )

    def _plan_view(self, now_ns: int) -> PlanView | None:
        plan = self.plan
        if plan is None:
            return None
        return PlanView(
            step=plan.step,
            age_s=_age(now_ns, plan.ts),
            dp_size=plan.dp_size,
            global_batch=plan.global_batch,
            micro_batch=plan.micro_batch,
            accumulation_steps=plan.accumulation_steps,
            lr=plan.lr,
            rescaled_from_dp=plan.rescaled_from_dp,
            callbacks=list(plan.callbacks),
        )

    def _step_view(self, now_ns: int) -> StepProgress:
        last = self.last_step
        if last is None:
            return StepProgress()
        start = now_ns - self.rate_window_ns
        recent = [ts for ts in self.step_ts if ts >= start]
        rate = None
        if len(recent) >= 2 and recent[-1] > recent[0]:
            rate = round((len(recent) - 1) / ((recent[-1] - recent[0]) / 1e9), 3)
        elif self.step_ts and not recent:
            rate = 0.0  # steps were seen, none in the window: training is not progressing
        return StepProgress(
            step=last.step,
            steps_per_s=rate,
            step_time_s=round(last.step_time_s, 4),
            loss=last.loss,
            tokens_per_s=(
                round(last.tokens / last.step_time_s, 1)  # tokens: the whole job's step
                if last.step_time_s > 0 and last.tokens
                else None
            ),
            last_step_age_s=_age(now_ns, last.ts),
        )

    def _nodes(self, now_ns: int) -> list[NodeView]:
        status = self.status
        roles: dict[str, NodeRole] = {}
        if status is not None:
            roles |= dict.fromkeys(status.spare_nodes, "spare")
            roles |= dict.fromkeys(status.failed_nodes, "failed")
            roles |= dict.fromkeys(status.active_nodes, "active")
        names = dict.fromkeys(
            [
                *self.known_nodes,
                *roles,
                *self.hosts,
                *(rank.node for rank in self.ranks.values()),
            ]
        )
        order = {"active": 0, "spare": 1, "failed": 2, "unknown": 3}
        views = []
        for name in names:
            ranks = sorted(r.rank for r in self.ranks.values() if r.node == name and r.running)
            pids = (
                list(status.pids.get(name, []))
                if status is not None and status.pids
                else [r.pid for r in self.ranks.values() if r.node == name and r.running]
            )
            host = self.hosts.get(name)
            heard = self.last_heard.get(name)
            views.append(
                NodeView(
                    name=name,
                    role=roles.get(name, "unknown"),
                    ranks=ranks,
                    pids=pids,
                    last_heard_age_s=_age(now_ns, heard) if heard else None,
                    host_healthy=host.healthy if host else None,
                    gpu_available=host.gpu_available if host else None,
                    host_faults=list(host.faults) if host else [],
                    host_detail=host.detail if host else "",
                    host_age_s=_age(now_ns, host.ts) if host else None,
                )
            )
        return sorted(views, key=lambda v: (order[v.role], v.name))

    def goodput(self, now_ns: int) -> GoodputView | None:
        """Running goodput, recomputed from the events so far at most every few seconds."""
        stale = self._goodput_at is None or now_ns - self._goodput_at >= self.goodput_every_ns
        if stale:
            if len(self.history) != self._goodput_events:
                self._goodput_events = len(self.history)
                self._goodput, self._goodput_note = self._compute_goodput()
            self._goodput_at = now_ns  # with no new event the figures are still current
        if self._goodput is None or self._goodput_at is None:
            return self._goodput
        return msgspec.structs.replace(self._goodput, computed_age_s=_age(now_ns, self._goodput_at))

    def _compute_goodput(self) -> tuple[GoodputView | None, str]:
        try:
            report = compute_goodput(self.history, job=self.job)
        except ValueError as exc:  # no training events yet
            return None, str(exc)
        except Exception as exc:  # a view must keep showing the rest; say why this part is blank
            return None, f"goodput calculation failed: {type(exc).__name__}: {exc}"
        badput = sorted(
            ((TITLES.get(k, k), round(v, 2)) for k, v in report.badput.items() if v > 0),
            key=lambda kv: -kv[1],
        )
        return (
            GoodputView(
                goodput_pct=round(report.goodput_pct, 2),
                productive_s=round(report.productive_s, 2),
                total_s=round(report.total_s, 2),
                ettr=round(report.ettr, 4),
                interruptions=report.interruptions,
                mttr_s=round(report.mttr_s, 2) if report.mttr_s is not None else None,
                top_badput=dict(badput[:4]),
                computed_age_s=0.0,
            ),
            "",
        )
