"""Retention: the one owner of which checkpoint copies may be deleted, on every tier.

One rule (:func:`deletable_steps`), applied per tier: keep the newest ``keep`` steps
complete there, and everything newer; older steps go, but only behind a newer step that is
complete there *and* in every tier of ``require`` (a *safe* step) — until such a step exists
nothing is deleted there. So the newest complete step is never deleted, and a copy is never
deleted while every newer one could still be lost with its node.

Two callers ask it: :func:`plan_gc` (the replicator and ``goodput ckpt gc``, every tier, from
the index) and the checkpoint engine's local retention (``goodput.checkpoint.engine.catalog``), which has
no bus: the replicator publishes :func:`safe_steps` into the node's volume
(:mod:`goodput.checkpoint.format.retention_record`) and the engine passes them here. Pure, no IO, and
no bus import at run time (the ranks import this module).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from goodput.schemas.events import STORAGE_TIERS, StorageTier

if TYPE_CHECKING:
    from goodput.checkpoint.index.index import IndexSnapshot, StepView
    from goodput.checkpoint.index.records import CopyRecord

#: complete checkpoints kept per tier unless configured otherwise
DEFAULT_KEEP: dict[StorageTier, int] = {"local": 2, "peer": 2, "object_store": 3}
#: tiers a newer checkpoint must be complete in before anything older is deleted anywhere
DEFAULT_REQUIRE: tuple[StorageTier, ...] = ("peer",)


@dataclass(frozen=True)
class Retention:
    keep: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_KEEP))
    require: tuple[str, ...] = DEFAULT_REQUIRE


def deletable_steps(
    present: Iterable[int],
    complete: Sequence[int],
    keep: int,
    safe: Collection[int] | None,
) -> list[int]:
    """Which of the ``present`` steps on one tier (complete or not) may be deleted now.

    ``complete``: the steps complete on this tier; ``keep`` < 1 keeps every one of them.
    ``safe``: the steps complete in every required tier (those not complete on this tier
    are ignored); ``None`` when nothing guards this tier (a volume no replicator serves),
    which is the plain keep-newest rule.
    """
    newest_first = sorted(complete, reverse=True)
    if not newest_first:
        return []
    floor = (newest_first[:keep] if keep >= 1 else newest_first)[-1]  # the oldest kept
    if safe is not None:
        newest_safe = next((step for step in newest_first if step in safe), None)
        if newest_safe is None:
            return []
        floor = min(floor, newest_safe)
    return sorted(step for step in set(present) if step < floor)


def attainable(
    require: Iterable[str], snapshot: IndexSnapshot, *, has_store: bool
) -> tuple[str, ...]:
    """The tiers of ``require`` this job can reach at all: a guard no copy can ever meet would
    keep every checkpoint forever. A peer needs a second node in the job's index (live or not:
    a peer that is down is what the guard waits out), the object store a configured store."""
    reachable = {"peer": len(snapshot.nodes) > 1, "object_store": has_store}
    return tuple(tier for tier in require if reachable.get(tier, True))


def safe_steps(snapshot: IndexSnapshot, require: Iterable[str]) -> set[int]:
    """Complete steps that are complete in every tier of ``require`` (live copies only)."""
    return _safe([v for v in snapshot.views() if v.complete], tuple(require))


def _safe(complete: list[StepView], require: tuple[str, ...]) -> set[int]:
    return {v.step for v in complete if all(v.complete_in(t) for t in require)}


def plan_gc(snapshot: IndexSnapshot, retention: Retention) -> list[CopyRecord]:
    """The copies (of every holder) that retention says may be deleted now."""
    complete = [v for v in snapshot.views() if v.complete]
    safe = _safe(complete, retention.require)
    doomed = []
    for tier in STORAGE_TIERS:
        on_tier = [c for c in snapshot.all_copies if c.tier == tier]
        steps = deletable_steps(
            {c.step for c in on_tier},
            [v.step for v in complete if v.complete_in(tier)],
            retention.keep[tier],
            safe,
        )
        gone = set(steps)
        doomed += [c for c in on_tier if c.step in gone]
    return doomed
