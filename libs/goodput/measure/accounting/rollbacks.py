"""Which work was kept: the rule both calculators share.

Work (a step, or a run of steps) is thrown away when later work, or a later checkpoint load,
starts again at or before its last step: the job went back past it, so it will be (or was)
done again. Everything else is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    end_s: float
    first_step: int
    last_step: int


def kept(work: Sequence[Work], rollbacks: Iterable[tuple[float, int]]) -> list[bool]:
    """For each piece of ``work``, whether it was kept; ``rollbacks`` are (time, step training
    resumes at) of checkpoint loads."""
    timeline = sorted(
        [(w.end_s, 1, index) for index, w in enumerate(work)]
        + [(t, 0, next_step) for t, next_step in rollbacks]
    )
    flags = [True] * len(work)
    lowest_later = float("inf")
    for _, is_work, value in reversed(timeline):
        if is_work:
            flags[value] = work[value].last_step < lowest_later
            lowest_later = min(lowest_later, work[value].first_step)
        else:
            lowest_later = min(lowest_later, value)
    return flags
