"""`goodput bench restore`: how fast a node gets its checkpoint back from each tier.

In one run: restore a node's shard set (``--size-gb``) from its local volume, from a peer
(a real peer-server process over loopback) and from a real fake-gcs-server; replication
throughput (a push to a peer with the source files in the page cache, and again with them
read from disk, as after an O_DIRECT checkpoint) against raw loopback TCP measured in the
same run with as many connections as a push uses: memory to memory (what the network path
carries), and into files with fsync, O_DIRECT from a writer thread the way the receiver
lands bytes (the ceiling for anything that lands durably on this disk) and, for
comparison, written through the page cache; and the bytes moved for three identical DP
replicas versus one, for peer replication and object-store backup (deduplication); and the
replication pipeline as deployed (two replicator processes, before and after event-driven,
hash-once replication; see :mod:`goodput.tools.bench.pipeline`): ``persisted_to_peer_s`` and
``hash_cpu_s_per_gb`` at the top level are the current behaviour's. Caches
are dropped before each restore when the kernel allows it (/proc/sys/vm/drop_caches),
otherwise the source files are evicted with posix_fadvise(DONTNEED). Memory is prewarmed
first (see prewarm_memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import xxhash
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from goodput.checkpoint.format import (
    FileEntry,
    Manifest,
    build_manifest,
    step_dir_name,
    write_all,
    write_manifest,
)
from goodput.checkpoint.tiers.backup import backup_checkpoint
from goodput.checkpoint.tiers.open_store import open_object_store
from goodput.checkpoint.tiers.peer import PeerClient, PeerServerProcess
from goodput.checkpoint.tiers.peer.loopback import measure_tcp_gbps
from goodput.checkpoint.tiers.restore import (
    LocalSource,
    ObjectStoreSource,
    PeerSource,
    Source,
    restore_to_volume,
)
from goodput.checkpoint.tiers.streams import STREAMS
from goodput.schemas.tiers import STORAGE_TIERS

STEP = 1000
BUCKET = "goodput-bench"
WRITE_CHUNK = 64 << 20


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "restore",
        help="restore time per tier (local, peer, object store), replication vs loopback, dedup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--size-gb", type=float, default=2.0, help="node shard set size (10^9 B)")
    parser.add_argument("--files", type=int, default=8, help="shard files per node")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir, removed)")
    parser.add_argument(
        "--no-pipeline",
        dest="pipeline",
        action="store_false",
        help="skip the replication pipeline (replicator processes on an embedded bus)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the object-store leg runs fake-gcs-server (the dev extra): without it, say so now, not
    # after minutes of the other legs
    from goodput.checkpoint.tiers.fake_gcs import binary_path

    binary_path()
    console = Console(stderr=True)
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix="goodput-bench-restore-") as tmp:
            result = measure(Path(tmp), args.size_gb, args.files, console, args.pipeline)
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="bench-restore-", dir=args.dir))
        try:
            result = measure(work, args.size_gb, args.files, console, args.pipeline)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        Console().print(result_table(result))
    return 0


def measure(
    work: Path, size_gb: float, file_count: int, console: Console, pipeline: bool = True
) -> dict:
    total = int(size_gb * 1e9)
    file_size = max(1, total // file_count)
    replica_bytes = file_size * file_count
    with bar(console, "write node shard set", replica_bytes) as tick:
        manifest = write_shard_set(work / "nodeA", file_count, file_size, tick)
    source_dir = work / "nodeA" / step_dir_name(STEP)
    for replica in ("nodeB", "nodeC"):  # identical DP replicas: same bytes, other nodes
        link_replica(source_dir, work / replica / step_dir_name(STEP))

    with console.status("prewarming memory"):
        prewarm_memory(work / "scratch", 2 * replica_bytes)
    with console.status("measuring raw loopback TCP, to memory and to disk"):
        sink = work / "sink.bin"
        loopback_gbps = measure_tcp_gbps(replica_bytes, streams=STREAMS)
        loopback_to_disk_gbps = measure_tcp_gbps(replica_bytes, to_file=sink, streams=STREAMS)
        loopback_to_disk_buffered_gbps = measure_tcp_gbps(
            replica_bytes, to_file=sink, direct=False, streams=STREAMS
        )
    result: dict = {
        "size_gb": replica_bytes / 1e9,
        "files": file_count,
        "replica_bytes": replica_bytes,
        "prewarmed_bytes": 2 * replica_bytes,
        "streams": STREAMS,
        "loopback_gbps": loopback_gbps,
        "loopback_to_disk_gbps": loopback_to_disk_gbps,
        "loopback_to_disk_buffered_gbps": loopback_to_disk_buffered_gbps,
    }
    cache_method = ""
    with PeerServerProcess(work / "peer") as peer:
        push_seconds, peer_bytes = asyncio.run(replicate(peer, work, replica_bytes, console))
        result["replication_gbps"] = replica_bytes / push_seconds / 1e9
        result["replication_fraction_of_loopback"] = result["replication_gbps"] / loopback_gbps
        result["replication_fraction_of_loopback_to_disk"] = (
            result["replication_gbps"] / loopback_to_disk_gbps
        )
        result["peer_bytes_3_replicas"] = peer_bytes

        cache_method = drop_caches(source_dir)
        result["local_s"] = timed_restore(
            manifest, work / "restore-local", [LocalSource(work / "nodeA")], console, "local"
        )
        drop_caches(work / "peer")
        result["peer_s"] = timed_restore(
            manifest,
            work / "restore-peer",
            [PeerSource(peer.host, peer.port, "nodeA")],
            console,
            "peer",
        )
    shutil.rmtree(work / "peer")
    # What a replicator does in production: the engine wrote the shards with O_DIRECT, so
    # the push reads them from disk (a fresh peer, or it would deduplicate).
    drop_caches(source_dir)
    with PeerServerProcess(work / "peer-cold") as peer:
        cold_seconds = asyncio.run(push_once(peer, source_dir, replica_bytes, console))
    result["replication_cold_source_gbps"] = replica_bytes / cold_seconds / 1e9
    shutil.rmtree(work / "peer-cold")

    # imported here, where the object-store leg runs: `goodput bench ckpt` (every bench's
    # parser is built from this module's register) must not need the GCS client to start
    from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer, ensure_bucket

    with FakeGcsServer(work / "gcs") as server:
        ensure_bucket(server.client(), BUCKET)
        store = open_object_store(server.store_uri(BUCKET), retry_s=30)
        uploaded = 0
        for replica in ("nodeA", "nodeB", "nodeC"):
            started = time.perf_counter()
            with console.status(f"backing up {replica} to fake-gcs-server"):
                report = backup_checkpoint(work / replica / step_dir_name(STEP), store, replica)
            uploaded += report.bytes_uploaded
            if replica == "nodeA":
                result["object_store_backup_s"] = time.perf_counter() - started
        result["object_store_bytes_3_replicas"] = uploaded
        drop_caches(work / "gcs")
        result["object_store_s"] = timed_restore(
            manifest, work / "restore-gcs", [ObjectStoreSource(store)], console, "object store"
        )
    result["dedup_bytes_ratio"] = {
        "peer_replication": peer_bytes / replica_bytes,
        "object_store_backup": uploaded / replica_bytes,
    }
    result["cache_drop"] = cache_method
    if pipeline:
        from goodput.tools.bench.pipeline import (
            measure_pipeline,  # starts services: only when asked
        )

        runs = measure_pipeline(
            work,
            STEP,
            lambda volume: write_shard_set(volume, file_count, file_size, lambda _: None),
            replica_bytes,
            console,
        )
        result["replication_pipeline"] = runs
        result["persisted_to_peer_s"] = runs["after"]["persisted_to_peer_s"]
        result["hash_cpu_s_per_gb"] = runs["after"]["hash_cpu_s_per_gb"]
    return result


@contextmanager
def bar(console: Console, label: str, total: int) -> Iterator[Callable[[int], None]]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


def write_shard_set(
    root: Path, file_count: int, file_size: int, tick: Callable[[int], None]
) -> Manifest:
    """Random (incompressible, distinct) shard files and an engine-format manifest."""
    directory = root / step_dir_name(STEP)
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for index in range(file_count):
        name = f"rank{index:02d}.distcp"
        hasher = xxhash.xxh3_128()
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            remaining = file_size
            while remaining:
                chunk = rng.bytes(min(WRITE_CHUNK, remaining))
                hasher.update(chunk)
                write_all(fd, memoryview(chunk))
                remaining -= len(chunk)
                tick(len(chunk))
            os.fsync(fd)
        finally:
            os.close(fd)
        entries.append(FileEntry(name=name, size=file_size, xxh3_128=hasher.hexdigest()))
    manifest = build_manifest(STEP, entries, metadata={"bench": "goodput bench restore"})
    write_manifest(directory, manifest)
    return manifest


def prewarm_memory(scratch: Path, nbytes: int) -> None:
    """Write then delete ``nbytes`` of file data so that later phases get page-cache pages
    the guest has already touched. On a VM, first-touch memory can cost several times more
    than the copy itself (measured: ~0.4 GB/s vs >4 GB/s here), and the phase that happens
    to run first would otherwise pay it alone."""
    block = memoryview(bytearray(WRITE_CHUNK))
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(max(1, nbytes // WRITE_CHUNK)):
            write_all(fd, block)
    finally:
        os.close(fd)
        scratch.unlink()


def link_replica(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for path in source.iterdir():
        os.link(path, dest / path.name)


async def replicate(
    peer: PeerServerProcess, work: Path, replica_bytes: int, console: Console
) -> tuple[float, int]:
    """Push node A (timed), then its identical replicas B and C to the same peer."""
    sent = 0
    seconds = 0.0
    async with await PeerClient.connect(peer.host, peer.port) as client:
        for replica in ("nodeA", "nodeB", "nodeC"):
            with bar(console, f"replicate {replica} to peer", replica_bytes) as tick:
                report = await client.push_checkpoint(
                    work / replica / step_dir_name(STEP),
                    f"{replica}/{step_dir_name(STEP)}",
                    tick,
                )
            sent += report.bytes_sent
            if replica == "nodeA":
                seconds = report.seconds
    return seconds, sent


async def push_once(
    peer: PeerServerProcess, checkpoint_dir: Path, replica_bytes: int, console: Console
) -> float:
    async with await PeerClient.connect(peer.host, peer.port) as client:
        with bar(console, "replicate from disk to a fresh peer", replica_bytes) as tick:
            report = await client.push_checkpoint(
                checkpoint_dir, f"nodeA/{step_dir_name(STEP)}", tick
            )
    return report.seconds


def timed_restore(
    manifest: Manifest, dest: Path, sources: list[Source], console: Console, label: str
) -> float:
    total = sum(f.size for f in manifest.files)

    async def restore() -> float:
        with bar(console, f"restore from {label}", total) as tick:
            report = await restore_to_volume(
                STEP, manifest.files, dest, sources, manifest=manifest, progress=tick
            )
        for source in sources:
            if isinstance(source, PeerSource):
                await source.close()
        if {f.tier for f in report.files} != {sources[0].tier}:
            raise RuntimeError(f"restore from {label} was served by {report.bytes_by_tier()}")
        return report.seconds

    seconds = asyncio.run(restore())
    shutil.rmtree(dest)
    return seconds


def drop_caches(tree: Path) -> str:
    """Evict file pages so restores read from disk; returns the method that worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        pass
    for dirpath, _, filenames in os.walk(tree):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise(DONTNEED)"


def result_table(result: dict) -> Table:
    table = Table(title=f"goodput bench restore — {result['size_gb']:.2f} GB node shard set")
    table.add_column("measure")
    table.add_column("value", justify="right")
    size = result["size_gb"]
    for tier in STORAGE_TIERS:
        seconds = result[f"{tier}_s"]
        table.add_row(f"restore from {tier}", f"{seconds:.2f} s ({size / seconds:.2f} GB/s)")
    table.add_row(
        f"replication (push to peer, {result['streams']} conn.)",
        f"{result['replication_gbps']:.2f} GB/s",
    )
    table.add_row(
        "replication, source read from disk",
        f"{result['replication_cold_source_gbps']:.2f} GB/s",
    )
    table.add_row(
        f"raw loopback TCP, memory to memory ({result['streams']} conn.)",
        f"{result['loopback_gbps']:.2f} GB/s",
    )
    table.add_row(
        "raw loopback TCP, to disk (O_DIRECT + fsync)",
        f"{result['loopback_to_disk_gbps']:.2f} GB/s",
    )
    table.add_row(
        "raw loopback TCP, to disk (page cache + fsync)",
        f"{result['loopback_to_disk_buffered_gbps']:.2f} GB/s",
    )
    table.add_row("replication / loopback", f"{result['replication_fraction_of_loopback']:.0%}")
    table.add_row(
        "replication / loopback to disk",
        f"{result['replication_fraction_of_loopback_to_disk']:.0%}",
    )
    table.add_row("object-store backup (1 replica)", f"{result['object_store_backup_s']:.2f} s")
    ratios = result["dedup_bytes_ratio"]
    table.add_row(
        "bytes for 3 DP replicas / 1, peer",
        f"{ratios['peer_replication']:.3f} ({result['peer_bytes_3_replicas']:,} B)",
    )
    table.add_row(
        "bytes for 3 DP replicas / 1, object store",
        f"{ratios['object_store_backup']:.3f} ({result['object_store_bytes_3_replicas']:,} B)",
    )
    table.add_row("cache eviction", result["cache_drop"])
    for mode, run in result.get("replication_pipeline", {}).items():
        table.add_row(
            f"pipeline {mode}: persisted → held by a peer",
            f"{run['persisted_to_peer_s']:.2f} s",
        )
        table.add_row(
            f"pipeline {mode}: hashing",
            f"{run['hash_cpu_s_per_gb']:.2f} CPU s/GB, {run['hashes_per_byte']:.1f} per byte",
        )
    return table
