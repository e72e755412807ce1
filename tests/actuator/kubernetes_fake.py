"""A recording FAKE of the Kubernetes API, and what the Kubernetes backend's tests build on it.

No Kubernetes cluster can run here, so ``FakeKubernetesApi`` stands in for ``CoreV1Api``: it
implements only the calls the backend makes, records the pods and services it is asked to
create or delete, and feeds pod changes (ours, and the ones a test pushes: a crashed rank, a
finished rank) to ``FakePodWatch``, the stand-in for ``kubernetes.watch.Watch``. The objects
are the real client's models. The backend has NOT been run against a real cluster here. The
fixture ``rig`` (a backend on this fake) is in this folder's ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import queue
import signal
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from goodput import schemas
from goodput.bus import BusSettings
from goodput.config import ServiceConfig, load_service_config
from goodput_services.actuator.kubernetes_backend import IMMEDIATE_GRACE_S, KubernetesBackend
from goodput_services.actuator.kubernetes_options import KubernetesOptions
from goodput_services.actuator.kubernetes_pods import run_tag
from goodput_services.actuator.ports import BusPorts

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
    """What a backend emits, in order (the ``emit`` of its ``BusPorts``), and a bounded wait
    for one."""

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


def _serialize(pod: client.V1Pod) -> dict:
    return client.ApiClient().sanitize_for_serialization(pod)
