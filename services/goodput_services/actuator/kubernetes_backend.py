"""The Kubernetes backend: a "node" is a Kubernetes node, every rank is a pod pinned to it.

Every remediation is a membership change (``membership.py``) followed by a new attempt: the
old attempt's pods are deleted (with a grace period when they are healthy and should save,
immediately when a rank failed) and the new attempt's pods are created (``kubernetes_pods``).
Pods on a node the supervisor declared failed are force-deleted (grace 0) and their exits
recorded at once: without a kubelet to confirm that their containers stopped, a graceful
delete would leave them Terminating for good; on a node not declared failed such a wait is
bounded, and the node suspect after it (``kubernetes_ranks``). The pod watch
(``kubernetes_watch``) turns the other pod terminations into ``RankExited`` events.

Pod names carry the run (``<job>-<run tag>-a<attempt>-r<rank>``): an actuator restarted while
an earlier run's pods are still Terminating starts its run beside them, without a name clash;
it deletes them first (force-deletes those on a node that is not Ready) and does not report
their exits, which belong to the earlier run.

In-process restart (``MembershipBackend.restart_in_process``): the surviving pods rejoin a
fresh rendezvous at rank 0's stable DNS name through the job's headless Service
(``<rank-0 pod>.<service>.<namespace>.svc``, the survivor's own pod when rank 0 survived) on a
port of its own per attempt; each dead rank's pod is deleted (its GPU is freed with it: a
container's GPU request is fixed at its creation) and a new pod joins the same rendezvous.

Standbys (``kubernetes_standbys``): pods on the spare nodes only, holding their GPUs with
the job built; a launch onto a spare (a hot swap) hands them its ranks over the bus.

This backend has been tested against fakes of the Kubernetes API only (one of them over HTTP
through the real client); it has not been run against a real cluster from this repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kubernetes import client, watch

from goodput import schemas, subjects
from goodput.bus import BusSettings
from goodput.supervisor.membership import Membership, check_job_shape
from goodput.telemetry import untraced_task
from goodput_services.actuator.backend import MembershipBackend
from goodput_services.actuator.kubernetes_options import KubernetesOptions, RankBus
from goodput_services.actuator.kubernetes_pods import (
    LABEL_JOB,
    PodApi,
    cluster_nodes,
    dns_label,
    ensure_service,
    remove_service,
    rendezvous_service,
    run_tag,
)
from goodput_services.actuator.kubernetes_ranks import RankPod, RankPods, api_reason
from goodput_services.actuator.kubernetes_specs import PodSpecs
from goodput_services.actuator.kubernetes_standbys import PodStandbys
from goodput_services.actuator.kubernetes_watch import PodEvent, PodWatch, PodWatcher
from goodput_services.actuator.ports import BusPorts

log = logging.getLogger(__name__)

#: "immediate" deletion on a live node: 0 would remove the pod object before its containers
#: stopped, and a new rank pod could then start on a GPU the old process still holds
IMMEDIATE_GRACE_S = 1


class KubernetesBackend(MembershipBackend[RankPod], PodSpecs):
    """Creates, watches and replaces rank pods; reports every change as an event."""

    name = "kubernetes"
    #: standby pods on the spare nodes only (``kubernetes_standbys``): a hot swap takes them
    standby_nodes = "spares"

    def __init__(
        self,
        *,
        job: str,
        bus_settings: BusSettings,
        ports: BusPorts,
        options: KubernetesOptions,
        api: PodApi,
        watch_factory: Callable[[], PodWatch],
    ):
        super().__init__(job=job, bus_settings=bus_settings, ports=ports)
        self.options = options
        self.stop_grace_s = options.stop_grace_s + options.delete_margin_s
        self.api = api
        #: an attempt's pods are being created: whether it finished is the launch's to say
        self._launching = False
        #: every pod this backend knows that has not been seen deleted yet
        self.pods = RankPods(api, options.namespace, self._rank_exited, options.delete_margin_s)
        self.standbys = PodStandbys(api, options.namespace, self._standby_pod, self._report)
        self.service_name = f"{dns_label(job, 50)}-ranks"
        self.rank_bus = RankBus.of(bus_settings, options)
        self._watcher = PodWatcher(api, options.namespace, f"{LABEL_JOB}={job}", watch_factory)
        self._consumer: asyncio.Task[None] | None = None

    @classmethod
    def connect(
        cls, *, job: str, bus_settings: BusSettings, ports: BusPorts, options: KubernetesOptions
    ) -> KubernetesBackend:
        """A backend talking to the cluster: in-cluster credentials in a pod, else kubeconfig."""
        RankBus.of(bus_settings, options)  # a refusal before the cluster is asked anything
        api_client = options.api_client()
        return cls(
            job=job,
            bus_settings=bus_settings,
            ports=ports,
            options=options,
            api=client.CoreV1Api(api_client),
            watch_factory=watch.Watch,
        )

    # ---- commands ----------------------------------------------------------------------------

    async def start_job(self, spec: schemas.StartJob) -> str:
        async with self._lock:
            check_job_shape(spec)
            if not (spec.image or self.options.image):
                raise RuntimeError(
                    "the job names no rank image and the actuator has no default: "
                    "goodput run --backend kubernetes --image IMAGE, or kubernetes.image"
                )
            nodes, ready = await asyncio.to_thread(
                cluster_nodes, self.api, self.options.node_selector
            )
            if len(nodes) < spec.nodes:
                raise RuntimeError(
                    f"the job needs {spec.nodes} nodes; {len(nodes)} ready nodes match "
                    f"{self.options.node_selector!r}: {', '.join(nodes) or 'none'}"
                )
            await self._begin_run(spec)
            await self.standbys.release(None, 0)  # an earlier run's: the leftovers go below
            self.standbys.configure(
                min(spec.standbys, spec.procs_per_node),
                f"{dns_label(self.job, 40)}-{run_tag(spec.run_id)}",
            )
            self._start_watch()
            service = rendezvous_service(self.service_name, self.job, self.options.master_port)
            await asyncio.to_thread(ensure_service, self.api, self.options.namespace, service)
            await self._remove_leftovers(ready)
            self.ranks = []  # an earlier run's, deleted with the leftovers: not this run's
            # a node that kept an earlier run's pod Terminating may still run it on its GPUs
            nodes = [n for n in nodes if n not in self.pods.suspect]
            if len(nodes) < spec.nodes:
                self.state = "failed"
                why = self.pods.suspect_detail(sorted(self.pods.suspect))
                await self._report(f"not enough nodes: {why}")
                raise RuntimeError(f"the job needs {spec.nodes} nodes; {why}")
            self.membership = Membership(
                active=nodes[: spec.nodes],
                spares=nodes[spec.nodes : spec.nodes + spec.spares],
                procs_per_node=spec.procs_per_node,
            )
            short = spec.spares - len(self.membership.spares)
            await self._launch(
                "starting", "job started" + (f"; {short} spare(s) short" if short else "")
            )
            return (
                f"started {self.membership.world_size} rank pods on "
                f"{', '.join(self.membership.active)}"
            )

    async def stop(self, reason: str) -> str:
        """Every pod of the job deleted (they save and exit), then its Service: nothing of the
        job is left in the namespace."""
        done = await super().stop(reason)
        await self._remove_service()
        return done

    async def shutdown(self) -> None:
        """The actuator is going away: stop the pods it owns (they save and exit), delete the
        job's Service, and stop the watch."""
        await super().shutdown()
        try:
            await self._remove_service()
        except RuntimeError as exc:  # the rest of the shutdown still runs
            log.warning("%s", exc)
        await asyncio.to_thread(self._watcher.stop)
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer

    # ---- state -------------------------------------------------------------------------------

    def _standby_pids(self) -> dict[str, list[int]]:
        return self.standbys.ready_counts()

    def _suspect_nodes(self) -> list[str]:
        return sorted(self.pods.suspect)

    async def _release_standbys(self, nodes: list[str] | None) -> None:
        await self.standbys.release(nodes, IMMEDIATE_GRACE_S + self.options.delete_margin_s)

    async def return_node(self, node: str) -> str:
        done = await super().return_node(node)
        async with self._lock:
            await self._keep_standbys()  # a spare again: it keeps standbys for a hot swap
        return done

    async def _keep_standbys(self) -> None:
        """Standbys on the spare nodes, none elsewhere (an active node's GPUs are its ranks')."""
        if self.membership is None or not self.standbys.per_node:
            return
        spares = self.membership.spares
        await self._release_standbys([n for n in self.standbys.nodes() if n not in spares])
        if await self.standbys.fill(spares):
            log.info("standby pods created on %s", ", ".join(spares))

    def _pids(self) -> dict[str, list[int]]:
        """Empty: rank processes live in pods, not on this machine (a node's host monitor
        sees them through NVML; ``_gpu_holders`` checks their pods before a reset)."""
        return {}

    async def _gpu_holders(self, nodes: list[str]) -> dict[str, str]:
        return await asyncio.to_thread(self.pods.holders, f"{LABEL_JOB}={self.job}", nodes)

    # ---- cluster objects (the pods' bodies and names: ``kubernetes_specs``) -----------------

    async def _remove_service(self) -> None:
        await asyncio.to_thread(remove_service, self.api, self.options.namespace, self.service_name)

    # ---- attempts ----------------------------------------------------------------------------

    async def _launch(
        self, state: schemas.JobStateName, detail: str, standbys: bool = False
    ) -> None:
        """Every rank a new pod, or (``standbys``) a ready standby pod of its node told to be
        it; then the spares' standbys are made up.

        Refused while an active node is suspect: a pod placed there could find its GPU still
        held by a pod whose deletion the node never confirmed."""
        assert self.spec is not None and self.membership is not None
        membership = self.membership
        suspect = self.pods.suspect_detail(membership.active)
        if suspect:
            message = f"no pod placed: {suspect} (replace the node, or wait for it)"
            await self._report(message)
            raise RuntimeError(message)
        self.attempt += 1
        await self._prepare_volumes()
        entries = [
            self._new_rank(node, node_index * membership.procs_per_node + local_rank, local_rank)
            for node_index, node in enumerate(membership.active)
            for local_rank in range(membership.procs_per_node)
        ]
        port = self.rendezvous_port(self.attempt)
        self._launching = True
        try:
            warm = []
            if standbys:
                warm = await self.standbys.hand_ranks(
                    entries,
                    lambda entry, standby, rank0: self._assign(entry, standby, rank0, port),
                    lambda entry: self._new_rank(entry.node, entry.rank, entry.local_rank),
                    IMMEDIATE_GRACE_S + self.options.delete_margin_s,
                )
            # the standbys left on active nodes hold GPUs their ranks' pods need
            await self._release_standbys(membership.active)
            await self._create(entries, self.address(entries[0].name), port, warm)
        except RuntimeError as exc:
            await self._terminate(graceful=False, why="launch failed")
            self.state = "failed"
            await self._report(str(exc))
            raise
        finally:
            self._launching = False
        if await self._launched(state, "every rank pod exited 0"):
            await self._keep_standbys()
            await self._report(detail)

    async def _assign(self, entry: RankPod, standby: str, rank0: str, port: int) -> str:
        """Tell the pod standby ``standby`` to be ``entry``'s rank; "" when it took it."""
        assert self.membership is not None
        if self.ports.assign_standby is None:
            return "the actuator has no bus to reach standbys"
        env = self.rank_env(
            node=entry.node,
            node_index=self.membership.node_index(entry.node),
            rank=entry.rank,
            local_rank=entry.local_rank,
            master_addr=self.address(rank0),
            master_port=port,
            volume=self.volume(entry.node),
            device=self.pod_device(),
        )
        return await self.ports.assign_standby(subjects.standby(self.job, standby), env)

    def _new_rank(self, node: str, rank: int, local_rank: int) -> RankPod:
        return RankPod(
            name=self.pod_name(self.attempt, rank),
            node=node,
            rank=rank,
            local_rank=local_rank,
            attempt=self.attempt,
            run=run_tag(self.run_id),
        )

    async def _create(
        self,
        entries: list[RankPod],
        master_addr: str,
        master_port: int,
        warm: list[RankPod] | None = None,
    ) -> None:
        """Create the pods of ``entries`` (ranks of the current attempt; the ``warm`` ones are
        standby pods already told their rank) and say they started; raises, naming the first
        pod refused, after forgetting the refused ones."""
        assert self.membership is not None
        membership = self.membership
        warm = warm or []
        cold = [entry for entry in entries if entry not in warm]
        bodies = []
        for entry in entries:
            if entry in cold:
                node_index = membership.node_index(entry.node)
                bodies.append(self._rank_pod(entry, node_index, master_addr, master_port))
            # known before it exists, so no watch event about it can be missed
            self.pods.add(entry)
            self.ranks.append(entry)
        self.ranks.sort(key=lambda r: r.rank)
        entries = [*warm, *cold]
        outcomes = await asyncio.gather(
            *(
                asyncio.to_thread(self.api.create_namespaced_pod, self.options.namespace, b)
                for b in bodies
            ),
            return_exceptions=True,
        )
        refused = [
            (entry, outcome)
            for entry, outcome in zip(cold, outcomes, strict=True)
            if isinstance(outcome, Exception)
        ]
        for entry, _ in refused:
            self.pods.by_name.pop(entry.name, None)
            self.ranks.remove(entry)
        if refused:
            entry, error = refused[0]
            raise RuntimeError(f"cannot create pod {entry.name}: {api_reason(error)}")
        for entry in entries:
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

    async def _terminate(self, *, graceful: bool, why: str) -> None:
        """Delete the current attempt's pods and wait (bounded) until the API server has
        removed them.

        Every pod still known on a node declared failed (this attempt's, and any an earlier
        deletion left Terminating there) is force-deleted instead, and not waited for.
        """
        pods, self.ranks = self.ranks, []
        failed = set(self.membership.failed) if self.membership else set()
        lost = self.pods.on_node(failed)
        healthy = [pod for pod in pods if pod.node not in failed]
        grace_s = self.options.stop_grace_s if graceful else IMMEDIATE_GRACE_S
        outcomes = await asyncio.gather(
            self.pods.force_delete(lost, why),
            self.pods.delete(healthy, grace_s, why),
            return_exceptions=True,  # one refused deletion must not leave the other running
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _remove_leftovers(self, ready: set[str]) -> None:
        """Pods of this job from an earlier actuator or run: deleted before the run starts
        (they may hold GPUs; ``RankPods.remove_leftovers``). Only the exits of this run's own
        pods are reported; a StartJob of the same run again continues its attempts."""
        listing = await asyncio.to_thread(
            self.api.list_namespaced_pod,
            self.options.namespace,
            label_selector=f"{LABEL_JOB}={self.job}",
        )
        attempt = await self.pods.remove_leftovers(
            listing.items, run_tag(self.run_id), ready, IMMEDIATE_GRACE_S
        )
        self.attempt = max(self.attempt, attempt)

    # ---- in-process restart (the sequence is MembershipBackend.restart_in_process) ----------

    def _survivors(self) -> tuple[list[RankPod], list[RankPod]]:
        return [r for r in self.ranks if not r.exited], [r for r in self.ranks if r.exited]

    def _rendezvous(self, live: list[RankPod]) -> tuple[str, int]:
        """Rank 0's pod: the survivor's own when rank 0 survived, else the one started for it."""
        rank0 = next((r.name for r in live if r.rank == 0), self.pod_name(self.attempt, 0))
        return self.address(rank0), self.rendezvous_port(self.attempt)

    async def _start_again(
        self, dead: list[RankPod], master_addr: str, master_port: int, standbys: bool
    ) -> None:
        """Each dead rank's pod is deleted (its GPU is freed with it) and a new one joins the
        rendezvous on the same node (no standbys here: ``standbys`` changes nothing)."""
        assert self.membership is not None
        suspect = self.pods.suspect_detail(sorted({r.node for r in dead}))
        if suspect:
            raise RuntimeError(suspect)
        for entry in dead:
            self.ranks.remove(entry)
        stuck = await self.pods.delete(dead, IMMEDIATE_GRACE_S, "in-process restart")
        if stuck:
            raise RuntimeError(self.pods.suspect_detail(sorted({r.node for r in stuck})))
        entries = [self._new_rank(r.node, r.rank, r.local_rank) for r in dead]
        await self._create(entries, master_addr, master_port)

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
                    for pod in payload:
                        await self.standbys.on_pod("MODIFIED", pod)
                    await self.pods.reconcile(payload)
                elif kind in ("ADDED", "MODIFIED", "DELETED") and not (
                    await self.standbys.on_pod(kind, payload)
                ):
                    await self.pods.on_pod(kind, payload)
            except Exception:
                log.exception("pod event %s not handled", kind)

    async def _rank_exited(self, entry: RankPod, exit_code: int | None, sig: int | None) -> None:
        """The one place a rank pod's exit is reported (once), whoever learnt of it; an
        earlier run's pod is not reported: the current run's history starts at its start."""
        if entry.exited:
            return
        entry.exited = True
        entry.succeeded = exit_code == 0
        if entry.run != run_tag(self.run_id):
            log.info(
                "pod %s of an earlier run ended (exit %s, signal %s)", entry.name, exit_code, sig
            )
            return
        # decided before any await, so exactly one exit finds the attempt complete; mid-launch
        # a "running" status would follow this one: the launch says it instead
        finished = entry in self.ranks and not self._launching and self._finished()
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
        if finished:
            self.state = "finished"
            await self._report("every rank pod exited 0")

    def _finished(self) -> bool:
        """Every pod of the current attempt exited 0 (each reports its exit once)."""
        return bool(self.ranks) and all(r.succeeded for r in self.ranks)
