"""Retention: the one owner of which checkpoint copies may be deleted, on every tier.

One rule (:func:`decide_retention`), applied per tier: keep the newest ``keep`` steps
complete there, and everything newer; older steps go, but only behind a newer step that is
complete there *and* in every tier of ``require`` (a *safe* step) — until such a step exists
nothing is deleted there. So the newest complete step is never deleted, and a copy is never
deleted while every newer one could still be lost with its node.

One step more stays on a node's volume: the checkpoint a numerical rollback restores, the
newest complete one at or before the last step its ranks know clean (:func:`clean_step`, from
the volume's :mod:`goodput.checkpoint.format.clean_record`), whatever its age.

Two callers ask it: :func:`plan_gc` (the replicator and ``goodput ckpt gc``, every tier, from
the index) and the checkpoint engine's local retention (``goodput.checkpoint.engine.catalog``), which has
no bus: the replicator publishes :func:`safe_steps` into the node's volume
(:mod:`goodput.checkpoint.format.retention_record`) and the engine passes them here. Pure, no IO, and
no bus import at run time (the ranks import this module).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, STORAGE_TIERS, TIERS, StorageTier

if TYPE_CHECKING:
    from goodput.checkpoint.index.index import IndexSnapshot, StepView
    from goodput.checkpoint.index.records import CopyRecord

#: complete checkpoints kept per tier unless configured otherwise
DEFAULT_KEEP: dict[StorageTier, int] = {LOCAL: 2, PEER: 2, OBJECT_STORE: 3}
#: tiers a newer checkpoint must be complete in before anything older is deleted anywhere
DEFAULT_REQUIRE: tuple[StorageTier, ...] = (PEER,)


@dataclass(frozen=True)
class Retention:
    keep: dict[StorageTier, int] = field(default_factory=lambda: dict(DEFAULT_KEEP))
    require: tuple[StorageTier, ...] = DEFAULT_REQUIRE


@dataclass(frozen=True)
class RetentionDecision:
    """What one retention pass over one tier deletes, and why each older step stays."""

    #: present steps that may be deleted now, oldest first
    delete: list[int]
    #: present steps older than the newest ``keep`` complete ones that stay, with the reason
    kept: dict[int, str]


def clean_step(complete: Iterable[int], clean_through: int | None) -> int | None:
    """The checkpoint a numerical rollback would restore from these ``complete`` ones: the
    newest at or before ``clean_through``, the last step every replica agreed at with nothing
    suspect seen since (None: no such step is known, or no checkpoint is that old)."""
    if clean_through is None:
        return None
    return max((step for step in complete if step <= clean_through), default=None)


def decide_retention(
    present: Iterable[int],
    complete: Sequence[int],
    keep: int,
    safe: Collection[int] | None,
    protected: int | None = None,
) -> RetentionDecision:
    """Which of the ``present`` steps on one tier (complete or not) may be deleted now.

    ``complete``: the steps complete on this tier; ``keep`` < 1 keeps every one of them.
    ``safe``: the steps complete in every required tier (those not complete on this tier
    are ignored); ``None`` when nothing guards this tier (a volume no replicator serves),
    which is the plain keep-newest rule. ``protected``: one step kept whatever its age (the
    known-clean checkpoint of :func:`clean_step`); it never makes anything else deletable.
    """
    newest_first = sorted(complete, reverse=True)
    if not newest_first:
        return RetentionDecision([], {})
    floor = (newest_first[:keep] if keep >= 1 else newest_first)[-1]  # the oldest kept
    older = sorted(step for step in set(present) if step < floor)
    kept: dict[int, str] = {}
    if safe is not None:
        newest_safe = next((step for step in newest_first if step in safe), None)
        if newest_safe is None:
            why = "no complete step is complete in every required tier yet"
            return RetentionDecision([], dict.fromkeys(older, why))
        why = f"not behind step {newest_safe}, the newest complete in every required tier"
        kept = {step: why for step in older if step >= newest_safe}
    if protected in older and protected not in kept:
        kept[protected] = "known clean: the checkpoint a numerical rollback restores"
    return RetentionDecision([step for step in older if step not in kept], kept)


def attainable(
    require: Iterable[StorageTier], snapshot: IndexSnapshot, *, has_store: bool
) -> tuple[StorageTier, ...]:
    """The tiers of ``require`` this job can reach at all: a guard no copy can ever meet would
    keep every checkpoint forever. A peer needs a second node in the job's index (live or not:
    a peer that is down is what the guard waits out), the object store a configured store."""
    reachable = {PEER: len(snapshot.nodes) > 1, OBJECT_STORE: has_store}
    return tuple(tier for tier in require if reachable.get(tier, True))


def safe_steps(snapshot: IndexSnapshot, require: Iterable[StorageTier]) -> set[int]:
    """Complete steps that are complete in every tier of ``require`` (live copies only)."""
    return _safe([v for v in snapshot.views() if v.complete], tuple(require))


def _safe(complete: list[StepView], require: tuple[StorageTier, ...]) -> set[int]:
    return {v.step for v in complete if all(v.complete_in(t) for t in require)}


def plan_gc(
    snapshot: IndexSnapshot, retention: Retention, clean_through: Mapping[str, int] | None = None
) -> list[CopyRecord]:
    """The copies (of every holder) that retention says may be deleted now.

    ``clean_through``: per holder, the step its volume's ranks are known clean through (its
    clean record); the holder's newest local copy at or before it is kept (:func:`clean_step`).
    The copies on peers and in the object store keep theirs too, at or before the oldest
    step any record given says (a quarantined node's spare has no local copy: it restores
    the clean checkpoint from a peer or the store). The rule's floor depends on no holder's
    copies, so asking it per holder changes nothing else."""
    complete = [v for v in snapshot.views() if v.complete]
    safe = _safe(complete, retention.require)
    clean_through = clean_through or {}
    job_clean = min(clean_through.values(), default=None)
    doomed = []
    for tier in STORAGE_TIERS:
        complete_here = [v.step for v in complete if v.complete_in(tier)]
        holders: dict[str, list[CopyRecord]] = {}
        for c in snapshot.all_copies:
            if c.tier == tier:
                holders.setdefault(c.holder, []).append(c)
        for holder, copies in holders.items():
            steps = {c.step for c in copies}
            held = [step for step in complete_here if step in steps]
            own = TIERS[tier].locality == "own"  # the holder's own volume: its own record
            clean = clean_through.get(holder) if own else job_clean
            protected = clean_step(held, clean)
            decision = decide_retention(steps, complete_here, retention.keep[tier], safe, protected)
            gone = set(decision.delete)
            doomed += [c for c in copies if c.step in gone]
    return doomed
