"""The replicator service process: one per node, moving checkpoints between tiers.

Control plane on the bus (the index in ``gp_ckpt_index``, events, ``RestoreToNode``), data
plane peer to peer: the node's peer server serves its directory (own volume and the copies it
keeps for peers) over direct TCP. Loops: sync (announce the node, hash and index what its disk
holds), replicate (newest own checkpoint to chosen peers), back up (every k-th checkpoint or
every T seconds, to the object store), collect garbage (by the retention policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goodput import schemas, subjects
from goodput.config import ServiceConfig
from goodput.telemetry import tracer
from goodput.tiers.backup import backup_checkpoint, is_backup_complete, listing_key
from goodput.tiers.peer import PeerClient, PeerServer
from goodput_services.base import Service
from goodput_services.replicator.gc import Retention, collect_garbage
from goodput_services.replicator.holdings import STEP_PREFIX, DiskHoldings, node_dir
from goodput_services.replicator.index import CheckpointIndex, IndexSnapshot
from goodput_services.replicator.options import (
    ReplicatorOptions,
    open_object_store,
    store_spec,
    store_uri,
)
from goodput_services.replicator.records import (
    STORE_HOLDER,
    CopyRecord,
    NodeRecord,
    copy_key,
    peer_root,
    store_namespace,
)
from goodput_services.replicator.restore import NothingToRestore, restore_to_node
from goodput_services.replicator.topology import choose_peers

log = logging.getLogger(__name__)


@dataclass
class Counters:
    replicated: int = 0
    backed_up: int = 0
    restored: int = 0
    gc_deleted: int = 0
    last_error: str = ""


class ReplicatorService(Service):
    name = "replicator"

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        if not config.node:
            raise SystemExit("the replicator serves one node: pass --node NAME")
        self.node = config.node
        self.command_target = subjects.node_target(subjects.REPLICATOR, self.node)
        self.options = ReplicatorOptions.from_mapping(config.options)
        self.state_dir = Path(config.state_dir).resolve()
        self.node_dir = node_dir(self.state_dir, self.node)
        self.store_spec = store_spec(self.options, self.state_dir)
        self.store = open_object_store(
            self.store_spec, self.options.gcs_endpoint, self.options.store_retry_s
        )
        self.holdings = DiskHoldings(
            self.node_dir, self.job, self.node, self.options.scrub_interval_s
        )
        self.retention = Retention(
            keep={
                "local": self.options.keep_local,
                "peer": self.options.keep_peer,
                "object_store": self.options.keep_object_store,
            },
            require=tuple(self.options.gc_require),
        )
        self.counters = Counters()
        self.index: CheckpointIndex | None = None
        self.peer_server: PeerServer | None = None
        self.snapshot: IndexSnapshot | None = None
        self.held: dict[str, CopyRecord] = {}
        self._fresh: list[asyncio.Event] = []  # one per transfer loop: a new snapshot
        self._store_lock = asyncio.Lock()  # backups and the store sweep never overlap here
        self._sync_lock = asyncio.Lock()
        #: recent pushes, counted as copies until the holder has indexed them (or withdrawn
        #: them: a copy that later fails its scrub is then replicated again)
        self._pushed: dict[tuple[int, str], float] = {}
        self._peer_cooldown: dict[str, float] = {}
        self._local_steps_seen: set[int] = set()
        self._last_backup: tuple[int, float] | None = None  # (step, monotonic time)
        self._backup_retry_at = 0.0
        self._tracer = tracer("goodput.replicator")

    # ---- service hooks ------------------------------------------------------------------

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self._run()]

    async def _run(self) -> None:
        assert self.bus is not None
        self.index = CheckpointIndex(self.bus, self.job)
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self.peer_server = PeerServer(self.node_dir, self.options.host, self.options.port)
        await self.peer_server.start()
        log.info(
            "peer data plane listening",
            extra={"host": self.peer_server.host, "port": self.peer_server.port},
        )
        await asyncio.gather(
            self._every(self.options.poll_s, self._sync, "sync"),
            self._on_snapshot(self._replicate, "replicate"),
            self._on_snapshot(self._backup, "backup"),
            self._every(self.options.gc_interval_s, self._collect_garbage, "gc", delay=True),
        )

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        if isinstance(command, schemas.RestoreToNode):
            return await self._restore(command)
        return await super().execute(command)

    def health(self) -> tuple[bool, str]:
        c = self.counters
        detail = (
            f"replicated {c.replicated}, backed up {c.backed_up}, restored {c.restored}, "
            f"gc deleted {c.gc_deleted}"
        )
        if c.last_error:
            detail += f"; last error: {c.last_error}"
        return self.peer_server is not None, detail

    async def on_stop(self) -> None:
        if self.peer_server is not None:
            await self.peer_server.close()

    # ---- loop machinery -----------------------------------------------------------------

    def _failed(self, what: str, exc: BaseException) -> None:
        self.counters.last_error = f"{what}: {type(exc).__name__}: {exc}"[:300]
        log.warning("%s failed: %r", what, exc)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _every(
        self, period_s: float, work: Callable[[], Awaitable[None]], what: str, delay: bool = False
    ) -> None:
        if delay:
            await self._pause(period_s)
        while not self.stopping.is_set():
            try:
                await work()
            except Exception as exc:
                self._failed(what, exc)
            await self._pause(period_s)

    async def _on_snapshot(
        self, work: Callable[[IndexSnapshot], Awaitable[None]], what: str
    ) -> None:
        """Run ``work`` on each new snapshot; slow work simply skips the ones it missed."""
        fresh = asyncio.Event()
        self._fresh.append(fresh)
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fresh.wait(), 1.0)
            if not fresh.is_set() or self.snapshot is None:
                continue
            fresh.clear()
            try:
                await work(self.snapshot)
            except Exception as exc:
                self._failed(what, exc)

    # ---- sync: announce and index what the disk holds ----------------------------------

    async def _sync(self) -> None:
        async with self._sync_lock:  # the loop and a restore may both ask for one
            await self._sync_once()

    async def _sync_once(self) -> None:
        assert self.index is not None and self.peer_server is not None
        await self.index.announce(
            NodeRecord(
                node=self.node,
                host=self.options.advertise_host or self.options.host,
                port=self.peer_server.port,
                labels=dict(self.options.labels),
                object_store=self.store_spec,
                gcs_endpoint=self.options.gcs_endpoint,
                ts=time.time_ns(),
            )
        )
        held, problems = await asyncio.to_thread(self.holdings.scan)
        for problem in problems:
            self.counters.last_error = f"not indexed: {problem}"[:300]
            log.warning("copy fails verification; not indexed", extra={"problem": problem})
        snapshot = await self.index.snapshot(self.options.node_ttl_s)
        indexed = {
            copy_key(self.job, c): c
            for c in snapshot.copies_held_by(self.node)
            if c.tier != "object_store"
        }
        changed = False
        for key, record in held.items():
            if key not in indexed or indexed[key].files != record.files:
                await self.index.put_copy(record)
                changed = True
        for key, record in indexed.items():
            if key not in held:
                await self.index.delete_copy(record)
                changed = True
        self.held = held
        self._local_steps_seen |= {c.step for c in held.values() if c.tier == "local"}
        if changed:
            snapshot = await self.index.snapshot(self.options.node_ttl_s)
        self.snapshot = snapshot
        for fresh in self._fresh:
            fresh.set()

    def _newest_own(self) -> CopyRecord | None:
        own = [c for c in self.held.values() if c.tier == "local"]
        return max(own, key=lambda c: c.step) if own else None

    def _identical_holders(self, snapshot: IndexSnapshot, mine: CopyRecord) -> set[str]:
        """Live nodes whose own checkpoint of this step has exactly our files."""
        return {
            c.holder
            for c in snapshot.copies
            if c.tier == "local" and c.step == mine.step and c.checksums() == mine.checksums()
        }

    # ---- replicate ----------------------------------------------------------------------

    @property
    def _index_lag_s(self) -> float:
        """How long a holder may take to hash and index a copy it just received."""
        return max(5.0, 5 * self.options.poll_s)

    async def _replicate(self, snapshot: IndexSnapshot) -> None:
        mine = self._newest_own()
        me = snapshot.nodes.get(self.node)
        if mine is None or me is None:
            return
        done = {
            c.holder
            for c in snapshot.copies
            if c.tier == "peer" and c.owner == self.node and c.step == mine.step
        } | {
            peer
            for (step, peer), at in self._pushed.items()
            if step == mine.step and time.monotonic() - at < self._index_lag_s
        }
        done &= {n.node for n in snapshot.live_nodes()}
        missing = self.options.replicas - len(done)
        if missing <= 0:
            return
        now = time.monotonic()
        candidates = [
            n
            for n in snapshot.live_nodes()
            if n.node not in done and self._peer_cooldown.get(n.node, 0.0) <= now
        ]
        # peers that already hold these exact files (their own checkpoint, or a copy of an
        # identical node's): replicating to them is verification, not transfer
        identical = {
            c.holder
            for c in snapshot.copies
            if c.tier != "object_store"
            and c.step == mine.step
            and c.checksums() == mine.checksums()
        } - {self.node}
        chosen = choose_peers(
            me,
            candidates,
            identical=identical,
            count=missing,
            block_label=self.options.block_label,
        )
        if not chosen:
            return
        # Give peers with identical shards time to commit theirs (then no byte moves); of
        # nodes with identical data, the lowest-named sends first and the others wait longer,
        # so a peer that needs a real copy receives it once and links it for the rest.
        leader = min(self._identical_holders(snapshot, mine) | {self.node}) == self.node
        patience = self.options.dedup_wait_s * (1 if leader else 2)
        if self.holdings.age_s(mine) < patience and not set(chosen) <= identical:
            return
        await asyncio.gather(*(self._push(mine, snapshot.nodes[p]) for p in chosen))

    async def _push(self, mine: CopyRecord, peer: NodeRecord) -> None:
        assert self.bus is not None
        source = self.node_dir / mine.root / f"{STEP_PREFIX}{mine.step:010d}"
        remote = f"{peer_root(self.job, self.node)}/{STEP_PREFIX}{mine.step:010d}"
        try:
            with self._tracer.start_as_current_span(
                "replicator push", attributes={"goodput.step": mine.step, "goodput.peer": peer.node}
            ):
                async with await PeerClient.connect(peer.host, peer.port) as client:
                    report = await asyncio.wait_for(
                        client.push_checkpoint(source, remote), self.options.push_timeout_s
                    )
        except Exception as exc:
            # pick another peer for a while; the partial files on this one let a retry resume
            self._peer_cooldown[peer.node] = time.monotonic() + self.options.node_ttl_s
            self._failed(f"replicate step {mine.step} to {peer.node}", exc)
            return
        self._pushed[(mine.step, peer.node)] = time.monotonic()
        self.counters.replicated += 1
        await self.bus.emit(
            schemas.CheckpointReplicated(
                job=self.job,
                node=self.node,
                peer=peer.node,
                step=mine.step,
                bytes_sent=report.bytes_sent,
                bytes_deduplicated=report.bytes_skipped,
                duration_s=report.seconds,
            )
        )

    # ---- back up ------------------------------------------------------------------------

    def _backup_due(self, snapshot: IndexSnapshot, mine: CopyRecord) -> bool:
        if self._last_backup is None:
            ours = [
                c.step
                for c in snapshot.all_copies
                if c.tier == "object_store" and c.owner == self.node
            ]
            if ours:
                self._last_backup = (max(ours), time.monotonic())
        if self._last_backup is None:
            return True
        last_step, last_time = self._last_backup
        if mine.step <= last_step:
            return False
        since = len([s for s in self._local_steps_seen if s > last_step])
        return (
            since >= self.options.backup_every
            or time.monotonic() - last_time >= self.options.backup_interval_s
        )

    async def _backup(self, snapshot: IndexSnapshot) -> None:
        mine = self._newest_own()
        if mine is None or time.monotonic() < self._backup_retry_at:
            return
        if not self._backup_due(snapshot, mine):
            return
        if self._should_wait_for_leader(snapshot, mine):
            return  # the group's leader uploads the shared shards once; we follow
        async with self._store_lock:
            await self._upload(mine)

    def _should_wait_for_leader(self, snapshot: IndexSnapshot, mine: CopyRecord) -> bool:
        """Nodes with identical data back up after the lowest-named of them (the leader) has
        stored the shards, so each unique shard is uploaded once. Lower-named live nodes that
        have not indexed this step yet may still turn out identical: they are waited for too,
        at most ``backup_wait_s``."""
        if self.holdings.age_s(mine) >= self.options.backup_wait_s:
            return False
        if any(
            c.tier == "object_store" and c.step == mine.step and c.checksums() == mine.checksums()
            for c in snapshot.all_copies
        ):
            return False
        leader = min(self._identical_holders(snapshot, mine) | {self.node})
        indexed = {c.holder for c in snapshot.copies if c.tier == "local" and c.step == mine.step}
        undecided = [n.node for n in snapshot.live_nodes() if n.node not in indexed]
        return leader != self.node or any(n < self.node for n in undecided)

    async def _upload(self, mine: CopyRecord) -> None:
        assert self.bus is not None and self.index is not None
        source = self.node_dir / mine.root / f"{STEP_PREFIX}{mine.step:010d}"
        namespace = store_namespace(self.job, self.node)
        try:
            with self._tracer.start_as_current_span(
                "replicator back up", attributes={"goodput.step": mine.step}
            ):
                report = await asyncio.to_thread(backup_checkpoint, source, self.store, namespace)
                complete = await asyncio.to_thread(
                    is_backup_complete, self.store, namespace, mine.step
                )
                if not complete:
                    raise RuntimeError("blobs vanished during the backup (concurrent sweep)")
        except Exception as exc:
            self._backup_retry_at = time.monotonic() + max(2.0, self.options.poll_s)
            self._failed(f"back up step {mine.step}", exc)
            return
        await self.index.put_copy(
            CopyRecord(
                step=mine.step,
                tier="object_store",
                holder=STORE_HOLDER,
                owner=self.node,
                root=namespace,
                files=list(mine.files),
                verified_ts=time.time_ns(),
            )
        )
        self._last_backup = (mine.step, time.monotonic())
        self.counters.backed_up += 1
        await self.bus.emit(
            schemas.CheckpointBackedUp(
                job=self.job,
                node=self.node,
                step=mine.step,
                uri=f"{store_uri(self.store_spec)}/{listing_key(namespace, mine.step)}",
                bytes_uploaded=report.bytes_uploaded,
                bytes_deduplicated=report.bytes_skipped,
                duration_s=report.seconds,
            )
        )

    # ---- garbage collection -------------------------------------------------------------

    async def _collect_garbage(self) -> None:
        assert self.index is not None
        snapshot = await self.index.snapshot(self.options.node_ttl_s)
        live = [n.node for n in snapshot.live_nodes()]
        sweeps_store = bool(live) and min(live) == self.node  # one sweeper for the shared store
        async with self._store_lock:
            report = await collect_garbage(
                self.index,
                snapshot,
                self.retention,
                state_dir=self.state_dir,
                disks_of={self.node},
                store=self.store if sweeps_store else None,
            )
        if report.deleted:
            self.counters.gc_deleted += len(report.deleted)
            log.info("garbage collected", extra={"summary": report.summary()})

    # ---- restore ------------------------------------------------------------------------

    async def _restore(self, command: schemas.RestoreToNode) -> tuple[bool, str]:
        assert self.bus is not None and self.index is not None
        if command.node != self.node:
            return False, f"this replicator serves {self.node}, not {command.node}"
        try:
            await self._sync()  # index a checkpoint the ranks committed a moment ago, if any
        except Exception as exc:
            self._failed("sync before restore", exc)
        snapshot = await self.index.snapshot(self.options.node_ttl_s)
        try:
            outcome = await restore_to_node(
                snapshot,
                job=self.job,
                node=self.node,
                node_dir=self.node_dir,
                store=self.store,
                step=command.step,
                block_label=self.options.block_label,
            )
        except NothingToRestore as exc:
            self._failed("restore", exc)
            return False, f"nothing restored: {exc}"
        if outcome.step is None:
            return True, outcome.detail
        self.counters.restored += 1
        await self.bus.emit(
            schemas.CheckpointRestored(
                job=self.job,
                node=self.node,
                rank=-1,
                step=outcome.step,
                tier=outcome.tier,  # type: ignore[arg-type]
                duration_s=outcome.seconds,
                bytes=outcome.bytes,
                fallbacks=outcome.fallbacks,
            )
        )
        return True, outcome.detail


SERVICE = ReplicatorService
