"""Where the timeline's labels go, so that close markers do not overprint.

Labels stand rotated upright above their markers, in stacked lanes (lane 0 nearest the plot).
Going left to right, a label takes the lowest lane whose last label is at least ``gap_px`` to
its left (a rotated label is one text line wide); when no lane has room it is not drawn but
counted on the nearest drawn label to its left, which then reads ``+k`` (so does a marker
that aggregates ``k + 1``: ``Marker.count``). A fault and its
remediation seconds apart so take two lanes, and a long run's hundreds of faults thin to what
the width can show, none lost from the count. Pure: no matplotlib, a plot passes the pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


class Placement(NamedTuple):
    """One label that is drawn."""

    #: its position in the labels laid out
    position: int
    #: 0: nearest the plot
    lane: int
    #: the markers beyond its own first that it stands for (its ``+k``): the rest of its own
    #: (an aggregated marker's) and those of the labels too close to draw after it
    others: int = 0


def place_labels(
    xs_px: Sequence[float],
    *,
    gap_px: float,
    lanes: int,
    counts: Sequence[int] | None = None,
) -> list[Placement]:
    """The labels at ``xs_px`` (ascending pixel positions) that are drawn, and where;
    ``counts``: how many markers each label stands for (default: one each)."""
    if lanes < 1 or gap_px <= 0:
        raise ValueError(f"need at least one lane and a positive gap, not {lanes}, {gap_px}")
    weights = counts if counts is not None else [1] * len(xs_px)
    last_x = [-math.inf] * lanes
    placed: list[Placement] = []
    for index, (x, count) in enumerate(zip(xs_px, weights, strict=True)):
        lane = next((k for k in range(lanes) if x - last_x[k] >= gap_px), None)
        if lane is None:  # the first label always has room: placed is not empty
            placed[-1] = placed[-1]._replace(others=placed[-1].others + count)
            continue
        last_x[lane] = x
        placed.append(Placement(position=index, lane=lane, others=count - 1))
    return placed


def with_count(text: str, others: int) -> str:
    """A drawn label's text, with the markers it stands for beyond its own counted."""
    return f"{text} +{others}" if others else text
