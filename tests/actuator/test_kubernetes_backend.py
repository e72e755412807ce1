"""The Kubernetes backend, driven against a recording FAKE of the Kubernetes API.

No Kubernetes cluster can run here, so ``FakeKubernetesApi`` stands in for ``CoreV1Api``: it
implements only the calls the backend makes, records the pods and services it is asked to
create or delete, and feeds pod changes (ours, and the ones a test pushes: a crashed rank, a
finished rank) to ``FakePodWatch``, the stand-in for ``kubernetes.watch.Watch``. The objects
are the real client's models. The backend has NOT been run against a real cluster here.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from goodput import schemas
from goodput.bus import BusSettings
from goodput.bus.settings import settings_from_env
from goodput.checkpoint.format.job_key import KEY_FILE_ENV
from goodput.config import ServiceConfig, load_service_config
from goodput.supervisor.membership import MembershipError
from goodput_services.actuator import kubernetes_watch
from goodput_services.actuator.backend import Backend
from goodput_services.actuator.kubernetes_backend import IMMEDIATE_GRACE_S, KubernetesBackend
from goodput_services.actuator.kubernetes_options import KubernetesOptions, RankBus
from goodput_services.actuator.kubernetes_pods import labels_of, name_of, run_tag
from goodput_services.actuator.kubernetes_ranks import FORCE_GRACE_S
from goodput_services.actuator.local_backend import LocalBackend
from goodput_services.actuator.ports import BusPorts
from goodput_services.actuator.service import ActuatorService
from goodput_services.replicator.options import ReplicatorOptions

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
JOB = "job-k8s"
NAMESPACE = "training"
POOL = {"goodput.dev/pool": "gpu"}
RUN_ID = "run-1"
#: the run's tag in its pod names
RUN = run_tag(RUN_ID)


def _node(name: str, labels: dict[str, str], *, ready: bool = True, cordoned: bool = False):
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1NodeSpec(unschedulable=cordoned),
        status=client.V1NodeStatus(
            conditions=[client.V1NodeCondition(type="Ready", status=str(ready))]
        ),
    )


def _pod_node(pod: client.V1Pod) -> str:
    """The node a pod is pinned to ("" for none)."""
    if pod.spec is None or pod.spec.affinity is None:
        return (pod.metadata.labels or {}).get("goodput.dev/node", "")
    return _pinned_node(pod)


def _matches(labels: dict[str, str] | None, selector: str) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all((labels or {}).get(k) == v for k, v in wanted.items())


def _terminated(exit_code: int) -> client.V1PodStatus:
    return client.V1PodStatus(
        phase="Succeeded" if exit_code == 0 else "Failed",
        container_statuses=[
            client.V1ContainerStatus(
                name="trainer",
                image="trainer:1",
                image_id="",
                ready=False,
                restart_count=0,
                state=client.V1ContainerState(
                    terminated=client.V1ContainerStateTerminated(exit_code=exit_code)
                ),
            )
        ],
    )


class FakeKubernetesApi:
    """FAKE CoreV1Api: records calls, keeps pods in a dict, queues watch events.

    As strict as an API server with a kubelet on every Ready node and none on the others: a
    name clash is 409; a graceful deletion on a node without a kubelet only marks the pod
    Terminating (``deletion_timestamp``), and it stays so until it is deleted with grace 0.
    """

    def __init__(self, nodes: list[client.V1Node]):
        self.nodes = nodes
        self.pods: dict[str, client.V1Pod] = {}
        self.created: list[client.V1Pod] = []
        self.deleted: list[tuple[str, int]] = []
        self.conflicts: list[str] = []
        self.services: list[client.V1Service] = []
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.refuse_create_after: int | None = None
        self.refuse_delete: set[str] = set()

    def list_node(self, label_selector: str = "", **_: Any) -> client.V1NodeList:
        items = [n for n in self.nodes if _matches(n.metadata.labels, label_selector)]
        return client.V1NodeList(items=items)

    def list_namespaced_pod(
        self, namespace: str, label_selector: str = "", **_: Any
    ) -> client.V1PodList:
        assert namespace == NAMESPACE
        items = [p for p in self.pods.values() if _matches(p.metadata.labels, label_selector)]
        return client.V1PodList(items=items, metadata=client.V1ListMeta(resource_version="7"))

    def create_namespaced_pod(self, namespace: str, body: client.V1Pod) -> client.V1Pod:
        assert namespace == NAMESPACE
        if self.refuse_create_after is not None and len(self.created) >= self.refuse_create_after:
            raise ApiException(status=403, reason="Forbidden")
        if body.metadata.name in self.pods:
            self.conflicts.append(body.metadata.name)
            raise ApiException(status=409, reason="AlreadyExists")
        body.status = client.V1PodStatus(phase="Pending")
        self.pods[body.metadata.name] = body
        self.created.append(body)
        self.events.put({"type": "ADDED", "object": body})
        return body

    def delete_namespaced_pod(
        self, name: str, namespace: str, grace_period_seconds: int | None = None, **_: Any
    ) -> None:
        assert namespace == NAMESPACE
        if name in self.refuse_delete:
            raise ApiException(status=403, reason="Forbidden")
        pod = self.pods.get(name)
        if pod is None:
            raise ApiException(status=404, reason="NotFound")
        self.deleted.append((name, grace_period_seconds))
        kubelet = self.has_kubelet(_pod_node(pod))
        if grace_period_seconds != 0 and not kubelet:
            # nobody stops the container nor confirms: Terminating until a force deletion
            if pod.metadata.deletion_timestamp is None:
                pod.metadata.deletion_timestamp = datetime.now(UTC)
                self.events.put({"type": "MODIFIED", "object": pod})
            return
        del self.pods[name]
        if kubelet and not (pod.status.container_statuses or []):
            # a healthy rank given time saves and exits 0; one killed at once dies of SIGKILL
            graceful = (grace_period_seconds or 0) > IMMEDIATE_GRACE_S
            pod.status = _terminated(0 if graceful else 128 + signal.SIGKILL)
            self.events.put({"type": "MODIFIED", "object": pod})
        self.events.put({"type": "DELETED", "object": pod})

    def has_kubelet(self, node: str) -> bool:
        """A Ready node runs a kubelet; a pod bound to no node needs none to be deleted."""
        found = next((n for n in self.nodes if n.metadata.name == node), None)
        return not node or (found is not None and found.status.conditions[0].status == "True")

    def set_ready(self, name: str) -> None:
        """The pod's readiness probe passed (a standby built its job)."""
        pod = self.pods[name]
        pod.status.conditions = [client.V1PodCondition(type="Ready", status="True")]
        self.events.put({"type": "MODIFIED", "object": pod})

    def kill_node(self, name: str) -> None:
        """The node's kubelet is gone: NotReady, and its pods' containers with it."""
        node = next(n for n in self.nodes if n.metadata.name == name)
        node.status.conditions[0].status = "False"

    def create_namespaced_service(self, namespace: str, body: client.V1Service):
        assert namespace == NAMESPACE
        if any(s.metadata.name == body.metadata.name for s in self.services):
            raise ApiException(status=409, reason="AlreadyExists")
        self.services.append(body)
        return body

    def delete_namespaced_service(self, name: str, namespace: str, **_: Any) -> None:
        """Kept until deleted, as an API server keeps it: nothing removes it with the pods."""
        assert namespace == NAMESPACE
        if name in self.refuse_delete:
            raise ApiException(status=403, reason="Forbidden")
        if not any(s.metadata.name == name for s in self.services):
            raise ApiException(status=404, reason="NotFound")
        self.services = [s for s in self.services if s.metadata.name != name]

    # ---- what a test makes the "cluster" do ----

    def exit(self, name: str, exit_code: int) -> None:
        """The rank's container terminated by itself."""
        self.pods[name].status = _terminated(exit_code)
        self.events.put({"type": "MODIFIED", "object": self.pods[name]})

    def pod(self, attempt: int, rank: int) -> client.V1Pod:
        return next(
            p
            for p in self.created
            if p.metadata.labels["goodput.dev/attempt"] == str(attempt)
            and p.metadata.labels["goodput.dev/rank"] == str(rank)
        )


class FakePodWatch:
    """FAKE kubernetes.watch.Watch: yields the events the fake API queued."""

    def __init__(self, api: FakeKubernetesApi):
        self.api = api
        self._stopped = False

    def stream(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict]:
        while not self._stopped:
            try:
                event = self.api.events.get(timeout=0.02)
            except queue.Empty:
                continue
            if event["type"] == "BROKEN":
                raise ConnectionError("watch connection reset")
            yield event

    def stop(self) -> None:
        self._stopped = True


class Recorder:
    def __init__(self) -> None:
        self.events: list[schemas.Event] = []

    async def __call__(self, event: schemas.Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(self, predicate: Callable[[schemas.Event], bool]) -> schemas.Event:
        for _ in range(1000):  # a bound on waiting, not a speed requirement
            found = [e for e in self.events if predicate(e)]
            if found:
                return found[-1]
            await asyncio.sleep(0.01)
        raise AssertionError("expected event never came")


OPTIONS = KubernetesOptions(
    image="trainer:1",
    namespace=NAMESPACE,
    node_selector="goodput.dev/pool=gpu",
    gpus_per_rank=1,
    stop_grace_s=60,
)


@pytest.fixture
async def rig() -> AsyncIterator[tuple[KubernetesBackend, FakeKubernetesApi, Recorder]]:
    api = FakeKubernetesApi(
        [
            _node("gpu-c", POOL),
            _node("gpu-a", POOL),
            _node("gpu-b", POOL),
            _node("gpu-d", POOL, ready=False),
            _node("gpu-e", POOL, cordoned=True),
            _node("cpu-a", {"goodput.dev/pool": "cpu"}),
        ]
    )
    recorder = Recorder()
    backend = _backend(api, recorder)
    yield backend, api, recorder
    await backend.shutdown()


def _start(nodes: int = 2, spares: int = 1, procs: int = 2) -> schemas.StartJob:
    return schemas.StartJob(
        job=JOB,
        argv=["python", "-m", "goodput.examples.gpt.supervised"],
        nodes=nodes,
        procs_per_node=procs,
        spares=spares,
        env={"GOODPUT_CKPT_EVERY": "20"},
        workdir="/opt/train",
        run_id=RUN_ID,
    )


def _env(pod: client.V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env}


def _pinned_node(pod: client.V1Pod) -> str:
    affinity = pod.spec.affinity.node_affinity
    terms = affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    (field,) = terms[0].match_fields
    assert (field.key, field.operator) == ("metadata.name", "In")
    return field.values[0]


def _placement(api: FakeKubernetesApi, attempt: int) -> list[tuple[int, str]]:
    pods = [p for p in api.created if p.metadata.labels["goodput.dev/attempt"] == str(attempt)]
    return sorted((int(p.metadata.labels["goodput.dev/rank"]), _pinned_node(p)) for p in pods)


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


async def test_a_refused_force_deletion_fails_the_command_and_is_tried_again_later(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start())
    api.refuse_delete = {f"job-k8s-{RUN}-a1-r0"}
    with pytest.raises(RuntimeError, match=f"cannot delete pod job-k8s-{RUN}-a1-r0: 403 Forbidden"):
        await backend.hot_swap("gpu-a", "", "XID 79")
    # the deletions that were allowed happened, and only their exits are reported
    assert sorted(name for name, _ in api.deleted) == [f"job-k8s-{RUN}-a1-r{r}" for r in (1, 2, 3)]
    lost = [e for e in recorder.of(schemas.RankExited) if e.node == "gpu-a"]
    assert [(e.rank, e.signal) for e in lost] == [(1, signal.SIGKILL)]

    api.refuse_delete.clear()
    await backend.restart("retry")
    assert (f"job-k8s-{RUN}-a1-r0", FORCE_GRACE_S) in api.deleted
    lost = [e for e in recorder.of(schemas.RankExited) if e.node == "gpu-a"]
    assert sorted((e.rank, e.signal, e.expected_reason) for e in lost) == [
        (0, signal.SIGKILL, "hot_swap"),
        (1, signal.SIGKILL, "hot_swap"),
    ]
    assert _placement(api, 2) == [(0, "gpu-c"), (1, "gpu-c"), (2, "gpu-b"), (3, "gpu-b")]


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


async def test_commands_naming_unknown_nodes_are_rejected_without_touching_pods(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start(spares=0))
    for command in (
        backend.hot_swap("gpu-z", "", "?"),
        backend.hot_swap("gpu-a", "", "no spare"),
        backend.hot_swap("gpu-a", "cpu-a", "not a spare"),
        backend.scale_to(["ghost"], [], "?"),
        backend.return_node("ghost"),
    ):
        with pytest.raises(MembershipError):
            await command
    assert api.deleted == [] and len(api.created) == 4
    assert backend.state == "running" and backend.attempt == 1


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


async def test_a_pod_that_vanished_while_the_watch_was_down_is_reported(rig, monkeypatch) -> None:
    backend, api, recorder = rig
    monkeypatch.setattr(kubernetes_watch, "WATCH_RETRY_S", 0.01)
    await backend.start_job(_start(nodes=1, spares=0))
    await asyncio.sleep(0)
    del api.pods[f"job-k8s-{RUN}-a1-r1"]  # node lost: the pod is gone, no event was delivered
    api.events.put({"type": "BROKEN"})
    lost = await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited))
    assert (lost.rank, lost.exit_code, lost.signal, lost.expected_reason) == (1, None, None, "")


async def test_too_few_matching_nodes_is_an_error_and_creates_nothing(rig) -> None:
    backend, api, _ = rig
    with pytest.raises(RuntimeError, match="needs 4 nodes; 3 ready nodes match"):
        await backend.start_job(_start(nodes=4))
    assert api.created == [] and backend.state == "stopped"


async def test_a_refused_pod_creation_fails_the_attempt_and_cleans_up(rig) -> None:
    backend, api, recorder = rig
    api.refuse_create_after = 2
    with pytest.raises(RuntimeError, match="403"):
        await backend.start_job(_start())
    assert api.pods == {}
    assert sorted(name for name, _ in api.deleted) == [p.metadata.name for p in api.created]
    assert recorder.of(schemas.JobStatus)[-1].state == "failed"


async def test_pods_left_by_an_earlier_actuator_are_deleted_before_starting(rig) -> None:
    backend, api, recorder = rig
    stale = client.V1Pod(  # named as before pod names carried the run
        metadata=client.V1ObjectMeta(
            name="job-k8s-a1-r0",
            labels={
                "goodput.dev/job": JOB,
                "goodput.dev/attempt": "1",
                "goodput.dev/rank": "0",
                "goodput.dev/node": "gpu-a",
            },
        ),
        status=client.V1PodStatus(phase="Running"),
    )
    api.pods[stale.metadata.name] = stale
    await backend.start_job(_start())
    assert api.deleted[0] == ("job-k8s-a1-r0", IMMEDIATE_GRACE_S)
    assert len(api.created) == 4
    # its exit is the earlier run's, not this one's
    await recorder.wait_for(lambda e: isinstance(e, schemas.JobStatus))
    assert not recorder.of(schemas.RankExited)


def _kill_actuator(backend: KubernetesBackend) -> None:
    """The actuator process dies: its watch ends, its pods stay (nothing deletes them)."""
    backend._watcher.stop()
    assert backend._consumer is not None
    backend._consumer.cancel()


async def test_a_restarted_actuator_starts_the_job_beside_a_dead_nodes_pods(rig) -> None:
    """Issue 28: a node dies, the actuator dies, a new actuator starts the same job."""
    first, api, _ = rig
    await first.start_job(_start(nodes=2, spares=1))  # gpu-a, gpu-b; gpu-c spare
    api.kill_node("gpu-b")
    _kill_actuator(first)
    first.ranks = []  # what the dead actuator held is gone with it; its pods are not

    recorder = Recorder()
    second = _backend(api, recorder)
    try:
        started = time.monotonic()
        rerun = msgspec.structs.replace(_start(nodes=2, spares=0), run_id="run-2")
        await second.start_job(rerun)
        assert time.monotonic() - started < 5  # no 31 s wait for gpu-b's pods
        assert api.conflicts == []  # no 409
        # gpu-b is not Ready: its pods were force-deleted, the others' given their grace
        graces = dict(api.deleted)
        assert {graces[f"job-k8s-{RUN}-a1-r{r}"] for r in (2, 3)} == {FORCE_GRACE_S}
        assert {graces[f"job-k8s-{RUN}-a1-r{r}"] for r in (0, 1)} == {IMMEDIATE_GRACE_S}
        assert second.membership.active == ["gpu-a", "gpu-c"]
        new = run_tag("run-2")
        assert sorted(api.pods) == [f"job-k8s-{new}-a1-r{r}" for r in range(4)]
        # the new run's history: its own run and attempts; nothing of the earlier run's pods
        (begun,) = recorder.of(schemas.RunStarted)
        assert begun.run_id == "run-2"
        assert not recorder.of(schemas.RankExited)
        status = recorder.of(schemas.JobStatus)[-1]
        assert (status.run_id, status.attempt, status.state) == ("run-2", 1, "running")
    finally:
        await second.shutdown()


async def test_a_reset_is_not_asked_while_a_rank_pod_of_the_node_is_terminating(rig) -> None:
    backend, api, recorder = rig
    backend.pods.margin_s = 0.2
    asked: list[str] = []

    async def resetter(node: str, gpus: list[int], run_id: str, attempt: int):
        asked.append(node)
        return True, "reset"

    backend.ports = replace(backend.ports, reset_gpus=resetter)
    await backend.start_job(_start(nodes=2, spares=0))
    api.kill_node("gpu-b")  # nobody has declared it failed: its pods stay Terminating
    with pytest.raises(RuntimeError, match="GPU reset not asked") as refused:
        await backend.restart("XID 79", reset_gpus={"gpu-b": []})
    assert asked == []
    for rank in (2, 3):
        assert f"job-k8s-{RUN}-a1-r{rank} (Terminating)" in str(refused.value)
    status = recorder.of(schemas.JobStatus)[-1]
    assert "gpu-b still has pod" in status.detail and "Terminating" in status.detail
    lost = [e for e in recorder.of(schemas.RankExited) if e.node == "gpu-b"]
    assert sorted((e.rank, e.exit_code, e.signal) for e in lost) == [
        (2, None, None),
        (3, None, None),
    ]
    # and no pod is placed on the suspect node until it is replaced
    with pytest.raises(RuntimeError, match="no pod placed: gpu-b never confirmed"):
        await backend.restart("again")
    assert not [p for p in api.created if p.metadata.labels["goodput.dev/attempt"] == "2"]


class FakeRejoinRound:
    """FAKE of the actuator service's bus round (``ActuatorService._rejoin_round``): records the
    Rejoin and answers for the ranks a test says are able to rejoin, as their shims would."""

    def __init__(self, answering: set[int] | None = None) -> None:
        self.commands: list[tuple[schemas.Rejoin, set[int]]] = []
        self.answering = answering

    async def __call__(self, command: schemas.Rejoin, ranks: set[int], deadline_s: float):
        self.commands.append((command, ranks))
        able = ranks if self.answering is None else ranks & self.answering
        if able != ranks:
            await asyncio.sleep(deadline_s)
        return {
            r: schemas.RankRejoined(job=JOB, node="", rank=r, pid=0, attempt=command.attempt)
            for r in able
        }


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


#: the bus as an in-cluster actuator reaches it
CLUSTER_BUS = BusSettings(url="tls://goodput-nats.goodput.svc:4222")


def _backend(
    api: FakeKubernetesApi,
    recorder: Recorder,
    settings: BusSettings = CLUSTER_BUS,
    options: KubernetesOptions = OPTIONS,
    ports: BusPorts | None = None,
) -> KubernetesBackend:
    """A backend on the API fake, its pod watch fed by the same fake."""
    return KubernetesBackend(
        job=JOB,
        bus_settings=settings,
        ports=ports or BusPorts(emit=recorder),
        options=options,
        api=api,
        watch_factory=lambda: FakePodWatch(api),
    )


async def _started_pod(
    settings: BusSettings, options: KubernetesOptions = OPTIONS
) -> tuple[client.V1Pod, KubernetesBackend]:
    """Rank 0's pod of a one-node job started by a backend on ``settings``."""
    api = FakeKubernetesApi([_node("gpu-a", POOL)])
    backend = _backend(api, Recorder(), settings, options)
    try:
        await backend.start_job(_start(nodes=1, spares=0, procs=1))
    finally:
        await backend.shutdown()
    return api.pod(1, 0), backend


def _secret_of(pod: client.V1Pod, volume_name: str) -> client.V1SecretVolumeSource:
    return next(v for v in pod.spec.volumes if v.name == volume_name).secret


def _mount_of(pod: client.V1Pod, volume_name: str) -> client.V1VolumeMount:
    return next(m for m in pod.spec.containers[0].volume_mounts if m.name == volume_name)


async def test_rank_pods_get_the_actuators_credentials_from_mounted_secrets() -> None:
    # the actuator's own files may sit anywhere; in rank pods they are where the Secrets are
    settings = BusSettings(
        url="tls://goodput-nats.goodput.svc:4222",
        creds_file="/run/goodput/creds/actuator.creds",
        tls_ca_file="/run/goodput/ca/bundle.pem",
    )
    options = msgspec.structs.replace(OPTIONS, bus_url="tls://nats.example.internal:4222")
    pod, _ = await _started_pod(settings, options)
    env = _env(pod)
    assert env["GOODPUT_NATS_URL"] == "tls://nats.example.internal:4222"  # the override holds
    assert env["GOODPUT_NATS_CREDS"] == "/etc/goodput/nats/actuator.creds"
    assert env["GOODPUT_NATS_TLS_CA"] == "/etc/goodput/tls/ca.crt"
    creds = _secret_of(pod, "nats-creds")
    assert (creds.secret_name, creds.items) == ("goodput-nats-creds", None)
    ca = _secret_of(pod, "nats-tls")
    assert ca.secret_name == "goodput-nats-tls"
    assert [(i.key, i.path) for i in ca.items] == [("ca.crt", "ca.crt")]
    for name, path in (("nats-creds", "/etc/goodput/nats"), ("nats-tls", "/etc/goodput/tls")):
        mount = _mount_of(pod, name)
        assert (mount.mount_path, mount.read_only) == (path, True)
    # what the shim will read from that environment passes its own security check
    settings_from_env(env).check_security()


async def test_rank_pods_of_an_unauthenticated_bus_get_no_secret_volumes(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start(nodes=1, spares=0, procs=1))
    pod = api.pod(1, 0)
    assert {v.name for v in pod.spec.volumes} == {"checkpoints", "dshm"}
    assert not any(k.startswith("GOODPUT_NATS_") and k != "GOODPUT_NATS_URL" for k in _env(pod))


async def test_a_password_reaches_rank_pods_only_through_a_secret_reference() -> None:
    settings = BusSettings(url="nats://nats.goodput.svc:4222", user="trainer", password="s3cret")
    with pytest.raises(SystemExit, match=r"password.*nats_auth_secret"):
        await _started_pod(settings)
    options = msgspec.structs.replace(OPTIONS, nats_auth_secret="goodput-nats-password")
    pod, backend = await _started_pod(settings, options)
    env = pod.spec.containers[0].env
    assert _env(pod)["GOODPUT_NATS_USER"] == "trainer"
    (password,) = [e for e in env if e.name == "GOODPUT_NATS_PASSWORD"]
    reference = password.value_from.secret_key_ref
    assert (password.value, reference.name, reference.key) == (
        None,
        "goodput-nats-password",
        "password",
    )
    assert "s3cret" not in json.dumps(_serialize(pod))
    assert backend.bus_settings.password == "s3cret"  # the actuator itself still has it


def _serialize(pod: client.V1Pod) -> dict:
    return client.ApiClient().sanitize_for_serialization(pod)


def test_the_deployed_actuator_hands_its_own_credential_paths_to_the_rank_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rank pods see the Secrets where the deployed actuator sees them, from the same names
    (the NATS credentials and the job's checkpoint key)."""
    bus = msgspec.convert(tomllib.loads((DEPLOY / "goodput.toml").read_text())["bus"], BusSettings)
    config, spec = _container_config("supervisor.yaml", "goodput-actuator", "actuator")
    deployed_env = {e["name"]: e["value"] for e in spec["containers"][0]["env"] if "value" in e}
    monkeypatch.setenv(KEY_FILE_ENV, deployed_env[KEY_FILE_ENV])
    options = KubernetesOptions.from_mapping(config.options["kubernetes"])
    rank_bus = RankBus.of(bus, options)
    assert rank_bus.env["GOODPUT_NATS_CREDS"] == bus.creds_file
    assert rank_bus.env["GOODPUT_NATS_TLS_CA"] == bus.tls_ca_file
    assert rank_bus.env[KEY_FILE_ENV] == deployed_env[KEY_FILE_ENV]
    # the same Secret at the same path as in the actuator's own pod
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    deployed = {
        m["mountPath"]: secrets[m["name"]]
        for m in spec["containers"][0]["volumeMounts"]
        if m["name"] in secrets
    }
    ranks = {
        m.mount_path: v.secret.secret_name
        for v, m in zip(rank_bus.volumes, rank_bus.mounts, strict=True)
    }
    assert ranks == deployed


def test_options_reject_unknown_keys_and_negative_gpus() -> None:
    assert KubernetesOptions.from_mapping({"namespace": "x"}).image == ""  # named per job
    with pytest.raises(SystemExit, match="gpus_per_rank"):
        KubernetesOptions.from_mapping({"gpus_per_rank": -1})
    with pytest.raises(SystemExit, match="namespce"):
        KubernetesOptions.from_mapping({"image": "t:1", "namespce": "x"})
    with pytest.raises(SystemExit, match="toleration"):
        KubernetesOptions.from_mapping({"image": "t:1", "tolerations": [{"keey": "gpu"}]})


async def test_a_toleration_may_bound_how_long_a_rank_pod_stays_on_a_tainted_node() -> None:
    # `tolerationSeconds` is an integer in a pod spec: options once typed every value a
    # string, so no toleration could carry it (an int was refused, a string by the model)
    unreachable = {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 30,
    }
    options = KubernetesOptions.from_mapping({"image": "t:1", "tolerations": [unreachable]})
    pod, _ = await _started_pod(
        CLUSTER_BUS, msgspec.structs.replace(OPTIONS, tolerations=options.tolerations)
    )
    assert _serialize(pod)["spec"]["tolerations"] == [unreachable]
    with pytest.raises(SystemExit, match=r"(?s)invalid kubernetes toleration .*valid integer"):
        KubernetesOptions.from_mapping(
            {"image": "t:1", "tolerations": [{**unreachable, "tolerationSeconds": "30"}]}
        )


def test_an_object_without_a_name_is_refused_in_one_line() -> None:
    # the client's models leave metadata optional; the API server never returns one unnamed
    with pytest.raises(RuntimeError, match=r"^a V1Node without metadata.name$"):
        name_of(client.V1Node(metadata=client.V1ObjectMeta(labels=POOL)))
    assert name_of(_node("gpu-a", POOL)) == "gpu-a"
    assert labels_of(client.V1Pod()) == {}


def test_credentials_come_from_the_kubeconfig_outside_a_cluster(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: lab\n"
        "clusters: [{name: lab, cluster: {server: 'https://10.1.2.3:6443'}}]\n"
        "users: [{name: me, user: {token: abc}}]\n"
        "contexts: [{name: lab, context: {cluster: lab, user: me}}]\n"
    )
    options = KubernetesOptions(image="t:1", kubeconfig=str(kubeconfig))
    backend = KubernetesBackend.connect(
        job=JOB, bus_settings=BusSettings(), ports=BusPorts(emit=Recorder()), options=options
    )
    assert backend.api.api_client.configuration.host == "https://10.1.2.3:6443"
    missing = KubernetesOptions(image="t:1", kubeconfig=str(tmp_path / "absent"))
    with pytest.raises(SystemExit, match="no Kubernetes credentials"):
        KubernetesBackend.connect(
            job=JOB, bus_settings=BusSettings(), ports=BusPorts(emit=Recorder()), options=missing
        )


def test_the_actuator_refuses_an_unknown_backend_by_name(tmp_path: Path) -> None:
    config = ServiceConfig(job=JOB, state_dir=str(tmp_path), options={"backend": "slurm"})
    with pytest.raises(SystemExit, match=r"invalid actuator option: .*'slurm'.*backend"):
        ActuatorService(config)


def test_both_backends_satisfy_the_protocol_the_service_uses(rig, tmp_path: Path) -> None:
    backend, _, recorder = rig
    local = LocalBackend(
        job=JOB, state_dir=tmp_path, bus_settings=BusSettings(), ports=BusPorts(emit=recorder)
    )
    assert isinstance(local, Backend) and isinstance(backend, Backend)


def test_each_backend_declares_what_it_can_do_once_the_service_wires_it(
    rig, tmp_path: Path
) -> None:
    """What a ``JobStatus`` tells the policy (``BackendCapabilities``): both backends run every
    membership rung; the local one keeps standbys on every node, the Kubernetes one on the
    spares only; an in-process restart and a GPU reset need the service's routes to the
    trainers and the host monitors, which a bare backend lacks."""
    kubernetes, api, recorder = rig
    bare = kubernetes.capabilities()
    assert not bare.in_process_restart and not bare.gpu_reset
    service = ActuatorService(ServiceConfig(job=JOB, state_dir=str(tmp_path)))
    local = service.backend
    kubernetes = _backend(api, recorder, ports=service.ports)
    declared = {b.name: b.status().capabilities for b in (local, kubernetes)}
    everything = {"in_process_restart": True, "gpu_reset": True, "hot_swap": True, "scale": True}
    assert declared == {
        "local": schemas.BackendCapabilities(backend="local", standbys="all", **everything),
        "kubernetes": schemas.BackendCapabilities(
            backend="kubernetes", standbys="spares", **everything
        ),
    }


def _manifest(file: str, kind: str, name: str) -> dict[str, Any]:
    documents = yaml.safe_load_all((DEPLOY / file).read_text())
    return next(d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)


def _container_config(file: str, name: str, service: str) -> tuple[ServiceConfig, dict]:
    """The service's settings from its manifest's args (less the mounted config file)."""
    pod = _manifest(file, "DaemonSet" if "daemons" in file else "Deployment", name)
    container = pod["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    del args[args.index("--config") : args.index("--config") + 2]
    return load_service_config(service, args), pod["spec"]["template"]["spec"]


def test_the_deployed_actuator_options_fit_the_node_daemons_and_rbac() -> None:
    config, _ = _container_config("supervisor.yaml", "goodput-actuator", "actuator")
    assert config.options["backend"] == "kubernetes"
    options = KubernetesOptions.from_mapping(config.options["kubernetes"])
    # rank pods write where the node's checkpoint tier serves from
    replicator, spec = _container_config("node-daemons.yaml", "goodput-replicator", "replicator")
    ReplicatorOptions.from_mapping(replicator.options)  # every option it is given exists
    volume = next(v for v in spec["volumes"] if v["name"] == "checkpoints")
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "checkpoints")
    assert volume["hostPath"]["path"] == options.checkpoint_host_path
    assert mount["mountPath"] == options.checkpoint_mount_path == replicator.state_dir
    # the actuator may make every call the backend makes, and the rank pods' account exists
    trainer = _manifest("rbac.yaml", "ServiceAccount", options.service_account)
    assert trainer["automountServiceAccountToken"] is False
    granted = {
        (resource, verb)
        for kind, name in (("Role", "goodput-actuator"), ("ClusterRole", "goodput-actuator-nodes"))
        for rule in _manifest("rbac.yaml", kind, name)["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {
        ("nodes", "list"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "create"),
        ("pods", "delete"),
        ("services", "create"),
        ("services", "delete"),
    }
    assert needed <= granted


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


async def test_a_refused_service_deletion_fails_the_stop_in_one_line(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start())

    api.refuse_delete.add("job-k8s-ranks")
    with pytest.raises(RuntimeError) as refused:
        await backend.stop("done")
    assert str(refused.value) == "cannot delete service job-k8s-ranks: 403 Forbidden"
    assert api.pods == {}  # the ranks were stopped first
