"""Deadlines for many keys, cheap to refresh: the heart of a sensor that scales to 10,000 nodes.

A heartbeat only moves a rank's "last seen" time forward, so pushing a heap entry per
heartbeat would be wasted work. Instead each key keeps at most one live entry holding the
*earliest* deadline it could have; refreshing a key to a later deadline is a no-op (O(1)).
When an entry comes due, the caller recomputes the real deadline from its own records and
re-arms the key if it is not due yet, so each key costs one heap push per timeout period
rather than one per event, and :meth:`due` touches only keys whose entry has come due.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class DeadlineQueue(Generic[K]):
    """A min-heap of (deadline, key) with lazy deletion; at most one live entry per key."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, K]] = []
        self._armed: dict[K, int] = {}
        # a tie-breaker, so keys never need to be comparable
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._armed)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a live entry (it will come due, or be re-armed by its check)."""
        return key in self._armed

    def arm(self, key: K, deadline_ns: int) -> None:
        """Make sure ``key`` comes due no later than ``deadline_ns`` (a later one is a no-op)."""
        current = self._armed.get(key)
        if current is not None and current <= deadline_ns:
            return
        self._armed[key] = deadline_ns
        self._sequence += 1
        heapq.heappush(self._heap, (deadline_ns, self._sequence, key))

    def disarm(self, key: K) -> None:
        self._armed.pop(key, None)

    def clear(self) -> None:
        self._heap.clear()
        self._armed.clear()

    def next_deadline(self) -> int | None:
        """The earliest armed deadline (epoch ns), or None when nothing is armed."""
        while self._heap:
            deadline, _, key = self._heap[0]
            if self._armed.get(key) == deadline:
                return deadline
            heapq.heappop(self._heap)
        return None

    def due(self, now_ns: int) -> list[K]:
        """Pop and return the keys whose deadline is at or before ``now_ns`` (they are disarmed)."""
        keys: list[K] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            deadline, _, key = heapq.heappop(heap)
            if self._armed.get(key) == deadline:
                del self._armed[key]
                keys.append(key)
        return keys
