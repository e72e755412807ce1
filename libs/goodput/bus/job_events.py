"""Every event of one job's newest run, from its start, as it arrives.

What the demo, the benchmarks and the tests follow a job with: an ephemeral ordered consumer
of ``gp.<job>.evt.>`` from the stream sequence of the newest ``RunStarted`` (so starting late
misses nothing of the run, and an earlier run of the same job name is not mistaken for this
one), the decoded events in arrival order, ``caught_up`` once what was stored at the start has
arrived, and a wait for the first event that matches. A node's rolled-up steps arrive as its
ranks' ``StepDone`` records (``schemas.expand_steps``).

The follower survives a NATS restart: the server forgets ephemeral consumers, and nats-py's
ordered consumer recreates its own only once, from its heartbeat check, and gives up if the
server is not answering yet. A guard checks every :data:`GUARD_S` that the consumer still
exists and, if it is missing at two checks in a row, subscribes again from the stream
sequence after the last event delivered (events are applied once: a sequence at or below it
is skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus.client import Bus, retry_transient
from goodput.bus.routing import decode_event_on

log = logging.getLogger(__name__)
E = TypeVar("E", bound=schemas.Event)
R = TypeVar("R")
POLL_S = 0.02
#: how often a follower checks that its consumer survived (a restarted server forgets it)
GUARD_S = 2.0
#: how long stopping a follower may wait on the bus
STOP_S = 5.0
#: how long a read of the event stream's state waits out a transient bus error
STREAM_READ_S = 30.0


async def _read_stream(read: Callable[[], Awaitable[R]]) -> R:
    """``read`` of the event stream, asked again through a transient error (a cluster
    electing the stream's leader after losing its server answers with timeouts and 503s for
    a few seconds): a report or a follower started then waits, it does not fail."""
    result: R = await retry_transient(read, deadline_s=STREAM_READ_S, what="read GP_EVENTS")
    return result


async def count_events(bus: Bus, job: str) -> int:
    """How many events of ``job`` the GP_EVENTS stream holds now."""
    try:
        info = await _read_stream(
            lambda: bus.js.stream_info(
                subjects.EVENTS_STREAM, subjects_filter=subjects.events_of(job)
            )
        )
    except nats.js.errors.NotFoundError:
        return 0  # the bus was never provisioned: nothing was ever stored
    return sum((info.state.subjects or {}).values())


async def next_step(bus: Bus, job: str) -> None:
    """Return once ``job`` publishes a step after this call (it trains again): a node agent
    and the local backend start the standbys a launch took only then, not beside it."""
    stepped = asyncio.Event()

    async def on_step(_: Msg) -> None:
        stepped.set()

    kinds = (schemas.kind_of(schemas.StepDone), schemas.kind_of(schemas.StepsDone))
    subscriptions = [
        await bus.nc.subscribe(subject, cb=on_step)
        for kind in kinds
        for subject in subjects.events_of_kind(job, kind)
    ]
    try:
        await stepped.wait()
    finally:
        for subscription in subscriptions:
            with contextlib.suppress(Exception):  # the connection may be closing under it
                await subscription.unsubscribe()


async def newest_run(bus: Bus, job: str) -> tuple[int, schemas.RunStarted] | None:
    """The stream sequence and event of the newest run start of ``job``; None: no run yet.

    One lookup (the last message on ``gp.<job>.evt.run_started``), however long the history.
    """
    subject = subjects.event(job, schemas.kind_of(schemas.RunStarted))
    try:
        message = await _read_stream(lambda: bus.js.get_last_msg(subjects.EVENTS_STREAM, subject))
    except nats.js.errors.NotFoundError:
        return None  # no such stream, or no run started on it
    try:
        event = decode_event_on(message.subject or "", message.data or b"")
    except schemas.SchemaError as exc:
        log.warning("newest run start of %s does not decode (%s); following all", job, exc)
        return None
    if not isinstance(event, schemas.RunStarted) or message.seq is None:
        return None  # a reply without its sequence has no position to follow from
    return message.seq, event


class HistoryRolledOffError(RuntimeError):
    """The start of a job's newest run is no longer in GP_EVENTS: it rolled off the stream's
    byte or age limit (``goodput.bus.store_sizing``), so a replay would miss its beginning."""


async def rolled_off(bus: Bus) -> int:
    """How many of GP_EVENTS's first sequences it no longer holds (discarded past its byte
    or age limit); 0 when it still holds everything it stored, or does not exist."""
    try:
        info = await _read_stream(lambda: bus.js.stream_info(subjects.EVENTS_STREAM))
    except nats.js.errors.NotFoundError:
        return 0
    return max(0, info.state.first_seq - 1) if info.state.messages else info.state.last_seq


async def check_history(bus: Bus, job: str, *, all_runs: bool = False) -> str:
    """Raise :class:`HistoryRolledOffError` when ``job``'s newest run began before the oldest
    event stored (its start rolled off); with ``all_runs``, return the one-line warning that
    earlier events are gone ("" when none are). A run whose start is stored is whole: the
    stream discards its oldest messages first."""
    lost = await rolled_off(bus)
    if not lost:
        return ""
    if all_runs:
        return (
            f"GP_EVENTS no longer holds its first {lost} events (rolled off its byte or age "
            f"limit): the report of job {job}'s runs covers only what is left"
        )
    if await newest_run(bus, job) is None and await count_events(bus, job):
        raise HistoryRolledOffError(
            f"the start of job {job}'s newest run has rolled off GP_EVENTS (its first {lost} "
            "events are gone past its byte or age limit): a report would miss its beginning; "
            "size the stream for longer runs (GOODPUT_STORE_SCALE keep_h) or export runs with "
            "`goodput report --export` while they are stored"
        )
    return ""


async def deliver_from(bus: Bus, job: str, *, all_runs: bool = False) -> ConsumerConfig:
    """Where a follower of ``job`` starts: its newest run's start, or the first event stored."""
    run = None if all_runs else await newest_run(bus, job)
    if run is None:
        return ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=run[0])


class JobEvents:
    """The events of ``job`` so far; ``on_event`` sees each one as it arrives.

    ``keep=False`` keeps none (``events`` stays empty): a follower of a long job that folds
    each event into its own state must not hold every step of the job in memory.
    ``all_runs=True`` follows from the first event stored, earlier runs included.
    """

    def __init__(
        self,
        bus: Bus,
        job: str,
        on_event: Callable[[schemas.Event], None] | None = None,
        *,
        keep: bool = True,
        all_runs: bool = False,
    ) -> None:
        self.bus = bus
        self.job = subjects.check_token(job, "job name")
        self.events: list[schemas.Event] = []
        self.undecodable = 0
        self._on_event = on_event
        self._keep = keep
        self._all_runs = all_runs
        self._subscription: JetStreamContext.PushSubscription | None = None
        self._guard: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        #: stream sequence of the newest event applied (a new consumer starts after it)
        self._seq = 0
        #: set once the events stored when following started have all arrived
        self.caught_up = asyncio.Event()

    async def start(self) -> JobEvents:
        """Follow from the newest run's start (or the first stored event); on a bus never
        provisioned there is nothing to follow, and the follower is caught up at once."""
        if await count_events(self.bus, self.job) == 0:
            self.caught_up.set()
        try:
            await self._subscribe(await deliver_from(self.bus, self.job, all_runs=self._all_runs))
        except nats.js.errors.NotFoundError:
            log.info("no %s stream: no events of %s to follow", subjects.EVENTS_STREAM, self.job)
        else:
            self._guard = asyncio.create_task(self._keep_following())
        return self

    async def _subscribe(self, config: ConsumerConfig) -> None:
        self._subscription = await self.bus.js.subscribe(
            subjects.events_of(self.job),
            stream=subjects.EVENTS_STREAM,
            cb=self._collect,
            ordered_consumer=True,
            config=config,
        )

    async def _keep_following(self) -> None:
        """Subscribe again, after the last event applied, when the consumer is gone.

        Gone means missing at two checks in a row: nats-py's ordered consumer replaces its
        consumer by itself after a missed heartbeat or a gap (a loaded host), and for that
        moment the old name is not found; taking the subscription away from under that reset
        left its tasks working on a subscription no one owned."""
        missing = 0
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), GUARD_S)
            subscription = self._subscription
            if subscription is None or self._stopping.is_set():
                return
            try:
                await subscription.consumer_info()
                missing = 0
                continue
            except nats.js.errors.NotFoundError:
                missing += 1  # the server lost it (restarted), or the client is replacing it
            except Exception as exc:  # the bus is away: look again later
                log.debug("follower of %s cannot check its consumer: %r", self.job, exc)
                continue
            if missing < 2:
                continue
            missing = 0
            try:
                await subscription.unsubscribe()
            except Exception as exc:
                log.debug("old subscription of %s not removed: %r", self.job, exc)
            try:  # a server killed hard may come back without its last few messages
                info = await self.bus.js.stream_info(subjects.EVENTS_STREAM)
                self._seq = min(self._seq, info.state.last_seq)
            except Exception as exc:
                log.debug("stream of %s not readable yet: %r", self.job, exc)
            log.info("follower of %s lost its consumer; following after %d", self.job, self._seq)
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._seq + 1
            )
            try:
                await self._subscribe(config)
            except Exception as exc:
                log.debug("follower of %s cannot subscribe yet: %r", self.job, exc)

    async def stop(self) -> None:
        """Stop following, in bounded time: a bus that no longer answers must not hold up the
        caller's teardown."""
        self._stopping.set()
        if self._guard is not None:
            # a flag, not only a cancel: nats-py swallows a CancelledError that arrives while
            # it flushes (Client._send_command), and a guard that lost its cancel looped on;
            # asyncio.wait, not wait_for, which would wait for a cancel that never lands
            self._guard.cancel()
            await asyncio.wait({self._guard}, timeout=STOP_S)
            self._guard = None
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._subscription.unsubscribe(), STOP_S)
            self._subscription = None

    async def _collect(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self._seq:
            return  # delivered again by a consumer made anew: applied already
        self._seq = seq
        try:
            event = decode_event_on(msg.subject, msg.data)
        except schemas.SchemaError as exc:
            self.undecodable += 1  # the sensor dead-letters it; a follower just skips it
            log.warning("skipping undecodable event on %s: %s", msg.subject, exc)
            event = None
        for each in schemas.expand_steps(event) if event is not None else ():
            if self._keep:
                self.events.append(each)
            if self._on_event is not None:
                self._on_event(each)
        if msg.metadata.num_pending == 0:
            self.caught_up.set()

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """True once the history is applied; False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self.caught_up.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(
        self,
        predicate: Callable[[schemas.Event], bool],
        timeout_s: float = 30.0,
        what: str = "event",
        after_ts: int = 0,
    ) -> schemas.Event:
        """The first event (from the start, or stamped at/after ``after_ts``) that matches."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in list(self.events):
                if event.ts >= after_ts and predicate(event):
                    return event
            await asyncio.sleep(POLL_S)
        kinds = Counter(type(e).__name__ for e in self.events)
        raise TimeoutError(f"no {what} within {timeout_s:g} s; saw {dict(kinds)}")
