"""The replicator service process: one per node, moving checkpoints between tiers.

Control plane on the bus (the index in ``gp_ckpt_index``, read once and then followed by its
changes: ``checkpoint.index.follower``; events, ``RestoreToNode``), data
plane peer to peer: the node's peer server serves its directory (own volume and the copies it
keeps for peers) over direct TCP. Loops: sync (announce the node when its record is due —
at start, on change, as a slow refresh: ``checkpoint.index.announcement`` —, check and index
what its disk holds: every ``poll_s``, and at once when a checkpoint is committed in the
node's volume (:mod:`.volume_watch`) or the peer server commits a copy; then tell the engine,
in the volume, behind which steps it may delete), replicate (newest own checkpoint to chosen peers), back
up (every k-th checkpoint or every T seconds, to the object store), collect garbage (by the
retention policy). An orderly stop withdraws the node's address. How a copy is checked
before it is indexed (hashed, or trusted after the engine's or the peer server's own
hashing) is :mod:`.holdings`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import nats.errors

from goodput import schemas, subjects
from goodput.checkpoint.format import (
    ChecksumMismatch,
    ManifestError,
    node_dir,
    node_volume,
    peer_root,
    step_dir,
    step_dir_name,
    write_retention_record,
)
from goodput.checkpoint.format.job_key import JobKeyError, configured_key
from goodput.checkpoint.index.announcement import announcement_due
from goodput.checkpoint.index.follower import IndexFollower
from goodput.checkpoint.index.gc import collect_garbage, sweep_staged_parts
from goodput.checkpoint.index.index import CheckpointIndex, IndexSnapshot
from goodput.checkpoint.index.records import (
    STORE_HOLDER,
    CopyRecord,
    NodeAddressRecord,
    copy_key,
    store_namespace,
)
from goodput.checkpoint.index.retention import Retention, attainable, safe_steps
from goodput.checkpoint.tiers.backup import backup_checkpoint, is_backup_complete, listing_key
from goodput.checkpoint.tiers.object_store import ObjectNotFound
from goodput.checkpoint.tiers.open_store import open_object_store
from goodput.checkpoint.tiers.peer import PeerClient, PeerError, PeerServer, SourceMismatch
from goodput.checkpoint.tiers.peer.address import AddressError, advertised_host
from goodput.checkpoint.tiers.store_uri import StoreUriError
from goodput.config import ServiceConfig
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, TIERS, StorageTier
from goodput.telemetry import tracer
from goodput_services.base import Service
from goodput_services.replicator.counters import Counters, hashing_fields
from goodput_services.replicator.holdings import DiskHoldings
from goodput_services.replicator.options import ReplicatorOptions, store_uri
from goodput_services.replicator.planner import (
    Held,
    Memory,
    Wait,
    plan_backup,
    plan_index_sync,
    plan_replication,
    recall_last_backup,
    sweeps_store,
)
from goodput_services.replicator.restore import NothingToRestore, restore_to_node
from goodput_services.replicator.restore_parts import NodePart
from goodput_services.replicator.rounds import Rounds
from goodput_services.replicator.volume_watch import watch_volume

#: what a push can fail with: the peer or the network, or a local file that changed under it
TRANSFER_ERRORS = (OSError, EOFError, PeerError, ChecksumMismatch, ManifestError)


class BackupIncomplete(RuntimeError):
    """Blobs a listing names vanished during the backup (a concurrent sweep): retry."""


#: what a backup can fail with: the store (unreachable or racing a sweep), or the local copy
BACKUP_ERRORS = (OSError, ChecksumMismatch, ManifestError, ObjectNotFound, BackupIncomplete)

log = logging.getLogger(__name__)


class ReplicatorService(Service):
    name = "replicator"

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        self.node = self.serve_node("replicator", subjects.REPLICATOR)
        self.options = ReplicatorOptions.from_mapping(config.options)
        try:
            self.advertise_host = advertised_host(
                self.options.host, self.options.advertise_host, os.environ, config.bus.hosts()
            )
        except AddressError as exc:
            raise SystemExit(f"replicator: {exc}") from None
        try:  # a key that is configured but unusable stops the service here, in one line
            self.keyed = configured_key() is not None
        except JobKeyError as exc:
            raise SystemExit(str(exc)) from None
        self.state_dir = Path(config.state_dir).resolve()
        self.node_dir = node_dir(self.state_dir, self.node)
        self.volume = node_volume(self.state_dir, self.node, self.job)
        self.store_uri = store_uri(self.options, self.state_dir)
        try:  # a store this install cannot open (s3:// without the s3 extra): one line
            self.store = open_object_store(self.store_uri, self.options.store_retry_s)
        except StoreUriError as exc:
            raise SystemExit(f"replicator: {exc}") from None
        self.holdings = DiskHoldings(
            self.node_dir,
            self.job,
            self.node,
            self.options.scrub_interval_s,
            trust=not self.options.legacy_scan,
        )
        self.retention = Retention(
            keep={
                LOCAL: self.options.keep_local,
                PEER: self.options.keep_peer,
                OBJECT_STORE: self.options.keep_object_store,
            },
            require=tuple(self.options.gc_require),
        )
        self.counters = Counters()
        self.rounds = Rounds(self.stopping, self.counters)
        self.index: CheckpointIndex | None = None
        self.follower: IndexFollower | None = None
        self.peer_server: PeerServer | None = None
        self.held: dict[str, CopyRecord] = {}
        self._store_lock = asyncio.Lock()  # backups and the store sweep never overlap here
        self._sync_lock = asyncio.Lock()
        self._volume_lock = asyncio.Lock()  # a restore stages parts; the sweep deletes them
        self._sync_asked = asyncio.Event()  # a checkpoint was persisted or received: sync now
        self.memory = Memory()
        #: stream sequence of this process's newest announcement; 0 before the first
        self._announced_seq = 0
        self._tracer = tracer("goodput.replicator")

    # ---- service hooks ------------------------------------------------------------------

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self._run()]

    async def _run(self) -> None:
        assert self.bus is not None
        self.index = CheckpointIndex(self.bus, self.job)
        self.follower = IndexFollower(self.bus, self.job)
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self.peer_server = PeerServer(
            self.node_dir,
            self.options.host,
            self.options.port,
            on_commit=None if self.options.legacy_scan else lambda _: self._sync_asked.set(),
            track_received=not self.options.legacy_scan,
        )
        # the scan trusts what the server verified on receive
        self.holdings.received = self.peer_server.received
        await self.peer_server.start()
        log.info(
            "peer data plane listening",
            extra={
                "host": self.peer_server.host,
                "port": self.peer_server.port,
                "advertised": self.advertise_host,
            },
        )
        if not self.keyed:
            log.warning(
                "no checkpoint key (GOODPUT_CKPT_KEY_FILE): manifests and the peer data plane"
                " are unauthenticated"
            )
        rounds = self.rounds
        loops = [
            self.follower.run(self.stopping),
            rounds.every(self.options.poll_s, self._sync, "sync", woken_by=self._sync_asked),
            rounds.on_snapshot(self._replicate, "replicate"),
            rounds.on_snapshot(self._backup, "backup"),
            rounds.every(self.options.gc_interval_s, self._collect_garbage, "gc", delay=True),
        ]
        if not self.options.legacy_scan:
            loops.append(watch_volume(self.volume, self._sync_asked, self.stopping))
        await asyncio.gather(*loops)

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        if isinstance(command, schemas.RestoreToNode):
            return await self._restore(command)
        return await super().execute(command)

    def health(self) -> tuple[bool, str]:
        return self.peer_server is not None, self.counters.detail()

    async def on_stop(self) -> None:
        log.info("replicator stopping", extra=hashing_fields())
        await self._withdraw_announcement()
        if self.peer_server is not None:
            await self.peer_server.close()

    # ---- sync: announce and index what the disk holds ----------------------------------

    async def _sync(self) -> None:
        async with self._sync_lock:  # the loop and a restore may both ask for one
            await self._sync_once()

    async def _sync_once(self) -> None:
        assert self.index is not None and self.peer_server is not None
        await self._announce_if_due(await self._snapshot())  # before a scan that may take long
        scan = await asyncio.to_thread(self.holdings.scan)
        held = scan.held
        for problem in scan.problems:
            self.counters.last_error = f"not indexed: {problem}"[:300]
            log.warning("copy fails verification; not indexed", extra={"problem": problem})
        for record, how in scan.checked:
            self.counters.checked[how] = self.counters.checked.get(how, 0) + 1
            log.info(
                "copy checked",
                extra={
                    "step": record.step,
                    "tier": record.tier,
                    "owner": record.owner,
                    "check": how,
                    "copy_bytes": sum(f.size for f in record.files),
                    **hashing_fields(),
                },
            )
        snapshot = await self._snapshot()
        indexed = {
            copy_key(self.job, c): c
            for c in snapshot.copies_held_by(self.node)
            if TIERS[c.tier].on_node
        }
        puts, deletes = plan_index_sync(held, indexed)
        for record in puts:
            await self.index.put_copy(record)
        for record in deletes:
            await self.index.delete_copy(record)
        self.held = held
        self.memory.local_steps_seen |= {c.step for c in held.values() if c.tier == LOCAL}
        if puts or deletes:
            snapshot = await self._snapshot()
        self.memory.last_backup = recall_last_backup(
            snapshot, self.node, time.monotonic(), self.memory
        )
        self.rounds.publish(snapshot)
        await asyncio.to_thread(self._publish_safe_steps, snapshot)

    async def _announce_if_due(self, snapshot: IndexSnapshot) -> None:
        """Write this node's address record if it is due (``index/announcement.py``: at
        start, on change, when the index lost it, or as the slow refresh), not every poll."""
        assert self.index is not None and self.peer_server is not None
        now_ns = time.time_ns()
        wanted = NodeAddressRecord(
            node=self.node,
            host=self.advertise_host,
            port=self.peer_server.port,
            labels=dict(self.options.labels),
            object_store=str(self.store_uri),
            ts=now_ns,
        )
        reason = announcement_due(
            wanted,
            snapshot.nodes.get(self.node),
            announced=bool(self._announced_seq),
            now_ns=now_ns,
            node_ttl_s=self.options.node_ttl_s,
        )
        if reason is not None:
            self._announced_seq = await self.index.announce(wanted)
            log.info("node announced", extra={"reason": reason, "seq": self._announced_seq})

    async def _withdraw_announcement(self) -> None:
        """An orderly stop takes the node's address record with it, so no peer waits out the
        TTL on it; only the record this process wrote (a newer one of its node stays)."""
        if self.index is None or not self._announced_seq:
            return
        try:
            withdrawn = await asyncio.wait_for(
                self.index.withdraw_node(self.node, if_last_seq=self._announced_seq), 2.0
            )
        except (nats.errors.Error, TimeoutError) as exc:  # the TTL ends it instead
            log.warning("address record not withdrawn: %r", exc)
            return
        log.info("address record withdrawn" if withdrawn else "address record rewritten by another")

    async def _snapshot(self, current: bool = False) -> IndexSnapshot:
        """The index as the follower holds it, with this node's own writes in it;
        ``current``: with every write acknowledged anywhere before the call."""
        assert self.follower is not None and self.index is not None
        return await self.follower.snapshot(
            self.options.node_ttl_s, after_seq=self.index.written_seq, current=current
        )

    def _publish_safe_steps(self, snapshot: IndexSnapshot) -> None:
        """The ranks' engines delete old checkpoints from the volume but have no bus: tell
        them, in the volume, behind which steps that is safe (``require`` honoured) and how
        many they keep (this GC's local count, so the two deleters keep the same)."""
        require = self._attainable(snapshot)
        write_retention_record(
            self.volume,
            require,
            safe_steps(snapshot, require),
            keep=self.retention.keep[LOCAL],
        )

    def _attainable(self, snapshot: IndexSnapshot) -> tuple[StorageTier, ...]:
        return attainable(self.retention.require, snapshot, has_store=self.store is not None)

    def _distrust(self, checkpoint_dir: Path) -> None:
        """A reader hashed a file of this copy and it did not match: hash it all now, and
        withdraw it from the index if it is damaged."""
        self.holdings.distrust(checkpoint_dir)
        self._sync_asked.set()

    def _held(self) -> Held:
        own = [c for c in self.held.values() if c.tier == LOCAL]
        mine = max(own, key=lambda c: c.step) if own else None
        first_seen = self.holdings.first_seen(mine) if mine else None
        return Held(self.node, mine, time.monotonic() if first_seen is None else first_seen)

    # ---- replicate ----------------------------------------------------------------------

    async def _replicate(self, snapshot: IndexSnapshot) -> None:
        held = self._held()
        decision = plan_replication(snapshot, held, time.monotonic(), self.options, self.memory)
        if isinstance(decision, Wait):
            log.debug("not replicating: %s", decision.reason)
            return
        assert held.newest_own is not None
        await asyncio.gather(
            *(self._push(held.newest_own, snapshot.nodes[p.peer], p.reason) for p in decision)
        )

    async def _push(self, mine: CopyRecord, peer: NodeAddressRecord, reason: str) -> None:
        assert self.bus is not None
        source = step_dir(self.node_dir / mine.root, mine.step)
        remote = f"{peer_root(self.job, self.node)}/{step_dir_name(mine.step)}"
        try:
            with self._tracer.start_as_current_span(
                "replicator push",
                attributes={"goodput.step": mine.step, "goodput.peer": peer.node, "reason": reason},
            ):
                async with await PeerClient.connect(peer.host, peer.port) as client:
                    report = await asyncio.wait_for(
                        client.push_checkpoint(source, remote), self.options.push_timeout_s
                    )
        except TRANSFER_ERRORS as exc:
            # pick another peer for a while; the partial files on this one let a retry resume
            self.memory.cooldown_until[peer.node] = time.monotonic() + self.options.peer_cooldown_s
            self.rounds.failed(f"replicate step {mine.step} to {peer.node}", exc)
            if isinstance(exc, SourceMismatch | ChecksumMismatch):
                self._distrust(source)
            return
        self.memory.pushed[(mine.step, peer.node)] = time.monotonic()
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

    async def _backup(self, snapshot: IndexSnapshot) -> None:
        held = self._held()
        decision = plan_backup(snapshot, held, time.monotonic(), self.options, self.memory)
        if isinstance(decision, Wait):
            log.debug("not backing up: %s", decision.reason)
            return
        assert held.newest_own is not None
        async with self._store_lock:
            await self._upload(held.newest_own, decision.reason)

    async def _upload(self, mine: CopyRecord, reason: str) -> None:
        assert self.bus is not None and self.index is not None
        source = step_dir(self.node_dir / mine.root, mine.step)
        namespace = store_namespace(self.job, self.node)
        try:
            with self._tracer.start_as_current_span(
                "replicator back up", attributes={"goodput.step": mine.step, "reason": reason}
            ):
                report = await asyncio.to_thread(backup_checkpoint, source, self.store, namespace)
                complete = await asyncio.to_thread(
                    is_backup_complete, self.store, namespace, mine.step
                )
                if not complete:
                    raise BackupIncomplete("blobs vanished during the backup (concurrent sweep)")
        except BACKUP_ERRORS as exc:
            self.memory.backup_retry_at = time.monotonic() + max(2.0, self.options.poll_s)
            self.rounds.failed(f"back up step {mine.step}", exc)
            if isinstance(exc, ChecksumMismatch):
                self._distrust(source)
            return
        await self.index.put_copy(  # the same files (and part, if one) as the own copy
            msgspec.structs.replace(
                mine,
                tier=OBJECT_STORE,
                holder=STORE_HOLDER,
                root=namespace,
                files=list(mine.files),
                verified_ts=time.time_ns(),
            )
        )
        self.memory.last_backup = (mine.step, time.monotonic())
        self.counters.backed_up += 1
        await self.bus.emit(
            schemas.CheckpointBackedUp(
                job=self.job,
                node=self.node,
                step=mine.step,
                uri=self.store_uri.key_uri(listing_key(namespace, mine.step)),
                bytes_uploaded=report.bytes_uploaded,
                bytes_deduplicated=report.bytes_skipped,
                duration_s=report.seconds,
            )
        )

    # ---- garbage collection -------------------------------------------------------------

    async def _collect_garbage(self) -> None:
        assert self.index is not None
        snapshot = await self._snapshot()
        async with self._store_lock:
            report = await collect_garbage(
                self.index,
                snapshot,
                replace(self.retention, require=self._attainable(snapshot)),
                state_dir=self.state_dir,
                disks_of={self.node},
                store=self.store if sweeps_store(snapshot, self.node) else None,
            )
        async with self._volume_lock:
            swept = await asyncio.to_thread(sweep_staged_parts, self.volume)
        if report.deleted or swept:
            self.counters.gc_deleted += len(report.deleted) + len(swept)
            log.info(
                "garbage collected",
                extra={"summary": report.summary(), "staged_parts": [p.name for p in swept]},
            )

    # ---- restore ------------------------------------------------------------------------

    async def _restore(self, command: schemas.RestoreToNode) -> tuple[bool, str]:
        assert self.bus is not None and self.index is not None
        if command.node != self.node:
            return False, f"this replicator serves {self.node}, not {command.node}"
        # index a checkpoint the ranks committed a moment ago, if any
        await self.rounds.guarded("sync before restore", self._sync())
        snapshot = await self._snapshot(current=True)
        try:
            async with self._volume_lock:  # the staged-part sweep waits
                outcome = await restore_to_node(
                    snapshot,
                    job=self.job,
                    node=self.node,
                    node_dir=self.node_dir,
                    store=self.store,
                    step=command.step,
                    before_step=command.before_step,
                    block_label=self.options.block_label,
                    assigned=NodePart.of(command.part, command.parts),
                )
        except NothingToRestore as exc:
            self.rounds.failed("restore", exc)
            return False, f"nothing restored: {exc}"
        if outcome.step is None:
            return True, outcome.detail
        self.counters.restored += 1
        await self.bus.emit(outcome.event(self.job, self.node))
        return True, outcome.detail


SERVICE = ReplicatorService
