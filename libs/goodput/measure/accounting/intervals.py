"""Give every instant of a job's wall time exactly one owner.

Sources of lost time overlap (a checkpoint load happens during a restart; a straggler's
detection window overlaps steps that still complete). Each source *claims* an interval with
a precedence; at every instant the highest-precedence claim wins and unclaimed time goes to
a default owner. Because the result is a partition of ``[start, end]``, the categories add
up to the total by construction.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from goodput.measure.accounting import categories as c

#: label of the claims made by step executions (steps that completed), resolved per step later
WORK = "work"

#: who wins where claims overlap, strongest first (documented in docs/GOODPUT.md)
PRECEDENCE: tuple[str, ...] = (
    c.CHECKPOINT_RESTORE,
    c.CHECKPOINT_SAVE,
    WORK,
    c.WASTED_PROGRESS,
    c.FAILURE_DETECTION,
    c.DECISION,
    c.RESTART,
    c.PROGRAM_STARTUP,
)
_RANK = {name: position for position, name in enumerate(PRECEDENCE)}


@dataclass(frozen=True, slots=True)
class Claim:
    """``[start, end)`` in seconds belongs to ``owner`` unless a stronger claim covers it.

    ``kind`` is one of :data:`PRECEDENCE`; ``owner`` is the category key the time is
    charged to (the kind's own, or one its cause puts in its place: a numerical rollback's
    restore is ranked as a restore and charged to ``numerical_rollback``), or for ``WORK``
    claims the index of the step execution.
    """

    start: float
    end: float
    kind: str
    owner: str | int


@dataclass(frozen=True, slots=True)
class Piece:
    start: float
    end: float
    kind: str
    owner: str | int

    @property
    def length(self) -> float:
        return self.end - self.start

    @property
    def execution(self) -> int:
        """A ``WORK`` piece's owner: the index of its step execution."""
        if not isinstance(self.owner, int):
            raise TypeError(f"a {self.kind} piece is owned by {self.owner!r}, no step execution")
        return self.owner

    @property
    def category(self) -> str:
        """Any other piece's owner: the category its time is charged to."""
        if not isinstance(self.owner, str):
            raise TypeError(f"a {self.kind} piece is owned by step execution {self.owner}")
        return self.owner


def partition(claims: Iterable[Claim], start: float, end: float) -> list[Piece]:
    """Split ``[start, end]`` into pieces, each owned by the strongest claim covering it.

    Time no claim covers belongs to :data:`~goodput.measure.accounting.categories.JOB_DOWN`.
    Adjacent pieces with the same owner are merged.
    """
    clipped = sorted(
        (
            Claim(max(claim.start, start), min(claim.end, end), claim.kind, claim.owner)
            for claim in claims
            if min(claim.end, end) > max(claim.start, start)
        ),
        key=lambda claim: claim.start,
    )
    points = sorted({start, end, *(x for claim in clipped for x in (claim.start, claim.end))})
    active: list[tuple[int, int]] = []  # (precedence rank, claim index); lazily expired
    next_claim = 0
    pieces: list[Piece] = []
    for left, right in pairwise(points):
        while next_claim < len(clipped) and clipped[next_claim].start <= left:
            heapq.heappush(active, (_RANK[clipped[next_claim].kind], next_claim))
            next_claim += 1
        while active and clipped[active[0][1]].end <= left:
            heapq.heappop(active)
        if active:
            winner = clipped[active[0][1]]
            kind, owner = winner.kind, winner.owner
        else:
            kind, owner = c.JOB_DOWN, c.JOB_DOWN
        if pieces and pieces[-1].owner == owner and pieces[-1].kind == kind:
            pieces[-1] = Piece(pieces[-1].start, right, kind, owner)
        else:
            pieces.append(Piece(left, right, kind, owner))
    return pieces
