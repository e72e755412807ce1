"""One rank of `goodput bench ckpt --sharded` (started by ``ckpt_sharded``, one process per rank).

Every rank holds its FSDP2 shard of one model + AdamW state whose mesh spans all the nodes
(``world = nodes x procs-per-node``, ranks numbered node by node), and an engine built as the
shim builds it (host buffers in the node's shared memory, ``node_shared``). Each repeat saves
the state three ways, in rotating order, each where it sits in training (after an optimizer
step; the next forward/backward runs, then what must end before the optimizer changes the
state, then the optimizer step): goodput's engine overlapped (``shim.guard``: the copy runs
on during the forward/backward, the optimizer step waits for it), blocking (the copy inside
the call, as the shim saves without the guard), and ``dcp.async_save`` into one shared
directory. The stall is the call plus that wait; the durable time runs from the call until
written and committed, watched from a thread. Both are the slowest rank's, taken with an
all-reduce after the clocks stopped. Every node's ranks write the node's part into its own
volume (``PartLayout``), committed globally.

Then the job restarts with the last node replaced: that node's engines are closed (its
memory is gone), its volume wiped, and node 0's peer server holds the copy of its part that
replication would have pushed there (pushed untimed). The clock runs from a barrier until the
slowest rank holds its shards again: the new node's leader pulls the part from the peer
(``restore_to_volume``, every file verified), then each rank restores in a new engine as the
shim's cold start does — from the node's shared memory where its predecessors' segments
hold the step (the surviving nodes, on Slurm or bare metal), else from its volume. Again with
every rank from its volume (a Kubernetes rank pod has a ``/dev/shm`` of its own, so nothing
is shared in memory there). Against both, every rank's ``dcp.load`` from the shared
directory. Page caches are dropped before each restore (shared memory is not a cache), and
each restore is compared bit for bit with the state at the save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host
from goodput.checkpoint.format import MANIFEST_NAME, peer_root, step_dir, step_dir_name
from goodput.checkpoint.tiers.peer import PeerClient
from goodput.checkpoint.tiers.restore import PeerSource, restore_to_volume
from goodput.shim.collectives import all_reduce_ints
from goodput.tools.bench.ckpt_sharded_saves import Training, engine_wait, save_repeats
from goodput.tools.bench.ckpt_sharded_state import (
    JOB,
    RESTORES,
    Rank,
    build,
    every,
    local_tensors,
    node_name,
    rotated,
    same_bits,
    slowest,
    state_bytes,
    state_of,
    train_step,
    zero,
)


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


def restore_goodput(
    rank: Rank, step: int, template: Any, *, memory: bool
) -> tuple[float, float, int, int]:
    """Seconds until this rank holds its shards (the new node: pulled from the peer first),
    seconds spent pulling, the bytes pulled and the bytes read from the node's memory. The
    rank restores in a new engine, as a restarted process would: with ``memory`` as the
    shim's cold start does (``TrainerShim._load``: the node's segments, the rest from the
    volume), else from the volume alone."""
    host, port = rank.args.peer.split(":")
    pulled = 0
    started = time.perf_counter()
    if rank.replaced and rank.local == 0:
        pulled = asyncio.run(pull_part(rank, step, host, int(port)))
    elif rank.replaced:
        wait_for(step_dir(rank.volume, step) / MANIFEST_NAME, rank.args.timeout)
    pull_s = time.perf_counter() - started if rank.replaced else 0.0
    from_memory = 0
    with rank.engine() as engine:
        outcome = restore_from_host(engine, step, template, own=False, merge=True) if memory else ""
        if isinstance(outcome, HostRestore):
            restored_step, from_memory = outcome.step, outcome.host_bytes
        else:  # as the shim: the reason is logged there, the volume serves everything
            restored_step, _ = engine.restore(step, into=template)
    if restored_step != step:
        raise RuntimeError(f"restored step {restored_step}, not {step}")
    return time.perf_counter() - started, pull_s, pulled, from_memory


def restore_repeat(
    rank: Rank, template: Any, expected: list[torch.Tensor], step: int, shared: Path, repeat: int
) -> dict[str, Any]:
    """One restore of each kind (``RESTORES``), each into a zeroed state after the page caches
    were dropped; the replacement node's volume starts empty for each of goodput's."""
    row: dict[str, Any] = {}
    for kind in rotated(RESTORES, repeat):
        if kind != "dcp" and rank.replaced and rank.local == 0:
            shutil.rmtree(rank.volume)
            rank.volume.mkdir(parents=True)
        zero(template)
        drop_caches(rank)
        if kind == "dcp":
            started = time.perf_counter()
            dcp.load(template, checkpoint_id=shared / step_dir_name(step))
            row["dcp_restore_s"] = slowest(time.perf_counter() - started)
        else:
            seconds, pull_s, pulled, memory = restore_goodput(
                rank, step, template, memory=kind == "goodput"
            )
            row[f"{kind}_restore_s"] = slowest(seconds)
            row[f"{kind}_pull_s"] = slowest(pull_s)
            row[f"{kind}_pulled_bytes"] = int(slowest(float(pulled)))
            row[f"{kind}_memory_bytes"] = all_reduce_ints([memory], dist.ReduceOp.SUM)[0]
        row[f"{kind}_consistent"] = every(same_bits(expected, template))
    return row


def save_both(training: Training, rank: Rank, step: int) -> tuple[Any, list[torch.Tensor]]:
    """The state restored later, saved both ways (untimed; goodput's overlapped, so every
    restore also checks that the training step after the call changed nothing it saved);
    returns it and a copy of its tensors as this rank held them at the save."""
    state = state_of(training.model, training.optim, step)
    expected = [tensor.clone() for tensor in local_tensors(state)]
    checkpoint = training.shared / step_dir_name(step)
    dcp.save(state, checkpoint_id=checkpoint, process_group=training.group)
    handle = training.engine.save(
        state, step, overlap=True, dp_rank=rank.local, dp_world=rank.local_world
    )
    train_step(training.model, training.optim, step + 1)  # the guard waits for the copy
    engine_wait(handle, rank.args.timeout)()
    return state, expected


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = Rank(args)
    dcp_group = dist.new_group(backend="gloo")  # DCP's async collectives off the training group
    model, optim = build(int(args.size_gb * 1e9), rank.world)
    train_step(model, optim, 0)  # creates AdamW's state
    engine = rank.engine()
    guard = engine.guard(optim)  # as shim.guard: optimizer steps wait for overlapped copies
    engine.prepare(state_of(model, optim, 0), dp_rank=rank.local, dp_world=rank.local_world)
    training = Training(model, optim, engine, Path(args.work) / "shared", dcp_group)
    saves, step = save_repeats(training, rank)
    step += 1
    state, expected = save_both(training, rank, step)
    guard.remove()
    if rank.replaced:  # the lost node's memory goes with it; the survivors' segments stay
        engine.close()
        if rank.local == 0:
            host, port = args.peer.split(":")
            asyncio.run(push_part(rank, step, host, int(port)))
    restores = []
    for repeat in range(args.repeats):
        restores.append(restore_repeat(rank, state, expected, step, training.shared, repeat))
        if rank.rank == 0:
            print(f"restore {repeat}: {json.dumps(restores[-1])}", file=sys.stderr, flush=True)
    if not rank.replaced:
        engine.close()
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
