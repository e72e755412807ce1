"""Retention across tiers, decided from the index alone (a pure function, no IO).

On each tier the newest ``keep_<tier>`` steps complete in that tier are kept, and everything
newer; older copies on that tier go, but only behind a newer step that is complete in that
tier *and* in every tier of ``require`` — until such a step exists nothing is deleted there.
The newest complete step is never deleted anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from goodput.ckptindex.index import IndexSnapshot
from goodput.ckptindex.records import CopyRecord
from goodput.schemas.events import STORAGE_TIERS, StorageTier

#: complete checkpoints kept per tier unless configured otherwise
DEFAULT_KEEP: dict[StorageTier, int] = {"local": 2, "peer": 2, "object_store": 3}
#: tiers a newer checkpoint must be complete in before anything older is deleted anywhere
DEFAULT_REQUIRE: tuple[StorageTier, ...] = ("peer",)


@dataclass(frozen=True)
class Retention:
    keep: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_KEEP))
    require: tuple[str, ...] = DEFAULT_REQUIRE


def plan_gc(snapshot: IndexSnapshot, retention: Retention) -> list[CopyRecord]:
    """The copies (of every holder) that retention says may be deleted now."""
    views = snapshot.views()
    complete = [v for v in views if v.complete]
    if not complete:
        return []
    newest_complete = complete[0].step
    qualified = [v for v in complete if all(v.complete_in(t) for t in retention.require)]
    doomed = []
    for tier in STORAGE_TIERS:
        safe_behind = [v.step for v in qualified if v.complete_in(tier)]
        if not safe_behind:
            continue
        kept = [v.step for v in complete if v.complete_in(tier)][: retention.keep[tier]]
        floor = min(kept[-1], safe_behind[0])
        doomed += [
            c
            for c in snapshot.all_copies
            if c.tier == tier and c.step < floor and c.step != newest_complete
        ]
    return doomed
