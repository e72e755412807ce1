"""What a real run's events say its checkpoints and remediations cost: the input of a replay.

``goodput demo --json`` carries this (``replay.costs``) so that ``goodput simulate replay`` can
price the same faults with what this machine measured, instead of a profile's guesses. Unit
costs are means over the reference rank's (rank 0) reports; each remediation's own cost is
measured as ``goodput report`` splits it: from the decision to the new attempt's ranks started
(a restart's relaunch, which an ``ActionResult``'s duration does not show: it is answered once
the processes are spawned), the checkpoint load (the union of every rank's: a rank whose load
ends after rank 0's is charged too), then start-up until the first step began;
and how long the old attempt went on training after the decision (a scale-up stops it only
once the new ranks are ready: 0.7–19 s of a 5–23 s relaunch in the demos). Steps are priced
per phase (the first attempt, then after each remediation): a job scaled down runs at a
different step time, and load on a shared machine changes it from one attempt to the next,
so one mean for the whole run misprices every phase but the average one; the median step
says the machine's pace (its load) apart from the job's own bursts. Each phase also keeps its
steps one by one (``steps_s``: each step's span from rank 0's previous step, less the saves in
it, as :mod:`goodput.measure.accounting.calculator` keeps it) and its saves (``saves_s``: rank
0's stall, which the controller's interval rule reads, and how long the job waited, the union
of every rank's stall, which the calculator charges): on a loaded machine the step after a
save, or one the load caught, runs 1.5–2× the phase's median and is charged as slowdown, flagged
or not, and another rank's save stalls the job beyond rank 0's own (a loaded demo's saves were
charged 0.14 s, priced 0.04 s at rank 0's mean). Seconds throughout;
``checkpoint_gb`` (rank 0's state, which ``goodput simulate predict`` prices) is no cost.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from goodput import schemas

#: the kinds of the commands that relaunch the worker group (``Command.restarts_group``)
RELAUNCHING = frozenset(schemas.kind_of(t) for t in schemas.COMMAND_TYPES if t.restarts_group)


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 4) if values else 0.0


@dataclass
class _Open:
    """A remediation from its decision until training's first step after it."""

    action: str
    decided_ns: int
    #: the old attempt's last step after the decision: a scale-up, for one, keeps the job
    #: training while it prepares the new ranks (0: none)
    trained_to_ns: int = 0
    trained_steps: int = 0
    #: the last rank started, else (an in-process restart of every rank) the last rejoined:
    #: `goodput report` ends the relaunch at a rank started
    started_ns: int = 0
    rejoined_ns: int = 0

    #: every rank's checkpoint load (start, end ns): the calculator charges their union
    loads: list[tuple[int, int]] = field(default_factory=list)
    #: the step rank 0 restored (every rank restores the same)
    restored_step: int | None = None

    @property
    def up_ns(self) -> int:
        return self.started_ns or self.rejoined_ns

    @property
    def restore_s(self) -> float:
        return _length(_merged(self.loads)) / 1e9


def measured_costs(
    events: Iterable[schemas.Event],
    faults: Sequence[tuple[int, int]] = (),
    slow_windows: Sequence[tuple[int, int]] = (),
) -> dict:
    """The run's costs. ``faults``: when each injected fault struck (epoch ns) and the step it
    was fired at, whose ``fault_delays_s`` say how long after that step was done;
    ``slow_windows``: (start, end) epoch ns of each injected straggler, whose measured
    ``slowdowns`` are the job's mean step time inside it over the healthy one, and
    ``slowed_steps`` each of its steps' over its phase's healthy step before it struck (a
    slowdown is not steady: under a moving load a 3× straggler faded to 1.3-1.6× while its
    window still ran), and ``slowed_after_step_s`` the healthy step of the same phase after
    it ended (None: a relaunch ended it, or the phase did)."""
    ordered = sorted(schemas.expand_all(events), key=lambda e: e.ts)
    actions = {
        e.command_id: e.action
        for e in ordered
        if isinstance(e, schemas.ActionResult) and e.ok and e.action in RELAUNCHING
    }
    #: rank 0's steps per phase: the first attempt's, then those after each remediation
    phases: list[list[schemas.StepDone]] = [[]]
    stalls, persists, sizes = [], [], []
    #: every rank's save stall as (start ns, end ns, step, rank): the job waits for them all
    saves: list[tuple[int, int, int, int]] = []
    signals: dict[str, int] = {}
    decisions: list[float] = []
    remediations: list[dict] = []
    first_start_ns: int | None = None
    first_startup_s: float | None = None
    current: _Open | None = None
    relaunched: list[int] = []
    for event in ordered:
        match event:
            case schemas.StepDone(rank=0):
                began = event.ts - int(event.step_time_s * 1e9)
                if first_startup_s is None and first_start_ns is not None:
                    first_startup_s = max(0.0, (began - first_start_ns) / 1e9)
                if current is not None and current.up_ns:
                    remediations.append(_closed(current, began))
                    phases.append([])
                    current = None
                elif current is not None:
                    current.trained_to_ns = event.ts
                    current.trained_steps += 1
                phases[-1].append(event)
            case schemas.RankStarted():
                if first_start_ns is None:
                    first_start_ns = event.ts
                if current is not None:
                    current.started_ns = max(current.started_ns, event.ts)
            case schemas.RankRejoined() if current is not None:
                current.rejoined_ns = max(current.rejoined_ns, event.ts)
            case schemas.CheckpointRestored() if current is not None and event.rank >= 0:
                current.loads.append((event.ts - int(event.duration_s * 1e9), event.ts))
                if event.rank == 0:
                    current.restored_step = event.step
            case schemas.CheckpointSaved():
                start = event.ts - int(event.stall_s * 1e9)
                saves.append((start, event.ts, event.step, event.rank))
                if event.rank == 0:
                    stalls.append(event.stall_s)
                    sizes.append(event.bytes / 1e9)
            case schemas.CheckpointPersisted(rank=0):
                persists.append(event.duration_s)
            case schemas.Signal():
                signals.setdefault(event.signal_id, event.ts)
            case schemas.Decision():
                if event.signal_id in signals:
                    decisions.append((event.ts - signals[event.signal_id]) / 1e9)
                relaunch = next((actions[c] for c in event.command_ids if c in actions), None)
                if relaunch is not None:
                    current = _Open(relaunch, event.ts)
                    relaunched.append(event.ts)
    # a straggler's effect ends with the first relaunch after it began (an eviction)
    windows = [
        (start, min([end, *(t for t in relaunched if t > start)])) for start, end in slow_windows
    ]
    cut = [window[1] != end for window, (_, end) in zip(windows, slow_windows, strict=True)]
    steps = [step for phase in phases for step in phase]
    healthy_times = _healthy_times(steps, windows)
    healthy = round(statistics.fmean(healthy_times), 4) if healthy_times else 0.0
    # the median says the machine's pace, which the job's own bursts (a standby built beside
    # it, the first steps after a restart) do not move
    median = round(statistics.median(healthy_times), 4) if healthy_times else 0.0
    # a phase a straggler struck is priced at its pace until then: the load around a window
    # changes (a loaded demo's phase stepped at 0.52 s on average and 0.44 s after the window,
    # and a replay stepping on at the mean counted them a straggler's excess to the next fault)
    phase_step_s = [
        _healthy_step_s(_before(phase, windows), windows) or _healthy_step_s(phase, windows)
        for phase in phases
    ]
    struck = [_phase_at(w[0], phases) for w in windows]
    #: each straggler's steps, the healthy step time of its phase before it, and after it
    slowed = [
        (
            [s.step_time_s for s in steps if w[0] <= s.ts <= w[1]],
            (phase_step_s[p] if p is not None else None) or healthy,
            None if p is None or ended else _healthy_step_s(_after(phases[p], w), windows),
        )
        for w, p, ended in zip(windows, struck, cut, strict=True)
    ]
    union = _merged([(start, end) for start, end, _, _ in saves])
    by_phase = _saves_by_phase(saves, phases)
    paces = [
        _pace(phase, saved, union, windows) for phase, saved in zip(phases, by_phase, strict=True)
    ]
    for remediation, step_s, pace in zip(remediations, phase_step_s[1:], paces[1:], strict=True):
        remediation |= {"step_time_s": step_s, **pace}
    lifecycle_end = max((e.ts for e in ordered if _ends_run(e)), default=0)
    return {
        "step_time_s": healthy,
        "median_step_time_s": median,
        "first_step_time_s": phase_step_s[0],
        "first_steps_s": paces[0]["steps_s"],
        "first_saves_s": paces[0]["saves_s"],
        "checkpoint_stall_s": _mean(stalls),
        "checkpoint_persist_s": _mean(persists),
        # not a cost: the job's state per rank, which a forward prediction prices
        "checkpoint_gb": round(statistics.fmean(sizes), 6) if sizes else 0.0,
        "first_startup_s": round(first_startup_s or 0.0, 4),
        "shutdown_s": round(max(0, lifecycle_end - steps[-1].ts) / 1e9, 4) if steps else 0.0,
        "decision_s": _mean(decisions),
        "remediations": remediations,
        "slowdowns": [_slowdown(inside, healthy) for inside, healthy, _ in slowed],
        "slowed_steps": [_factors(inside, healthy) for inside, healthy, _ in slowed],
        "slowed_after_step_s": [after for _, _, after in slowed],
        "fault_delays_s": [_delay(steps, at_ns, step) for at_ns, step in faults],
    }


def _closed(remediation: _Open, first_step_began_ns: int) -> dict:
    relaunch = (remediation.up_ns - remediation.decided_ns) / 1e9
    startup = (first_step_began_ns - remediation.up_ns) / 1e9 - remediation.restore_s
    trained_on = (remediation.trained_to_ns - remediation.decided_ns) / 1e9
    return {
        "action": remediation.action,
        "relaunch_s": round(max(0.0, relaunch), 4),
        "trained_on_s": round(max(0.0, trained_on), 4),
        "trained_on_steps": remediation.trained_steps,
        "restore_s": round(remediation.restore_s, 4),
        "restored_step": remediation.restored_step,
        "startup_s": round(max(0.0, startup), 4),
    }


def _delay(steps: list[schemas.StepDone], at_ns: int, step: int) -> float:
    """Seconds from the (latest) completion of ``step`` to the fault, which fired after it."""
    done = [s.ts for s in steps if s.step == step and s.ts <= at_ns]
    return round((at_ns - max(done)) / 1e9, 4) if done else 0.0


def _ends_run(event: schemas.Event) -> bool:
    """The events the goodput calculator bounds a run's accounting window with."""
    return isinstance(
        event,
        schemas.RankExited | schemas.StepDone | schemas.CheckpointSaved
        | schemas.CheckpointPersisted | schemas.CheckpointRestored,
    )  # fmt: skip


def _inside(ts: int, windows: Sequence[tuple[int, int]]) -> bool:
    return any(start <= ts <= end for start, end in windows)


def _healthy_times(steps: list[schemas.StepDone], slow: Sequence[tuple[int, int]]) -> list[float]:
    """The step times outside stragglers' windows (the job's time per step, load included)."""
    return [s.step_time_s for s in steps if not _inside(s.ts, slow)]


def _healthy_step_s(steps: list[schemas.StepDone], slow: Sequence[tuple[int, int]]) -> float | None:
    """The mean of :func:`_healthy_times`; None without such a step."""
    times = _healthy_times(steps, slow)
    return round(statistics.fmean(times), 4) if times else None


def _began(phase: list[schemas.StepDone]) -> int:
    return phase[0].ts - int(phase[0].step_time_s * 1e9)


def _phase_at(ts: int, phases: list[list[schemas.StepDone]]) -> int | None:
    """The index of the phase that was running at ``ts``."""
    running = None
    for index, phase in enumerate(phases):
        if phase and _began(phase) <= ts:
            running = index
    return running


def _before(phase: list[schemas.StepDone], windows: Sequence[tuple[int, int]]) -> list:
    """The phase's steps before the first straggler window that began inside it."""
    if not phase:
        return phase
    starts = [start for start, _ in windows if _began(phase) <= start <= phase[-1].ts]
    return [s for s in phase if s.ts < min(starts)] if starts else phase


def _after(phase: list[schemas.StepDone], window: tuple[int, int]) -> list:
    return [s for s in phase if s.ts > window[1]]


def _saves_by_phase(
    saves: list[tuple[int, int, int, int]], phases: list[list[schemas.StepDone]]
) -> list[dict[int, list[tuple[int, int, int]]]]:
    """Every rank's saves (start, end, rank) by step, per phase: the phase running when it
    ended (a stopped attempt's save is its own), the first phase's before it began (the save
    of step 0). One pass, a bisection each: a large job saves 16,000 ranks at a time."""
    began = [(_began(phase), index) for index, phase in enumerate(phases) if phase]
    starts = [ts for ts, _ in began]
    by_phase: list[dict[int, list[tuple[int, int, int]]]] = [defaultdict(list) for _ in phases]
    for start, end, step, rank in saves:
        at = bisect.bisect_right(starts, end) - 1
        by_phase[began[at][1] if at >= 0 else 0][step].append((start, end, rank))
    return by_phase


def _pace(
    phase: list[schemas.StepDone],
    saved: dict[int, list[tuple[int, int, int]]],
    union: list[tuple[int, int]],
    windows: Sequence[tuple[int, int]],
) -> dict[str, list[list[float]]]:
    """A phase's steps and saves one by one, as [step, seconds] pairs: each step's span as the
    calculator takes it (from the previous step's end; the phase's first, its own time) less
    the saves in it (``union``: every rank's stalls, merged), outside stragglers' windows
    (their slowdown is measured apart); and each of its saves (``saved``) as [step, rank 0's
    stall, the job's wait]: the union of every rank's stall, which the calculator charges,
    where the controller prices the interval with rank 0's."""
    steps: list[list[float]] = []
    for previous, step in zip([None, *phase], phase, strict=False):
        if not _inside(step.ts, windows):
            span = step.step_time_s
            if previous is not None:
                span = (step.ts - previous.ts - _overlap(union, previous.ts, step.ts)) / 1e9
            steps.append([step.step, round(max(span, 0.0), 4)])
    stalls: list[list[float]] = []
    for saved_step, spans in sorted(saved.items()):
        waited = _length(_merged([(start, end) for start, end, _ in spans])) / 1e9
        own = next(((e - s) / 1e9 for s, e, rank in spans if rank == 0), waited)
        stalls.append([saved_step, round(own, 4), round(waited, 4)])
    return {"steps_s": steps, "saves_s": stalls}


def _length(merged: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in merged)


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``intervals`` as disjoint intervals, oldest first."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(merged: list[tuple[int, int]], lo: int, hi: int) -> int:
    """How much of (``lo``, ``hi``] the disjoint ``merged`` intervals cover (ns)."""
    first = max(bisect.bisect_right(merged, (lo, lo)) - 1, 0)
    covered = 0
    for start, end in merged[first:]:
        if start >= hi:
            break
        covered += max(0, min(end, hi) - max(start, lo))
    return covered


def _factors(inside: list[float], healthy: float) -> list[float]:
    """Each step's time over the healthy one (none without a healthy step to compare with)."""
    return [round(t / healthy, 3) for t in inside] if healthy > 0 else []


def _slowdown(inside: list[float], healthy: float) -> float:
    if not inside or healthy <= 0:
        return 1.0
    return round(max(1.0, statistics.fmean(inside) / healthy), 4)
