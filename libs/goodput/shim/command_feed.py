"""The trainer's commands, without a JetStream consumer per rank (issue 36).

GP_CMDS stores every trainer command (the record; senders are unchanged), but a rank does not
read it through a consumer: 16,384 ranks (re)starting would create 16,384 consumers at once,
each living as long as its rank. A rank holds a *core* subscription on its job's trainer
subject instead, and on subscribing and on every reconnect it reads the newest stored trainer
command of the job with one direct lookup (last message on the subject: no consumer state),
delivered if it was stored at or after the rank's launch. Deliveries are de-duplicated by
``command_id`` (a bounded memory of recent ids): a command seen live and by the lookup, or
re-sent by the actuator's Rejoin round, is handled once.

**Newest wins across a gap.** Of the commands sent while a rank was not subscribed (starting
up, reconnecting) only the newest reaches it. For each trainer command that is right:

* ``Rejoin`` is per attempt: a newer one supersedes an older (``RejoinMailbox`` ignores an
  attempt reached), and the actuator re-sends it until every rank answered or the deadline;
* ``SetCheckpointInterval`` is a setting: the newest is the one in force (the schedule puts
  only the last received to the vote);
* ``CheckpointNow`` is voted MIN over the ranks: one rank that got it makes all checkpoint;
* ``Stop`` and ``Rescale`` are sent to the actuator, not to trainers, by the supervisor;
* ``InjectFault`` is a test tool: a test injects after its ranks are up.

Order: live messages and the lookup's answer pass one queue. On one server the live copy of a
message stored before the lookup was answered precedes the answer on the connection; a flush
after the answer lets the subscription's callback queue it first, so a command is never
followed by an older one.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from goodput import schemas, subjects
from goodput.bus import Bus, BusUnavailableError
from goodput.bus.client import retry_transient

log = logging.getLogger(__name__)

#: command ids remembered for de-duplication: far more than a job sends within a gap
SEEN_IDS = 1024
#: seconds a lookup, or a flush, may take (an int: nats-py annotates flush's timeout so)
LOOKUP_TIMEOUT_S = 5
#: how long a lookup is retried through an outage (a server restarting recovers its streams)
LOOKUP_FOR_S = 60.0


def stored_ns(timestamp: str) -> int:
    """Nanoseconds since the epoch of a stream's RFC 3339 time (``Nats-Time-Stamp``); nats-py
    parses it to a datetime, which drops the nanoseconds the launch time is compared at."""
    stamp = timestamp.rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 10**9 + int((fraction + "000000000")[:9] or 0)


class RecentIds:
    """The last ``capacity`` command ids delivered."""

    def __init__(self, capacity: int = SEEN_IDS) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first_time(self, command_id: str) -> bool:
        """Remember ``command_id``; False if it was delivered already."""
        if command_id in self._ids:
            return False
        self._ids[command_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return True


#: what is done with a message that is no command for this job's trainers: (subject, reason,
#: payload), dead-lettered by the link
Reject = Callable[[str, str, bytes], Awaitable[None]]


class CommandFeed:
    """One rank's trainer commands: a core subscription, and a lookup on (re)subscribing."""

    def __init__(
        self,
        bus: Bus,
        *,
        job: str,
        since_ns: int,
        on_command: Callable[[schemas.Command], None],
        reject: Reject,
    ) -> None:
        self.bus = bus
        self.subject = subjects.command(job, subjects.TRAINER)
        self.since_ns = since_ns
        self._on_command = on_command
        self._reject = reject
        self._seen = RecentIds()
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._tasks: set[asyncio.Future[None]] = set()
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        """Subscribe, then look up what was sent before; again after every reconnect."""

        async def on_message(msg: Msg) -> None:
            self._queue.put_nowait((msg.subject, msg.data))

        self._subscription = await self.bus.nc.subscribe(self.subject, cb=on_message)
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            # the server has the subscription once this returns: what is sent then arrives live
            await self.bus.nc.flush(timeout=LOOKUP_TIMEOUT_S)
        self._spawn(self._handle())
        self.bus.on_reconnect(self._catch_up_later)
        # sent after the SUB on the same connection: the server has the subscription by then;
        # not awaited: a lookup retried through an outage must not hold the link's events
        self._catch_up_later()

    async def stop(self) -> None:
        self.bus.on_reconnect(self._catch_up_later, remove=True)
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()

    def _catch_up_later(self) -> None:
        self._spawn(self.catch_up())

    async def catch_up(self) -> None:
        """Queue the newest stored trainer command if it was stored since the launch."""

        async def lookup() -> Msg:
            msg = await self.bus.nc.request(
                f"$JS.API.DIRECT.GET.{subjects.COMMANDS_STREAM}.{self.subject}",
                b"",
                timeout=LOOKUP_TIMEOUT_S,
            )
            status = (msg.headers or {}).get("Status", "")
            if status not in ("", "404"):  # 404: none stored; else not answerable yet
                raise nats.js.errors.ServiceUnavailableError(description=f"status {status}")
            # live copies read before the answer reach the queue first (the module's order)
            await self.bus.nc.flush(timeout=LOOKUP_TIMEOUT_S)
            return msg

        try:
            # a server just restarted answers "no responders" until its stream is back
            msg = await retry_transient(lookup, deadline_s=LOOKUP_FOR_S, what="trainer commands")
        except (nats.errors.Error, BusUnavailableError) as exc:
            log.warning("trainer commands sent while away are missed: lookup failed: %s", exc)
            return
        headers = msg.headers or {}
        stamp = headers.get("Nats-Time-Stamp")
        if not msg.data or stamp is None:  # none stored
            return
        try:
            since_launch = stored_ns(stamp) >= self.since_ns
        except ValueError:
            log.warning("trainer commands: the lookup's stored time %r is no time", stamp)
            return
        if since_launch:
            self._queue.put_nowait((headers.get("Nats-Subject", self.subject), msg.data))

    async def _handle(self) -> None:
        while True:
            subject, data = await self._queue.get()
            try:
                command = schemas.decode_command(data)
                misrouted = subjects.mismatch(subject, command)
                reason = f"wrong subject: {misrouted}" if misrouted else ""
            except schemas.SchemaError as exc:
                reason = f"undecodable: {exc}"
            try:
                if reason:
                    await self._reject(subject, reason, data)
                elif self._seen.first_time(command.command_id):
                    self._on_command(command)
            except Exception:
                log.exception("trainer command not handled")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
