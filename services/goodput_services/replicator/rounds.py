"""How the replicator's loops run: a round every period or when woken, a round on each new
index snapshot, and a failed round logged and shown in health without ending its loop (one
bad round must not stop replication for good)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from goodput.checkpoint.index.index import IndexSnapshot
from goodput_services.replicator.counters import Counters

log = logging.getLogger(__name__)


class Rounds:
    """The loops of one replicator, until ``stopping`` is set."""

    def __init__(self, stopping: asyncio.Event, counters: Counters):
        self.stopping = stopping
        self.counters = counters
        #: the newest snapshot the sync published, which the transfer loops act on
        self.snapshot: IndexSnapshot | None = None
        self._fresh: list[asyncio.Event] = []  # one per transfer loop: a new snapshot

    def failed(self, what: str, exc: BaseException) -> None:
        self.counters.last_error = f"{what}: {type(exc).__name__}: {exc}"[:300]
        log.warning("%s failed: %r", what, exc)

    async def guarded(self, what: str, work: Awaitable[None]) -> None:
        """The one place an unexpected failure of a round is caught. Expected failures
        (transfers, the object store) are handled where they happen."""
        try:
            await work
        except Exception as exc:
            self.failed(what, exc)

    async def pause(self, seconds: float, woken_by: asyncio.Event | None = None) -> None:
        """Sleep ``seconds``, less if the service stops or ``woken_by`` is set."""
        waits = [asyncio.ensure_future(self.stopping.wait())]
        if woken_by is not None:
            waits.append(asyncio.ensure_future(woken_by.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def every(
        self,
        period_s: float,
        work: Callable[[], Awaitable[None]],
        what: str,
        delay: bool = False,
        woken_by: asyncio.Event | None = None,
    ) -> None:
        """Run ``work`` every ``period_s``, and at once whenever ``woken_by`` is set."""
        if delay:
            await self.pause(period_s)
        while not self.stopping.is_set():
            if woken_by is not None:
                woken_by.clear()  # what sets it from here on asks for another round
            await self.guarded(what, work())
            await self.pause(period_s, woken_by)

    def publish(self, snapshot: IndexSnapshot) -> None:
        """Hand ``snapshot`` to every :meth:`on_snapshot` loop."""
        self.snapshot = snapshot
        for fresh in self._fresh:
            fresh.set()

    async def on_snapshot(
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
            await self.guarded(what, work(self.snapshot))
