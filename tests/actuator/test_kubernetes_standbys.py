"""Standby pods of the Kubernetes backend, against the API FAKE of kubernetes_fake, and
their bus channel (goodput.launch.standby_channel, pod flavour) against a real nats-server.

The standbys' assignments go through ``FakeAssignments``, a FAKE of the actuator service's
bus request (``ActuatorService._assign_standby``): it records what each standby pod is told
and answers as a standby would (taken, or no responder). The real request/reply is tested
below it, end to end over NATS, with the standby's side as the shim runs it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.launch.rank_env import RankEnv
from goodput.launch.standby_channel import (
    READY_FILE,
    SUBJECT_ENV,
    assign_on_bus,
    await_assignment_on_bus,
)
from goodput_services.actuator.kubernetes_standbys import standby_env
from tests.processes import kill_async

from .kubernetes_fake import (
    JOB,
    RUN,
    FakeKubernetesApi,
    _env,
    _pinned_node,
    _start,
)


class FakeAssignments:
    """FAKE of the service's bus request to a standby pod: records, answers "" (taken) or,
    for the pods in ``absent``, what NATS says when nobody serves the subject."""

    def __init__(self, absent: set[str] | None = None) -> None:
        self.told: dict[str, RankEnv] = {}
        self.absent = absent or set()

    async def __call__(self, subject: str, env: RankEnv) -> str:
        name = subject.rsplit(".", 1)[-1]
        assert subject == subjects.standby(JOB, name)
        if name in self.absent:
            return "no answer from the standby (NoRespondersError)"
        self.told[name] = env
        return ""


def _standby_pods(api: FakeKubernetesApi) -> list:
    """The standby pods that exist, in creation order."""
    return [
        p
        for p in api.created
        if p.metadata.name in api.pods and p.metadata.labels.get("goodput.dev/role") == "standby"
    ]


async def _ready_standbys(backend, api, recorder, count: int) -> list[str]:
    """The spare's standby pods, each made Ready (as its probe would once the job is built)."""
    pods = _standby_pods(api)
    assert len(pods) == count
    for pod in pods:
        api.set_ready(pod.metadata.name)
    await recorder.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and len(e.standbys.get("gpu-c", [])) == count
    )
    return [p.metadata.name for p in pods]  # in creation order: the order they are taken in


def _with_standbys(count: int) -> schemas.StartJob:
    return msgspec.structs.replace(_start(nodes=2, spares=1, procs=2), standbys=count)


async def test_standby_pods_live_on_the_spare_with_its_gpus_and_are_reported_ready(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_with_standbys(2))
    pods = _standby_pods(api)
    # the spare only: an active node's GPUs are its ranks'
    assert sorted(_pinned_node(p) for p in pods) == ["gpu-c", "gpu-c"]
    pod = pods[0]
    assert pod.metadata.name.startswith(f"job-k8s-{RUN}-s")
    container = pod.spec.containers[0]
    assert container.resources.limits == {"nvidia.com/gpu": "1"}  # it holds its GPU
    assert container.readiness_probe._exec.command == ["test", "-e", str(READY_FILE)]
    env = _env(pod)
    assert env["GOODPUT_STANDBY"] == "1" and env["GOODPUT_NODE"] == "gpu-c"
    assert env[SUBJECT_ENV] == subjects.standby(JOB, pod.metadata.name)
    assert "RANK" not in env and "MASTER_ADDR" not in env  # told with its assignment
    assert env["GOODPUT_CKPT_EVERY"] == "20"  # the job's own environment
    assert (pod.spec.hostname, pod.spec.subdomain) == (pod.metadata.name, "job-k8s-ranks")
    assert recorder.of(schemas.JobStatus)[-1].standbys == {}  # none ready yet
    await _ready_standbys(backend, api, recorder, 2)
    # stopping the job deletes them with the ranks
    await backend.stop("done")
    assert _standby_pods(api) == []


async def test_a_hot_swap_hands_the_spares_standbys_the_failed_nodes_ranks(rig) -> None:
    backend, api, recorder = rig
    told = FakeAssignments()
    backend.ports = replace(backend.ports, assign_standby=told)
    await backend.start_job(_with_standbys(2))
    standbys = await _ready_standbys(backend, api, recorder, 2)
    created = len(api.created)

    await backend.hot_swap("gpu-a", "", "XID 79", standbys=True)
    # ranks 0 and 1 (gpu-a's places) are the standby pods now; only gpu-b's are new pods
    assert sorted(told.told) == sorted(standbys)
    assert sorted(env.rank for env in told.told.values()) == [0, 1]
    rank0 = next(name for name, env in told.told.items() if env.rank == 0)
    address = f"{rank0}.job-k8s-ranks.training.svc"
    for env in told.told.values():
        assert (env.master_addr, env.master_port, env.world_size) == (address, 29502, 4)
        assert (env.node, env.group_rank, env.attempt) == ("gpu-c", 0, 2)
        assert env.ckpt_dir == f"/var/lib/goodput/nodes/gpu-c/checkpoints/{JOB}"
    new = api.created[created:]
    assert sorted((p.metadata.labels["goodput.dev/rank"], _pinned_node(p)) for p in new) == [
        ("2", "gpu-b"),
        ("3", "gpu-b"),
    ]
    assert {_env(p)["MASTER_ADDR"] for p in new} == {address}
    started = [e for e in recorder.of(schemas.RankStarted) if e.attempt == 2]
    assert sorted((e.rank, e.node) for e in started) == [
        (0, "gpu-c"),
        (1, "gpu-c"),
        (2, "gpu-b"),
        (3, "gpu-b"),
    ]
    status = recorder.of(schemas.JobStatus)[-1]
    assert (status.state, status.attempt, status.standbys) == ("running", 2, {})
    # a standby that became a rank is watched as one: its exit is that rank's
    api.exit(rank0, 1)
    exited = await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.attempt == 2)
    assert (exited.rank, exited.node, exited.attempt, exited.exit_code) == (0, "gpu-c", 2, 1)


async def test_a_standby_that_does_not_take_its_rank_is_deleted_and_the_rank_starts_cold(
    rig,
) -> None:
    backend, api, recorder = rig
    await backend.start_job(_with_standbys(2))
    first, second = await _ready_standbys(backend, api, recorder, 2)
    # rank 0's standby (the first created is taken first) is gone from the bus: rank 0 starts cold, and the
    # other standby is told the cold rank 0's address
    told = FakeAssignments(absent={first})
    backend.ports = replace(backend.ports, assign_standby=told)
    await backend.hot_swap("gpu-a", "", "XID 79", standbys=True)
    assert first not in api.pods and second in api.pods
    assert list(told.told) == [second] and told.told[second].rank == 1
    cold0 = f"job-k8s-{RUN}-a2-r0"
    assert _pinned_node(api.pods[cold0]) == "gpu-c"
    assert told.told[second].master_addr == f"{cold0}.job-k8s-ranks.training.svc"
    assert recorder.of(schemas.JobStatus)[-1].state == "running"


async def test_a_standby_pod_that_ends_before_ready_stops_standbys_on_its_node(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_with_standbys(1))
    (pod,) = _standby_pods(api)
    api.exit(pod.metadata.name, 1)  # the script does not serve standbys (no run_job)
    await recorder.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.detail.endswith("ended")
    )
    assert backend.standbys.disabled.keys() == {"gpu-c"}
    assert _standby_pods(api) == []
    await backend.return_node("gpu-c")  # no new standby there: no crash loop of pods
    assert _standby_pods(api) == []


async def test_a_standby_takes_its_assignment_over_a_real_bus(
    bus, nats_server, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("GOODPUT_NATS_URL", nats_server.url)
    subject = subjects.standby(JOB, "job-k8s-abc-s1")
    ready = tmp_path / "ready"
    standby = asyncio.ensure_future(await_assignment_on_bus(subject, ready))
    for _ in range(500):
        if ready.exists():
            break
        await asyncio.sleep(0.01)
    assert ready.exists()
    env = RankEnv(rank=3, world_size=8, master_addr="r0.svc", master_port=29502, node="gpu-c")
    assert await assign_on_bus(bus.nc, subject, env, 5.0) == ""
    assert await asyncio.wait_for(standby, 10) == env
    # nobody serves it any more: the actuator is told so at once, and starts the rank cold
    why = await assign_on_bus(bus.nc, subject, env, 5.0)
    assert why.startswith("no answer from the standby")


async def test_a_standby_process_with_the_pods_environment_takes_its_rank_over_the_bus(
    bus, nats_server
) -> None:
    """A real process with a standby pod's environment (``standby_env``) runs the standby
    side as ``run_job`` does (``receive_assignment``), says ready in the probe's file, and
    leaves with the RankEnv the actuator's request carried."""
    if READY_FILE.exists():
        pytest.skip(f"{READY_FILE} exists: another standby runs on this machine")
    name = "job-k8s-abc-s2"
    env = {
        **os.environ,
        **standby_env(
            {"GOODPUT_CKPT_EVERY": "20"}, {"GOODPUT_NATS_URL": nats_server.url}, JOB, "gpu-c", name
        ),
    }
    script = (
        "from goodput.launch.standby_channel import receive_assignment\n"
        "env = receive_assignment()\n"
        "print(env.rank, env.world_size, env.master_addr, flush=True)\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        for _ in range(1000):  # a bound on waiting (a loaded machine), not a speed test
            if READY_FILE.exists():
                break
            await asyncio.sleep(0.02)
        assert READY_FILE.exists()
        rank = RankEnv(rank=5, world_size=8, master_addr="r0.svc", master_port=29503, node="gpu-c")
        assert await assign_on_bus(bus.nc, subjects.standby(JOB, name), rank, 10.0) == ""
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert out.decode().split() == ["5", "8", "r0.svc"]
        assert process.returncode == 0
    finally:
        READY_FILE.unlink(missing_ok=True)
        await kill_async(process)
