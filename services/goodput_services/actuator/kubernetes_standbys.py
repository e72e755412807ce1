"""Standby pods of the Kubernetes backend: pre-warmed ranks on the SPARE nodes.

A container's GPU request is fixed when its pod is created, and on an active node every GPU
is held by a rank pod until that pod is gone: a standby there could hold no GPU and could
never take the dead rank's. So standbys live only on spare nodes, whose GPUs are free: each
standby pod requests a rank's GPUs, runs the job's argv with ``GOODPUT_STANDBY=1`` (the shim's
``run_job`` builds the job, on its GPU), and serves its assignment on the bus
(``goodput.launch.standby_channel``, bus flavour); its readiness probe turns Ready once the job is
built, and the pod watch tells this pool. A hot swap (or any launch) onto that node with
``standbys`` hands its ready standbys the node's ranks: the pod keeps its name, which becomes
the rank's DNS name. A standby that exits before it was ever ready means the script does not
serve standbys: its node gets no more (said in the log), never a crash loop of pods.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kubernetes import client

from goodput import subjects
from goodput.launch.rank_env import VARIABLES
from goodput.launch.standby_channel import SUBJECT_ENV
from goodput_services.actuator.kubernetes_pods import (
    PodApi,
    is_pod_ready,
    name_of,
    terminated_state,
)
from goodput_services.actuator.kubernetes_ranks import RankPod, api_reason

log = logging.getLogger(__name__)

#: builds the pod of a standby (its name, its node)
StandbyPodSpec = Callable[[str, str], client.V1Pod]
#: tells a standby pod (its name) to be the rank of an entry, with rank 0's pod name; returns
#: "" when it took it, else why not
Assign = Callable[[RankPod, str, str], Awaitable[str]]
#: called when a standby became ready or died (the job status changed)
Changed = Callable[[str], Awaitable[None]]


@dataclass(eq=False)
class StandbyPod:
    name: str
    node: str
    ready: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


class PodStandbys:
    """The standby pods of one run, by name."""

    def __init__(self, api: PodApi, namespace: str, spec: StandbyPodSpec, changed: Changed):
        self.api = api
        self.namespace = namespace
        self.prefix = ""
        self.spec = spec
        self.changed = changed
        self.per_node = 0
        self.pods: dict[str, StandbyPod] = {}
        #: deleted, not yet seen gone
        self.leaving: dict[str, StandbyPod] = {}
        #: node -> why it gets no standby (one exited before it was ever ready)
        self.disabled: dict[str, str] = {}

    def configure(self, per_node: int, prefix: str) -> None:
        """A new run: ``per_node`` standbys on each spare node, named ``<prefix>-s<hex>`` (the
        run's prefix: no name clashes with an earlier run's pods)."""
        self.per_node, self.prefix, self.disabled = per_node, prefix, {}

    def ready_counts(self) -> dict[str, list[int]]:
        """Ready standbys per node, for ``JobStatus.standbys`` (a pod's pid is not visible
        from the actuator: 0 each, as for rank pods)."""
        ready: dict[str, list[int]] = {}
        for pod in self.pods.values():
            if pod.ready:
                ready.setdefault(pod.node, []).append(0)
        return ready

    def nodes(self) -> set[str]:
        return {pod.node for pod in self.pods.values()}

    def take(self, node: str) -> StandbyPod | None:
        """A ready standby of ``node``, now out of the pool (None: the rank starts cold)."""
        for pod in self.pods.values():
            if pod.node == node and pod.ready:
                del self.pods[pod.name]
                return pod
        if self.per_node:
            why = self.disabled.get(node) or "none is ready"
            log.warning("no standby to take on %s (%s): starting the rank cold", node, why)
        return None

    async def hand_ranks(
        self,
        entries: list[RankPod],
        assign: Assign,
        cold: Callable[[RankPod], RankPod],
        wait_s: float,
    ) -> list[RankPod]:
        """Hand each rank of ``entries`` whose node keeps standbys to a ready one (rank 0
        first: its pod's name is everyone's rendezvous address), renaming its entry after the
        pod; a standby that does not take its rank is deleted (it holds the GPU the rank's
        cold pod needs: waited up to ``wait_s``) and the entry is ``cold(entry)`` again.
        Returns the entries now standby pods."""
        taken: dict[int, StandbyPod] = {}
        keeping = self.nodes()  # spares just made active: no other node has any
        for index, entry in enumerate(entries):
            standby = self.take(entry.node) if entry.node in keeping else None
            if standby is not None:
                taken[index] = standby
                entry.name = standby.name

        async def hand(index: int, rank0: str) -> None:
            entry, standby = entries[index], taken[index]
            why = await assign(entry, standby.name, rank0)
            if not why:
                log.info("rank %d on %s: standby pod %s", entry.rank, entry.node, standby.name)
                return
            log.warning(
                "standby %s did not take rank %d (%s): cold pod", standby.name, entry.rank, why
            )
            await self.delete([standby], wait_s)
            entries[index] = cold(entry)

        if 0 in taken:
            await hand(0, entries[0].name)
        await asyncio.gather(*(hand(i, entries[0].name) for i in taken if i != 0))
        return [entries[i] for i in taken if entries[i].name == taken[i].name]

    async def fill(self, nodes: list[str]) -> int:
        """Create the standby pods ``nodes`` lack; returns how many were created."""
        created = 0
        for node in nodes:
            if node in self.disabled:
                continue
            have = sum(1 for pod in self.pods.values() if pod.node == node)
            for _ in range(self.per_node - have):
                name = f"{self.prefix}-s{secrets.token_hex(3)}"
                entry = StandbyPod(name=name, node=node)
                self.pods[name] = entry  # known before it exists: no event of it is missed
                try:
                    await asyncio.to_thread(
                        self.api.create_namespaced_pod, self.namespace, self.spec(name, node)
                    )
                except Exception as exc:
                    del self.pods[name]
                    log.warning("standby pod on %s not created: %s", node, api_reason(exc))
                    break
                created += 1
        return created

    async def release(self, nodes: list[str] | None, wait_s: float) -> None:
        """Delete the standbys of ``nodes`` (None: all) and wait, at most ``wait_s``, until
        they are gone: a standby holds GPUs a rank pod of its node may need next."""
        await self.delete(
            [p for p in self.pods.values() if nodes is None or p.node in nodes], wait_s
        )

    async def delete(self, pods: list[StandbyPod], wait_s: float) -> None:
        """Take ``pods`` out of the pool, delete them and wait up to ``wait_s`` (0: not)."""
        for pod in pods:
            self.pods.pop(pod.name, None)
            self.leaving[pod.name] = pod
        outcomes = await asyncio.gather(
            *(
                asyncio.to_thread(
                    self.api.delete_namespaced_pod, p.name, self.namespace, grace_period_seconds=1
                )
                for p in pods
            ),
            return_exceptions=True,
        )
        for pod, outcome in zip(pods, outcomes, strict=True):
            if isinstance(outcome, Exception):  # gone already (404), or refused: not waited for
                if getattr(outcome, "status", None) != 404:
                    log.warning("standby pod %s not deleted: %s", pod.name, api_reason(outcome))
                self._gone(pod)
        if wait_s <= 0:
            return
        waiting = [pod.gone.wait() for pod in pods if not pod.gone.is_set()]
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), wait_s)
        except TimeoutError:
            left = [p.name for p in pods if not p.gone.is_set()]
            log.warning("standby pods still terminating after %.0f s: %s", wait_s, left)

    async def on_pod(self, kind: str, pod: client.V1Pod) -> bool:
        """A watch event about a standby pod (False: not one of ours)."""
        name = name_of(pod)
        if name in self.leaving:
            if kind == "DELETED":
                self._gone(self.leaving[name])
            return True
        entry = self.pods.get(name)
        if entry is None:
            return False
        if kind == "DELETED" or terminated_state(pod) is not None:
            if not entry.ready:
                why = "a standby pod ended before it was ready: does the job use run_job?"
                self.disabled[entry.node] = why
                log.error("no more standbys on %s: %s", entry.node, why)
            if kind == "DELETED":
                del self.pods[name]
            else:
                await self.delete([entry], 0)
            await self.changed(f"standby {name} of {entry.node} ended")
        elif is_pod_ready(pod) and not entry.ready:
            entry.ready = True
            await self.changed(f"standby {name} of {entry.node} ready")
        return True

    def _gone(self, pod: StandbyPod) -> None:
        self.leaving.pop(pod.name, None)
        pod.gone.set()


def standby_env(
    job_env: dict[str, str], bus_env: dict[str, str], job: str, node: str, name: str
) -> dict[str, str]:
    """A standby pod's environment: the job's and the bus's, no rank yet (that comes with the
    assignment), and the subject its assignment comes on."""
    return {
        **job_env,
        **bus_env,
        VARIABLES["job"]: job,
        VARIABLES["node"]: node,
        VARIABLES["standby"]: "1",
        SUBJECT_ENV: subjects.standby(job, name),
        "PYTHONUNBUFFERED": "1",
    }
