"""The Kubernetes backend: a "node" is a Kubernetes node, every rank is a pod pinned to it.

Ranks get the torchrun environment (rank 0's stable DNS name through a headless Service is
the rendezvous address) and the GOODPUT_* variables of the local backend; the node's
checkpoint volume is a hostPath, the same directory the node's checkpoint tier serves. The
shim reaches the bus as the actuator does: the Secrets holding the actuator's NATS credential
files and TLS CA are mounted read-only into every rank pod and ``GOODPUT_NATS_*`` point at
them; a password or token is never written into a pod spec (``secretKeyRef`` only).
Every remediation is a membership change (``membership.py``) followed by a new attempt:
the old attempt's pods are deleted (with a grace period when they are healthy and should
save, immediately when a rank failed) and the new attempt's pods are created. A watch on the
job's pods, in a thread around the blocking client, turns pod terminations into
``RankExited`` events.

This backend has been tested against a recording fake of the Kubernetes API only; it has not
been run against a real cluster from this repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from goodput import schemas
from goodput.bus import BusSettings
from goodput.bus.settings import ENV_VARS, FILE_FIELDS, SECRET_FIELDS, settings_to_env
from goodput.ckptfmt import node_volume
from goodput.subjects import check_token
from goodput.telemetry import untraced_task
from goodput_services.actuator.backend import EventSink, MembershipBackend, NodePreparer
from goodput_services.actuator.membership import Membership

log = logging.getLogger(__name__)

LABEL_JOB = "goodput.dev/job"
LABEL_ATTEMPT = "goodput.dev/attempt"
LABEL_RANK = "goodput.dev/rank"
LABEL_NODE = "goodput.dev/node"
CONTAINER = "trainer"

#: a deleted pod that is still there this long after its grace period is left behind
DELETE_MARGIN_S = 30.0
#: "immediate" deletion: 0 would remove the pod object before its containers stopped, and a
#: new rank pod could then start on a GPU the old process still holds
IMMEDIATE_GRACE_S = 1
#: the watch is re-established (with a fresh list, so nothing is missed) this often
WATCH_PERIOD_S = 300
WATCH_RETRY_S = 2.0


class KubernetesOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The actuator's ``kubernetes`` option table (``--set 'kubernetes={image="…"}'``)."""

    #: the training image; the StartJob's argv is its command
    image: str = ""
    namespace: str = "goodput"
    #: the nodes the job may use, as a label selector; sorted by name, the first N run the job
    #: and the next S wait as spares
    node_selector: str = "goodput.dev/pool=gpu"
    service_account: str = "goodput-trainer"
    image_pull_policy: str = "IfNotPresent"
    master_port: int = 29500
    #: GPUs each rank pod requests (0: none, e.g. CPU-only test clusters)
    gpus_per_rank: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    tolerations: list[dict[str, str]] = msgspec.field(
        default_factory=lambda: [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    )
    #: the node's checkpoint directory on the host, and where rank pods see it; the node's
    #: checkpoint tier must use the same directory as its state directory
    checkpoint_host_path: str = "/mnt/stateful_partition/goodput-checkpoints"
    checkpoint_mount_path: str = "/var/lib/goodput"
    #: the bus as the rank pods reach it; empty: the actuator's own bus URL
    bus_url: str = ""
    #: the Secret holding the files the actuator authenticates with (creds file, nkey seed,
    #: client certificate and key) under the same file names, mounted read-only here in each
    #: rank pod; used only when the actuator has such a file
    nats_creds_secret: str = "goodput-nats-creds"
    nats_creds_mount_path: str = "/etc/goodput/nats"
    #: the Secret and key holding the CA that verifies the NATS server, mounted here; used only
    #: when the actuator has a CA file (empty secret: the CA comes from ``nats_creds_secret``)
    nats_tls_secret: str = "goodput-nats-tls"
    nats_tls_ca_key: str = "ca.crt"
    nats_tls_mount_path: str = "/etc/goodput/tls"
    #: a Secret with key ``password`` (and/or ``token``) when the actuator authenticates with
    #: a password or token: rank pods read it through ``secretKeyRef``, never in clear text
    nats_auth_secret: str = ""
    #: how long ranks asked to stop (SIGTERM: save and exit) may take
    stop_grace_s: int = 60
    #: credentials: in a pod the service account's (in-cluster), else this kubeconfig
    kubeconfig: str = ""
    context: str = ""

    @classmethod
    def from_mapping(cls, options: dict[str, Any]) -> KubernetesOptions:
        try:
            parsed = msgspec.convert(options, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise SystemExit(f"invalid kubernetes option: {exc}") from exc
        if not parsed.image:
            raise SystemExit("the kubernetes backend needs an image: --set 'kubernetes={image=…}'")
        for toleration in parsed.tolerations:
            try:
                client.V1Toleration(**toleration)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                raise SystemExit(f"invalid kubernetes toleration {toleration}: {exc}") from exc
        return parsed


class PodApi(Protocol):
    """The CoreV1Api methods this backend calls (a test passes a recording fake)."""

    def list_node(self, **kwargs: Any) -> client.V1NodeList: ...

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> client.V1PodList: ...

    def create_namespaced_pod(self, namespace: str, body: client.V1Pod) -> client.V1Pod: ...

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...

    def create_namespaced_service(
        self, namespace: str, body: client.V1Service
    ) -> client.V1Service: ...


class PodWatch(Protocol):
    """What ``kubernetes.watch.Watch`` offers: a stream of ``{"type", "object"}`` events."""

    def stream(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict]: ...

    def stop(self) -> None: ...


@dataclass(eq=False)
class RankPod:
    name: str
    node: str
    rank: int
    local_rank: int
    attempt: int
    expected_reason: str = ""
    #: an event or listing showed it exists (only then does its absence mean deleted)
    seen: bool = False
    exited: bool = False
    succeeded: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


class KubernetesBackend(MembershipBackend):
    """Creates, watches and replaces rank pods; reports every change as an event."""

    def __init__(
        self,
        *,
        job: str,
        bus_settings: BusSettings,
        emit: EventSink,
        options: KubernetesOptions,
        api: PodApi,
        watch_factory: Callable[[], PodWatch],
        prepare_node: NodePreparer | None = None,
    ):
        self.job = job
        self.bus_settings = bus_settings
        self.emit = emit
        self.options = options
        self.api = api
        self.watch_factory = watch_factory
        self.prepare_node = prepare_node
        self.spec: schemas.StartJob | None = None
        self.membership: Membership | None = None
        self.attempt = 0
        self.state: str = "stopped"
        #: the current attempt's pods, in rank order
        self.ranks: list[RankPod] = []
        #: every pod this backend created that has not been seen deleted yet, by name
        self.pods: dict[str, RankPod] = {}
        self.service_name = f"{_dns_label(job, 50)}-ranks"
        self.rank_bus = RankBus.of(bus_settings, options)
        self._lock = asyncio.Lock()
        self._stop_watch = threading.Event()
        self._watcher: PodWatch | None = None
        self._consumer: asyncio.Task[None] | None = None

    @classmethod
    def connect(
        cls, *, job: str, bus_settings: BusSettings, emit: EventSink, options: KubernetesOptions
    ) -> KubernetesBackend:
        """A backend talking to the cluster: in-cluster credentials in a pod, else kubeconfig."""
        RankBus.of(bus_settings, options)  # a refusal before the cluster is asked anything
        api_client = _api_client(options)
        return cls(
            job=job,
            bus_settings=bus_settings,
            emit=emit,
            options=options,
            api=client.CoreV1Api(api_client),
            watch_factory=watch.Watch,
        )

    # ---- commands ----------------------------------------------------------------------------

    async def start_job(self, spec: schemas.StartJob) -> str:
        async with self._lock:
            if self.state in ("running", "starting", "restarting"):
                return f"job already {self.state} (attempt {self.attempt}); not started again"
            nodes = await asyncio.to_thread(self._eligible_nodes)
            if len(nodes) < spec.nodes:
                raise RuntimeError(
                    f"the job needs {spec.nodes} nodes; {len(nodes)} ready nodes match "
                    f"{self.options.node_selector!r}: {', '.join(nodes) or 'none'}"
                )
            self.spec = spec
            self.membership = Membership(
                active=nodes[: spec.nodes],
                spares=nodes[spec.nodes : spec.nodes + spec.spares],
                procs_per_node=spec.procs_per_node,
            )
            self._start_watch()
            await asyncio.to_thread(self._ensure_service)
            await self._remove_leftovers()
            short = spec.spares - len(self.membership.spares)
            await self._launch(
                "starting", "job started" + (f"; {short} spare(s) short" if short else "")
            )
            return (
                f"started {self.membership.world_size} rank pods on "
                f"{', '.join(self.membership.active)}"
            )

    async def shutdown(self) -> None:
        """The actuator is going away: stop the pods it owns (they save and exit), and the watch."""
        await super().shutdown()
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.stop()
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer

    # ---- state -------------------------------------------------------------------------------

    def _pids(self) -> dict[str, list[int]]:
        """Empty: rank processes live in pods, not on this machine."""
        return {}

    # ---- cluster objects ---------------------------------------------------------------------

    def _eligible_nodes(self) -> list[str]:
        """Ready, schedulable nodes matching the selector, in a stable (name) order."""
        listing = self.api.list_node(label_selector=self.options.node_selector)
        names = sorted(
            node.metadata.name
            for node in listing.items
            if not (node.spec and node.spec.unschedulable) and _is_ready(node)
        )
        for name in names:
            try:
                check_token(name, "node name")
            except ValueError as exc:
                raise RuntimeError(str(exc)) from exc
        return names

    def _ensure_service(self) -> None:
        """The headless Service that gives rank 0 a stable DNS name for the rendezvous."""
        body = client.V1Service(
            metadata=client.V1ObjectMeta(name=self.service_name, labels={LABEL_JOB: self.job}),
            spec=client.V1ServiceSpec(
                cluster_ip="None",
                selector={LABEL_JOB: self.job},
                # rank 0 must resolve before it is "ready": the others dial it while it starts
                publish_not_ready_addresses=True,
                ports=[
                    client.V1ServicePort(
                        name="rendezvous", port=self.options.master_port, protocol="TCP"
                    )
                ],
            ),
        )
        try:
            self.api.create_namespaced_service(self.options.namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # already there from an earlier start
                raise RuntimeError(f"cannot create service {self.service_name}: {exc}") from exc

    def pod_name(self, attempt: int, rank: int) -> str:
        return f"{_dns_label(self.job, 40)}-a{attempt}-r{rank}"

    def master_addr(self) -> str:
        return f"{self.pod_name(self.attempt, 0)}.{self.service_name}.{self.options.namespace}.svc"

    def rank_pod(self, node: str, node_index: int, rank: int, local_rank: int) -> client.V1Pod:
        """The pod of one rank of the current attempt, pinned to ``node``."""
        assert self.spec is not None
        options = self.options
        name = self.pod_name(self.attempt, rank)
        env = self._rank_env(node, node_index, rank, local_rank)
        secret_names = {e.name for e in self.rank_bus.secret_env}
        env_vars = [
            client.V1EnvVar(name=k, value=v) for k, v in env.items() if k not in secret_names
        ]
        resources = None
        if options.gpus_per_rank > 0:
            limits = {options.gpu_resource: str(options.gpus_per_rank)}
            resources = client.V1ResourceRequirements(limits=limits)
        return client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={
                    LABEL_JOB: self.job,
                    LABEL_ATTEMPT: str(self.attempt),
                    LABEL_RANK: str(rank),
                    LABEL_NODE: node,
                },
            ),
            spec=client.V1PodSpec(
                restart_policy="Never",  # the actuator decides what a failed rank means
                hostname=name,
                subdomain=self.service_name,
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
                tolerations=[client.V1Toleration(**t) for t in options.tolerations],
                service_account_name=options.service_account,
                automount_service_account_token=False,
                termination_grace_period_seconds=options.stop_grace_s,
                containers=[
                    client.V1Container(
                        name=CONTAINER,
                        image=options.image,
                        image_pull_policy=options.image_pull_policy,
                        command=list(self.spec.argv),
                        working_dir=self.spec.workdir or None,
                        env=env_vars + self.rank_bus.secret_env,
                        ports=[client.V1ContainerPort(container_port=options.master_port)],
                        resources=resources,
                        volume_mounts=[
                            client.V1VolumeMount(
                                name="checkpoints", mount_path=options.checkpoint_mount_path
                            ),
                            client.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
                            *self.rank_bus.mounts,
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
                    *self.rank_bus.volumes,
                ],
            ),
        )

    def rank_bus_environment(self) -> dict[str, str]:
        return self.rank_bus.env

    def _rank_env(self, node: str, node_index: int, rank: int, local_rank: int) -> dict[str, str]:
        return self.rank_environment(
            node=node,
            node_index=node_index,
            rank=rank,
            local_rank=local_rank,
            master_addr=self.master_addr(),
            master_port=self.options.master_port,
            volume=node_volume(Path(self.options.checkpoint_mount_path), node, self.job),
        )

    # ---- attempts ----------------------------------------------------------------------------

    async def _launch(self, state: str, detail: str) -> None:
        assert self.spec is not None and self.membership is not None
        self.attempt += 1
        membership = self.membership
        await self._prepare_volumes()
        bodies: list[client.V1Pod] = []
        for node_index, node in enumerate(membership.active):
            for local_rank in range(membership.procs_per_node):
                rank = node_index * membership.procs_per_node + local_rank
                body = self.rank_pod(node, node_index, rank, local_rank)
                entry = RankPod(
                    name=body.metadata.name,
                    node=node,
                    rank=rank,
                    local_rank=local_rank,
                    attempt=self.attempt,
                )
                # known before it exists, so no watch event about it can be missed
                self.pods[entry.name] = entry
                self.ranks.append(entry)
                bodies.append(body)
        outcomes = await asyncio.gather(
            *(
                asyncio.to_thread(self.api.create_namespaced_pod, self.options.namespace, b)
                for b in bodies
            ),
            return_exceptions=True,
        )
        errors = [(b, o) for b, o in zip(bodies, outcomes, strict=True) if isinstance(o, Exception)]
        if errors:
            for body, _ in errors:
                self.pods.pop(body.metadata.name, None)
                self.ranks = [r for r in self.ranks if r.name != body.metadata.name]
            await self._terminate(graceful=False, why="launch failed")
            self.state = "failed"
            body, error = errors[0]
            message = f"cannot create pod {body.metadata.name}: {_api_reason(error)}"
            await self._report(message)
            raise RuntimeError(message)
        for entry in self.ranks:
            await self.emit(
                schemas.RankStarted(
                    job=self.job,
                    node=entry.node,
                    rank=entry.rank,
                    local_rank=entry.local_rank,
                    world_size=membership.world_size,
                    pid=0,  # a pod's process is not visible from here
                    attempt=self.attempt,
                )
            )
        self.state = state if state != "starting" else "running"
        await self._report(detail)

    async def _terminate(self, *, graceful: bool, why: str) -> None:
        """Delete the current attempt's pods and wait until the API server has removed them."""
        pods, self.ranks = self.ranks, []
        await self._delete(pods, self.options.stop_grace_s if graceful else IMMEDIATE_GRACE_S, why)

    async def _delete(self, pods: list[RankPod], grace_s: int, why: str) -> None:
        for pod in pods:
            if not pod.exited:
                pod.expected_reason = why
        found = await asyncio.gather(
            *(asyncio.to_thread(self._delete_pod, pod.name, grace_s) for pod in pods)
        )
        for pod, exists in zip(pods, found, strict=True):
            if not exists:
                pod.gone.set()
        waiting = [pod.gone.wait() for pod in pods if not pod.gone.is_set()]
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), grace_s + DELETE_MARGIN_S)
        except TimeoutError:
            left = [pod.name for pod in pods if not pod.gone.is_set()]
            log.warning("pods still terminating after %d s: %s", grace_s, ", ".join(left))

    def _delete_pod(self, name: str, grace_s: int) -> bool:
        """Ask for the pod's deletion; False when it was already gone."""
        try:
            self.api.delete_namespaced_pod(
                name, self.options.namespace, grace_period_seconds=grace_s
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise RuntimeError(f"cannot delete pod {name}: {_api_reason(exc)}") from exc
        return True

    async def _remove_leftovers(self) -> None:
        """Pods of this job from an earlier actuator would collide with the new names."""
        listing = await asyncio.to_thread(
            self.api.list_namespaced_pod,
            self.options.namespace,
            label_selector=f"{LABEL_JOB}={self.job}",
        )
        leftovers = []
        for pod in listing.items:
            labels = pod.metadata.labels or {}
            entry = self.pods.get(pod.metadata.name) or RankPod(
                name=pod.metadata.name,
                node=labels.get(LABEL_NODE, ""),
                rank=int(labels.get(LABEL_RANK, "0")),
                local_rank=0,
                attempt=int(labels.get(LABEL_ATTEMPT, "0")),
            )
            entry.seen = True
            self.pods[entry.name] = entry
            leftovers.append(entry)
        if leftovers:
            log.info("deleting %d pods left by an earlier run of job %s", len(leftovers), self.job)
            await self._delete(leftovers, IMMEDIATE_GRACE_S, "left by an earlier actuator")

    # ---- watch -------------------------------------------------------------------------------

    def _start_watch(self) -> None:
        if self._consumer is not None:
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        # pod changes are facts of their own, not part of the trace of the job's start
        self._consumer = untraced_task(self._consume(queue))
        threading.Thread(
            target=self._watch_pods, args=(loop, queue), name="pod-watch", daemon=True
        ).start()

    def _watch_pods(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        """Thread: list, then watch from that version; again after every timeout or error."""
        selector = f"{LABEL_JOB}={self.job}"
        namespace = self.options.namespace
        while not self._stop_watch.is_set():
            try:
                listing = self.api.list_namespaced_pod(namespace, label_selector=selector)
                loop.call_soon_threadsafe(queue.put_nowait, ("LIST", listing.items))
                self._watcher = self.watch_factory()
                for event in self._watcher.stream(
                    self.api.list_namespaced_pod,
                    namespace,
                    label_selector=selector,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=WATCH_PERIOD_S,
                    # a connection that died silently must not hold the watch forever
                    _request_timeout=WATCH_PERIOD_S + 30,
                ):
                    loop.call_soon_threadsafe(queue.put_nowait, (event["type"], event["object"]))
                    if self._stop_watch.is_set():
                        return
            except Exception as exc:  # API server restart, network, expired version
                if loop.is_closed():
                    return  # the actuator has gone
                log.warning("pod watch interrupted (%s); listing again", exc)
                self._stop_watch.wait(WATCH_RETRY_S)

    async def _consume(self, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        while True:
            kind, payload = await queue.get()
            try:
                if kind == "LIST":
                    await self._reconcile(payload)
                elif kind in ("ADDED", "MODIFIED", "DELETED"):
                    await self._on_pod(kind, payload)
            except Exception:
                log.exception("pod event %s not handled", kind)

    async def _reconcile(self, pods: list[client.V1Pod]) -> None:
        """A full listing: pods seen before that vanished while the watch was down are deleted.

        A pod never seen may be created after the listing was taken: its absence means nothing.
        """
        present = {pod.metadata.name for pod in pods}
        for pod in pods:
            await self._on_pod("MODIFIED", pod)
        for name in [n for n, e in self.pods.items() if e.seen and n not in present]:
            entry = self.pods.pop(name)
            await self._rank_exited(entry, None)
            entry.gone.set()

    async def _on_pod(self, kind: str, pod: client.V1Pod) -> None:
        entry = self.pods.get(pod.metadata.name)
        if entry is None:
            return
        entry.seen = True
        phase = pod.status.phase if pod.status else None
        terminated = _terminated_state(pod)
        if terminated is not None or phase in ("Succeeded", "Failed") or kind == "DELETED":
            await self._rank_exited(entry, terminated)
        if kind == "DELETED":
            self.pods.pop(entry.name, None)
            entry.gone.set()

    async def _rank_exited(
        self, entry: RankPod, terminated: client.V1ContainerStateTerminated | None
    ) -> None:
        if entry.exited:
            return
        entry.exited = True
        exit_code, sig = _exit_of(terminated)
        entry.succeeded = exit_code == 0
        await self.emit(
            schemas.RankExited(
                job=self.job,
                node=entry.node,
                rank=entry.rank,
                pid=0,
                exit_code=exit_code,
                signal=sig,
                attempt=entry.attempt,
                expected_reason=entry.expected_reason,
            )
        )
        finished = bool(self.ranks) and all(r.succeeded for r in self.ranks)
        if entry in self.ranks and finished and self.state != "finished":
            self.state = "finished"
            await self._report("every rank pod exited 0")


@dataclass
class RankBus:
    """How rank pods reach the bus: the actuator's settings, with files from mounted Secrets."""

    #: plain ``GOODPUT_NATS_*`` values (URL, user, paths inside the pod)
    env: dict[str, str]
    #: password/token through ``secretKeyRef``
    secret_env: list[client.V1EnvVar]
    volumes: list[client.V1Volume]
    mounts: list[client.V1VolumeMount]

    @classmethod
    def of(cls, settings: BusSettings, options: KubernetesOptions) -> RankBus:
        """Refuses (SystemExit) what rank pods could not be given without a Secret to hold it."""
        paths: dict[str, str] = {}
        volumes: list[client.V1Volume] = []
        mounts: list[client.V1VolumeMount] = []
        from_creds = [f for f in FILE_FIELDS if getattr(settings, f)]
        if settings.tls_ca_file and options.nats_tls_secret:
            from_creds.remove("tls_ca_file")
            key = options.nats_tls_ca_key
            paths["tls_ca_file"] = f"{options.nats_tls_mount_path.rstrip('/')}/{key}"
            volumes.append(_secret_volume("nats-tls", options.nats_tls_secret, [key]))
            mounts.append(_read_only_mount("nats-tls", options.nats_tls_mount_path))
        if from_creds:
            if not options.nats_creds_secret:
                raise SystemExit(
                    "the actuator reaches NATS with "
                    + ", ".join(f"{f.replace('_', ' ')} {getattr(settings, f)}" for f in from_creds)
                    + "; rank pods need them too: name the Secret holding them (same file names) "
                    "with kubernetes.nats_creds_secret"
                )
            for field in from_creds:
                name = Path(getattr(settings, field)).name
                paths[field] = f"{options.nats_creds_mount_path.rstrip('/')}/{name}"
            volumes.append(_secret_volume("nats-creds", options.nats_creds_secret, None))
            mounts.append(_read_only_mount("nats-creds", options.nats_creds_mount_path))
        secrets = [f for f in SECRET_FIELDS if getattr(settings, f)]
        if secrets and not options.nats_auth_secret:
            raise SystemExit(
                f"the actuator reaches NATS with a {' and a '.join(secrets)}, which the kubernetes "
                "backend does not write into pod specs: put it in a Secret (key "
                f"{', '.join(repr(f) for f in secrets)}) and name it with "
                "kubernetes.nats_auth_secret, or authenticate with a creds file"
            )
        secret_env = [
            client.V1EnvVar(
                name=ENV_VARS[field],
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(
                        name=options.nats_auth_secret, key=field
                    )
                ),
            )
            for field in secrets
        ]
        rank_settings = msgspec.structs.replace(
            settings,
            url=options.bus_url or settings.url,
            password="",
            token="",
            **paths,
        )
        return cls(settings_to_env(rank_settings), secret_env, volumes, mounts)


def _secret_volume(name: str, secret: str, keys: list[str] | None) -> client.V1Volume:
    items = [client.V1KeyToPath(key=k, path=k) for k in keys] if keys else None
    return client.V1Volume(
        name=name, secret=client.V1SecretVolumeSource(secret_name=secret, items=items)
    )


def _read_only_mount(name: str, path: str) -> client.V1VolumeMount:
    return client.V1VolumeMount(name=name, mount_path=path, read_only=True)


def _api_client(options: KubernetesOptions) -> client.ApiClient:
    try:
        if not options.kubeconfig and "KUBERNETES_SERVICE_HOST" in os.environ:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(
            config_file=options.kubeconfig or None, context=options.context or None
        )
    except config.ConfigException as exc:
        raise SystemExit(f"no Kubernetes credentials: {exc}") from exc


def _is_ready(node: client.V1Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _terminated_state(pod: client.V1Pod) -> client.V1ContainerStateTerminated | None:
    statuses = (pod.status.container_statuses if pod.status else None) or []
    for status in statuses:
        if status.name == CONTAINER and status.state and status.state.terminated:
            return status.state.terminated
    return None


def _exit_of(terminated: client.V1ContainerStateTerminated | None) -> tuple[int | None, int | None]:
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


def _api_reason(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}"
    return str(error)


def _dns_label(text: str, limit: int) -> str:
    """``text`` as a DNS label (pod and service names): lowercase, letters, digits and '-'."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "job"
