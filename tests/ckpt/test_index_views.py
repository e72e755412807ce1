"""Issue 36: the step views built once per snapshot, and reused by a follower's snapshots
across polls, answer exactly as the algorithm they replaced. That algorithm is kept here as
the reference (each view rebuilt from every copy record, liveness asked per copy), and both
are run on seeded random indexes: several steps, tiers and holders, replicas sharing files,
parts of sharded commits, holders expired or gone, a record repeated under a second key."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from goodput.checkpoint.index.index import (
    Commit,
    FileLocations,
    IndexSnapshot,
    StepView,
    ViewCache,
)
from goodput.checkpoint.index.records import STORE_HOLDER, CopyRecord, FileRef, NodeAddressRecord
from goodput.checkpoint.index.retention import Retention, plan_gc, safe_steps
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, STORAGE_TIERS, TIERS, StorageTier

NOW_NS = 10**18
TTL_S = 900.0


@dataclass
class ReferenceSnapshot(IndexSnapshot):
    """The snapshot's views as they were computed before issue 36: every step's view filtered
    out of every copy record, the liveness of each copy's holder asked again each time."""

    @property
    def copies(self) -> list[CopyRecord]:  # type: ignore[override]
        return [c for c in self.all_copies if not TIERS[c.tier].on_node or self.alive(c.holder)]

    def steps(self) -> list[int]:
        return sorted({c.step for c in self.copies}, reverse=True)

    def view(self, step: int) -> StepView:
        copies = tuple(c for c in self.copies if c.step == step)
        commits: dict[Commit, dict[int, list[CopyRecord]]] = {}
        for copy in sorted(copies, key=lambda c: (TIERS[c.tier].nearness, c.holder, c.owner)):
            if copy.is_part:
                commits.setdefault((copy.commit, copy.parts), {}).setdefault(copy.part, [])
                commits[(copy.commit, copy.parts)][copy.part].append(copy)
        copies_of_parts = {
            key: {part: tuple(cs) for part, cs in sorted(parts.items())}
            for key, parts in commits.items()
        }
        whole = [c for c in copies if not c.is_part]
        by_content: dict[tuple[int, str], list[CopyRecord]] = {}
        for copy in whole:
            for f in copy.files:
                holders = by_content.setdefault((f.size, f.xxh3_128), [])
                if copy not in holders:
                    holders.append(copy)
        owners: dict[str, tuple[FileLocations, ...]] = {}
        for copy in sorted(whole, key=lambda c: (c.owner, TIERS[c.tier].nearness)):
            if copy.owner not in owners:
                owners[copy.owner] = tuple(
                    FileLocations(f, tuple(by_content[(f.size, f.xxh3_128)])) for f in copy.files
                )
        return StepView(step, copies, owners, copies_of_parts)

    def views(self) -> list[StepView]:
        return [self.view(step) for step in self.steps()]


def reference_complete(view: StepView) -> bool:
    owners = [o for o, files in view.owners.items() if all(f.copies for f in files)]
    whole = [key for key, parts in view.commits.items() if len(parts) == key[1]]
    return bool(owners) or bool(whole)


def reference_complete_in(view: StepView, tier: StorageTier) -> bool:
    if any(all(tier in f.tiers for f in files) for files in view.owners.values() if files):
        return True
    return any(
        len(parts) == count and all(any(c.tier == tier for c in cs) for cs in parts.values())
        for (_, count), parts in view.commits.items()
    )


def reference_safe_steps(snapshot: ReferenceSnapshot, require: tuple[StorageTier, ...]) -> set[int]:
    return {
        v.step
        for v in snapshot.views()
        if reference_complete(v) and all(reference_complete_in(v, t) for t in require)
    }


def random_index(rng: random.Random) -> tuple[dict[str, NodeAddressRecord], list[CopyRecord]]:
    """Nodes (some expired, some never announced) and their copies of a few steps."""
    names = [f"node-{n}" for n in range(rng.randint(1, 6))]
    nodes = {
        n: NodeAddressRecord(
            node=n, host="h", port=1, ts=NOW_NS - int(rng.choice((1, 1, 1, 2 * TTL_S)) * 1e9)
        )
        for n in names
        if rng.random() < 0.85
    }
    pool = [FileRef(f"f{i}", rng.choice((10, 20)), f"{i % 4:032x}") for i in range(6)]
    copies: list[CopyRecord] = []
    for step in rng.sample(range(10, 20), rng.randint(1, 4)):
        commit = rng.choice(("c1", "c2"))
        for owner in rng.sample(names, rng.randint(1, len(names))):
            for tier in rng.sample(STORAGE_TIERS, rng.randint(1, len(STORAGE_TIERS))):
                holder = STORE_HOLDER if not TIERS[tier].on_node else rng.choice(names)
                files = rng.sample(pool, rng.randint(0, 3))
                files += rng.sample(files, min(len(files), rng.randint(0, 1)))  # a content twice
                part = {}
                if rng.random() < 0.3:
                    count = rng.randint(1, 3)
                    part = {"part": rng.randrange(count), "parts": count, "commit": commit}
                copy = CopyRecord(
                    step=step,
                    tier=tier,
                    holder=holder,
                    owner=owner,
                    root=owner,
                    files=files,
                    **part,
                )
                copies.append(copy)
                if rng.random() < 0.05:  # the same record under another key
                    copies.append(
                        CopyRecord(**{f: getattr(copy, f) for f in copy.__struct_fields__})
                    )
    rng.shuffle(copies)
    return nodes, copies


def assert_same_answers(snapshot: IndexSnapshot, reference: ReferenceSnapshot) -> None:
    assert snapshot.copies == reference.copies
    assert snapshot.steps() == reference.steps()
    views, expected = snapshot.views(), reference.views()
    assert views == expected
    for view, old in zip(views, expected, strict=True):
        assert snapshot.view(view.step) == old
        assert view.complete == reference_complete(old)
        assert view.complete_owners() == old.complete_owners()
        for tier in STORAGE_TIERS:
            assert view.complete_in(tier) == reference_complete_in(old, tier)
        assert (view.bytes, view.part_count, view.owner_for("node-0")) == (
            old.bytes,
            old.part_count,
            old.owner_for("node-0"),
        )
    for require in ((), (PEER,), (PEER, OBJECT_STORE), (LOCAL,)):
        assert safe_steps(snapshot, require) == reference_safe_steps(reference, require)
    retention = Retention(keep={LOCAL: 1, PEER: 1, OBJECT_STORE: 2})
    clean = {"node-0": 15}
    assert plan_gc(snapshot, retention, clean) == plan_gc(reference, retention, clean)


@pytest.mark.parametrize("seed", range(200))
def test_views_answer_as_the_algorithm_they_replaced(seed: int) -> None:
    rng = random.Random(seed)
    nodes, copies = random_index(rng)
    snapshot = IndexSnapshot(nodes, copies, TTL_S, NOW_NS)
    assert_same_answers(snapshot, ReferenceSnapshot(nodes, copies, TTL_S, NOW_NS))


@pytest.mark.parametrize("seed", range(50))
def test_views_reused_across_changes_answer_as_rebuilt_ones(seed: int) -> None:
    """A follower's cache over a run of changes (copies added and withdrawn, holders lapsing
    and returning) answers as the reference does for each snapshot."""
    rng = random.Random(seed)
    cache = ViewCache()
    nodes, copies = random_index(rng)
    for _ in range(6):
        # the follower keeps unchanged records' objects and rebuilds the list on a change
        keep = [c for c in copies if rng.random() < 0.9]
        copies = keep + random_index(rng)[1][:2] if rng.random() < 0.7 else copies
        now_ns = NOW_NS + int(rng.choice((0, 0, TTL_S)) * 1e9)
        snapshot = IndexSnapshot(nodes, copies, TTL_S, now_ns, view_cache=cache)
        assert_same_answers(snapshot, ReferenceSnapshot(nodes, copies, TTL_S, now_ns))


def test_a_snapshot_of_nothing_changed_builds_no_view() -> None:
    nodes, copies = random_index(random.Random(7))
    cache = ViewCache()
    first = IndexSnapshot(nodes, copies, TTL_S, NOW_NS, view_cache=cache)
    views = first.views()
    built = cache.built
    assert built == len(views) > 0
    # the next poll: a new snapshot of the same records, the same nodes alive
    second = IndexSnapshot(nodes, copies, TTL_S, NOW_NS + 10**9, view_cache=cache)
    assert all(a is b for a, b in zip(second.views(), views, strict=True))
    assert safe_steps(second, (PEER,)) == safe_steps(first, (PEER,))
    assert cache.built == built
    # the list rebuilt with the same records (an address refreshed): each step's view kept
    third = IndexSnapshot(dict(nodes), list(copies), TTL_S, NOW_NS, view_cache=cache)
    assert all(a is b for a, b in zip(third.views(), views, strict=True))
    assert cache.built == built
