"""A rank's recent progress intervals, for a hang timeout built from its own step-time
distribution (a high quantile of the window, times a margin) rather than a guessed constant.

The window is kept twice: in arrival order (to drop the oldest) and sorted (so a quantile is a
lookup). An update costs O(window) memory moves, a quantile O(1): the sensor updates it once per
progress observation and reads it on every heartbeat, for tens of thousands of ranks.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque


class RecentIntervals:
    """The last ``size`` intervals (ns) of one rank, with their quantiles."""

    __slots__ = ("_order", "_sorted", "count")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._sorted: list[int] = []
        #: intervals held (a plain attribute: read on every heartbeat)
        self.count = 0

    def add(self, interval_ns: int, size: int) -> None:
        """Remember ``interval_ns``, keeping the newest ``size`` intervals."""
        self._order.append(interval_ns)
        insort(self._sorted, interval_ns)
        self.trim(size)

    def trim(self, size: int) -> None:
        while len(self._order) > size:
            del self._sorted[bisect_left(self._sorted, self._order.popleft())]
        self.count = len(self._order)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0 < q <= 1, linear between neighbours); 0.0 when empty."""
        values = self._sorted
        if not values:
            return 0.0
        position = q * (len(values) - 1)
        low = int(position)
        high = min(low + 1, len(values) - 1)
        return values[low] + (values[high] - values[low]) * (position - low)
