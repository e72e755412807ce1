"""The simulated clock's units and what the simulator keeps per rank the sensor follows."""

from __future__ import annotations

from dataclasses import dataclass

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
    ):
        """``first_step_time_s``: the first attempt's mean step time (None: the run's mean)."""
        self.first_startup_s = first_startup_s
        self.first_step_time_s = first_step_time_s
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
