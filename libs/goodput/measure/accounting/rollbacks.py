"""Which work was kept, and what threw the rest away: the rule both calculators share.

Work (a step, or a run of steps) is thrown away when later work, or a later checkpoint load,
starts again at or before its last step: the job went back past it, so it will be (or was)
done again. Everything else is kept. What threw it away is the *first* such load or work: the
moment the job went back past it (a later, deeper rollback throws away the re-executions, not
work already lost), which is what tells a numerical rollback's loss from a crash's.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    end_s: float
    first_step: int
    last_step: int


@dataclass(frozen=True)
class Discard:
    """What threw a piece of work away: ``rollbacks[index]`` when ``by_rollback``, else the
    later ``work[index]`` (a restart that re-ran the steps without a load to say so)."""

    by_rollback: bool
    index: int


def discarded_by(
    work: Sequence[Work], rollbacks: Sequence[tuple[float, int]]
) -> list[Discard | None]:
    """For each piece of ``work``, the first later rollback or work that went back to or before
    its last step (None: kept); ``rollbacks`` are (time, step training resumes at) of
    checkpoint loads. A load that ends when a piece of work does counts as before it.

    One backwards sweep, O(n log n): the candidates later than the current time that no nearer
    candidate dominates (a nearer one going back as far or further) form a stack whose steps
    rise towards the nearest; the first to discard a piece is the nearest with a step at or
    below the piece's last step.
    """
    timeline = sorted(
        [(w.end_s, 1, index) for index, w in enumerate(work)]
        + [(t, 0, index) for index, (t, _) in enumerate(rollbacks)]
    )
    found: list[Discard | None] = [None] * len(work)
    steps: list[int] = []  # the stack's steps, farthest first (strictly rising)
    owners: list[int] = []  # its candidates: a work index, or ~index of a rollback
    for _, is_work, index in reversed(timeline):
        if is_work:
            last = work[index].last_step
            if steps and steps[0] <= last:  # something later goes back past it
                owner = owners[bisect.bisect_right(steps, last) - 1]
                found[index] = Discard(by_rollback=owner < 0, index=~owner if owner < 0 else owner)
            step, candidate = work[index].first_step, index
        else:
            step, candidate = rollbacks[index][1], ~index
        while steps and steps[-1] >= step:  # farther and going back no further: dominated
            steps.pop()
            owners.pop()
        steps.append(step)
        owners.append(candidate)
    return found


def kept(work: Sequence[Work], rollbacks: Sequence[tuple[float, int]]) -> list[bool]:
    """For each piece of ``work``, whether it was kept (nothing threw it away)."""
    return [discard is None for discard in discarded_by(work, rollbacks)]
