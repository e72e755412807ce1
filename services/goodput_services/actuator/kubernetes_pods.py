"""The Kubernetes objects of a job: rank pods, the rendezvous Service, and how to read them.

Every rank is a pod pinned to its node, with the torchrun environment the backend computes
(rank 0's stable DNS name through a headless Service is the rendezvous address); the node's
checkpoint volume is a hostPath, the same directory the node's checkpoint tier serves.
"""

from __future__ import annotations

import hashlib
import re
import signal
from collections.abc import Sequence
from typing import Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from goodput.subjects import check_token
from goodput_services.actuator.kubernetes_options import KubernetesOptions, RankBus

LABEL_JOB = "goodput.dev/job"
LABEL_ATTEMPT = "goodput.dev/attempt"
LABEL_RANK = "goodput.dev/rank"
LABEL_NODE = "goodput.dev/node"
#: the run a pod belongs to, as :func:`run_tag` (a run id need not be a valid label value)
LABEL_RUN = "goodput.dev/run"
#: "standby" on a standby pod (``kubernetes_standbys``); rank pods have none
LABEL_ROLE = "goodput.dev/role"
CONTAINER = "trainer"


class PodApi(Protocol):
    """The CoreV1Api methods the backend calls, with the arguments it passes (a test passes a
    recording fake); ``list_namespaced_pod`` also feeds the pod watch, which adds its own."""

    def list_node(self, *, label_selector: str | None = None) -> client.V1NodeList: ...

    def list_namespaced_pod(
        self, namespace: str, *, label_selector: str | None = None
    ) -> client.V1PodList: ...

    def create_namespaced_pod(self, namespace: str, body: client.V1Pod) -> client.V1Pod: ...

    def delete_namespaced_pod(
        self, name: str, namespace: str, *, grace_period_seconds: int | None = None
    ) -> object: ...

    def create_namespaced_service(
        self, namespace: str, body: client.V1Service
    ) -> client.V1Service: ...

    def delete_namespaced_service(self, name: str, namespace: str) -> object: ...


def name_of(obj: client.V1Pod | client.V1Node | client.V1Service) -> str:
    """An object's name: the API server stores none without one (the model leaves it
    optional), so a nameless object is refused in one clear line."""
    name = obj.metadata.name if obj.metadata else None
    if name is None:
        raise RuntimeError(f"a {type(obj).__name__} without metadata.name")
    return name


def labels_of(pod: client.V1Pod) -> dict[str, str]:
    return (pod.metadata.labels if pod.metadata else None) or {}


def rank_pod(
    *,
    name: str,
    labels: dict[str, str],
    node: str,
    service_name: str,
    argv: Sequence[str],
    workdir: str,
    env: dict[str, str],
    image: str,
    gpus: int,
    options: KubernetesOptions,
    rank_bus: RankBus,
    ready_file: str = "",
) -> client.V1Pod:
    """The pod of one rank (or standby), pinned to ``node``, running ``image`` with ``gpus``
    GPUs; bus secrets come by reference, never inline. With ``ready_file`` the pod is Ready
    once that file exists (a standby's readiness; the image needs ``test``, from coreutils)."""
    secret_names = {e.name for e in rank_bus.secret_env}
    env_vars = [client.V1EnvVar(name=k, value=v) for k, v in env.items() if k not in secret_names]
    resources = None
    if gpus > 0:
        limits = {options.gpu_resource: str(gpus)}
        resources = client.V1ResourceRequirements(limits=limits)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            restart_policy="Never",  # the actuator decides what a failed rank means
            hostname=name,
            subdomain=service_name,
            # node affinity rather than nodeName: the scheduler still checks GPUs and taints
            affinity=client.V1Affinity(
                node_affinity=client.V1NodeAffinity(
                    required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                        node_selector_terms=[
                            client.V1NodeSelectorTerm(
                                match_fields=[
                                    client.V1NodeSelectorRequirement(
                                        key="metadata.name", operator="In", values=[node]
                                    )
                                ]
                            )
                        ]
                    )
                )
            ),
            tolerations=[client.V1Toleration.model_validate(t) for t in options.tolerations],
            service_account_name=options.service_account,
            automount_service_account_token=False,
            termination_grace_period_seconds=options.stop_grace_s,
            containers=[
                client.V1Container(
                    name=CONTAINER,
                    image=image,
                    image_pull_policy=options.image_pull_policy,
                    command=list(argv),
                    working_dir=workdir or None,
                    env=env_vars + rank_bus.secret_env,
                    ports=[client.V1ContainerPort(container_port=options.master_port)],
                    resources=resources,
                    readiness_probe=(
                        client.V1Probe(
                            _exec=client.V1ExecAction(command=["test", "-e", ready_file]),
                            period_seconds=1,
                        )
                        if ready_file
                        else None
                    ),
                    volume_mounts=[
                        client.V1VolumeMount(
                            name="checkpoints", mount_path=options.checkpoint_mount_path
                        ),
                        client.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
                        *rank_bus.mounts,
                    ],
                )
            ],
            volumes=[
                client.V1Volume(
                    name="checkpoints",
                    host_path=client.V1HostPathVolumeSource(
                        path=options.checkpoint_host_path, type="DirectoryOrCreate"
                    ),
                ),
                # data loader workers and NCCL share memory through /dev/shm (64 MiB default)
                client.V1Volume(
                    name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory")
                ),
                *rank_bus.volumes,
            ],
        ),
    )


def rendezvous_service(name: str, job: str, port: int) -> client.V1Service:
    """The headless Service that gives rank 0 a stable DNS name for the rendezvous."""
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name, labels={LABEL_JOB: job}),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            selector={LABEL_JOB: job},
            # rank 0 must resolve before it is "ready": the others dial it while it starts
            publish_not_ready_addresses=True,
            ports=[client.V1ServicePort(name="rendezvous", port=port, protocol="TCP")],
        ),
    )


def cluster_nodes(api: PodApi, selector: str) -> tuple[list[str], set[str]]:
    """(ready, schedulable nodes matching ``selector`` in a stable name order; every Ready
    node of the cluster). Refuses a node name that cannot be a subject token."""
    ready = {name_of(node) for node in api.list_node().items if is_ready(node)}
    names = sorted(
        name_of(node)
        for node in api.list_node(label_selector=selector).items
        if not (node.spec and node.spec.unschedulable) and name_of(node) in ready
    )
    for name in names:
        try:
            check_token(name, "node name")
        except ValueError as exc:
            raise RuntimeError(str(exc)) from exc
    return names, ready


def ensure_service(api: PodApi, namespace: str, body: client.V1Service) -> None:
    """Create the rendezvous Service unless it is there from an earlier start."""
    try:
        api.create_namespaced_service(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise RuntimeError(f"cannot create service {name_of(body)}: {exc}") from exc


def remove_service(api: PodApi, namespace: str, name: str) -> None:
    """Delete the rendezvous Service (gone already is fine): the job no longer runs."""
    try:
        api.delete_namespaced_service(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise RuntimeError(f"cannot delete service {name}: {exc.status} {exc.reason}") from exc


def is_ready(node: client.V1Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def is_pod_ready(pod: client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def terminated_state(pod: client.V1Pod) -> client.V1ContainerStateTerminated | None:
    """The trainer container's final state, once it has one."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    for status in statuses:
        if status.name == CONTAINER and status.state and status.state.terminated:
            return status.state.terminated
    return None


def exit_of(terminated: client.V1ContainerStateTerminated | None) -> tuple[int | None, int | None]:
    """(exit code, signal) of a container; None, None for a pod that vanished with its node.

    Container runtimes report a signal death as exit code 128 + signal (137 = SIGKILL, also for
    the OOM killer), so it is reported as a signal, like the local backend's negative codes.
    """
    if terminated is None:
        return None, None
    if terminated.signal:
        return None, terminated.signal
    code = terminated.exit_code
    if 128 < code < 128 + signal.NSIG:
        return None, code - 128
    return code, None


def run_tag(run_id: str) -> str:
    """A run's short name in its pod names and labels: eight hex digits of its id's digest,
    so that no run's pod can clash with an earlier run's (a run id may be any string)."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


def pod_name(job: str, run_id: str, attempt: int, rank: int) -> str:
    """``<job>-<run tag>-a<attempt>-r<rank>``: also the pod's hostname, so at most 63 chars
    (40 of the job name leave room for 10 digits of attempt and rank)."""
    return f"{dns_label(job, 40)}-{run_tag(run_id)}-a{attempt}-r{rank}"


def dns_label(text: str, limit: int) -> str:
    """``text`` as a DNS label (pod and service names): lowercase, letters, digits and '-'."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "job"
