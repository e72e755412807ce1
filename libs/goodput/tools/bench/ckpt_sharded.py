"""`goodput bench ckpt --sharded`: a sharded checkpoint across nodes, goodput's parts vs DCP.

An FSDP2 model + AdamW (about --size-gb) sharded over one mesh spanning --nodes x
--procs-per-node gloo rank processes on this machine, each node with a volume of its own
(``<work>/nodes/node<k>/checkpoints/bench``) and one shared directory for DCP. In the same
run, per repeat (--saves, rotating which goes first), each save where it sits in training:
the engine's sharded save (each node's part into its volume, then the global commit),
overlapped with the next forward/backward as ``shim.guard`` makes it and blocking as the shim
saves without it, against ``dcp.async_save`` of the same state into the shared directory:
stall (the call, plus the wait before the optimizer step) and durable time (until written
and committed), the slowest rank's; one untimed save of each comes first (all pay their
set-up there). Then a replacement node: the last node's memory is gone, its volume wiped and
its part pulled from node 0's peer server (a real peer-server process holding the copy
replication pushed); every rank restores in a new engine as the shim's cold start does (the
surviving nodes from their shared memory, the rest from the volume) and again from the
volumes alone (a Kubernetes rank pod shares no memory with its node's others), against every
rank's ``dcp.load`` from the shared directory (page caches dropped first; every restore
compared bit for bit with the saved state). See ``ckpt_sharded_rank`` for the rank's side.

Figures are medians with [min, max] over the repeats; ratios (goodput / DCP) are taken per
repeat, so each compares runs next to each other. The aims: stall at most half of DCP's,
durable and the replacement's restore at most DCP's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from goodput.checkpoint.format import node_dir
from goodput.checkpoint.tiers.peer import PeerServerProcess
from goodput.tools.bench.ckpt_sharded_state import RESTORES, node_name

#: figure -> (goodput's key, DCP's key, the aim for goodput / DCP): the overlapped save
#: (``shim.guard``) and the blocking one; the restore as the shim restores after a hot swap
#: (the survivors' nodes from their shared memory) and from the volumes alone
FIGURES = {
    "stall": ("goodput_stall_s", "dcp_stall_s", 0.5),
    "stall_blocking": ("goodput_blocking_stall_s", "dcp_stall_s", 0.5),
    "durable": ("goodput_durable_s", "dcp_durable_s", 1.0),
    "durable_blocking": ("goodput_blocking_durable_s", "dcp_durable_s", 1.0),
    "restore": ("goodput_restore_s", "dcp_restore_s", 1.0),
    "restore_volumes": ("goodput_volumes_restore_s", "dcp_restore_s", 1.0),
}


class BenchFailed(RuntimeError):
    """A rank process failed; the message names it and ends with its last line."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians and ranges per method, goodput / DCP per repeat, and whether each aim is met
    (the median ratio against the aim)."""
    summary: dict[str, Any] = {}
    for figure, (ours, theirs, aim) in FIGURES.items():
        rows = result["restores" if figure.startswith("restore") else "saves"]
        ratios = [row[ours] / row[theirs] for row in rows if row[theirs] > 0]
        summary[figure] = {
            "goodput_s": _spread([row[ours] for row in rows]),
            "dcp_s": _spread([row[theirs] for row in rows]),
            "ratio": _spread(ratios) if ratios else None,
            "aim": aim,
            "met": bool(ratios) and statistics.median(ratios) <= aim,
        }
    restores = result["restores"]
    summary["consistent"] = {
        kind: all(row[f"{kind}_consistent"] for row in restores) for kind in RESTORES
    }
    summary["replacement_pulled_bytes"] = restores[0]["goodput_pulled_bytes"] if restores else 0
    if restores:  # where the replacement's restore goes: pulling its part, then loading
        goodputs = [kind for kind in RESTORES if kind != "dcp"]
        pulls = [row[f"{kind}_pull_s"] for row in restores for kind in goodputs]
        summary["replacement_pull_s"] = _spread(pulls)
        summary["memory_bytes"] = _spread([float(row["goodput_memory_bytes"]) for row in restores])
    return summary


def _launch(work: Path, args: Any, peer: str, run_id: str) -> list[tuple[subprocess.Popen, Path]]:
    world = args.nodes * args.procs_per_node
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env["WORLD_SIZE"] = str(world)
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [
        *(sys.executable, "-m", "goodput.tools.bench.ckpt_sharded_rank", "--work", str(work)),
        *("--nodes", str(args.nodes), "--procs-per-node", str(args.procs_per_node)),
        *("--size-gb", str(args.size_gb), "--repeats", str(args.saves), "--peer", peer),
        *("--writer-threads", str(args.writer_threads), "--run-id", run_id),
    ]
    ranks = []
    for rank in range(world):
        log = work / f"rank-{rank}.log"
        with open(log, "wb") as sink:
            local = str(rank % args.procs_per_node)
            process = subprocess.Popen(
                command,
                env=dict(env, RANK=str(rank), LOCAL_RANK=local),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        ranks.append((process, log))
    return ranks


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _wait(ranks: list[tuple[subprocess.Popen, Path]], timeout_s: float, console: Console) -> None:
    """Until every rank exits; the first that fails (or the timeout) stops the others."""
    deadline = time.monotonic() + timeout_s
    shown = 0
    try:
        while any(process.poll() is None for process, _ in ranks):
            for rank, (process, log) in enumerate(ranks):
                if process.poll() not in (None, 0):
                    raise BenchFailed(f"rank {rank} exited {process.returncode}: {_last_line(log)}")
            if time.monotonic() > deadline:
                raise BenchFailed(f"the ranks did not finish within {timeout_s:.0f} s")
            progress = ranks[0][1].read_text(errors="replace").splitlines()
            for line in progress[shown:]:
                if line.startswith(("save ", "restore ")):
                    console.print(line, soft_wrap=True, markup=False, highlight=False)
            shown = len(progress)
            time.sleep(0.2)
        for rank, (process, log) in enumerate(ranks):
            if process.returncode != 0:
                raise BenchFailed(f"rank {rank} exited {process.returncode}: {_last_line(log)}")
    finally:
        for process, _ in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()


def run_sharded(args: Any, work: Path) -> dict[str, Any]:
    """The benchmark in ``work`` (an empty directory); returns the report."""
    console = Console(stderr=True)
    for node in range(args.nodes):
        node_dir(work, node_name(node)).mkdir(parents=True)
    (work / "shared").mkdir()
    run_id = uuid.uuid4().hex[:12]
    with PeerServerProcess(node_dir(work, node_name(0))) as peer:
        ranks = _launch(work, args, f"{peer.host}:{peer.port}", run_id)
        _wait(ranks, args.timeout, console)
    result = json.loads((work / "result.json").read_text())
    return {
        "nodes": args.nodes,
        "procs_per_node": args.procs_per_node,
        "size_gb": args.size_gb,
        "state_bytes": result["state_bytes"],
        "repeats": args.saves,
        "writer_threads": args.writer_threads,
        "cpus": os.cpu_count(),
        "cache_drop": result["cache_drop"],
        "summary": summarize(result),
        "saves": result["saves"],
        "restores": result["restores"],
        "notes": {
            "stall_s": "the save call plus the wait before the optimizer step, the slowest"
            " rank's: goodput's engine overlapped with the next forward/backward (shim.guard;"
            " the optimizer step waits for the copy) and blocking (the copy into its reused"
            " host buffer inside the call, as the shim saves unguarded) vs dcp.async_save"
            " (its staging copy inside the call)",
            "durable_s": "save call until written and committed, the slowest rank's: the"
            " engine's handle (parts durable, commit table, part renamed) vs DCP's future",
            "restore_s": "from a barrier until the slowest rank holds its shards: the replaced"
            " (last) node, its memory gone, pulls its part from node 0's peer server; every"
            " rank restores in a new engine as the shim's cold start does (restore: the"
            " surviving nodes' ranks from the segments of the node's shared memory, as on"
            " Slurm or bare metal; restore_volumes: every rank from its volume, as rank pods"
            " on Kubernetes) vs every rank's dcp.load from the shared directory",
            "memory_bytes": "bytes the restore read from the nodes' shared memory (all ranks)",
            "ratio": "goodput / DCP per repeat; 'met' compares the median ratio with the aim",
            "machine": "every rank, the peer server and both writers share this machine's"
            " CPUs and disk: a busy machine spreads the figures (see the ranges)",
        },
    }


def _spread_text(spread: dict[str, float]) -> str:
    return f"{spread['median']:.3f} [{spread['min']:.3f}, {spread['max']:.3f}]"


def print_table(report: dict[str, Any]) -> None:
    summary = report["summary"]
    table = Table(
        title=f"sharded checkpoint of {report['state_bytes'] / 1e9:.2f} GB over"
        f" {report['nodes']} nodes x {report['procs_per_node']} ranks, {report['repeats']} repeats"
    )
    for column in ("figure", "goodput s", "DCP s", "goodput / DCP", "aim", "met"):
        table.add_column(column, justify="right")
    for figure in FIGURES:
        row = summary[figure]
        table.add_row(
            figure,
            _spread_text(row["goodput_s"]),
            _spread_text(row["dcp_s"]),
            _spread_text(row["ratio"]) if row["ratio"] else "-",
            f"≤ {row['aim']:g}",
            "yes" if row["met"] else "[red]no[/red]",
        )
    console = Console()
    console.print(table)
    console.print(f"restored bit for bit: {summary['consistent']}")
    if "memory_bytes" in summary:
        memory = summary["memory_bytes"]["median"] / 1e6
        console.print(f"read from the nodes' shared memory in a restore: {memory:.1f} MB")


def run(args: Any) -> int:
    if args.nodes < 2 or args.procs_per_node < 1:
        raise SystemExit(
            "goodput bench ckpt --sharded: needs --nodes 2 or more (a node is replaced)"
        )
    parent = Path(args.dir) if args.dir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="goodput-bench-sharded-", dir=parent))
    try:
        report = run_sharded(args, work)
    except BenchFailed as exc:
        raise SystemExit(f"goodput bench ckpt --sharded: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0
