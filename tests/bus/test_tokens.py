"""Names that become subject tokens, KV keys or paths are checked at decoding, and a message
must be about the subject it came on (issue 41, "Tokens everywhere"): a forged or misrouted
message is dead-lettered, never handed to a handler."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.routing import decode_event_on
from goodput.supervisor.agent import registry
from tests.bus.recording_runner import recording_runner
from tests.bus.samples import JOB, sample_commands, sample_events
from tests.bus.test_dead_letters import _consume, _letters, _until

BAD_TOKENS = ["*", ">", "a b", "", "a.b"]


def _step(**fields) -> schemas.StepDone:
    values = {"job": JOB, "node": "node-0", "rank": 0, "step": 1, "step_time_s": 0.1}
    return schemas.StepDone(**{**values, "tokens": 1, "loss": 1.0, **fields})


@pytest.mark.parametrize("field", ["job", "node"])
async def test_an_event_naming_a_job_or_node_that_is_no_token_is_dead_lettered(
    bus: Bus, field: str
) -> None:
    subject = subjects.event(JOB, "step")
    published = [(subject, schemas.encode(_step(**{field: bad}))) for bad in BAD_TOKENS]
    good = _step(step=2)
    handled, consumer = await _consume(bus, published, good)
    assert handled == [good]
    assert consumer.dead_lettered == len(BAD_TOKENS)
    letters = await _letters(bus, len(BAD_TOKENS))
    assert all(f"$.{field}" in letter.reason for _, letter in letters), letters


async def test_an_event_on_another_jobs_or_kinds_subject_is_dead_lettered(bus: Bus) -> None:
    other_job = _step(job="job-b")
    signal = schemas.Signal(job=JOB, signal="crash", node="node-0")
    published = [
        (subjects.event(JOB, "step"), schemas.encode(other_job)),
        (subjects.event(JOB, "step"), schemas.encode(signal)),
    ]
    good = _step(step=2)
    handled, consumer = await _consume(bus, published, good)
    assert handled == [good] and consumer.dead_lettered == 2
    reasons = [letter.reason for _, letter in await _letters(bus, 2)]
    assert reasons == [
        f"wrong subject: job 'job-b' is not the job of its subject gp.{JOB}.evt.step",
        f"wrong subject: a signal message belongs on gp.{JOB}.evt.signal, not gp.{JOB}.evt.step",
    ]


async def test_a_command_for_another_job_or_a_forged_node_is_not_executed(bus: Bus) -> None:
    executed: list[str] = []
    runner = recording_runner(bus, JOB, executed, "actuator")
    task = asyncio.create_task(runner.run())
    target = subjects.command(JOB, "actuator")
    await bus.js.publish(target, schemas.encode(schemas.Stop(job="job-b")))
    await bus.js.publish(target, schemas.encode(schemas.Stop(job=JOB, nodes=["node-0", "*"])))
    await bus.js.publish(target, schemas.encode(schemas.HotSwap(job=JOB, failed_node="a b")))
    good = schemas.Stop(job=JOB)
    await bus.send_command("actuator", good)
    await _until(lambda: executed, "the good command executed")
    runner.stop()
    await task
    assert executed == [good.command_id] and runner.consumer.dead_lettered == 3


def test_a_heartbeat_must_name_the_node_and_rank_of_its_subject() -> None:
    beat = schemas.Heartbeat(job=JOB, node="node-0", rank=3, pid=1, step=0)
    payload = schemas.encode(beat)
    assert decode_event_on(subjects.heartbeat(JOB, "node-0", 3), payload) == beat
    for subject in (subjects.heartbeat(JOB, "node-1", 3), subjects.heartbeat(JOB, "node-0", 4)):
        with pytest.raises(schemas.SchemaError, match=r"belongs on gp\.job-a\.hb\.node-0\.3"):
            decode_event_on(subject, payload)
    forged = schemas.encode(schemas.Heartbeat(job=JOB, node="*", rank=3, pid=1, step=0))
    with pytest.raises(schemas.SchemaError, match=r"\$\.node"):
        decode_event_on(subjects.heartbeat(JOB, "x", 3), forged)


def test_a_step_or_checkpoint_must_name_the_rank_of_its_subject() -> None:
    """Every rank's steps and checkpoints name it (the controller reads rank 0's only): one on
    another rank's subject is refused; one on its kind's subject without a rank was stored
    before ranks were named, and still reads (GP_EVENTS keeps 14 days of history)."""
    saved = schemas.CheckpointSaved(job=JOB, node="n0", rank=3, step=5, stall_s=0.1, bytes=1)
    persisted = schemas.CheckpointPersisted(
        job=JOB, node="n0", rank=3, step=5, path="/c", bytes=1, duration_s=1.0
    )
    for event in (_step(rank=3), saved, persisted):
        kind, payload = schemas.kind_of(type(event)), schemas.encode(event)
        assert subjects.event_for(event) == f"gp.{JOB}.evt.{kind}.3"
        assert decode_event_on(subjects.event_for(event), payload) == event
        assert decode_event_on(subjects.event(JOB, kind), payload) == event
        with pytest.raises(schemas.SchemaError, match=rf"belongs on gp\.{JOB}\.evt\.{kind}\.3"):
            decode_event_on(subjects.event(JOB, kind, 0), payload)
    assert subjects.event(JOB, "signal", 3) == f"gp.{JOB}.evt.signal"  # not a ranked kind


FORGED = [
    schemas.Stop(job=JOB, nodes=["a.b"]),
    schemas.Restart(job=JOB, reset_gpus={"*": [0]}),
    schemas.ScaleTo(job=JOB, num_dp_replicas=1, drop_nodes=[">"]),
    schemas.InjectFault(job=JOB, node="", fault="x"),
    schemas.SetThresholds(job=JOB, values={}, command_id="a b"),
    schemas.JobStatus(
        job=JOB, state="running", attempt=1, world_size=1, procs_per_node=1, pids={"a b": [1]}
    ),
    schemas.JobStatus(
        job=JOB, state="running", attempt=1, world_size=1, procs_per_node=1, spare_nodes=[""]
    ),
    schemas.ServiceHealth(job=JOB, service="a.b", instance="i", pid=1, healthy=True, started_ts=1),
    schemas.CheckpointReplicated(
        job=JOB, node="n", peer="*", step=1, bytes_sent=1, bytes_deduplicated=0, duration_s=0.0
    ),
]


@pytest.mark.parametrize("message", FORGED, ids=lambda m: type(m).__name__)
def test_every_name_that_reaches_a_subject_or_key_is_checked_at_decoding(
    message: schemas.Message,
) -> None:
    with pytest.raises(schemas.SchemaError):
        schemas.decode_any(schemas.encode(message))


def test_every_sample_message_still_decodes() -> None:
    """The narrowing changes no valid message: what a build sends decodes as before."""
    for message in [*sample_events(), *sample_commands()]:
        assert schemas.decode_any(schemas.encode(message)) == message


async def test_an_agent_record_filed_under_another_nodes_key_is_no_agent(bus: Bus) -> None:
    def record(node: str) -> schemas.AgentRecord:
        return schemas.AgentRecord(
            job=JOB, node=node, address="10.0.0.1", pid=1, instance="i", started_ts=1,
            state_dir="/var/goodput",
        )  # fmt: skip

    await registry.claim(bus, record("node-0"))
    kv = await registry.bucket(bus)
    await kv.put(registry.agent_key(JOB, "node-1"), schemas.encode(record("node-2")))
    await kv.put(registry.agent_key(JOB, "node-2"), msgspec.msgpack.encode({"job": JOB}))
    assert list(await registry.live_agents(bus, JOB)) == ["node-0"]
