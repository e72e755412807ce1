"""The Kubernetes backend: a "node" is a Kubernetes node, every rank is a pod pinned to it.

Every remediation is a membership change (``membership.py``) followed by a new attempt: the
old attempt's pods are deleted (with a grace period when they are healthy and should save,
immediately when a rank failed) and the new attempt's pods are created (``kubernetes_pods``).
Pods on a node the supervisor declared failed are force-deleted (grace 0) and their exits
recorded at once: without a kubelet to confirm that their containers stopped, a graceful
delete would leave them Terminating for good. The pod watch (``kubernetes_watch``) turns the
other pod terminations into ``RankExited`` events.

This backend has been tested against fakes of the Kubernetes API only (one of them over HTTP
through the real client); it has not been run against a real cluster from this repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from goodput import schemas
from goodput.bus import BusSettings
from goodput.ckptfmt import node_volume
from goodput.membership import Membership, check_job_shape
from goodput.subjects import check_token
from goodput.telemetry import untraced_task
from goodput_services.actuator.backend import EventSink, MembershipBackend, NodePreparer
from goodput_services.actuator.kubernetes_options import KubernetesOptions, RankBus
from goodput_services.actuator.kubernetes_pods import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_NODE,
    LABEL_RANK,
    PodApi,
    dns_label,
    exit_of,
    is_ready,
    rank_pod,
    rendezvous_service,
    terminated_state,
)
from goodput_services.actuator.kubernetes_watch import PodEvent, PodWatch, PodWatcher

log = logging.getLogger(__name__)

#: a deleted pod that is still there this long after its grace period is left behind
DELETE_MARGIN_S = 30.0
#: "immediate" deletion on a live node: 0 would remove the pod object before its containers
#: stopped, and a new rank pod could then start on a GPU the old process still holds
IMMEDIATE_GRACE_S = 1
#: deletion on a node declared failed: no rank of the job starts there again, and no kubelet
#: may ever confirm that the containers stopped, so the object is removed at once
FORCE_GRACE_S = 0


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
        self.stop_grace_s = options.stop_grace_s + DELETE_MARGIN_S
        self.api = api
        self.prepare_node = prepare_node
        self.spec: schemas.StartJob | None = None
        self.membership: Membership | None = None
        self.attempt = 0
        self.state: str = "stopped"
        #: the current attempt's pods, in rank order
        self.ranks: list[RankPod] = []
        #: every pod this backend created that has not been seen deleted yet, by name
        self.pods: dict[str, RankPod] = {}
        self.service_name = f"{dns_label(job, 50)}-ranks"
        self.rank_bus = RankBus.of(bus_settings, options)
        self._lock = asyncio.Lock()
        self._watcher = PodWatcher(api, options.namespace, f"{LABEL_JOB}={job}", watch_factory)
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
            check_job_shape(spec)
            if spec.standbys:
                raise RuntimeError(
                    "standby ranks need the local backend: a rank pod cannot be handed a rank"
                )
            if not (spec.image or self.options.image):
                raise RuntimeError(
                    "the job names no rank image and the actuator has no default: "
                    "goodput run --backend kubernetes --image IMAGE, or kubernetes.image"
                )
            nodes = await asyncio.to_thread(self._eligible_nodes)
            if len(nodes) < spec.nodes:
                raise RuntimeError(
                    f"the job needs {spec.nodes} nodes; {len(nodes)} ready nodes match "
                    f"{self.options.node_selector!r}: {', '.join(nodes) or 'none'}"
                )
            await self._begin_run(spec)
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
        await asyncio.to_thread(self._watcher.stop)
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
            if not (node.spec and node.spec.unschedulable) and is_ready(node)
        )
        for name in names:
            try:
                check_token(name, "node name")
            except ValueError as exc:
                raise RuntimeError(str(exc)) from exc
        return names

    def _ensure_service(self) -> None:
        body = rendezvous_service(self.service_name, self.job, self.options.master_port)
        try:
            self.api.create_namespaced_service(self.options.namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # already there from an earlier start
                raise RuntimeError(f"cannot create service {self.service_name}: {exc}") from exc

    def pod_name(self, attempt: int, rank: int) -> str:
        return f"{dns_label(self.job, 40)}-a{attempt}-r{rank}"

    def master_addr(self) -> str:
        return f"{self.pod_name(self.attempt, 0)}.{self.service_name}.{self.options.namespace}.svc"

    def rank_bus_environment(self) -> dict[str, str]:
        return self.rank_bus.env

    def _rank_pod(self, node: str, node_index: int, rank: int, local_rank: int) -> client.V1Pod:
        """The pod of one rank of the current attempt, pinned to ``node``."""
        assert self.spec is not None
        env = self.rank_environment(
            node=node,
            node_index=node_index,
            rank=rank,
            local_rank=local_rank,
            master_addr=self.master_addr(),
            master_port=self.options.master_port,
            volume=node_volume(Path(self.options.checkpoint_mount_path), node, self.job),
        )
        return rank_pod(
            name=self.pod_name(self.attempt, rank),
            labels={
                LABEL_JOB: self.job,
                LABEL_ATTEMPT: str(self.attempt),
                LABEL_RANK: str(rank),
                LABEL_NODE: node,
            },
            node=node,
            service_name=self.service_name,
            argv=self.spec.argv,
            workdir=self.spec.workdir,
            env=env,
            image=self.spec.image or self.options.image,
            gpus=(
                self.options.gpus_per_rank
                if self.spec.gpus_per_rank is None
                else self.spec.gpus_per_rank
            ),
            options=self.options,
            rank_bus=self.rank_bus,
        )

    # ---- attempts ----------------------------------------------------------------------------

    async def _launch(self, state: str, detail: str, standbys: bool = False) -> None:
        """Every rank a new pod (this backend keeps no standbys: ``standbys`` changes nothing)."""
        assert self.spec is not None and self.membership is not None
        self.attempt += 1
        membership = self.membership
        await self._prepare_volumes()
        bodies: list[client.V1Pod] = []
        for node_index, node in enumerate(membership.active):
            for local_rank in range(membership.procs_per_node):
                rank = node_index * membership.procs_per_node + local_rank
                body = self._rank_pod(node, node_index, rank, local_rank)
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
        """Delete the current attempt's pods and wait until the API server has removed them.

        Every pod still known on a node declared failed (this attempt's, and any an earlier
        deletion left Terminating there) is force-deleted instead, and not waited for.
        """
        pods, self.ranks = self.ranks, []
        failed = set(self.membership.failed) if self.membership else set()
        lost = [pod for pod in self.pods.values() if pod.node in failed]
        healthy = [pod for pod in pods if pod.node not in failed]
        grace_s = self.options.stop_grace_s if graceful else IMMEDIATE_GRACE_S
        outcomes = await asyncio.gather(
            self._force_delete(lost, why),
            self._delete(healthy, grace_s, why),
            return_exceptions=True,  # one refused deletion must not leave the other running
        )
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome

    async def _force_delete(self, pods: list[RankPod], why: str) -> None:
        """Remove the pods of a failed node at once; their exits are recorded as SIGKILL now.

        They are forgotten before the call, so that the watch's report of the deletion (which
        knows no exit status) cannot come first.
        """
        for pod in pods:
            pod.expected_reason = pod.expected_reason or why
            self.pods.pop(pod.name, None)
        outcomes = await asyncio.gather(
            *(asyncio.to_thread(self._delete_pod, pod.name, FORCE_GRACE_S) for pod in pods),
            return_exceptions=True,
        )
        errors = []
        for pod, outcome in zip(pods, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self.pods[pod.name] = pod  # still there: a later listing or command sees it
                errors.append(outcome)
                continue
            await self._rank_exited(pod, None, signal.SIGKILL)
            pod.gone.set()
        if pods:
            log.info("force-deleted %d pods of failed nodes (%s)", len(pods) - len(errors), why)
        if errors:
            raise errors[0]

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

    # ---- pod changes -------------------------------------------------------------------------

    def _start_watch(self) -> None:
        if self._consumer is not None:
            return
        queue: asyncio.Queue[PodEvent] = asyncio.Queue()
        # pod changes are facts of their own, not part of the trace of the job's start
        self._consumer = untraced_task(self._consume(queue))
        self._watcher.start(asyncio.get_running_loop(), queue)

    async def _consume(self, queue: asyncio.Queue[PodEvent]) -> None:
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
            await self._rank_exited(entry, None, None)
            entry.gone.set()

    async def _on_pod(self, kind: str, pod: client.V1Pod) -> None:
        entry = self.pods.get(pod.metadata.name)
        if entry is None:
            return
        entry.seen = True
        phase = pod.status.phase if pod.status else None
        terminated = terminated_state(pod)
        if terminated is not None or phase in ("Succeeded", "Failed") or kind == "DELETED":
            await self._rank_exited(entry, *exit_of(terminated))
        if kind == "DELETED":
            self.pods.pop(entry.name, None)
            entry.gone.set()

    async def _rank_exited(self, entry: RankPod, exit_code: int | None, sig: int | None) -> None:
        """The one place a rank pod's exit is reported (once), whoever learnt of it."""
        if entry.exited:
            return
        entry.exited = True
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


def _api_reason(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}"
    return str(error)
