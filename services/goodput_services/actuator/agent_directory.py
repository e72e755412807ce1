"""The node agents the actuator can reach, as their records in ``gp_agents`` arrive.

An agent refreshes its record every second; a KV entry that lapses is dropped by the server
without a notification, so an agent is *live* while a new revision of its record came in the
last :data:`~goodput.subjects.AGENT_TTL_S` seconds (this process's clock: no skew between
hosts). A watch re-created after a bus outage delivers the newest revisions again; a revision
already seen proves nothing about liveness and does not count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.supervisor.agent import registry

log = logging.getLogger(__name__)

OnRecord = Callable[[schemas.AgentRecord], None]

#: no update at all for this long: the watch is re-created (a restarted server forgets it)
_SILENT_WATCH_S = 3.0


class AgentDirectory:
    def __init__(self, job: str, ttl_s: float = subjects.AGENT_TTL_S):
        self.job = job
        self.ttl_s = ttl_s
        self.records: dict[str, schemas.AgentRecord] = {}
        self._seen: dict[str, tuple[int, float]] = {}

    def apply(self, record: schemas.AgentRecord, revision: int, now: float) -> bool:
        """Take a record delivered at ``now`` (monotonic seconds); False when not newer."""
        if record.job != self.job:
            return False
        known = self._seen.get(record.node)
        if known is not None and revision <= known[0]:
            return False
        self._seen[record.node] = (revision, now)
        self.records[record.node] = record
        return True

    def forget(self, node: str) -> None:
        """The agent released its name (a clean stop)."""
        self.records.pop(node, None)
        self._seen.pop(node, None)

    def live(self, now: float) -> dict[str, schemas.AgentRecord]:
        return {
            node: record
            for node, record in self.records.items()
            if now - self._seen[node][1] < self.ttl_s
        }

    def is_live(self, node: str, now: float) -> bool:
        seen = self._seen.get(node)
        return seen is not None and now - seen[1] < self.ttl_s

    async def follow(self, bus: Bus, on_record: OnRecord) -> None:
        """Apply every record of the job's agents as it comes, for as long as it runs."""
        while True:
            try:
                kv = await registry.bucket(bus)
                watcher = await kv.watch(f"{self.job}.*")
            except Exception as exc:  # the bus is away: try again
                log.debug("agent watch not started: %r", exc)
                await asyncio.sleep(1.0)
                continue
            try:
                await self._drain(watcher, on_record)
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()

    async def _drain(self, watcher, on_record: OnRecord) -> None:
        while True:
            try:
                entry = await watcher.updates(timeout=_SILENT_WATCH_S)
            except nats.errors.TimeoutError:
                return  # silent: re-created (the agents refresh every second)
            if entry is None:
                continue  # the end of the initial values
            node = entry.key.split(".", 1)[-1]
            if entry.operation in ("DEL", "PURGE"):
                self.forget(node)
                continue
            record = registry.decode(entry.value)
            if record is not None and self.apply(record, entry.revision, time.monotonic()):
                on_record(record)
