"""A run's step reports as its nodes publish them rolled up, through the shim's own rollup
(``goodput.shim.step_rollup``): what the readers' tests feed to show that both shapes of the
wire give the same answers (issue 36)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import msgspec

from goodput import schemas
from goodput.shim.step_rollup import GRACE_S, Rollup, rolled_up

Timed = tuple[int, schemas.Event]


def rolled_up_per_node(timed: Iterable[Timed]) -> list[Timed]:
    """``timed`` (each event with when it was published) with every node's ``StepDone``
    taken in by a ``Rollup`` of the node's ranks and published as ``StepsDone`` when it is
    due (every rank in, or its grace out), stamped then; other events as they were."""
    ordered = sorted(timed, key=lambda pair: pair[0])
    ranks: dict[str, set[int]] = defaultdict(set)
    for _, event in ordered:
        if isinstance(event, schemas.StepDone):
            ranks[event.node].add(event.rank)
    rollups = {node: Rollup(ranks=len(members)) for node, members in ranks.items()}
    out: list[Timed] = []

    def publish(node: str, at: int, *, everything: bool = False) -> None:
        reports = rollups[node].due(at, everything=everything)
        job = reports[0].job if reports else ""
        for event in rolled_up(job, node, min(ranks[node]), reports):
            out.append((at, msgspec.structs.replace(event, ts=at)))

    def publish_due(until: int) -> None:
        while True:
            due = [(r.next_due_ns(), node) for node, r in rollups.items()]
            ready = sorted((at, node) for at, node in due if at is not None and at <= until)
            if not ready:
                return
            publish(ready[0][1], ready[0][0])

    for at, event in ordered:
        publish_due(at)
        if isinstance(event, schemas.StepDone):
            rollups[event.node].add(event, at)
            publish(event.node, at)
        else:
            out.append((at, event))
    end = (ordered[-1][0] if ordered else 0) + int(GRACE_S * 1e9)
    for node in rollups:
        publish(node, end, everything=True)
    return sorted(out, key=lambda pair: pair[0])


def steps_rolled_up(events: Iterable[schemas.Event]) -> list[schemas.Event]:
    """``events`` with each node's steps rolled up, each published at its own ``ts``."""
    return [event for _, event in rolled_up_per_node((e.ts, e) for e in events)]
