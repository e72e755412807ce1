"""A warm restore (after an in-process restart) hands back the cold restore's typed result,
read from the engine's host buffer: the real shim and checkpoint engine, no bus."""

from __future__ import annotations

from pathlib import Path

import torch

from goodput import schemas
from goodput.shim import BatchPlan, ShimConfig, TrainerShim
from goodput.shim.restore_result import METADATA_KEY

PLAN = BatchPlan(global_batch=8, micro_batch=2, lr=0.02)


def test_a_rejoined_rank_restores_from_host_memory_with_the_saved_plan(tmp_path: Path) -> None:
    shim = TrainerShim(
        ShimConfig(ckpt_dir=str(tmp_path), world_size=1), install_signal_handlers=False
    )
    try:
        assert shim.restore({"w": torch.zeros(3)}, plan=PLAN) is None
        saved = {"w": torch.arange(3.0)}
        shim.save(saved, 4)
        shim.engine.wait_until_idle()
        rejoin = schemas.Rejoin(
            job="j", attempt=2, master_addr="127.0.0.1", master_port=1, world_size=1
        )
        shim.answer_rejoin(rejoin, ok=True)
        live = {"w": torch.full((3,), 9.0)}  # the survivor trained on past the checkpoint
        warm = shim.restore(live, plan=BatchPlan(global_batch=4, lr=1.0))
        assert warm is not None and warm.tier == "host" and warm.step == 4
        assert warm.plan == PLAN == shim.plan and not warm.rescaled  # the checkpoint's plan
        assert warm.saved_layout == warm.layout and METADATA_KEY not in warm.state
        assert torch.equal(warm.state["w"], saved["w"]) and warm.state["w"] is live["w"]
        cold = shim.restore({"w": torch.zeros(3)}, plan=None)  # memory is used once
        assert cold is not None and cold.tier == "local" and cold.plan == PLAN
    finally:
        shim.finish({"w": torch.zeros(3)}, 4)  # step 4 is saved: flushes and closes


def _node_rank(tmp_path: Path, local_rank: int) -> TrainerShim:
    """Rank ``local_rank`` of a node with two ranks (they share the node's volume)."""
    config = ShimConfig(
        ckpt_dir=str(tmp_path),
        world_size=2,
        rank=local_rank,
        local_rank=local_rank,
        local_world_size=2,
    )
    return TrainerShim(config, install_signal_handlers=False)


def test_with_two_ranks_per_node_the_survivor_restores_its_slice_from_host_memory(
    tmp_path: Path,
) -> None:
    """Each rank saves half of the state; rank 1 exits and comes back as a new process, rank 0
    survives in process: tier "host", bit-exact, into its live tensors. The new rank 1 has no
    buffer of its own, but rank 0's is a segment of the node: it reads that half from shared
    memory and only its own half (its predecessor's segment went with its close) from the
    volume."""
    saved = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(5000)}
    ranks = [_node_rank(tmp_path, r) for r in range(2)]
    for shim in ranks:
        assert shim.restore({"w": torch.zeros(300_000), "b": torch.zeros(5000)}) is None
        shim.save(saved, 4)
    for shim in ranks:
        shim.engine.wait_until_idle()
    survivor, dead = ranks
    dead.finish(saved, 4)  # it is gone: its host buffer with it
    respawned = _node_rank(tmp_path, 1)
    rejoin = schemas.Rejoin(
        job="j", attempt=2, master_addr="127.0.0.1", master_port=1, world_size=2
    )
    try:
        survivor.answer_rejoin(rejoin, ok=True)
        live = {"w": torch.full((300_000,), 9.0), "b": torch.zeros(5000)}
        warm = survivor.restore(live)
        assert warm is not None and warm.tier == "host" and warm.step == 4
        assert warm.state["w"] is live["w"] and torch.equal(live["w"], saved["w"])
        assert torch.equal(warm.state["b"], saved["b"])
        cold = respawned.restore({"w": torch.zeros(300_000), "b": torch.zeros(5000)})
        assert cold is not None and cold.tier == "host" and cold.step == 4
        assert torch.equal(cold.state["w"], saved["w"]) and torch.equal(cold.state["b"], saved["b"])
    finally:
        survivor.finish(saved, 4)
        respawned.finish(saved, 4)
