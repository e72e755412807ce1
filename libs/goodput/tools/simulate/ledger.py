"""Where the simulated job's time goes: every second to one category of ``goodput report``.

The categories are :mod:`goodput.measure.accounting.categories`' (one owner). Training time is split
as the calculator splits kept step time (straggler excess, then the scaled-down share, then
productive); work done since the checkpoint a restart goes back to is moved to
``wasted_progress`` when that restart restores it, as the calculator throws away executions
that are run again. A stall nobody remediates (waiting for a repair) is ``job_down`` — unless
a relaunch ends it: then, as the calculator claims the time from a decision to the ranks
started again, it is ``restart_reprovision``.
"""

from __future__ import annotations

from dataclasses import dataclass

from goodput.measure.accounting.categories import (
    BADPUT_KEYS,
    CHECKPOINT_RESTORE,
    CHECKPOINT_SAVE,
    DECISION,
    FAILURE_DETECTION,
    JOB_DOWN,
    PRODUCTIVE,
    PROGRAM_STARTUP,
    RESTART,
    SCALED_DOWN,
    STRAGGLER,
    WASTED_PROGRESS,
)

#: job phases and the category their time goes to ("running" is split, see above)
PHASE_CATEGORY = {
    "saving": CHECKPOINT_SAVE,
    "detect": FAILURE_DETECTION,
    "decide": DECISION,
    "restart": RESTART,
    "restore": CHECKPOINT_RESTORE,
    "startup": PROGRAM_STARTUP,
    "down": JOB_DOWN,
}
WORK = (PRODUCTIVE, STRAGGLER, SCALED_DOWN)


@dataclass(frozen=True, slots=True)
class WorkMark:
    """The training-time totals at a moment (a checkpoint's capture), to roll back to."""

    productive: float
    straggler: float
    scaled_down: float


class Ledger:
    """Accumulates seconds per category as the job changes phase (times in ns)."""

    def __init__(self, start_ns: int, nominal_nodes: int):
        self.seconds: dict[str, float] = dict.fromkeys((PRODUCTIVE, *BADPUT_KEYS), 0.0)
        self.phase = "startup"
        self._since = start_ns
        self._nominal = nominal_nodes
        self._nodes = nominal_nodes
        self._slowdown = 1.0
        self._down_s = 0.0

    def switch(self, now: int, phase: str) -> None:
        """The job enters ``phase`` at ``now``; the time since the last switch is booked."""
        self.book(now)
        if self.phase == "down" and phase == "restart":
            self.add(RESTART, self._down_s, taken_from=JOB_DOWN)
        if phase != self.phase:
            self._down_s = 0.0
        self.phase = phase

    def set_shape(self, now: int, nodes: int, slowdown: float) -> None:
        """Training from ``now`` on runs on ``nodes`` nodes, ``slowdown`` × slower."""
        self.book(now)
        self._nodes, self._slowdown = nodes, slowdown

    def book(self, now: int) -> None:
        elapsed = (now - self._since) / 1e9
        self._since = now
        if elapsed <= 0:
            return
        if self.phase != "running":
            self.seconds[PHASE_CATEGORY[self.phase]] += elapsed
            if self.phase == "down":
                self._down_s += elapsed
            return
        excess = elapsed * (1 - 1 / self._slowdown)
        rest = elapsed - excess
        idle = rest * max(0, self._nominal - self._nodes) / self._nominal
        self.seconds[STRAGGLER] += excess
        self.seconds[SCALED_DOWN] += idle
        self.seconds[PRODUCTIVE] += rest - idle

    def mark(self, now: int) -> WorkMark:
        self.book(now)
        s = self.seconds
        return WorkMark(s[PRODUCTIVE], s[STRAGGLER], s[SCALED_DOWN])

    def roll_back(self, now: int, to: WorkMark) -> float:
        """Training since ``to`` is thrown away; returns the seconds moved to wasted."""
        self.book(now)
        s = self.seconds
        moved = 0.0
        for key, then in zip(WORK, (to.productive, to.straggler, to.scaled_down), strict=True):
            lost = max(0.0, s[key] - then)
            s[key] -= lost
            moved += lost
        s[WASTED_PROGRESS] += moved
        return moved

    def add(self, category: str, seconds: float, *, taken_from: str = "") -> None:
        """Re-book ``seconds`` (a stall inside training) from ``taken_from`` to ``category``."""
        self.seconds[category] += seconds
        if taken_from:
            self.seconds[taken_from] -= seconds

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def goodput_pct(self) -> float:
        total = self.total_s
        return 100.0 * self.seconds[PRODUCTIVE] / total if total else 0.0

    def badput(self) -> dict[str, float]:
        return {key: self.seconds[key] for key in BADPUT_KEYS}
