"""A node's step reports rolled up by its first local rank (issue 36): the rollup's timing,
the node-local channel's checks on real sockets, and the links of two ranks on a real server."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
import uuid

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import next_step
from goodput.shim.link import BusLink
from goodput.shim.step_rollup import (
    GRACE_S,
    Rollup,
    StepAggregator,
    StepSender,
    channel_name,
    rolled_up,
)

GRACE_NS = int(GRACE_S * 1e9)


def _report(rank: int, step: int, *, job: str = "j", node: str = "node-0") -> schemas.StepDone:
    return schemas.StepDone(
        job=job,
        node=node,
        rank=rank,
        step=step,
        step_time_s=1.0 + rank / 100,
        tokens=4096,
        loss=2.5 - step / 1000,
        world_size=8,
        compute_time_s=0.9,
        in_process_restart=rank % 2 == 0,
    )


def test_a_step_goes_once_every_local_rank_reported_it() -> None:
    rollup = Rollup(ranks=3)
    rollup.add(_report(1, 5), now_ns=0)
    rollup.add(_report(0, 5), now_ns=1)
    assert rollup.due(2) == []
    rollup.add(_report(2, 5), now_ns=3)
    assert [(r.rank, r.step) for r in rollup.due(4)] == [(0, 5), (1, 5), (2, 5)]
    assert rollup.due(GRACE_NS * 10) == [] and rollup.next_due_ns() is None


def test_a_late_rank_rides_in_the_next_rollup() -> None:
    rollup = Rollup(ranks=3)
    for rank in (0, 1):
        rollup.add(_report(rank, 5), now_ns=0)
    assert rollup.due(GRACE_NS - 1) == []
    assert [r.rank for r in rollup.due(GRACE_NS)] == [0, 1]  # the grace ran out: what it has
    rollup.add(_report(2, 5), now_ns=GRACE_NS + 1)  # step 5 went without it
    for rank in (0, 1, 2):
        rollup.add(_report(rank, 6), now_ns=GRACE_NS + 2)
    sent = rollup.due(GRACE_NS + 3)
    assert [(r.rank, r.step) for r in sent] == [(2, 5), (0, 6), (1, 6), (2, 6)]


def test_a_late_report_alone_goes_after_its_grace() -> None:
    rollup = Rollup(ranks=2)
    rollup.add(_report(0, 5), now_ns=0)
    assert len(rollup.due(GRACE_NS)) == 1
    rollup.add(_report(1, 5), now_ns=GRACE_NS)
    assert rollup.due(2 * GRACE_NS - 1) == []
    assert [r.rank for r in rollup.due(2 * GRACE_NS)] == [1]


def test_a_step_trained_again_after_a_rollback_is_not_late() -> None:
    rollup = Rollup(ranks=2)
    for rank in (0, 1):
        rollup.add(_report(rank, 5), now_ns=0)
    assert len(rollup.due(1)) == 2
    for rank in (0, 1):  # the job went back to step 4's checkpoint and trains step 5 again
        rollup.add(_report(rank, 5), now_ns=2)
    assert [r.rank for r in rollup.due(3)] == [0, 1] and not rollup.late


def test_a_rollup_holds_every_field_of_every_report() -> None:
    reports = [_report(rank, step) for step in (7, 8) for rank in range(4)]
    [event] = rolled_up("j", "node-0", 0, reports)
    decoded = schemas.decode_event(schemas.encode(event))
    assert subjects.event_for(decoded) == "gp.j.evt.steps.0"
    assert list(schemas.expand_steps(decoded)) == reports


def test_more_reports_than_a_rollup_carries_go_in_several() -> None:
    reports = [_report(rank % 8, rank // 8) for rank in range(schemas.MAX_ROLLED_UP + 3)]
    events = rolled_up("j", "node-0", 0, reports)
    assert [len(e.steps) for e in events] == [schemas.MAX_ROLLED_UP, 3]
    assert list(schemas.expand_all(events)) == reports


def _channel() -> bytes:
    return channel_name("nats://127.0.0.1:4222", f"test-{uuid.uuid4().hex[:8]}", 1, "node-0")


def _aggregator(address: bytes, ranks: int, sent: list[schemas.StepsDone]) -> StepAggregator:
    aggregator = StepAggregator.bind(
        address, job="j", node="node-0", rank=0, ranks=ranks, emit=sent.append
    )
    assert aggregator is not None
    return aggregator


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_every_local_ranks_report_makes_one_event() -> None:
    address = _channel()
    sent: list[schemas.StepsDone] = []
    aggregator = _aggregator(address, 4, sent)
    senders = [StepSender(address) for _ in range(4)]
    try:
        reports = [_report(rank, 3) for rank in range(4)]
        began = time.monotonic()
        for report, sender in zip(reports, senders, strict=True):
            assert sender.send(report)
        _wait(lambda: sent)
        assert time.monotonic() - began < GRACE_S  # complete: it did not wait for the grace
        [event] = sent
        assert list(schemas.expand_steps(event)) == reports
    finally:
        aggregator.close()
        for sender in senders:
            sender.close()


def test_the_channel_is_the_nodes_in_one_attempt_of_one_job_on_one_bus() -> None:
    name = channel_name("nats://a:4222", "j", 1, "node-0")
    assert len(name) == len(channel_name("nats://a:4222", "j" * 200, 1, "n" * 200)) < 108
    others = [
        ("nats://b:4222", "j", 1, "node-0"),  # a job of the same name on another bus
        ("nats://a:4222", "k", 1, "node-0"),
        ("nats://a:4222", "j", 2, "node-0"),
        ("nats://a:4222", "j", 1, "node-1"),  # the local backend: nodes on one machine
    ]
    assert name not in {channel_name(*other) for other in others}


def test_a_second_aggregator_of_the_node_does_not_bind() -> None:
    address = _channel()
    first = _aggregator(address, 2, [])
    try:
        second = StepAggregator.bind(
            address, job="j", node="node-0", rank=0, ranks=2, emit=lambda _: None
        )
        assert second is None
    finally:
        first.close()


def _send_as(address: bytes, payload: bytes, uid: int) -> None:
    """A datagram whose credentials say ``uid`` (root may state another user's)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        credentials = struct.pack("3i", os.getpid(), uid, os.getgid())
        sock.sendmsg(
            [payload], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, credentials)], 0, address
        )


@pytest.mark.skipif(os.getuid() != 0, reason="only root can send another user's credentials")
def test_a_report_from_another_user_is_dropped() -> None:
    address = _channel()
    sent: list[schemas.StepsDone] = []
    aggregator = _aggregator(address, 2, sent)
    try:
        _send_as(address, schemas.encode(_report(1, 3)), uid=65534)
        _send_as(address, schemas.encode(_report(0, 3)), uid=os.getuid())
        _wait(lambda: aggregator.refused == 1 and aggregator.rollup.pending)
        aggregator.close()
        [event] = sent
        assert [s.rank for s in event.steps] == [0]
    finally:
        aggregator.close()


def test_malformed_and_foreign_datagrams_are_dropped_and_counted() -> None:
    address = _channel()
    sent: list[schemas.StepsDone] = []
    aggregator = _aggregator(address, 2, sent)
    sender = StepSender(address)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
            raw.sendto(b"\xc1 not msgpack", address)
            raw.sendto(schemas.encode(schemas.CheckpointNow(job="j")), address)
        assert sender.send(_report(1, 3, node="node-1"))  # another node's
        assert sender.send(_report(1, 3, job="k"))  # another job's
        reports = [_report(0, 3), _report(1, 3)]
        for report in reports:
            assert sender.send(report)
        _wait(lambda: sent)
        assert aggregator.refused == 4
        [event] = sent
        assert list(schemas.expand_steps(event)) == reports
    finally:
        aggregator.close()
        sender.close()


def test_without_an_aggregator_a_send_fails_so_the_rank_publishes() -> None:
    address = _channel()
    sender = StepSender(address)
    assert not sender.send(_report(1, 3))  # none bound
    aggregator = _aggregator(address, 2, [])
    assert sender.send(_report(1, 3))
    aggregator.close()  # a closing aggregator refuses what comes after it
    assert not sender.send(_report(1, 4))
    sender.close()


def test_closing_sends_what_is_pending() -> None:
    address = _channel()
    sent: list[schemas.StepsDone] = []
    aggregator = _aggregator(address, 3, sent)
    sender = StepSender(address)
    assert sender.send(_report(0, 9)) and sender.send(_report(1, 9))
    _wait(lambda: aggregator.rollup.pending)
    aggregator.close()
    sender.close()
    assert [(s.rank, s.step) for s in sent[0].steps] == [(0, 9), (1, 9)]


def _link(bus: Bus, rank: int, local_rank: int, job: str) -> BusLink:
    return BusLink(
        settings=bus.settings,
        job=job,
        node="node-0",
        rank=rank,
        heartbeat_period_s=1.0,
        on_command=lambda _command: None,
        local_rank=local_rank,
        local_world_size=2,
    )


async def _stored(bus: Bus, job: str) -> list[tuple[str, schemas.Event]]:
    subscription = await bus.js.pull_subscribe(
        subjects.events_of(job), stream=subjects.EVENTS_STREAM
    )
    try:
        messages = await subscription.fetch(100, timeout=2)
    except Exception:
        return []
    finally:
        await subscription.unsubscribe()
    return [(m.subject, schemas.decode_event(m.data)) for m in messages]


async def test_a_nodes_two_ranks_publish_one_rollup_per_step(bus: Bus) -> None:
    job = f"roll{uuid.uuid4().hex[:6]}"
    first, second = _link(bus, 4, 0, job), _link(bus, 5, 1, job)
    reports = [_report(rank, step, job=job) for step in (1, 2) for rank in (4, 5)]
    try:
        for report in reports:
            (first if report.rank == 4 else second).publish(report)
    finally:
        await asyncio.to_thread(second.close)
        await asyncio.to_thread(first.close)
    stored = await _stored(bus, job)
    assert [subject for subject, _ in stored] == [f"gp.{job}.evt.steps.4"] * 2
    assert list(schemas.expand_all(e for _, e in stored)) == reports


async def test_a_rank_whose_aggregator_is_gone_publishes_its_own_steps(bus: Bus) -> None:
    job = f"roll{uuid.uuid4().hex[:6]}"
    alone = _link(bus, 5, 1, job)  # its node's first rank never came up
    report = _report(5, 1, job=job)
    try:
        alone.publish(report)
    finally:
        await asyncio.to_thread(alone.close)
    stored = await _stored(bus, job)
    assert stored == [(f"gp.{job}.evt.step.5", report)]


def test_a_rollup_is_decoded_strictly() -> None:
    """A forged rollup is refused whole at decoding (and dead-lettered), never expanded."""
    [good] = rolled_up("j", "node-0", 0, [_report(0, 1)])
    raw = msgspec.msgpack.decode(schemas.encode(good))
    entry = raw["steps"][0]
    forged = [
        {**raw, "steps": [entry] * (schemas.MAX_ROLLED_UP + 1)},  # more than a rollup carries
        {**raw, "steps": [[*entry, 0]]},  # a field more than a rank's report has
        {**raw, "steps": [entry[:-1]]},  # one less
        {**raw, "steps": [[entry[0], entry[1], entry[2], -1.0, *entry[4:]]]},  # negative step time
    ]
    for payload in forged:
        with pytest.raises(schemas.SchemaError):
            schemas.decode_event(msgspec.msgpack.encode(payload))


async def test_a_rollup_is_a_step_to_whoever_waits_for_the_next(bus: Bus) -> None:
    """A node agent starts a launch's standbys once the job steps again (``next_step``)."""
    job = f"roll{uuid.uuid4().hex[:6]}"
    waiting = asyncio.create_task(next_step(bus, job))
    await asyncio.sleep(0.2)  # subscribed
    [rollup] = rolled_up(job, "node-0", 0, [_report(0, 1, job=job), _report(1, 1, job=job)])
    await bus.emit(rollup)
    await asyncio.wait_for(waiting, 30)
