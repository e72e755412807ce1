"""Which agents the actuator takes for live, and how it follows their ranks (pure parts)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from goodput import schemas
from goodput.bus import BusSettings
from goodput.supervisor.agent.host import is_loopback, visible_gpus
from goodput.supervisor.membership import Membership
from goodput_services.actuator.agent_backend import AgentBackend, AgentRankEntry
from goodput_services.actuator.agent_directory import AgentDirectory
from goodput_services.actuator.ports import BusPorts


def _record(node: str, *ranks: schemas.AgentRank, run_id: str = "r1") -> schemas.AgentRecord:
    return schemas.AgentRecord(
        job="j",
        node=node,
        address="10.0.0.1",
        pid=1,
        instance="i",
        started_ts=1,
        state_dir="/var/goodput",
        run_id=run_id,
        ranks=list(ranks),
    )


def test_an_agent_is_live_while_new_revisions_of_its_record_arrive() -> None:
    agents = AgentDirectory("j", ttl_s=5.0)
    assert agents.apply(_record("a"), revision=1, now=100.0)
    assert agents.is_live("a", 104.9) and not agents.is_live("a", 105.0)
    # a watch re-created after an outage delivers the same revision again: no proof of life
    assert not agents.apply(_record("a"), revision=1, now=109.0)
    assert agents.live(109.0) == {}
    assert agents.apply(_record("a"), revision=7, now=109.0)
    assert set(agents.live(110.0)) == {"a"}
    assert not agents.apply(
        _record("b").__class__(**{**_fields(_record("b")), "job": "other"}), revision=9, now=110.0
    )
    agents.forget("a")
    assert agents.live(110.0) == {}


def _fields(record: schemas.AgentRecord) -> dict:
    return {f: getattr(record, f) for f in record.__struct_fields__}


async def test_a_rank_restarted_in_process_is_matched_by_its_pid_and_its_exit_ends_the_run() -> (
    None
):
    emitted: list[schemas.Event] = []

    async def emit(event: schemas.Event) -> None:
        emitted.append(event)

    backend = AgentBackend(
        job="j", bus_settings=BusSettings(url="nats://x:4222"), ports=BusPorts(emit=emit)
    )
    declared = backend.capabilities()
    assert (declared.backend, declared.standbys, declared.hot_swap) == ("agent", "all", True)
    backend.run_id, backend.state, backend.attempt = "r1", "running", 3
    # rank 0 survived into attempt 3 in its process (started under attempt 1); rank 1 was
    # launched again for attempt 3 and its pid is not known yet
    survivor = AgentRankEntry(node="a", rank=0, local_rank=0, attempt=3, pid=500)
    relaunched = AgentRankEntry(node="b", rank=1, local_rank=0, attempt=3)
    backend.ranks = [survivor, relaunched]
    backend._on_record(
        _record("b", schemas.AgentRank(rank=1, local_rank=0, attempt=3, pid=700, running=True))
    )
    assert relaunched.pid == 700 and relaunched.started.is_set()
    assert backend._pids() == {"a": [500], "b": [700]}
    # an earlier run's record says nothing about this run's ranks
    backend._on_record(
        _record(
            "a",
            schemas.AgentRank(rank=0, local_rank=0, attempt=3, pid=500, running=False, exit_code=1),
            run_id="r0",
        )
    )
    assert not survivor.exited.is_set()
    done = schemas.AgentRank(rank=0, local_rank=0, attempt=1, pid=500, running=False, exit_code=0)
    backend._on_record(_record("a", done))
    assert survivor.exited.is_set() and backend.state == "running"
    backend._on_record(
        _record(
            "b",
            schemas.AgentRank(rank=1, local_rank=0, attempt=3, pid=700, running=False, exit_code=0),
        )
    )
    assert backend.state == "finished"
    await asyncio.sleep(0.01)  # the status is emitted by a task of its own
    assert [e.state for e in emitted if isinstance(e, schemas.JobStatus)] == ["finished"]


async def test_the_job_status_shows_the_ready_standbys_the_agents_of_the_job_report() -> None:
    emitted: list[schemas.Event] = []

    async def emit(event: schemas.Event) -> None:
        emitted.append(event)

    backend = AgentBackend(
        job="j", bus_settings=BusSettings(url="nats://x:4222"), ports=BusPorts(emit=emit)
    )
    backend.spec = schemas.StartJob(
        job="j", argv=["train"], nodes=1, procs_per_node=1, spares=1, standbys=1
    )
    backend.membership = Membership(active=["a"], spares=["b"], failed=["c"])
    backend.standbys.begin_run("r1", 1, ["train"], "", {})
    backend.run_id, backend.state, backend.attempt = "r1", "running", 1
    for revision, (node, run_id, ready) in enumerate(
        [("a", "r1", [11]), ("b", "r1", [12]), ("c", "r1", [13]), ("d", "r0", [14])], start=1
    ):
        record = msgspec.structs.replace(_record(node, run_id=run_id), standbys=ready)
        assert backend.agents.apply(record, revision=revision, now=time.monotonic())
        backend._on_record(record)
    # the job's nodes (spares included) of this run: not a failed node's, nor another run's
    status = backend.status()
    assert status.standbys == {"a": [11], "b": [12]} and status.capabilities is not None
    assert status.capabilities.standbys == "all"
    await asyncio.sleep(0.01)  # each change is a JobStatus of its own (the policy reads it)
    reported = [e.standbys for e in emitted if isinstance(e, schemas.JobStatus)]
    assert reported and reported[-1] == {"a": [11], "b": [12]}
    # the same standbys again are no news
    before = len(emitted)
    backend._on_record(msgspec.structs.replace(_record("a"), standbys=[11]))
    await asyncio.sleep(0.01)
    assert len(emitted) == before


def test_the_host_probes() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == [0, 1]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({}, dev=Path("/nonexistent")) == []
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("10.0.0.1")
