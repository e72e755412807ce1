"""The Kubernetes backend's job lifecycle, against the API FAKE of ``kubernetes_fake``: pods
created, replaced, swapped, scaled, finished, and nothing of a job left once it stops."""

from __future__ import annotations

import signal
import time
from dataclasses import replace

import msgspec
import pytest
from kubernetes import client

from goodput import schemas
from goodput_services.actuator.kubernetes_backend import IMMEDIATE_GRACE_S
from goodput_services.actuator.kubernetes_pods import run_tag
from goodput_services.actuator.kubernetes_ranks import FORCE_GRACE_S
from tests.actuator.kubernetes_fake import (
    JOB,
    NAMESPACE,
    OPTIONS,
    POOL,
    RUN,
    RUN_ID,
    FakeKubernetesApi,
    FakeRejoinRound,
    Recorder,
    _backend,
    _env,
    _node,
    _placement,
    _pod_node,
    _start,
)


async def test_start_creates_pinned_rank_pods_with_torchrun_environment(rig) -> None:
    backend, api, recorder = rig
    detail = await backend.start_job(_start())
    assert "4 rank pods" in detail
    # ready, schedulable pool nodes in name order: two run the job, one waits as a spare
    assert backend.membership.active == ["gpu-a", "gpu-b"]
    assert backend.membership.spares == ["gpu-c"]
    assert _placement(api, 1) == [(0, "gpu-a"), (1, "gpu-a"), (2, "gpu-b"), (3, "gpu-b")]

    (service,) = api.services
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    assert service.spec.selector == {"goodput.dev/job": JOB}

    pod = api.pod(1, 3)
    assert pod.metadata.name == f"job-k8s-{RUN}-a1-r3"
    assert pod.metadata.labels == {
        "goodput.dev/job": JOB,
        "goodput.dev/run": RUN,
        "goodput.dev/attempt": "1",
        "goodput.dev/rank": "3",
        "goodput.dev/node": "gpu-b",
    }
    assert len(pod.metadata.name) <= 63 and run_tag(RUN_ID) == RUN and len(RUN) == 8
    assert (pod.spec.hostname, pod.spec.subdomain) == (
        f"job-k8s-{RUN}-a1-r3",
        service.metadata.name,
    )
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.termination_grace_period_seconds == 60
    container = pod.spec.containers[0]
    assert container.image == "trainer:1" and container.working_dir == "/opt/train"
    assert container.command == ["python", "-m", "goodput.examples.gpt.supervised"]
    assert container.resources.limits == {"nvidia.com/gpu": "1"}
    env = _env(pod)
    assert env["MASTER_ADDR"] == f"job-k8s-{RUN}-a1-r0.{service.metadata.name}.{NAMESPACE}.svc"
    assert env["MASTER_PORT"] == "29501"  # master_port + attempt: an attempt's own port
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "4",
    }
    assert env["LOCAL_WORLD_SIZE"] == "2"
    assert env["GOODPUT_NODE"] == "gpu-b" and env["GOODPUT_ATTEMPT"] == "1"
    assert env["GOODPUT_NATS_URL"] == "tls://goodput-nats.goodput.svc:4222"
    assert env["GOODPUT_CKPT_EVERY"] == "20"  # the job's own environment is kept
    checkpoint_dir = env["GOODPUT_CKPT_DIR"]
    assert checkpoint_dir == f"/var/lib/goodput/nodes/gpu-b/checkpoints/{JOB}"
    volume = next(v for v in pod.spec.volumes if v.name == "checkpoints")
    assert volume.host_path.path == OPTIONS.checkpoint_host_path
    mount = next(m for m in container.volume_mounts if m.name == "checkpoints")
    assert checkpoint_dir.startswith(mount.mount_path + "/")

    started = recorder.of(schemas.RankStarted)
    assert sorted((e.node, e.rank, e.local_rank) for e in started) == [
        ("gpu-a", 0, 0),
        ("gpu-a", 1, 1),
        ("gpu-b", 2, 0),
        ("gpu-b", 3, 1),
    ]
    status = recorder.of(schemas.JobStatus)[-1]
    assert (status.state, status.attempt, status.world_size) == ("running", 1, 4)
    assert status.spare_nodes == ["gpu-c"]
    with pytest.raises(RuntimeError, match="already running"):
        await backend.start_job(_start())  # a second run while one is going: refused
    assert len(api.created) == 4


async def test_a_crashed_rank_is_reported_and_restart_replaces_every_pod(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start())
    api.exit(f"job-k8s-{RUN}-a1-r1", 128 + signal.SIGSEGV)
    crashed = await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited))
    assert (crashed.rank, crashed.node, crashed.attempt) == (1, "gpu-a", 1)
    assert crashed.signal == signal.SIGSEGV and crashed.exit_code is None
    assert crashed.expected_reason == ""

    await backend.restart("rank 1 crashed")
    # a failed worker group is not waited for: deleted at once, all of it
    assert sorted(api.deleted) == [(f"job-k8s-{RUN}-a1-r{r}", IMMEDIATE_GRACE_S) for r in range(4)]
    assert _placement(api, 2) == _placement(api, 1)
    assert _env(api.pod(2, 0))["MASTER_ADDR"].startswith(f"job-k8s-{RUN}-a2-r0.")
    assert _env(api.pod(2, 0))["TORCHELASTIC_RESTART_COUNT"] == "1"
    others = [e for e in recorder.of(schemas.RankExited) if e.attempt == 1 and e.rank != 1]
    assert sorted(e.rank for e in others) == [0, 2, 3]
    assert {e.expected_reason for e in others} == {"restart"}
    assert {e.signal for e in others} == {signal.SIGKILL}
    status = recorder.of(schemas.JobStatus)[-1]
    assert (status.state, status.attempt) == ("running", 2)


async def test_hot_swap_puts_the_spare_in_the_failed_nodes_rank_positions(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start())
    await backend.hot_swap("gpu-a", "", "XID 79")
    assert _placement(api, 2) == [(0, "gpu-c"), (1, "gpu-c"), (2, "gpu-b"), (3, "gpu-b")]
    # the failed node's pods are force-deleted; the healthy node's are killed, not waited for
    assert sorted(api.deleted) == [
        (f"job-k8s-{RUN}-a1-r0", FORCE_GRACE_S),
        (f"job-k8s-{RUN}-a1-r1", FORCE_GRACE_S),
        (f"job-k8s-{RUN}-a1-r2", IMMEDIATE_GRACE_S),
        (f"job-k8s-{RUN}-a1-r3", IMMEDIATE_GRACE_S),
    ]
    status = recorder.of(schemas.JobStatus)[-1]
    assert status.active_nodes == ["gpu-c", "gpu-b"] and status.failed_nodes == ["gpu-a"]
    assert status.world_size == 4 and status.spare_nodes == []
    swapped = [e for e in recorder.of(schemas.RankExited) if e.attempt == 1]
    assert {e.expected_reason for e in swapped} == {"hot_swap"}


async def test_scale_down_then_up_deletes_gracefully_only_when_growing(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start(spares=0))
    await backend.scale_to([], ["gpu-b"], "gpu-b lost")
    assert _placement(api, 2) == [(0, "gpu-a"), (1, "gpu-a")]
    assert sorted(api.deleted) == [
        (f"job-k8s-{RUN}-a1-r0", IMMEDIATE_GRACE_S),
        (f"job-k8s-{RUN}-a1-r1", IMMEDIATE_GRACE_S),
        (f"job-k8s-{RUN}-a1-r2", FORCE_GRACE_S),
        (f"job-k8s-{RUN}-a1-r3", FORCE_GRACE_S),
    ]
    assert _env(api.pod(2, 1))["WORLD_SIZE"] == "2"
    assert recorder.of(schemas.JobStatus)[-1].failed_nodes == ["gpu-b"]

    await backend.return_node("gpu-b")
    assert recorder.of(schemas.JobStatus)[-1].spare_nodes == ["gpu-b"]
    api.deleted.clear()
    await backend.scale_to(["gpu-a", "gpu-b"], [], "gpu-b repaired")
    # the running ranks are healthy: they get the grace period to save before they go
    assert sorted(api.deleted) == [(f"job-k8s-{RUN}-a2-r0", 60), (f"job-k8s-{RUN}-a2-r1", 60)]
    assert _placement(api, 3) == [(0, "gpu-a"), (1, "gpu-a"), (2, "gpu-b"), (3, "gpu-b")]
    saved = [e for e in recorder.of(schemas.RankExited) if e.attempt == 2]
    assert {(e.expected_reason, e.exit_code) for e in saved} == {("scale_up", 0)}


async def test_the_job_finishes_when_every_rank_pod_exits_zero(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start(nodes=1, spares=0))
    api.exit(f"job-k8s-{RUN}-a1-r0", 0)
    await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.exit_code == 0)
    assert backend.state == "running"
    api.exit(f"job-k8s-{RUN}-a1-r1", 0)
    finished = await recorder.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished"
    )
    assert finished.attempt == 1
    assert "saved and stopped" in await backend.stop("done")


class LateAnsweringApi(FakeKubernetesApi):
    """FAKE API server that answers the attempt's last pod creation only once the backend has
    reported every pod's exit: a short job whose pods ran and exited 0 on a fast kubelet while
    the API server was slow to answer the create call."""

    def __init__(self, nodes: list[client.V1Node], recorder: Recorder, pods: int):
        super().__init__(nodes)
        self.recorder, self.pods_per_attempt = recorder, pods

    def create_namespaced_pod(self, namespace: str, body: client.V1Pod) -> client.V1Pod:
        created = super().create_namespaced_pod(namespace, body)
        if len(self.created) == self.pods_per_attempt:
            for pod in self.created:
                self.exit(pod.metadata.name, 0)
            for _ in range(1000):  # a bound on waiting, not a speed requirement
                if len(self.recorder.of(schemas.RankExited)) == self.pods_per_attempt:
                    break
                time.sleep(0.01)
        return created


async def test_pods_that_all_exit_zero_before_the_launch_returns_leave_the_job_finished() -> None:
    recorder = Recorder()
    api = LateAnsweringApi([_node("gpu-a", POOL)], recorder, pods=2)
    backend = _backend(api, recorder)
    try:
        await backend.start_job(_start(nodes=1, spares=0))
        statuses = [e.state for e in recorder.of(schemas.JobStatus)]
        # one status, and no "running" after it (a follower would wait for its end forever)
        assert (statuses, backend.state) == (["finished"], "finished")
        assert [e.exit_code for e in recorder.of(schemas.RankExited)] == [0, 0]
    finally:
        await backend.shutdown()


async def test_a_second_run_on_the_same_actuator_has_only_its_own_ranks(rig) -> None:
    backend, api, recorder = rig
    backend.ports = replace(backend.ports, rejoin=FakeRejoinRound())
    await backend.start_job(_start(nodes=1, spares=0))
    for rank in (0, 1):
        api.exit(f"job-k8s-{RUN}-a1-r{rank}", 0)
    await recorder.wait_for(lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished")

    await backend.start_job(msgspec.structs.replace(_start(nodes=1, spares=0), run_id="run-2"))
    new = run_tag("run-2")
    assert sorted(api.pods) == [f"job-k8s-{new}-a1-r{r}" for r in (0, 1)]  # the old ones gone
    api.exit(f"job-k8s-{new}-a1-r1", 1)
    await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.exit_code == 1)
    detail = await backend.restart_in_process("rank 1 crashed", deadline_s=5.0)
    # the first run's finished ranks are not this run's dead ones
    assert "1 rank(s) restarted in process, 1 started again" in detail
    assert sorted(api.pods) == [f"job-k8s-{new}-a1-r0", f"job-k8s-{new}-a2-r1"]


@pytest.mark.parametrize("ending", ["stop", "shutdown"])
async def test_a_job_leaves_no_object_of_its_own_once_stopped(rig, ending: str) -> None:
    backend, api, recorder = rig
    await backend.start_job(msgspec.structs.replace(_start(), standbys=1))
    assert [s.metadata.name for s in api.services] == ["job-k8s-ranks"]
    standby = [p for p in api.pods.values() if p.metadata.labels.get("goodput.dev/role")]
    assert [_pod_node(p) for p in standby] == ["gpu-c"]
    api.exit(f"job-k8s-{RUN}-a1-r3", 1)  # a failed pod stays an object until deleted
    await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.rank == 3)

    if ending == "stop":
        assert await backend.stop("done") == "ranks saved and stopped"
        assert await backend.stop("again") == "no rank running"  # nothing left to delete
    else:
        await backend.shutdown()  # the actuator's SIGTERM: `goodput down`
    assert api.pods == {} and api.services == []
