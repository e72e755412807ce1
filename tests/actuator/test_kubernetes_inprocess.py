"""In-process restart across the Kubernetes backend's rank pods, against the API FAKE of
``kubernetes_fake`` and a FAKE of the actuator service's rejoin round."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from goodput import schemas
from goodput_services.actuator.kubernetes_backend import IMMEDIATE_GRACE_S
from tests.actuator.kubernetes_fake import (
    NAMESPACE,
    RUN,
    FakeKubernetesApi,
    FakeRejoinRound,
    Recorder,
    _env,
    _pinned_node,
    _start,
)


async def _crash(api: FakeKubernetesApi, recorder: Recorder, rank: int) -> None:
    api.exit(f"job-k8s-{RUN}-a1-r{rank}", 128 + signal.SIGSEGV)
    await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.rank == rank)


@pytest.mark.parametrize("dead", [2, 0], ids=["rank-2-dies", "rank-0-dies"])
async def test_in_process_restart_across_pods_on_two_nodes(rig, dead: int) -> None:
    backend, api, recorder = rig
    rejoin = FakeRejoinRound()
    backend.ports = replace(backend.ports, rejoin=rejoin)
    await backend.start_job(_start(nodes=2, spares=0, procs=2))  # 2 nodes x 2 ranks
    await _crash(api, recorder, dead)

    detail = await backend.restart_in_process("rank crashed", deadline_s=5.0)
    assert "3 rank(s) restarted in process, 1 started again (attempt 2)" in detail
    ((command, asked),) = rejoin.commands
    assert asked == {0, 1, 2, 3} - {dead}
    # rank 0's stable DNS name through the headless Service: the survivor's pod, or the new one
    rank0 = f"job-k8s-{RUN}-a{2 if dead == 0 else 1}-r0"
    assert command.master_addr == f"{rank0}.job-k8s-ranks.{NAMESPACE}.svc"
    assert (command.attempt, command.world_size, command.master_port) == (2, 4, 29502)
    # only the dead rank's pod is replaced, on its node, into the same rendezvous
    assert api.deleted == [(f"job-k8s-{RUN}-a1-r{dead}", IMMEDIATE_GRACE_S)]
    replacement = api.pod(2, dead)
    assert _pinned_node(replacement) == ("gpu-b" if dead == 2 else "gpu-a")
    env = _env(replacement)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (command.master_addr, "29502")
    assert (env["RANK"], env["WORLD_SIZE"], env["GOODPUT_ATTEMPT"]) == (str(dead), "4", "2")
    assert replacement.metadata.name == f"job-k8s-{RUN}-a2-r{dead}"
    assert len(api.pods) == 4
    started = [e for e in recorder.of(schemas.RankStarted) if e.attempt == 2]
    assert [(e.rank, e.node) for e in started] == [(dead, _pinned_node(replacement))]
    status = recorder.of(schemas.JobStatus)[-1]
    assert (status.state, status.attempt) == ("running", 2)
    # a survivor's later exit counts for the attempt it is in now
    survivor = 3
    api.exit(f"job-k8s-{RUN}-a1-r{survivor}", 1)
    exit_ = await recorder.wait_for(
        lambda e: isinstance(e, schemas.RankExited) and e.rank == survivor
    )
    assert exit_.attempt == 2


async def test_in_process_restart_that_misses_its_deadline_stops_every_pod(rig) -> None:
    backend, api, recorder = rig
    # rank 3 is stuck in a native call
    backend.ports = replace(backend.ports, rejoin=FakeRejoinRound(answering={0, 1}))
    await backend.start_job(_start(nodes=2, spares=0, procs=2))
    await _crash(api, recorder, 2)
    with pytest.raises(RuntimeError, match=r"rank 3 did not rejoin within 0\.3 s"):
        await backend.restart_in_process("rank crashed", deadline_s=0.3)
    assert api.pods == {}  # survivors and the new rank 2 alike: the cold restart starts clean
    status = recorder.of(schemas.JobStatus)[-1]
    assert status.state == "restarting" and "in-process restart failed" in status.detail
    await backend.restart("cold, after the warm restart failed")
    assert sorted(api.pods) == [f"job-k8s-{RUN}-a3-r{r}" for r in range(4)]


async def test_in_process_restart_is_refused_without_a_live_rank_or_a_bus(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start(nodes=1, spares=0, procs=2))
    with pytest.raises(RuntimeError, match="no bus"):
        await backend.restart_in_process("?", deadline_s=1.0)
    backend.ports = replace(backend.ports, rejoin=FakeRejoinRound())
    await _crash(api, recorder, 0)
    await _crash(api, recorder, 1)
    with pytest.raises(RuntimeError, match="no rank is alive"):
        await backend.restart_in_process("?", deadline_s=1.0)
    assert backend.attempt == 1
