"""The Rejoin round of a warm restart: send the trainers ``Rejoin``, re-send it to the ranks
that have not answered, collect their ``RankRejoined`` answers until all did or the deadline.

Ranks read trainer commands through a core subscription (``goodput.shim.command_feed``): a
rank reconnecting while the Rejoin was published sees it only by its lookup of the newest
stored command, which a later command in the same gap hides. So the round re-sends the same
command (same id) every :data:`RESEND_EVERY_S` while a rank is silent: GP_CMDS stores it once
(the id is its ``Nats-Msg-Id``), every subscribed rank gets it again, and a rank that had it
already drops it (the feed's de-duplication by id; the ``RejoinMailbox`` ignores an attempt
reached). A fresh id is not needed: the actuator's fence guards its own ``RestartInProcess``,
not the Rejoin, which no executor records in ``gp_done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from nats.aio.msg import Msg

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.routing import decode_event_on

log = logging.getLogger(__name__)

#: how often the Rejoin is sent again while a rank has not answered
RESEND_EVERY_S = 1.5


def to_ask_again(ranks: set[int], answers: Mapping[int, schemas.RankRejoined]) -> set[int]:
    """The ranks the Rejoin is sent again for: those that have not answered; none once one
    answered that it cannot (the round failed, every rank is stopped)."""
    if any(not answer.ok for answer in answers.values()):
        return set()
    return ranks - answers.keys()


async def rejoin_round(
    bus: Bus,
    command: schemas.Rejoin,
    ranks: set[int],
    deadline_s: float,
    resend_every_s: float = RESEND_EVERY_S,
) -> dict[int, schemas.RankRejoined]:
    """Send ``command`` to the trainers and collect the answers of ``ranks`` for its attempt
    until each answered or ``deadline_s`` passed (listening before sending), sending it again
    every ``resend_every_s`` while :func:`to_ask_again` names a rank."""
    answers: dict[int, schemas.RankRejoined] = {}
    answered = asyncio.Event()

    async def on_answer(msg: Msg) -> None:
        try:
            event = decode_event_on(msg.subject, msg.data)
        except schemas.SchemaError:
            return  # the sensor's consumer dead-letters it
        # only the ranks asked: one started into this attempt is not rejoining
        if (
            isinstance(event, schemas.RankRejoined)
            and event.attempt == command.attempt
            and event.rank in ranks
        ):
            answers[event.rank] = event
            answered.set()

    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    subject = subjects.event(command.job, schemas.kind_of(schemas.RankRejoined))
    subscription = await bus.nc.subscribe(subject, cb=on_answer)
    try:
        await bus.send_command(subjects.TRAINER, command)
        next_send = loop.time() + resend_every_s
        while silent := to_ask_again(ranks, answers):
            now = loop.time()
            if now >= end:
                break
            if now >= next_send:
                log.info(
                    "Rejoin %d sent again: ranks %s have not answered",
                    command.attempt,
                    sorted(silent),
                )
                await bus.send_command(subjects.TRAINER, command, retry_for_s=end - now)
                next_send = loop.time() + resend_every_s
            answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(answered.wait(), max(0.0, min(next_send, end) - now))
    finally:
        await subscription.unsubscribe()
    return answers
