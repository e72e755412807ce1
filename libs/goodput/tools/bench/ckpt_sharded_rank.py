"""One rank of `goodput bench ckpt --sharded` (started by ``ckpt_sharded``, one process per rank).

Every rank holds its FSDP2 shard of one model + AdamW state whose mesh spans all the nodes
(``world = nodes x procs-per-node``, ranks numbered node by node). Each repeat trains a step
and saves the same state twice, in alternating order: through goodput's engine (each node's
ranks write the node's part into the node's own volume, ``PartLayout``, committed globally)
and through ``dcp.async_save`` into one shared directory. Each save's stall (the call) and
durable time (the call until written: the engine's handle, DCP's future) are the slowest
rank's, taken with an all-reduce after the clocks stopped.

Then the job restarts with the last node replaced: its volume is wiped, node 0's peer server
holds the copy of its part that replication would have pushed there (pushed untimed), and
the clock runs from a barrier until the slowest rank holds its shards again: the new node's
leader pulls the part from the peer (``restore_to_volume``, every file verified), then every
rank restores through the engine from its node's volume. Against it, every rank's
``dcp.load`` from the shared directory. Page caches are dropped before each restore, and each
restore is compared bit for bit with the state at the save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.format import MANIFEST_NAME, node_volume, peer_root, step_dir, step_dir_name
from goodput.checkpoint.tiers.peer import PeerClient
from goodput.checkpoint.tiers.restore import PeerSource, restore_to_volume
from goodput.shim.collectives import all_reduce_ints, collective_device
from goodput.tools.bench.ckpt_measure import PageCache

JOB = "bench"
LAYERS = 4


def node_name(node: int) -> str:
    return f"node{node}"


def build(
    size_bytes: int, world: int, device: str = "cpu"
) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    """``LAYERS`` square linear layers whose weights, biases and AdamW moments (4 bytes each,
    3 copies) make about ``size_bytes``, FSDP2-sharded over one mesh of every rank on
    ``device`` ("cpu", or "cuda": `goodput bench gpu`'s sharded restore onto the GPU)."""
    width = max(16, int(math.sqrt(size_bytes / (12 * LAYERS))) // 16 * 16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(LAYERS)))
    model.to(device)
    mesh = init_device_mesh(device, (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: torch.nn.Sequential, optim: torch.optim.Optimizer, step: int) -> None:
    first = model[0]
    assert isinstance(first, torch.nn.Linear)  # build's layers (fully_shard keeps the class)
    width = first.in_features
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(step))
    x = x.to(first.weight.device)
    model(x).pow(2).mean().backward()
    optim.step()
    optim.zero_grad()


def state_of(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd, "step": step}


def local_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor of the state as this rank holds it (DTensors: the local shard), in order."""
    if isinstance(state, DTensor):
        return [state.to_local()]
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for key in sorted(state, key=str) for t in local_tensors(state[key])]
    if isinstance(state, list | tuple):
        return [t for value in state for t in local_tensors(value)]
    return []


def same_bits(expected: list[torch.Tensor], state: Any) -> bool:
    actual = local_tensors(state)
    return len(actual) == len(expected) and all(
        a.shape == e.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), e.reshape(-1).view(torch.uint8))
        for a, e in zip(actual, expected, strict=True)
    )


def slowest(seconds: float) -> float:
    """The slowest rank's figure (the job waits for it)."""
    value = torch.tensor([seconds], dtype=torch.float64, device=collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def every(flag: bool) -> bool:
    return bool(all_reduce_ints([int(flag)], dist.ReduceOp.MIN)[0])


class Rank:
    """This rank's place: node, volume, the engine's part layout."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.node, self.local = divmod(self.rank, args.procs_per_node)
        self.volume = node_volume(args.work, node_name(self.node), JOB)
        self.cache = PageCache()  # rank 0 drops the machine's (or the work dir's) page cache
        self.layout = PartLayout(
            part=self.node,
            parts=args.nodes,
            rank=self.rank,
            world=self.world,
            local_rank=self.local,
            local_world=args.procs_per_node,
            namespace=f"{JOB}/{args.run_id}",
        )

    def engine(self) -> CheckpointEngine:
        return CheckpointEngine(
            self.volume, parts=self.layout, writer_threads=self.args.writer_threads, keep_last=2
        )

    @property
    def replaced(self) -> bool:
        """On the node that is lost and replaced (the last one)."""
        return self.node == self.args.nodes - 1


def save_goodput(
    engine: CheckpointEngine, state: Any, step: int, rank: Rank
) -> tuple[float, float]:
    started = time.perf_counter()
    handle = engine.save(state, step, dp_rank=rank.local, dp_world=rank.args.procs_per_node)
    stall = time.perf_counter() - started
    result = handle.wait(rank.args.timeout)
    durable = time.perf_counter() - started
    if result.error:
        raise RuntimeError(f"engine save of step {step} failed: {result.error}")
    return stall, durable


def save_dcp(state: Any, step: int, shared: Path, group: dist.ProcessGroup) -> tuple[float, float]:
    started = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=shared / step_dir_name(step), process_group=group)
    assert isinstance(future, Future)  # without a stager, async_save answers the upload's
    stall = time.perf_counter() - started
    future.result()
    return stall, time.perf_counter() - started


async def pull_part(rank: Rank, step: int, host: str, port: int) -> int:
    """The replacement node's leader: its part from node 0's peer copy onto its empty volume."""
    remote = peer_root(JOB, node_name(rank.node))
    async with await PeerClient.connect(host, port) as client:
        manifest = await client.fetch_manifest(f"{remote}/{step_dir_name(step)}")
    async with PeerSource(host, port, remote) as source:
        report = await restore_to_volume(
            step, manifest.files, rank.volume, [source], manifest=manifest
        )
    return sum(report.bytes_by_tier().values())


async def push_part(rank: Rank, step: int, host: str, port: int) -> None:
    """What the replicator does after a save: the node's part to its peer (untimed setup)."""
    async with await PeerClient.connect(host, port) as client:
        remote = f"{peer_root(JOB, node_name(rank.node))}/{step_dir_name(step)}"
        await client.push_checkpoint(step_dir(rank.volume, step), remote)


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.005)


def drop_caches(rank: Rank) -> None:
    dist.barrier()
    if rank.rank == 0:
        rank.cache.drop(Path(rank.args.work))
    dist.barrier()


def restore_goodput(rank: Rank, step: int, template: Any) -> tuple[float, float, int]:
    """Seconds until this rank holds its shards (the new node: pulled from the peer first),
    seconds spent pulling, and the bytes pulled."""
    host, port = rank.args.peer.split(":")
    pulled = 0
    started = time.perf_counter()
    if rank.replaced and rank.local == 0:
        pulled = asyncio.run(pull_part(rank, step, host, int(port)))
    elif rank.replaced:
        wait_for(step_dir(rank.volume, step) / MANIFEST_NAME, rank.args.timeout)
    pull_s = time.perf_counter() - started if rank.replaced else 0.0
    with rank.engine() as engine:
        restored_step, _ = engine.restore(step, into=template)
    if restored_step != step:
        raise RuntimeError(f"restored step {restored_step}, not {step}")
    return time.perf_counter() - started, pull_s, pulled


def zero(template: Any) -> None:
    with torch.no_grad():
        for tensor in local_tensors(template):
            tensor.zero_()


def restore_repeat(
    rank: Rank, template: Any, expected: list[torch.Tensor], step: int, shared: Path
) -> dict[str, Any]:
    """One restore of each: the replacement node's from its peer and the volumes, and DCP's."""
    if rank.replaced and rank.local == 0:
        shutil.rmtree(rank.volume)  # the replacement node's volume starts empty
        rank.volume.mkdir(parents=True)
    zero(template)
    drop_caches(rank)
    seconds, pull_s, pulled = restore_goodput(rank, step, template)
    row: dict[str, Any] = {"goodput_restore_s": slowest(seconds)}
    row["goodput_pull_s"] = slowest(pull_s)
    row["goodput_consistent"] = every(same_bits(expected, template))
    row["goodput_pulled_bytes"] = int(slowest(float(pulled)))
    zero(template)
    drop_caches(rank)
    started = time.perf_counter()
    dcp.load(template, checkpoint_id=shared / step_dir_name(step))
    row["dcp_restore_s"] = slowest(time.perf_counter() - started)
    row["dcp_consistent"] = every(same_bits(expected, template))
    return row


def state_bytes(state: Any) -> int:
    """The global state's tensor bytes (every shard once)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    return 0


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = Rank(args)
    dcp_group = dist.new_group(backend="gloo")  # DCP's async collectives off the training group
    shared = Path(args.work) / "shared"
    model, optim = build(int(args.size_gb * 1e9), rank.world)
    train_step(model, optim, 0)  # creates AdamW's state
    engine = rank.engine()
    engine.prepare(state_of(model, optim, 0), dp_rank=rank.local, dp_world=args.procs_per_node)
    saves: list[dict[str, float]] = []
    step = 0
    # one untimed save of each first: both pay their one-time set-up (threads, connections)
    for repeat in range(-1, args.repeats):
        figures: dict[str, float] = {}
        for method in ("goodput", "dcp") if repeat % 2 else ("dcp", "goodput"):
            step += 1
            train_step(model, optim, step)
            state = state_of(model, optim, step)
            dist.barrier()
            if method == "goodput":
                stall, durable = save_goodput(engine, state, step, rank)
            else:
                stall, durable = save_dcp(state, step, shared, dcp_group)
            figures[f"{method}_stall_s"] = slowest(stall)
            figures[f"{method}_durable_s"] = slowest(durable)
        if repeat < 0:
            continue
        saves.append(figures)
        if rank.rank == 0:
            print(f"save {repeat}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    # one state saved both ways, then restored both ways after the last node is replaced
    step += 1
    train_step(model, optim, step)
    state = state_of(model, optim, step)
    save_goodput(engine, state, step, rank)
    save_dcp(state, step, shared, dcp_group)
    engine.close()
    expected = [tensor.clone() for tensor in local_tensors(state)]
    if rank.replaced and rank.local == 0:
        host, port = args.peer.split(":")
        asyncio.run(push_part(rank, step, host, int(port)))
    restores = []
    for repeat in range(args.repeats):
        restores.append(restore_repeat(rank, state, expected, step, shared))
        if rank.rank == 0:
            print(f"restore {repeat}: {json.dumps(restores[-1])}", file=sys.stderr, flush=True)
    if rank.rank == 0:
        result = {
            "saves": saves,
            "restores": restores,
            "state_bytes": state_bytes(state),
            "cache_drop": rank.cache.method,
        }
        (Path(args.work) / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--procs-per-node", type=int, required=True)
    parser.add_argument("--size-gb", type=float, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--writer-threads", type=int, required=True)
    parser.add_argument("--peer", required=True, help="host:port of node 0's peer server")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(parse(sys.argv[1:]))
    # leave without the interpreter's finalization: FSDP's DTensors still hold the gloo group,
    # and a gloo thread freeing their work during finalization can abort the process
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
