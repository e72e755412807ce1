"""Goodput of one job from goodput's own events (the GP_EVENTS stream or an exported log).

The method, in three passes (docs/GOODPUT.md defines every category precisely):

1. **Step executions.** A step is done when the reference rank (the lowest rank that reports
   steps, normally rank 0) publishes its ``StepDone``. An execution's wall span runs from the
   previous execution's end, or — first step after a (re)start — ``step_time_s`` before its
   end. An execution is *productive* unless the same or an earlier step completes again later
   (or a later restore rolls back past it): then it was thrown away.
2. **Claims.** Every source of lost time claims an interval (checkpoint stalls and loads,
   detection, decision, restart, startup, the partial step a fault cut short); step
   executions claim their spans. :func:`goodput.measure.accounting.intervals.partition` resolves the
   overlaps by precedence, so every instant has one owner and the totals add up.
3. **Split of kept work.** What a productive execution kept after stronger claims is split
   into straggler excess (over the healthy median step time, for every slow step, flagged or
   not: :mod:`goodput.measure.accounting.slowdown`), capacity idle while scaled down (the missing share of the nominal world size) and
   productive time. Executions that were thrown away count whole as wasted progress, or, when
   the outage that went back past them first had a numerical fault (a NaN, a loss spike, a
   corrupt replica), as a numerical rollback, with that outage's restore.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TypeVar

from goodput import schemas
from goodput.measure.accounting import categories as c
from goodput.measure.accounting.intervals import WORK, Claim, Piece, partition
from goodput.measure.accounting.labels import exit_label, fault_label, remedy_label
from goodput.measure.accounting.report import (
    GoodputReport,
    Interruption,
    Marker,
    Span,
    StepPoint,
    Timeline,
    bound_markers,
    bound_spans,
    summarize,
    thin,
)
from goodput.measure.accounting.rollbacks import Work, discarded_by
from goodput.measure.accounting.selection import SelectedJob, earliest_ns, select_job
from goodput.measure.accounting.slowdown import KeptStep, step_time_deviation

E = TypeVar("E", bound=schemas.Event)

#: signals that mean training stopped (or will stop) for a fault, not for a plan
FAILURE_SIGNALS = frozenset(
    {"crash", "hang", "missed_heartbeat", "degraded_host", "job_down"} | schemas.NUMERICAL_SIGNALS
)

#: events that belong to the job's life and bound its accounting window
_LIFECYCLE = (
    schemas.RankStarted,
    schemas.RankExited,
    schemas.StepDone,
    schemas.CheckpointSaved,
    schemas.CheckpointPersisted,
    schemas.CheckpointFailed,
    schemas.CheckpointDropped,
    schemas.CheckpointRestored,
    schemas.Signal,
    schemas.Decision,
    schemas.ActionResult,
)


def is_failure_exit(event: schemas.RankExited) -> bool:
    """An exit nobody asked for, with a non-zero code or a signal."""
    return event.expected_reason == "" and (event.exit_code != 0 or event.signal is not None)


@dataclass(slots=True)
class Execution:
    """One completion of one step (by the reference rank)."""

    step: int
    start: float
    end: float
    world_size: int
    run: int
    productive: bool = True
    #: the category a thrown-away execution is charged to (its rollback's cause)
    lost_to: str = c.WASTED_PROGRESS
    kept: float = 0.0  # seconds left to this execution after stronger claims


@dataclass(slots=True)
class Run:
    """Consecutive executions with no restart in between."""

    first: int  # index of its first execution
    last: int


@dataclass(slots=True)
class Outage:
    """The time between two runs (or before the first / after the last) with its milestones."""

    start: float
    end: float
    before: Run | None
    after: Run | None
    signals: list[schemas.Signal] = field(default_factory=list)
    exits: list[schemas.RankExited] = field(default_factory=list)
    decisions: list[schemas.Decision] = field(default_factory=list)
    #: a numerical signal is among its fault evidence: its rollback went back to a checkpoint
    #: before the numerical fault, whatever else went wrong around it (the trainer dying of
    #: its NaN, the job seen down while the rollback restarted it), so what the rollback threw
    #: away and restored is charged to ``numerical_rollback``
    numerical: bool = False


class _Accounting:
    def __init__(self, selected: SelectedJob, nominal_world_size: int | None):
        self.job = job = selected.job
        self.by_type: dict[type, list] = defaultdict(list)
        for event in selected.events:  # one pass; every later pass reads only its kinds
            self.by_type[type(event)].append(event)
        lifecycle = [e for kind in _LIFECYCLE for e in self.by_type.get(kind, ())]
        starts = [earliest_ns(e) for e in lifecycle]
        ends = [e.ts for e in lifecycle]
        if selected.steps_from_ns is not None and selected.steps_to_ns is not None:
            starts.append(selected.steps_from_ns)  # every rank's steps, the folded ones too
            ends.append(selected.steps_to_ns)
        if not starts:
            raise ValueError(f"job {job!r} has no training events (steps, ranks, checkpoints)")
        self.t0_ns = min(starts)
        self.t1_ns = max(ends)
        self.end = self.sec(self.t1_ns)
        self.notes: list[str] = []
        self.restarts: list[float] = []  # when each restarted group was fully up
        started = self.of(schemas.RankStarted)
        self.started_times = sorted(self.sec(e.ts) for e in started)
        sizes = [e.world_size for e in started]
        if selected.step_rank is not None:
            sizes.append(selected.steps_world_size)
        self.nominal = max(nominal_world_size or max(sizes, default=1), 1)
        steps = self.of(schemas.StepDone)  # the reference rank's (selection folded the others)
        self.ref_rank = selected.step_rank if selected.step_rank is not None else 0
        if steps and self.ref_rank != 0:
            self.notes.append(
                f"no steps from rank 0: step completion taken from rank {self.ref_rank}"
            )
        if not steps:
            self.notes.append("no StepDone events: nothing counts as productive")

    def sec(self, ts_ns: int) -> float:
        return (ts_ns - self.t0_ns) / 1e9

    def of(self, kind: type[E]) -> list[E]:
        """The job's events of one kind, oldest first."""
        return self.by_type.get(kind, [])

    # -- pass 1: executions and runs ---------------------------------------------------------

    def restart_markers(self) -> list[float]:
        """Times after which the next step cannot continue the previous run."""
        return sorted(
            [self.sec(e.ts) for e in self.of(schemas.RankStarted)]
            + [self.sec(e.ts) for e in self.of(schemas.CheckpointRestored)]
            + [self.sec(e.ts) for e in self.of(schemas.RankExited) if is_failure_exit(e)]
        )

    def executions(self) -> tuple[list[Execution], list[Run]]:
        markers = self.restart_markers()
        done = self.of(schemas.StepDone)
        executions: list[Execution] = []
        runs: list[Run] = []
        for event in done:
            end = self.sec(event.ts)
            previous = executions[-1] if executions else None
            if previous is not None and (event.step, end) == (previous.step, previous.end):
                continue  # the same report twice
            marker_before = bisect.bisect_left(markers, end) - 1
            continuous = (
                previous is not None
                and event.step > previous.step
                and (marker_before < 0 or markers[marker_before] <= previous.end)
            )
            if continuous:
                assert previous is not None
                start = previous.end
                runs[-1].last = len(executions)
            else:
                floor = max(
                    markers[marker_before] if marker_before >= 0 else 0.0,
                    previous.end if previous is not None else 0.0,
                )
                start = max(end - event.step_time_s, floor)
                runs.append(Run(first=len(executions), last=len(executions)))
            executions.append(
                Execution(
                    step=event.step,
                    start=start,
                    end=end,
                    world_size=event.world_size,
                    run=len(runs) - 1,
                )
            )
        return executions, runs

    def mark_thrown_away(
        self, executions: list[Execution], outages: list[Outage], owner: Callable[[float], Outage]
    ) -> None:
        """An execution is thrown away if a later execution or restore goes back to or before
        it; it is charged to the cause of the outage that went back past it first (its restore's,
        or the one before the run that re-ran it)."""
        rollbacks = [(self.sec(e.ts), e.step + 1) for e in self.of(schemas.CheckpointRestored)]
        work = [Work(x.end, x.step, x.step) for x in executions]
        for execution, discard in zip(executions, discarded_by(work, rollbacks), strict=True):
            execution.productive = discard is None
            if discard is None:
                continue
            outage = (
                owner(rollbacks[discard.index][0])
                if discard.by_rollback
                else outages[executions[discard.index].run]  # the outage before its run
            )
            if outage.numerical:
                execution.lost_to = c.NUMERICAL_ROLLBACK

    # -- pass 2: outages and claims ----------------------------------------------------------

    @staticmethod
    def owner_of(outages: list[Outage]) -> Callable[[float], Outage]:
        """The outage a moment belongs to: the first that ends at or after it (a restart's
        events end before its run's first step begins)."""
        bounds = [outage.end for outage in outages]
        return lambda t: outages[min(bisect.bisect_left(bounds, t), len(outages) - 1)]

    def outages(self, executions: list[Execution], runs: list[Run]) -> list[Outage]:
        outages = []
        for k in range(len(runs) + 1):
            before = runs[k - 1] if k > 0 else None
            after = runs[k] if k < len(runs) else None
            start = executions[before.last].end if before else 0.0
            end = executions[after.first].start if after else self.end
            outages.append(Outage(start=start, end=end, before=before, after=after))
        decisions = self.of(schemas.Decision)
        acting = {d.signal_id: d for d in decisions if d.command_ids}
        owner = self.owner_of(outages)
        for exited in self.of(schemas.RankExited):
            if is_failure_exit(exited):
                owner(self.sec(exited.ts)).exits.append(exited)
        for signal in self.of(schemas.Signal):
            self.attach_signal(signal, acting.get(signal.signal_id), owner, executions)
        for outage in outages:
            ids = {s.signal_id for s in outage.signals}
            outage.decisions = [d for d in decisions if d.signal_id in ids]
            outage.numerical = any(s.signal in schemas.NUMERICAL_SIGNALS for s in outage.signals)
        return outages

    def attach_signal(
        self,
        signal: schemas.Signal,
        decision: schemas.Decision | None,
        owner: Callable[[float], Outage],
        executions: list[Execution],
    ) -> None:
        """A signal belongs to the outage that follows it if it stopped the run: it came at
        most one step before the run ended, or the controller acted on it."""
        fault = self.sec(signal.observed_ts or signal.ts)
        acted = decision is not None
        target = owner(self.sec(decision.ts) if decision is not None else fault)
        if signal.signal not in FAILURE_SIGNALS and not acted:
            return
        last_span_start = executions[target.before.last].start if target.before else 0.0
        if acted or fault >= last_span_start:
            target.signals.append(signal)

    def interruption_claims(
        self, outage: Outage, executions: list[Execution]
    ) -> tuple[list[Claim], Interruption | None]:
        failures = [s for s in outage.signals if s.signal in FAILURE_SIGNALS]
        fault_times = [self.sec(s.observed_ts or s.ts) for s in failures] + [
            self.sec(e.ts) for e in outage.exits
        ]
        fault = min(fault_times, default=None)
        detected = min((self.sec(s.ts) for s in failures), default=None)
        decided = min((self.sec(d.ts) for d in outage.decisions), default=None)
        first = (bisect.bisect_left if outage.before is None else bisect.bisect_right)(
            self.started_times, outage.start
        )
        started = self.started_times[first : bisect.bisect_right(self.started_times, outage.end)]
        claims: list[Claim] = []
        if fault is not None and outage.before is not None and fault >= outage.start:
            cut_short = c.NUMERICAL_ROLLBACK if outage.numerical else c.WASTED_PROGRESS
            claims.append(Claim(outage.start, fault, c.WASTED_PROGRESS, cut_short))
        if fault is not None and detected is not None:
            claims.append(Claim(fault, detected, c.FAILURE_DETECTION, c.FAILURE_DETECTION))
        if decided is not None:
            signalled = (
                detected if detected is not None else min(self.sec(s.ts) for s in outage.signals)
            )
            claims.append(Claim(signalled, decided, c.DECISION, c.DECISION))
        recovery_from = next((t for t in (decided, detected, fault) if t is not None), None)
        restarted = max(started, default=None)
        if restarted is not None and outage.before is not None:
            self.restarts.append(restarted)
        if recovery_from is not None and restarted is not None and restarted > recovery_from:
            claims.append(Claim(recovery_from, restarted, c.RESTART, c.RESTART))
            startup_from: float | None = restarted
        else:
            startup_from = min(started, default=None)
        if startup_from is not None and outage.after is not None:
            claims.append(Claim(startup_from, outage.end, c.PROGRAM_STARTUP, c.PROGRAM_STARTUP))
        if fault is None:
            return claims, None
        cause = ", ".join(
            sorted({s.signal for s in failures} | ({"rank_exit"} if outage.exits else set()))
        )
        acting = [d for d in outage.decisions if d.command_ids]
        acted_on = {d.signal_id for d in acting}
        # the fault the controller answered names the interruption (a lost node's ranks crash
        # before its heartbeats are missed: "node lost n1" says more than "crash rank 2")
        named = next((s for s in failures if s.signal_id in acted_on), None) or next(
            iter(failures), None
        )
        remedies = [remedy_label(d) for d in sorted(acting, key=lambda d: d.ts)]
        resumed = executions[outage.after.first].end if outage.after else None
        return claims, Interruption(
            fault_s=fault,
            cause=cause,
            fault=fault_label(named) if named is not None else exit_label(outage.exits[0]),
            remedy=" → ".join(dict.fromkeys(remedies)),
            detected_s=detected,
            decided_s=decided,
            restarted_s=restarted,
            resumed_s=resumed,
            repair_s=None if resumed is None else resumed - fault,
        )

    def event_claims(self, owner: Callable[[float], Outage]) -> list[Claim]:
        claims = []
        for saved in self.of(schemas.CheckpointSaved):
            end = self.sec(saved.ts)
            claims.append(Claim(end - saved.stall_s, end, c.CHECKPOINT_SAVE, c.CHECKPOINT_SAVE))
        for restored in self.of(schemas.CheckpointRestored):
            end = self.sec(restored.ts)
            category = c.NUMERICAL_ROLLBACK if owner(end).numerical else c.CHECKPOINT_RESTORE
            claims.append(Claim(end - restored.duration_s, end, c.CHECKPOINT_RESTORE, category))
        return claims

    # -- pass 3: split what kept executions kept ---------------------------------------------

    # -- assembly ----------------------------------------------------------------------------

    def report(self) -> GoodputReport:
        executions, runs = self.executions()
        outages = self.outages(executions, runs)
        owner = self.owner_of(outages)
        self.mark_thrown_away(executions, outages, owner)
        claims = self.event_claims(owner)
        claims += [Claim(x.start, x.end, WORK, index) for index, x in enumerate(executions)]
        failures: list[Interruption] = []
        for outage in outages:
            outage_claims, interruption = self.interruption_claims(outage, executions)
            claims += outage_claims
            if interruption is not None:
                failures.append(interruption)
        pieces = partition(claims, 0.0, self.end)

        totals: dict[str, float] = defaultdict(float)
        for piece in pieces:
            if piece.kind == WORK:
                executions[piece.execution].kept += piece.length
            else:
                totals[piece.category] += piece.length
        slowdown = step_time_deviation([KeptStep(x.kept, x.world_size, x.run) for x in executions])
        self.notes += slowdown.notes
        for index, x in enumerate(executions):
            if not x.productive:
                totals[x.lost_to] += x.kept
                continue
            excess = slowdown.excess.get(index, 0.0)
            idle = max(0, self.nominal - x.world_size) / self.nominal * (x.kept - excess)
            totals[c.STRAGGLER] += excess
            totals[c.SCALED_DOWN] += idle
            totals[c.PRODUCTIVE] += x.kept - excess - idle

        uptime = sum(executions[r.last].end - executions[r.first].start for r in runs)
        return summarize(
            job=self.job,
            source="events",
            start_ts_ns=self.t0_ns,
            end_ts_ns=self.t1_ns,
            totals=dict(totals),
            failures=failures,
            uptime_s=uptime,
            steps_productive=sum(x.productive for x in executions),
            steps_wasted=sum(not x.productive for x in executions),
            nominal_world_size=self.nominal,
            healthy_step_time_s=slowdown.medians,
            timeline=self.timeline(executions, pieces, failures),
            notes=self.notes,
        )

    def timeline(
        self, executions: list[Execution], pieces: list[Piece], failures: list[Interruption]
    ) -> Timeline:
        points = [
            StepPoint(t_s=x.end, step=x.step, productive=x.productive, world_size=x.world_size)
            for x in executions
        ]
        markers: list[Marker] = []
        for failure in failures:
            markers.append(
                Marker(
                    t_s=failure.fault_s, kind="failure", detail=failure.cause, label=failure.fault
                )
            )
            if failure.detected_s is not None:
                markers.append(Marker(t_s=failure.detected_s, kind="detected"))
        # every remediation of a signal (a fault's, a straggler's, a node's return), labelled
        # with its rule; the controller's own checkpoint-interval tuning answers no signal
        markers += [
            Marker(t_s=self.sec(d.ts), kind="decision", label=remedy_label(d))
            for d in self.of(schemas.Decision)
            if d.command_ids and d.signal_id
        ]
        markers += [Marker(t_s=t, kind="restart") for t in self.restarts]
        markers += [
            Marker(t_s=self.sec(e.ts), kind="checkpoint", detail=f"step {e.step}")
            for e in self.of(schemas.CheckpointPersisted)
            if e.rank == self.ref_rank
        ]
        markers += [
            Marker(t_s=self.sec(e.ts), kind="restore", detail=f"step {e.step} from {e.tier}")
            for e in self.of(schemas.CheckpointRestored)
            if e.rank == self.ref_rank
        ]
        markers += [
            Marker(t_s=self.sec(e.ts), kind="straggler", detail=e.node, label=fault_label(e))
            for e in self.of(schemas.Signal)
            if e.signal == "straggler"
        ]
        for previous, x in pairwise(executions):
            if x.world_size != previous.world_size:
                markers.append(
                    Marker(
                        t_s=x.start, kind="scale", detail=f"{previous.world_size} → {x.world_size}"
                    )
                )
        spans: list[Span] = []
        for piece in pieces:
            if piece.kind == WORK:
                execution = executions[piece.execution]
                category = c.PRODUCTIVE if execution.productive else execution.lost_to
            else:
                category = piece.category
            if spans and spans[-1].category == category:
                spans[-1] = Span(start_s=spans[-1].start_s, end_s=piece.end, category=category)
            else:
                spans.append(Span(start_s=piece.start, end_s=piece.end, category=category))
        return Timeline(
            steps=thin(points), markers=bound_markers(markers), spans=bound_spans(spans)
        )


def compute_events_goodput(
    events: Iterable[schemas.Event],
    *,
    job: str | None = None,
    nominal_world_size: int | None = None,
) -> GoodputReport:
    return _Accounting(select_job(events, job), nominal_world_size).report()
