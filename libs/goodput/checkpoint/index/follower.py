"""One job's checkpoint index kept in memory by following the bucket's changes.

A replicator used to read the whole index every poll: at 2,048 nodes one read is ~17 MB and
seconds of CPU, and the fleet's replicators together read N² times a node's records each
second (``goodput bench index-reads``). The follower reads it completely once (the
read protocol of ``bus/kv_scan.py``, its mark included, so the first view is current), keeps
that read's consumer open and from then on receives only what changes: the messages, and
the bytes, it takes grow with the index's changes, not with its size (a node's address
record is written on change and refreshed every few minutes: ``index/announcement.py``).
Records are decoded once, when they change, and a snapshot's lists are rebuilt only after a
change; its step views (``index.ViewCache``) only for the steps whose live copies changed,
and not at all while neither the records nor the live nodes did.

A lost consumer (a server restart, a leader change, the inactivity threshold after a long
pause) or one that skipped a message makes it read completely again, and it says so in the
log; no snapshot is served until that read is current. Its own process's writes are seen in
the next snapshot asked for after them (``after_seq``: the write's stream sequence), and a
snapshot may be asked to hold every write acknowledged anywhere before it (``current``: a
read mark, waited for).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats.errors

from goodput import subjects
from goodput.bus import Bus
from goodput.bus.kv_scan import Change, LiveRead, ReadLost, open_read, write_mark
from goodput.checkpoint.index.index import (
    DEFAULT_NODE_TTL_S,
    IndexSnapshot,
    Record,
    ViewCache,
    decode_entry,
    job_keys,
    split_records,
)
from goodput.checkpoint.index.records import CopyRecord, NodeAddressRecord, key_kind

log = logging.getLogger(__name__)

#: how long one fetch waits for a change; the consumer's liveness is checked this often
#: when nothing changes (below ``kv_scan.INACTIVE_S``, after which the server drops it)
WAIT_S = 3.0
#: a failed read is retried after this, doubling up to a second
RETRY_S = 0.05


class IndexBehind(nats.errors.TimeoutError):
    """The follower was not current, or not past the asked sequence, within the time."""

    def __str__(self) -> str:
        return "the index follower is not current (reading the index again, or the bus away)"


@dataclass
class FollowerCounts:
    """What the follower has read: complete reads, and the changes since the newest one."""

    reads: int = 0
    #: messages and value bytes received after the newest complete read, by the kind of key:
    #: "node" (announcements), "copy", or "mark" (read marks: other readers' complete reads
    #: and this one's ``current`` snapshots)
    messages: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)


class IndexFollower:
    """The records of ``job`` in ``gp_ckpt_index``, current while :meth:`run` runs."""

    def __init__(self, bus: Bus, job: str, wait_s: float = WAIT_S):
        self.bus = bus
        self.job = job
        self.wait_s = wait_s
        self.counts = FollowerCounts()
        self._records: dict[str, Record] = {}
        self._read: LiveRead | None = None
        #: stream sequence up to which the records are current; 0 while (re)reading
        self._seq = 0
        self._advanced = asyncio.Event()
        self._built: tuple[dict[str, NodeAddressRecord], list[CopyRecord]] | None = None
        #: the step views every snapshot served shares: rebuilt per changed step only
        self.view_cache = ViewCache()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[IndexFollower]:
        """Follow in a task of its own for the block (a tool's, a test's; a service runs
        :meth:`run` among its loops)."""
        stopping = asyncio.Event()
        task = asyncio.create_task(self.run(stopping))
        try:
            yield self
        finally:
            stopping.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self, stopping: asyncio.Event) -> None:
        """Read, then follow, until ``stopping`` is set (or the task is cancelled)."""
        retry_s = RETRY_S
        try:
            while not stopping.is_set():
                try:
                    if self._read is None:
                        await self._read_all()
                    else:
                        self._apply(await self._read.changes(self.wait_s))
                    retry_s = RETRY_S
                except ReadLost as exc:
                    log.warning("index follower: %s; reading the whole index again", exc)
                    await self._drop()
                except (nats.errors.Error, TimeoutError) as exc:
                    # once per outage, not once per retry
                    level = logging.WARNING if retry_s == RETRY_S else logging.DEBUG
                    log.log(level, "index follower: %r; reading the whole index again", exc)
                    await self._drop()
                    await asyncio.sleep(retry_s)
                    retry_s = min(2 * retry_s, 1.0)
        finally:
            await self._drop()

    async def snapshot(
        self,
        node_ttl_s: float = DEFAULT_NODE_TTL_S,
        *,
        after_seq: int = 0,
        current: bool = False,
        timeout_s: float = 10.0,
    ) -> IndexSnapshot:
        """The job's records, from a current read and at least up to stream sequence
        ``after_seq`` (a write of one's own); ``current``: also every write acknowledged
        anywhere before the call. Raises :class:`IndexBehind` rather than serve less."""
        deadline = time.monotonic() + timeout_s
        if current:
            after_seq = max(after_seq, await write_mark(self.bus, subjects.CKPT_INDEX_BUCKET))
        while not self._seq or self._seq < after_seq:
            advanced = self._advanced
            try:
                await asyncio.wait_for(advanced.wait(), deadline - time.monotonic())
            except TimeoutError:
                raise IndexBehind from None
        if self._built is None:
            self._built = split_records(self._records.values())
        nodes, copies = self._built
        return IndexSnapshot(nodes, copies, node_ttl_s, view_cache=self.view_cache)

    async def _read_all(self) -> None:
        self._read = await open_read(self.bus, subjects.CKPT_INDEX_BUCKET, job_keys(self.job))
        decoded = ((key, decode_entry(key, value)) for key, value in self._read.entries.items())
        self._records = {key: record for key, record in decoded if record is not None}
        self._read.entries.clear()  # the decoded records are what is kept
        self._built = None
        self.counts = FollowerCounts(reads=self.counts.reads + 1)
        log.info("index read completely", extra={"job": self.job, "records": len(self._records)})
        self._advance(self._read.seq)

    def _apply(self, changes: list[Change]) -> None:
        if not changes:
            return
        assert self._read is not None
        for change in changes:
            kind = "mark" if change.is_mark else key_kind(change.key)
            self.counts.messages[kind] += 1
            self.counts.bytes[kind] += len(change.value or b"")
            if change.is_mark:
                continue
            record = None if change.value is None else decode_entry(change.key, change.value)
            if record is None:  # deleted, or no longer a valid record
                self._records.pop(change.key, None)
            else:
                self._records[change.key] = record
            self._built = None
        self._advance(self._read.seq)

    def _advance(self, seq: int) -> None:
        self._seq = seq
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def _drop(self) -> None:
        """Forget the consumer (and stop serving snapshots) until the next complete read."""
        self._seq = 0
        if self._read is not None:
            read, self._read = self._read, None
            await read.close()
