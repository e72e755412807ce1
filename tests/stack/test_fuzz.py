"""10,000 malformed messages against a running stack: no service dies, everything is dead-lettered.

Events, every service's commands and heartbeats get seeded garbage (see ``tests/bus/fuzz.py``),
some of it at the server's max payload. Afterwards every durable consumer has acked
everything, each stored message is in its reader's dead-letter subject exactly once (by stream
sequence, with its size and the head of its payload), every service is healthy, and a valid
command to each is executed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import defaultdict
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.owned_process import is_running
from goodput.supervisor.jobstate.folds import controller_filters
from goodput.tools.stack.health import services_health
from goodput.tools.stack.keeper import kept_service
from goodput.tools.stack.launcher import expected_slots
from goodput.tools.stack.record import read_stack
from tests.bus.fuzz import Fuzzer

JOB = "job-a"
SEED = 16
COUNT = 10_000
HUGE = 24  # payloads at or just below the max payload, spread through the run
#: command target -> the service (and dead-letter subject) that reads it
TARGETS = {
    subjects.SENSOR: "sensor",
    subjects.ACTUATOR: "actuator",
    subjects.node_target(subjects.HOST_MONITOR, "node-0"): "hostmon",
    subjects.node_target(subjects.REPLICATOR, "node-0"): "replicator",
}
EVENT_READERS = ("sensor", "controller")


async def _publish_fuzz(bus: Bus) -> tuple[dict[str, dict[tuple[str, int], bytes]], int]:
    """Publish the fuzz; return per reading service {(subject, stream seq): payload}, beats sent."""
    fuzzer = Fuzzer(SEED, bus.nc.max_payload)
    rng = random.Random(SEED)
    huge_at = set(rng.sample(range(COUNT), HUGE))
    expected: dict[str, dict[tuple[str, int], bytes]] = defaultdict(dict)
    pending: list[tuple[list[str], str, bytes, asyncio.Future]] = []
    beats = 0
    kinds = sorted(schemas.kind_of(t) for t in schemas.EVENT_TYPES)
    controller_reads = set(controller_filters(JOB))
    assert not any("*" in f or ">" in f for f in controller_reads), "match them as subjects"
    for i in range(COUNT):
        where = rng.random()
        family = "event" if where < 0.6 else "command"
        payload = fuzzer.huge() if i in huge_at else fuzzer.payload(family)[1]
        if where < 0.15:
            await bus.nc.publish(subjects.heartbeat(JOB, "node-0", rng.randint(0, 7)), payload)
            beats += 1
            continue
        if family == "event":
            subject = subjects.event(JOB, rng.choice(kinds))
            # the controller is sent only the kinds it reads (issue 36): only those it letters
            readers = [r for r in EVENT_READERS if r != "controller" or subject in controller_reads]
        else:
            target = rng.choice(sorted(TARGETS))
            subject, readers = subjects.command(JOB, target), [TARGETS[target]]
        future = await bus.js.publish_async(subject, payload)
        pending.append((readers, subject, payload, future))
        if len(pending) % 500 == 0:
            await asyncio.gather(*(f for *_, f in pending[-500:]))
    for readers, subject, payload, future in pending:
        ack = await future
        for reader in readers:
            expected[reader][(subject, ack.seq)] = payload
    return expected, beats


async def _wait_consumers_drained(bus: Bus, timeout_s: float) -> dict[str, tuple[int, int]]:
    durables = [(subjects.EVENTS_STREAM, f"{JOB}-{r}") for r in EVENT_READERS] + [
        (subjects.COMMANDS_STREAM, f"{JOB}-{t}") for t in TARGETS
    ]
    deadline = time.monotonic() + timeout_s
    while True:
        state = {}
        for stream, durable in durables:
            info = await bus.js.consumer_info(stream, durable)
            state[f"{stream}/{durable}"] = (info.num_pending, info.num_ack_pending)
        if all(v == (0, 0) for v in state.values()) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(1.0)


async def _stored(bus: Bus, stream: str, subject: str) -> list[bytes]:
    """Every payload stored under ``subject`` so far."""
    subscription = await bus.js.pull_subscribe(
        subject,
        stream=stream,
        # no acks: an explicit-ack reader would stall at its max_ack_pending (1,000)
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    info = await subscription.consumer_info()
    payloads: list[bytes] = []
    while len(payloads) < info.num_pending:
        # small batches: a batch of max-size letters must stay under the client's pending limit
        payloads += [m.data for m in await subscription.fetch(8, timeout=10)]
    await subscription.unsubscribe()
    return payloads


async def _executed(bus: Bus, ids: set[str], timeout_s: float) -> dict[str, int]:
    """How many ActionResults each command got (the subject also holds fuzz: skipped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = dict.fromkeys(ids, 0)
        for data in await _stored(
            bus, subjects.EVENTS_STREAM, subjects.event(JOB, "action_result")
        ):
            with contextlib.suppress(schemas.SchemaError):
                result = schemas.decode_event(data)
                if isinstance(result, schemas.ActionResult) and result.command_id in ids:
                    counts[result.command_id] += 1
        if all(counts.values()) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_ten_thousand_malformed_messages_leave_the_stack_healthy(stack: Path) -> None:
    record = read_stack(stack)
    assert record is not None
    # the services themselves, not their keepers (which would restart one that died)
    services = [kept_service(s.process) for s in record.services]
    bus = await Bus.connect(BusSettings(url=record.url), name="fuzz")
    try:
        expected, beats = await _publish_fuzz(bus)
        # every reader gets its share; the controller only the event kinds it reads (issue 36)
        assert beats > 1000 and sum(map(len, expected.values())) > 8_000
        assert all(len(expected[r]) > 1000 for r in EVENT_READERS)

        drained = await _wait_consumers_drained(bus, timeout_s=300)
        assert all(v == (0, 0) for v in drained.values()), drained
        assert all(s is not None and is_running(s) for s in services), "a service process died"

        got: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for data in await _stored(bus, subjects.DEAD_LETTER_STREAM, f"gp.{JOB}.dlq.>"):
            assert len(data) <= bus.nc.max_payload
            letter = schemas.decode_event(data)
            assert isinstance(letter, schemas.DeadLetter)
            key = (letter.subject, letter.stream_seq)
            assert key not in got[letter.service], f"dead-lettered twice: {key}"
            got[letter.service].add(key)
            original = expected[letter.service].get(key)
            assert original is not None, f"not fuzz: {letter.service} {key} {letter.reason}"
            assert letter.size == len(original)
            assert original.startswith(letter.payload) and letter.reason
        missing = {s: sorted(set(v) - got[s]) for s, v in expected.items()}
        assert not any(missing.values()), {s: (len(m), m[:5]) for s, m in missing.items() if m}

        commands = {
            target: schemas.SetThresholds(job=JOB, values={"heartbeat_timeout_s": 9.0})
            for target in TARGETS
        }
        for target, command in commands.items():
            await bus.send_command(target, command)
        ids = {c.command_id for c in commands.values()}
        assert await _executed(bus, ids, timeout_s=60) == dict.fromkeys(ids, 1)

        # the health records `goodput status` reads (its CLI would also replay the fuzz events)
        report = await services_health(
            bus, JOB, time.time_ns(), expected=expected_slots(record.services)
        )
        services = report.entries
        assert report.healthy and len(services) == len(record.services), services
        sensor = next(s for s in services if s["name"] == "sensor")
        assert "undecodable" in sensor["detail"], sensor
    finally:
        await bus.close()
