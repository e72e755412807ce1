"""Straggler detection: each rank's compute time against the median of its peers at the same step.

Comparing within one step cancels what every rank shares (a checkpoint step, a slow data
shard, a machine-wide slowdown); the median of the *peers* (the rank itself left out) keeps a
2-rank job meaningful. A rank is flagged when the lower median of its last ``window`` ratios
reaches ``ratio``, i.e. when more than half of a full window of steps were that slow.

Why a long window, the *lower* median and a ratio of 1.25 (measured on a 2-core VM at load
4-11, traces in ``tests/sensor/traces/``): a healthy rank's per-step ratio scatters with a
log spread of 0.23, in bursts; ten steps at a median of 1.3-1.4× happen, while the lower median
of 20 steps stayed at or below 1.17×. The chaos tool's 1.5× straggler (a SIGSTOP duty cycle)
measures only 1.27-1.4× per step under that load, as its stops also land outside its compute.
More than half of a window must be slow, so a burst shorter than ``window // 2 + 1`` steps, of
any height, cannot flag a rank by itself, and a persistent straggler is found that many steps
after it slowed (15 steps for the recorded one). The rank must also have stayed slow for
``hold_s`` seconds (from when its lower median first reached the ratio, until it is back
under the halfway mark, the flag's own hysteresis) and be at the ratio then, before it is
flagged: on fast steps 20 steps are a few seconds, and a healthy rank sharing its cores with
a burst of other work was flagged after 2-4 s of it (`goodput bench detect` at 0.13-0.2 s
steps, one quiet run in four; and a rank just started on a spare, still warming up).
Contention comes and goes in seconds; a straggler worth evicting (a throttled GPU, a degraded
link) stays for minutes, so waiting ``hold_s`` costs little. A flag is cleared (and may fire again) once the lower median falls back below
halfway between 1 and ``ratio``.

Step reports are grouped by step number and judged when all ``world_size`` ranks reported,
or when reports ``lag_steps`` steps later arrive (a rank that never reports that step does
not hold the others back). A report for a step already judged is dropped.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque


class StragglerTracker:
    def __init__(self, ratio: float, window: int, hold_s: float, lag_steps: int = 3):
        self.ratio = ratio
        self.window = window
        self.hold_ns = int(hold_s * 1e9)
        self.lag_steps = lag_steps
        self._pending: dict[int, dict[int, float]] = {}
        self._expected: dict[int, int] = {}
        self._judged_upto = -1
        self._ratios: dict[int, deque[float]] = {}
        self._flagged: set[int] = set()
        #: since when (ns) each rank's lower median has been at the ratio
        self._slow_since: dict[int, int] = {}

    def configure(self, ratio: float, window: int, hold_s: float) -> None:
        """New thresholds; windows keep their newest ``window`` ratios."""
        self.ratio = ratio
        self.hold_ns = int(hold_s * 1e9)
        if window != self.window:
            self.window = window
            self._ratios = {rank: deque(r, maxlen=window) for rank, r in self._ratios.items()}

    def forget(self, rank: int) -> None:
        """The rank (re)started or left: its history says nothing about its new placement."""
        self._ratios.pop(rank, None)
        self._flagged.discard(rank)
        self._slow_since.pop(rank, None)

    def is_flagged(self, rank: int) -> bool:
        return rank in self._flagged

    def observe(
        self, rank: int, step: int, step_time_s: float, world_size: int, now: int
    ) -> list[tuple[int, float]]:
        """Record one report, received at ``now`` (ns); returns ``(rank, lower median ratio)``
        for ranks newly flagged."""
        if step <= self._judged_upto or step_time_s <= 0:
            return []
        reports = self._pending.setdefault(step, {})
        reports[rank] = step_time_s
        self._expected[step] = max(self._expected.get(step, 0), world_size)
        flagged: list[tuple[int, float]] = []
        if len(reports) >= self._expected[step]:
            flagged += self._judge(step, now)
        stale = [s for s in self._pending if s <= step - self.lag_steps]
        for old in sorted(stale):
            flagged += self._judge(old, now)
        return flagged

    def _judge(self, step: int, now: int) -> list[tuple[int, float]]:
        reports = self._pending.pop(step, {})
        self._expected.pop(step, None)
        self._judged_upto = max(self._judged_upto, step)
        if len(reports) < 2:
            return []
        ordered = sorted(reports.values())
        flagged = []
        for rank, seconds in reports.items():
            peer_median = _median_without(ordered, seconds)
            if peer_median <= 0:
                continue
            window = self._ratios.get(rank)
            if window is None:
                window = self._ratios[rank] = deque(maxlen=self.window)
            window.append(seconds / peer_median)
            if len(window) < self.window:
                continue
            typical = statistics.median_low(window)
            if typical < (1 + self.ratio) / 2:  # healthy again: the same hysteresis as a flag
                self._slow_since.pop(rank, None)
                self._flagged.discard(rank)
            elif typical >= self.ratio or rank in self._slow_since:
                since = self._slow_since.setdefault(rank, now)
                held = now - since >= self.hold_ns
                if held and rank not in self._flagged and typical >= self.ratio:
                    self._flagged.add(rank)
                    flagged.append((rank, typical))
        return flagged


def _median_without(ordered: list[float], value: float) -> float:
    """Median of sorted ``ordered`` with one occurrence of ``value`` removed, in O(log n)."""
    removed_at = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def at(index: int) -> float:
        return ordered[index] if index < removed_at else ordered[index + 1]

    middle = size // 2
    if size % 2:
        return at(middle)
    return (at(middle - 1) + at(middle)) / 2
