"""The controller reads only the events it decides on (issue 36): ``CONTROLLER_READS`` names
them, every fold's input is in it, and its durable consumer is sent nothing else — not the
other ranks' steps and checkpoints, most of what a 16,384-rank job stores."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from goodput import schemas, subjects
from goodput.bus import Bus, DurableConsumer, EmbeddedNats
from goodput.supervisor.jobstate.folds import (
    CONTROLLER_READS,
    controller_filters,
    new_job_state,
    observe_event,
)
from tests.bus.samples import JOB, sample_events
from tests.controller.helpers import spawn_service

RANKED = subjects.RANKED_EVENTS


def _every_event() -> list[schemas.Event]:
    """One of every event kind, and of the ranked kinds both rank 0's and rank 1's."""
    samples = sample_events()
    assert {type(e) for e in samples} == set(schemas.EVENT_TYPES), "a kind has no sample"
    rank_0 = [_as_rank_0(e) for e in samples if isinstance(e, RANKED)]
    return [*samples, *rank_0]


def _as_rank_0(event: schemas.Event) -> schemas.Event:
    if isinstance(event, schemas.StepsDone):  # rank 0's node: its first rank is rank 0
        steps = [msgspec.structs.replace(s, rank=r) for r, s in enumerate(event.steps)]
        return msgspec.structs.replace(event, rank=0, steps=steps)
    return msgspec.structs.replace(event, rank=0)


def _read(event: schemas.Event) -> bool:
    """Whether the controller reads ``event``, by ``CONTROLLER_READS``."""
    if type(event) not in CONTROLLER_READS:
        return False
    rank = CONTROLLER_READS[type(event)]
    return rank is None or getattr(event, "rank", None) == rank


def test_the_folds_read_nothing_outside_the_controllers_reads() -> None:
    """A fold added for another kind (or another rank) fails here: its consumer never gets it."""
    state = new_job_state(JOB, ["n0", "n1"], num_nodes_per_dp=1, spares=["n2"], now=1)
    # as the service folds them: a node's rollup as its ranks' steps
    folded = [
        e
        for e in _every_event()
        if any(observe_event(state, each, 2) is not state for each in schemas.expand_steps(e))
    ]
    outside = [
        f"{type(e).__name__} of rank {getattr(e, 'rank', '-')}" for e in folded if not _read(e)
    ]
    assert not outside, f"observe_event folds {outside}, which CONTROLLER_READS leaves out"
    kinds = {type(e) for e in folded}
    assert kinds == {schemas.JobStatus, *RANKED}, "a fold the set names no longer folds"


async def _publish_every_event(bus: Bus) -> list[schemas.Event]:
    """Every event, on its subject; rank 1's step also on the subject used before ranks were
    named (history a new controller still reads). What the controller must be sent."""
    events = _every_event()
    for event in events:
        await bus.js.publish(subjects.event_for(event), schemas.encode(event))
    legacy = next(e for e in events if isinstance(e, schemas.StepDone) and e.rank == 1)
    await bus.js.publish(subjects.event(JOB, "step"), schemas.encode(legacy))
    return [*(e for e in events if _read(e)), legacy]


async def test_its_consumer_gets_every_kind_it_reads_and_no_other_ranks_step(bus: Bus) -> None:
    expected = await _publish_every_event(bus)
    handled: list[schemas.Event] = []

    async def handler(event: schemas.Event, msg: object) -> None:
        handled.append(event)

    consumer = DurableConsumer(
        bus,
        stream=subjects.EVENTS_STREAM,
        durable="reads",
        subject=controller_filters(JOB),
        decode=schemas.decode_event,
        handler=handler,
        service="controller",
        job=JOB,
    )
    task = asyncio.create_task(consumer.run())
    deadline = time.monotonic() + 20
    while len(handled) < len(expected) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # anything more it would be sent arrives within this
    consumer.stop()
    await task
    assert handled == expected and consumer.dead_lettered == 0
    assert {type(e) for e in handled} == set(CONTROLLER_READS)
    steps = [e.rank for e in handled if isinstance(e, schemas.StepDone)]
    assert steps == [0, 1]  # rank 1's only from the subject without a rank (stored before)


async def test_a_controller_takes_over_the_durable_an_older_one_left_with_every_event(
    nats_server: EmbeddedNats, bus: Bus, tmp_path: Path
) -> None:
    """The durable of a controller that read ``gp.<job>.evt.>`` is updated in place to the
    filters, keeping its position: nothing before it is read twice, the rest is filtered."""
    durable = f"{JOB}-controller"
    old = ConsumerConfig(
        durable_name=durable, filter_subject=subjects.events_of(JOB), ack_policy=AckPolicy.EXPLICIT
    )
    await bus.js.add_consumer(subjects.EVENTS_STREAM, old)
    earlier = await bus.emit(schemas.Signal(job=JOB, signal="crash", node="n9"))
    reader = await bus.js.pull_subscribe_bind(durable, subjects.EVENTS_STREAM)
    (message,) = await reader.fetch(1, timeout=5)
    assert message.metadata.sequence.stream == earlier.seq
    await message.ack_sync()
    await reader.unsubscribe()
    expected = await _publish_every_event(bus)
    controller = spawn_service("controller", JOB, nats_server, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = await bus.js.consumer_info(subjects.EVENTS_STREAM, durable)
            if info.config.filter_subjects and info.num_pending == 0 and not info.num_ack_pending:
                break
            assert controller.poll() is None, "the controller exited"
            await asyncio.sleep(0.2)
        else:
            pytest.fail("the controller never consumed the events")
        assert info.config.filter_subjects == controller_filters(JOB)
        assert info.config.filter_subject is None
        # delivered once each: what it reads, and nothing sent before the update again
        assert info.delivered.consumer_seq == 1 + len(expected)
    finally:
        controller.terminate()
        controller.wait(timeout=30)
