"""The actuator's Rejoin round on a real nats-server: the Rejoin is sent again while a rank
has not answered (it missed the first: reconnecting), and no more once every rank answered."""

from __future__ import annotations

import asyncio

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput_services.actuator.rejoin_round import rejoin_round, to_ask_again

JOB = "j"


def rejoin() -> schemas.Rejoin:
    return schemas.Rejoin(
        job=JOB, attempt=2, master_addr="127.0.0.1", master_port=1, world_size=2, reason="t"
    )


def answer(rank: int, ok: bool = True) -> schemas.RankRejoined:
    return schemas.RankRejoined(
        job=JOB, node=f"node-{rank}", rank=rank, pid=100 + rank, attempt=2, ok=ok
    )


def test_whom_to_ask_again() -> None:
    assert to_ask_again({0, 1}, {}) == {0, 1}
    assert to_ask_again({0, 1}, {0: answer(0)}) == {1}
    assert to_ask_again({0, 1}, {0: answer(0), 1: answer(1)}) == set()
    assert to_ask_again({0, 1}, {0: answer(0, ok=False)}) == set()  # the round failed


async def test_a_rank_that_missed_the_rejoin_gets_it_again_until_all_answered(bus: Bus) -> None:
    """Rank 0 answers the first delivery; rank 1 ignores the first (as if it was away) and
    answers the second. The round ends then; the command is stored once."""
    command = rejoin()
    deliveries: list[str] = []

    async def ranks(msg) -> None:
        deliveries.append(schemas.decode_command(msg.data).command_id)
        if len(deliveries) == 1:
            await bus.emit(answer(0))
        elif len(deliveries) == 2:
            await bus.emit(answer(1))

    await bus.nc.subscribe(subjects.command(JOB, subjects.TRAINER), cb=ranks)
    await bus.nc.flush()
    loop = asyncio.get_running_loop()
    began = loop.time()
    answers = await rejoin_round(bus, command, {0, 1}, deadline_s=30, resend_every_s=0.3)
    assert sorted(answers) == [0, 1]
    assert loop.time() - began < 30  # ended when all answered, not at the deadline
    await asyncio.sleep(1.0)  # more than three periods: a round still going would re-send
    assert deliveries == [command.command_id] * 2  # the same command, the same id
    stream = await bus.js.stream_info(subjects.COMMANDS_STREAM)
    assert stream.state.messages == 1


async def test_a_silent_rank_is_asked_until_the_deadline(bus: Bus) -> None:
    deliveries: list[str] = []

    async def silent(msg) -> None:
        deliveries.append(schemas.decode_command(msg.data).command_id)

    await bus.nc.subscribe(subjects.command(JOB, subjects.TRAINER), cb=silent)
    await bus.nc.flush()
    loop = asyncio.get_running_loop()
    began = loop.time()
    answers = await rejoin_round(bus, rejoin(), {0}, deadline_s=1.6, resend_every_s=0.5)
    assert loop.time() - began >= 1.6
    await bus.nc.flush()
    await asyncio.sleep(0.2)
    assert answers == {}
    # at 0, 0.5, 1.0 and 1.5 s; a loaded host may push the last past the deadline
    assert 3 <= len(deliveries) <= 4
    assert len(set(deliveries)) == 1
