"""A sharded checkpoint spanning nodes: one part per node's volume, one global commit.

Real processes (gloo, CPU): FSDP2 over 3 "nodes" x 2 ranks, the mesh spanning the nodes, each
node's ranks sharing a root of their own, saving through the shim every 2 steps
(``fsdp_nodes_job.py``). The reference run's last commit (step 6) loses node 2's leader
before its rename; restarts from its volumes: a replaced node's volume holding only its own
part, the volumes as the kill left them, and a scale-down to 2 nodes resharded from the
three parts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from goodput.checkpoint.engine import NoCheckpointError, latest_complete_step, restore_checkpoint
from goodput.checkpoint.engine.part_sources import lacking
from goodput.checkpoint.format import Manifest, read_manifest, step_dir
from goodput.checkpoint.format.parts import PartOf, staged_part_dir
from goodput.checkpoint.format.parts_needed import parts_needed
from goodput.checkpoint.format.placement import shard_box
from goodput.checkpoint.format.sharded import read_records
from tests.ckpt.fsdp_job import mismatches
from tests.ckpt.rank_procs import run_ranks_of

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("fsdp_nodes_job.py")
NODES, PER_NODE, STEPS = 3, 2, 6
KILLED = 2 * PER_NODE  # node 2's first rank: its part's leader


def run(base: Path, out: Path, steps: int, *extra: str, nodes: int = NODES, **kw: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    args = [str(base), str(out), str(steps), *extra]
    run_ranks_of(JOB, args, nodes * PER_NODE, out, per_node=PER_NODE, tag="rank", **kw)


def results(out: Path, ranks: range | list[int]) -> list[dict[str, Any]]:
    return [json.loads((out / f"result-{rank}.json").read_text()) for rank in ranks]


def copy_step(source: Path, step: int, target: Path) -> None:
    shutil.copytree(step_dir(source, step), target)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The uninterrupted run: steps 2, 4, 6 saved as parts, full tensors recorded; node 2's
    leader dies during step 6's commit, after the table reached it."""
    base = tmp_path_factory.mktemp("parts")
    kill = ("--kill-at", str(STEPS))
    run(base / "volumes", base / "out", STEPS, "--record", *kill, expect={KILLED: 17})
    return base / "volumes", base / "out"


def test_each_node_holds_its_part_and_every_part_names_one_commit(
    reference: tuple[Path, Path],
) -> None:
    volumes, _ = reference
    commits = set()
    for node in range(NODES):
        manifest = read_manifest(step_dir(volumes / f"node-{node}", 4))
        assert isinstance(manifest.part, PartOf) and manifest.part.part == node
        assert manifest.part.summary().ranks == [2 * node, 2 * node + 1]
        assert {entry.dp_rank for entry in manifest.files} == {2 * node, 2 * node + 1}
        commits.add(manifest.part.commit)
    assert len(commits) == 1


def test_a_replaced_volume_holding_only_its_part_ends_bit_identical(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Node 2's volume is replaced by an empty one holding a copy of its step-4 part (no
    other part beside it): every rank agrees on step 4, restores its own shards from its
    node's part alone, and the job ends as the uninterrupted run did, bit for bit."""
    volumes, expected = reference
    for node in (0, 1):
        shutil.copytree(volumes / f"node-{node}", tmp_path / "volumes" / f"node-{node}")
    copy_step(volumes / "node-2", 4, step_dir(tmp_path / "volumes" / "node-2", 4))
    args = ("--record", "--warm", "--expected", str(expected))
    run(tmp_path / "volumes", tmp_path / "out", STEPS, *args)
    reference_losses = results(expected, [0])[0]["losses"]
    restarted = results(tmp_path / "out", range(NODES * PER_NODE))
    for result in restarted:
        assert result["start"] == 4 and result["mismatches"] == []
        assert result["losses"] == {k: reference_losses[k] for k in ("4", "5")}
    # then a warm restore of step 6 (its parts): each rank's shard from its own buffer
    assert [r["warm"]["local_shape"] for r in restarted] == [[6, 12]] * 5 + [[3, 12]]
    for result in restarted:
        warm = result["warm"]
        assert warm["mismatches"] == [] and warm["same_object"] and warm["volume_bytes"] == 0
        # exactly its shards' bytes (a node-mate of the leader: the plain tensors from the
        # leader's segment), all from host memory
        assert warm["host_bytes"] == warm["local_bytes"]
    final = torch.load(tmp_path / "out" / f"full-{STEPS}.pt", weights_only=True)
    assert mismatches(torch.load(expected / f"full-{STEPS}.pt", weights_only=True), final) == []


def test_a_scale_down_to_two_nodes_reshards_from_the_three_parts(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """3 -> 2 nodes: each new node's volume holds its own old part and, staged beside it, only
    the part ``parts_needed`` predicts from its FSDP2 records (what the replicator stages);
    the restored shards are the saved global tensors exactly, the global batch is kept,
    and the losses go on as the uninterrupted run's (up to the reduction order)."""
    volumes, expected = reference
    for node, needs in ((0, {0, 1}), (1, {1, 2})):  # 33 rows: old ranks' 6 each, new 9
        root = tmp_path / "volumes" / f"node-{node}"
        copy_step(volumes / f"node-{node}", 4, step_dir(root, 4))
        own = read_manifest(step_dir(root, 4))
        assert isinstance(own.part, PartOf)
        needed = parts_needed(
            own.part.table,
            node,
            read_records(step_dir(root, 4), own),
            [entry.shape for entry in own.tensors],
            node,
            2,
        )
        assert needed.parts == needs, needed.reason
        for other in needs - {node}:
            copy_step(volumes / f"node-{other}", 4, staged_part_dir(root, 4, other))
        # a rank lacking a part it needs is told that one, not every part it lacks
        lacks = lacking(own, read_records(step_dir(root, 4), own), *new_regions(own, node))
        assert lacks == {other: "not staged" for other in needs - {node}}
    out = tmp_path / "out"
    run(tmp_path / "volumes", out, STEPS, "--expected", str(expected), nodes=2)
    reference_losses = results(expected, [0])[0]["losses"]
    restored = results(out, range(2 * PER_NODE))
    assert [result["local_rows"] for result in restored] == [9, 9, 9, 6]  # 33 rows over 4
    for result in restored:
        assert result["start"] == 4 and result["mismatches"] == []
        assert result["global_batch"] == 24
        for step in ("4", "5"):
            assert result["losses"][step] == pytest.approx(reference_losses[step], rel=1e-5)
    manifest = read_manifest(step_dir(tmp_path / "volumes" / "node-1", STEPS))
    assert isinstance(manifest.part, PartOf) and manifest.part.count == 2


def new_regions(
    manifest: Manifest, node: int
) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], dict[int, str]]:
    """The regions new node ``node``'s last rank fills (FSDP2 over 2 nodes of 2 ranks, by
    torch's rule), and every other part reported as not staged."""
    rank, mesh = node * PER_NODE + PER_NODE - 1, (2 * PER_NODE,)
    regions = [
        shard_box(entry.shape, mesh, (0,), (rank,)) if len(entry.shape) else ((), ())
        for entry in manifest.tensors
    ]
    return regions, {other: "not staged" for other in range(NODES) if other != node}


def test_a_restore_lacking_a_part_names_it_and_consolidates_with_all(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Without a template a restore needs every shard: from node 0's part plus the staged
    parts it is the saved full tensors; a part not staged, or staged from another commit,
    is named."""
    volumes, expected = reference
    root = tmp_path / "node-0"
    copy_step(volumes / "node-0", 4, step_dir(root, 4))
    copy_step(volumes / "node-1", 2, staged_part_dir(root, 4, 1))  # an older step's part 1
    lacks = r"parts it lacks: 1 \(of another commit\), 2 \(not staged\)"
    with pytest.raises(NoCheckpointError, match=lacks):
        restore_checkpoint(root)
    shutil.rmtree(staged_part_dir(root, 4, 1))
    copy_step(volumes / "node-1", 4, staged_part_dir(root, 4, 1))
    with pytest.raises(NoCheckpointError, match=r"parts it lacks: 2 \(not staged\)"):
        restore_checkpoint(root)
    copy_step(volumes / "node-2", 4, staged_part_dir(root, 4, 2))
    step, state = restore_checkpoint(root)
    full = {"model": state["model"], "optim": state["optim"]}
    assert step == 4
    assert mismatches(torch.load(expected / "full-4.pt", weights_only=True), full) == []


def test_a_node_killed_during_the_commit_leaves_the_previous_step_for_every_rank(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """Nodes 0 and 1 renamed step 6, node 2 (killed) did not: restarted on those volumes,
    every rank agrees on step 4 and restores it exactly."""
    volumes, expected = reference
    assert [latest_complete_step(volumes / f"node-{n}") for n in range(NODES)] == [6, 6, 4]
    assert not step_dir(volumes / "node-2", STEPS).exists()
    shutil.copytree(volumes, tmp_path / "volumes")
    run(tmp_path / "volumes", tmp_path / "out", 4, "--expected", str(expected))
    for result in results(tmp_path / "out", range(NODES * PER_NODE)):
        assert result["start"] == 4 and result["mismatches"] == []


def test_a_scale_down_past_a_step_lacking_a_part_restores_the_previous_step_on_every_rank(
    reference: tuple[Path, Path], tmp_path: Path
) -> None:
    """3 -> 2 nodes where the newest step (6) lacks node 2's part (no node holds it) but both
    survivors hold their own parts of it, with step 4's parts staged: every rank agrees on
    step 6 first; new rank 0 can read its shards of it from part 0 alone, the others cannot
    and fall back to step 4. Every rank then restores step 4 (rank 0 leaving the agreement a
    round later than the others used to hang the job), exactly the saved state."""
    volumes, expected = reference
    for node in (0, 1):
        root = tmp_path / "volumes" / f"node-{node}"
        copy_step(volumes / f"node-{node}", 4, step_dir(root, 4))
        copy_step(volumes / f"node-{node}", STEPS, step_dir(root, STEPS))
        for other in {0, 1, 2} - {node}:
            copy_step(volumes / f"node-{other}", 4, staged_part_dir(root, 4, other))
    out = tmp_path / "out"
    run(tmp_path / "volumes", out, STEPS, "--expected", str(expected), nodes=2)
    for result in results(out, range(2 * PER_NODE)):
        assert result["start"] == 4 and result["mismatches"] == []
