"""Garbage collection by the replicators, and `goodput ckpt ls|verify|restore|gc` on them."""

from __future__ import annotations

import asyncio
import json

import pytest

from goodput.checkpoint.format import read_retention_record, write_clean_record
from goodput.checkpoint.tiers.object_store import DirectoryObjectStore
from goodput.state_dir import StateDir
from goodput_services.replicator.holdings import verify_copy
from tests.replicator.conftest import (
    JOB,
    Harness,
    ckpt_cli,
    file_checksums,
    in_store,
    peer_copies,
    write_checkpoint,
)

RETENTION = {"keep_local": "1", "keep_peer": "1", "keep_object_store": "1", "gc_interval_s": "1"}


async def published_safe_steps(h: Harness, node: str, expected: tuple[int, ...]) -> None:
    """Wait until ``node``'s replicator has told its engine (in the volume) these steps are
    safe to delete behind, under the default ``require`` (a peer)."""
    record = None
    for _ in range(50):
        record = read_retention_record(h.replicators.volume(node))
        if record is not None and record.safe_steps == expected:
            assert record.require == ("peer",)
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{node}'s retention record is {record}, not safe steps {expected}")


def blobs(h: Harness) -> set[str]:
    store = DirectoryObjectStore(StateDir(h.replicators.state_dir).object_store)
    return {key.rsplit("/", 1)[-1] for key in store.list("goodput/blobs/")}


@pytest.mark.slow
async def test_gc_keeps_the_newest_complete_step_and_the_cli_sees_it(
    dir_harness: Harness,
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0", replicas="1", **RETENTION)
    reps.start("node-1", replicas="1", **RETENTION)
    old = write_checkpoint(reps.volume("node-0"), 10, seed=1)
    await h.until(lambda s: peer_copies(s, "node-0", 10) and in_store(s, "node-0", 10))
    await published_safe_steps(h, "node-0", (10,))
    old_blobs = set(file_checksums(old).values())
    assert old_blobs <= blobs(h)

    new = write_checkpoint(reps.volume("node-0"), 20, seed=2)
    await h.until(
        lambda s: s.steps() == [20] and peer_copies(s, "node-0", 20) and in_store(s, "node-0", 20),
        what="step 10 collected from every tier once step 20 is complete in them",
    )
    for _ in range(50):
        if not old.exists() and not (old_blobs & blobs(h)):
            break
        await asyncio.sleep(0.2)
    assert not old.exists()
    await published_safe_steps(h, "node-0", (20,))
    assert not (reps.node_dir("node-1") / "peer" / JOB / "node-0" / old.name).exists()
    assert not (old_blobs & blobs(h))
    assert set(file_checksums(new).values()) <= blobs(h)

    listing = json.loads(ckpt_cli(h, "ls", "--json").stdout)
    assert listing["newest_complete"] == 20
    (step,) = listing["steps"]
    assert step["complete_in"] == ["local", "peer", "object_store"]
    assert {f["xxh3_128"] for f in step["files"]} == set(file_checksums(new).values())
    assert {n["node"] for n in listing["nodes"] if n["alive"]} == {"node-0", "node-1"}

    run = ckpt_cli(h, "verify", "--deep", "--json")
    verified = json.loads(run.stdout)
    assert [c["ok"] for c in verified["copies"]] == [True, True, True]
    # no key in this stack: checked for damage, and said to be unauthenticated
    assert verified["authenticated"] is False and "unauthenticated" in run.stderr

    dry = json.loads(ckpt_cli(h, "gc", "--dry-run", "--json").stdout)
    assert dry["deleted"] == []

    # a corrupt file on the peer's copy: verify says so and fails
    peer_copy = reps.node_dir("node-1") / "peer" / JOB / "node-0" / new.name
    victim = sorted(peer_copy.glob("data-*.bin"))[0]
    victim.write_bytes(b"\0" * victim.stat().st_size)
    bad = ckpt_cli(h, "verify", "--json", check=False)
    assert bad.returncode == 1
    problems = [c for c in json.loads(bad.stdout)["copies"] if not c["ok"]]
    assert [(c["tier"], c["holder"]) for c in problems] == [("peer", "node-1")]

    # restore by hand, through node-0's replicator
    reps.lose_volume("node-0")
    restored = ckpt_cli(h, "restore", "--node", "node-0")
    assert "step 20 restored from" in restored.stdout
    files, problem = verify_copy(reps.volume("node-0") / new.name)
    assert not problem and {f.xxh3_128 for f in files} == set(file_checksums(new).values())


@pytest.mark.slow
async def test_gc_by_hand_follows_the_retention_flags(dir_harness: Harness) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0", replicas="1")
    reps.start("node-1", replicas="1")
    steps = {}
    for step, seed in ((10, 1), (20, 2)):
        steps[step] = write_checkpoint(reps.volume("node-0"), step, seed=seed)
        await h.until(lambda s, n=step: peer_copies(s, "node-0", n) and in_store(s, "node-0", n))

    old_blobs = set(file_checksums(steps[10]).values())
    keep_one = ("--keep-local", "1", "--keep-peer", "1", "--keep-object-store", "1")
    require_all = ("--require", "local", "peer", "object_store")
    plan = json.loads(ckpt_cli(h, "gc", "--dry-run", "--json", *keep_one, *require_all).stdout)
    assert sorted((c["step"], c["tier"]) for c in plan["deleted"]) == [
        (10, "local"),
        (10, "object_store"),
        (10, "peer"),
    ]
    assert steps[10].exists()  # a dry run deletes nothing

    done = json.loads(ckpt_cli(h, "gc", "--json", *keep_one, *require_all).stdout)
    assert len(done["deleted"]) == 3 and done["blobs_deleted"] == len(old_blobs)
    assert not steps[10].exists() and steps[20].exists()
    assert blobs(h) == set(file_checksums(steps[20]).values())
    snapshot = await h.until(lambda s: s.steps() == [20], what="step 10 gone from the index")
    assert snapshot.newest_complete().step == 20

    # node-0's ranks know step 25 clean: the newest checkpoint at or before it stays on every
    # tier (a spare restores it from a peer or the store), and goes once 35 is known clean
    steps[30] = write_checkpoint(reps.volume("node-0"), 30, seed=3)
    await h.until(lambda s: peer_copies(s, "node-0", 30) and in_store(s, "node-0", 30))
    write_clean_record(reps.volume("node-0"), 25)
    for dry_run in (("--dry-run",), ()):
        run = ckpt_cli(h, "gc", *dry_run, "--json", *keep_one, *require_all)
        assert json.loads(run.stdout)["deleted"] == [], dry_run
    assert steps[20].exists() and steps[30].exists()
    write_clean_record(reps.volume("node-0"), 35)
    run = ckpt_cli(h, "gc", "--json", *keep_one, *require_all)
    deleted = sorted((c["step"], c["tier"]) for c in json.loads(run.stdout)["deleted"])
    assert deleted == [(20, "local"), (20, "object_store"), (20, "peer")]
    assert not steps[20].exists() and steps[30].exists()
