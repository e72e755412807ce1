"""The simulated clock's units and what the simulator keeps per rank the sensor follows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

NS = 1_000_000_000
#: the simulated clock's origin (epoch ns): the sensor treats 0 as "never"
T0 = 1_700_000_000 * NS


@dataclass(slots=True)
class FedRank:
    """A rank the sensor knows of: what the simulator keeps sending for it."""

    node: str
    heartbeating: bool = True
    stepping: bool = True
    busy: str = ""
    last_beat: int = 0
    compute_factor: float = 1.0


@dataclass(frozen=True, slots=True)
class Slowing:
    """How much slower the job steps while a node straggles: ``mean`` throughout, or a
    replay's measured ``steps``, one factor per step from ``from_step`` on (a straggler's
    slowdown is not steady: on a loaded machine a 3× one faded to 1.3-1.6× while its window
    still ran, and the calculator stopped counting it at the first step back within 10 %);
    and a replay's step time once it ends (``after_step_s``) in the attempt it struck."""

    mean: float
    steps: tuple[float, ...] = ()
    from_step: int = 0
    after_step_s: float | None = None
    attempt: int = 0

    def at(self, step: int) -> float:
        offset = step - self.from_step
        return self.steps[offset] if 0 <= offset < len(self.steps) else self.mean


@dataclass(frozen=True, slots=True)
class Pace:
    """A replayed phase's steps and saves as its run measured them, by step (seconds): a
    loaded machine's steps are not one constant (the step after a save, or one the load
    caught, ran 1.5-2x the phase's median, and the calculator charges it as slowdown), and the
    job waits for every rank's save, not only rank 0's. A step or save the run did not make
    in that phase is priced at the phase's step time, and a save at the profile's stall and the
    run's mean wait."""

    steps: Mapping[int, float] = field(default_factory=dict)
    #: per step saved: (rank 0's stall, which the controller hears, the job's wait for every
    #: rank's, which the calculator charges)
    saves: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    #: the job's mean wait for a save, for one the run did not make (None: rank 0's stall)
    save_wait_s: float | None = None

    def step_s(self, step: int, healthy_s: float, slowdown: float) -> float:
        """``step``'s time: as measured, unless a straggler slows it (its factor prices it
        over the phase's healthy step: a run measures a straggler's window apart)."""
        if slowdown == 1.0 and step in self.steps:
            return self.steps[step]
        return healthy_s * slowdown

    def save_s(self, step: int, stall_s: float) -> tuple[float, float]:
        """A save of ``step``: (rank 0's stall, the job's wait); ``stall_s``: the profile's."""
        return self.saves.get(step) or (stall_s, max(stall_s, self.save_wait_s or 0.0))


@dataclass(frozen=True, slots=True)
class RemediationCost:
    """What one remediation of a replayed run cost, measured from its events (seconds)."""

    #: decision -> the new attempt's ranks started
    relaunch_s: float
    restore_s: float
    #: ranks started (and restored) -> the first step began
    startup_s: float
    #: the step the ranks restored (None: none, or not measured)
    restored_step: int | None = None
    #: the mean step time of the phase it started (None: not measured; the run's mean holds)
    step_time_s: float | None = None
    #: the old attempt went on training this long after the decision (part of ``relaunch_s``),
    #: doing this many steps (slower than its phase's while the new ranks start beside it)
    trained_on_s: float = 0.0
    trained_on_steps: int = 0
    #: the steps and saves of the phase it started, one by one
    pace: Pace = field(default_factory=Pace)

    @property
    def trained_on_pace_s(self) -> float:
        """The old attempt's step time while it trained on (call when it did steps)."""
        return self.trained_on_s / self.trained_on_steps


class MeasuredCosts:
    """A replayed run's remediations, handed out per action in the order the run met them.

    When the simulation relaunches more often than the run did, a further one of an action
    costs the mean of that action's (or, none measured, of every) remediation.
    """

    def __init__(
        self,
        by_action: dict[str, list[RemediationCost]],
        first_startup_s: float,
        first_step_time_s: float | None = None,
        first_pace: Pace | None = None,
    ):
        """``first_step_time_s``: the first attempt's mean step time (None: the run's mean);
        ``first_pace``: its steps and saves one by one."""
        self.first_startup_s = first_startup_s
        self.first_step_time_s = first_step_time_s
        self.first_pace = first_pace or Pace()
        self._left = {action: list(costs) for action, costs in by_action.items()}
        everything = [c for costs in by_action.values() for c in costs]
        self._means = {a: _mean_cost(c) for a, c in by_action.items() if c}
        self._overall = _mean_cost(everything) if everything else None

    def next(self, action: str) -> RemediationCost | None:
        left = self._left.get(action)
        if left:
            return left.pop(0)
        return self._means.get(action, self._overall)


def _mean_cost(costs: list[RemediationCost]) -> RemediationCost:
    n = len(costs)
    return RemediationCost(
        relaunch_s=sum(c.relaunch_s for c in costs) / n,
        restore_s=sum(c.restore_s for c in costs) / n,
        startup_s=sum(c.startup_s for c in costs) / n,
    )
