"""The rank pods a Kubernetes backend knows of, how they are deleted, and what the watch says.

A deletion is only done when the API server has removed the pod object: until then the pod may
still run, hold its GPU and answer on its hostname. A node's kubelet confirms a deletion after
the container stopped; a node that lost its kubelet never does, and its pods stay Terminating
for good. So every wait for a deletion is bounded (grace period + ``margin_s``): a pod still
there after it is reported as *lost* (its rank's exit, with neither code nor signal) and its
node becomes *suspect* — no pod of the job is placed there and no GPU of it is reset — until the
watch sees those pods go (the node came back) or the node is declared failed (its pods are then
force-deleted, grace 0, which needs no kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from goodput_services.actuator.kubernetes_pods import (
    LABEL_ATTEMPT,
    LABEL_NODE,
    LABEL_RANK,
    LABEL_RUN,
    PodApi,
    exit_of,
    labels_of,
    name_of,
    terminated_state,
)

log = logging.getLogger(__name__)

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
    #: the run tag of the run that created it (``kubernetes_pods.run_tag``)
    run: str
    expected_reason: str = ""
    #: an event or listing showed it exists (only then does its absence mean deleted)
    seen: bool = False
    exited: bool = False
    succeeded: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


#: reports a rank pod's exit (exit code, signal; both None: lost with its node); called once
Exited = Callable[[RankPod, int | None, int | None], Awaitable[None]]


class RankPods:
    """Every rank pod of the job that is not known to be deleted yet, by name."""

    def __init__(self, api: PodApi, namespace: str, exited: Exited, margin_s: float) -> None:
        self.api = api
        self.namespace = namespace
        self.exited = exited
        self.margin_s = margin_s
        self.by_name: dict[str, RankPod] = {}
        #: node -> the pods whose deletion it never confirmed (see the module's docstring)
        self.suspect: dict[str, set[str]] = {}

    def add(self, pod: RankPod) -> None:
        self.by_name[pod.name] = pod

    def adopt(self, pods: list[client.V1Pod]) -> list[RankPod]:
        """The entries of listed pods of the job (those not known yet rebuilt from their
        labels and binding: pods of an earlier actuator); each now counts as seen."""
        entries = []
        for pod in pods:
            labels, name = labels_of(pod), name_of(pod)
            entry = self.by_name.get(name) or RankPod(
                name=name,
                node=labels.get(LABEL_NODE) or (pod.spec.node_name if pod.spec else "") or "",
                rank=int(labels.get(LABEL_RANK, "0")),
                local_rank=0,
                attempt=int(labels.get(LABEL_ATTEMPT, "0")),
                run=labels.get(LABEL_RUN, ""),
            )
            entry.seen = True
            self.add(entry)
            entries.append(entry)
        return entries

    async def remove_leftovers(
        self, pods: list[client.V1Pod], run: str, ready: set[str], grace_s: int
    ) -> int:
        """Delete listed pods of the job left by an earlier actuator: force-deleted on a node
        that is not Ready (no kubelet there will confirm a deletion), else given ``grace_s``.
        Returns the highest attempt of run ``run`` among them (0: none)."""
        stranded: list[RankPod] = []
        leftovers: list[RankPod] = []
        attempt = 0
        for entry in self.adopt(pods):
            if entry.run == run:
                attempt = max(attempt, entry.attempt)
            # an unscheduled pod (no node) goes at once, without a kubelet
            (stranded if entry.node and entry.node not in ready else leftovers).append(entry)
        if stranded or leftovers:
            log.info(
                "deleting %d pods left by an earlier run (%d on nodes not Ready)",
                len(stranded) + len(leftovers),
                len(stranded),
            )
        why = "left by an earlier actuator"
        await asyncio.gather(self.force_delete(stranded, why), self.delete(leftovers, grace_s, why))
        return attempt

    def holders(self, selector: str, nodes: list[str]) -> dict[str, str]:
        """The pods matching ``selector`` that still exist on ``nodes`` (Terminating ones
        included), asked of the API server: a GPU is free only once its pod object is gone."""
        listing = self.api.list_namespaced_pod(self.namespace, label_selector=selector)
        found: dict[str, list[str]] = {}
        for pod in listing.items:
            node = labels_of(pod).get(LABEL_NODE, "")
            if node in nodes:
                deleting = pod.metadata.deletion_timestamp if pod.metadata else None
                terminating = " (Terminating)" if deleting else ""
                found.setdefault(node, []).append(name_of(pod) + terminating)
        return {node: "pod " + ", ".join(sorted(names)) for node, names in found.items()}

    def on_node(self, nodes: set[str]) -> list[RankPod]:
        return [pod for pod in self.by_name.values() if pod.node in nodes]

    def suspect_detail(self, nodes: list[str]) -> str:
        """Why pods must not go to those of ``nodes`` that are suspect ("" if none is)."""
        return "; ".join(
            f"{node} never confirmed the deletion of {', '.join(sorted(self.suspect[node]))}"
            for node in nodes
            if node in self.suspect
        )

    async def force_delete(self, pods: list[RankPod], why: str) -> None:
        """Remove pods of a failed node at once; their exits are recorded as SIGKILL now.

        They are forgotten before the call, so that the watch's report of the deletion (which
        knows no exit status) cannot come first.
        """
        for pod in pods:
            pod.expected_reason = pod.expected_reason or why
            self._forget(pod)
        outcomes = await asyncio.gather(
            *(asyncio.to_thread(self.delete_pod, pod.name, FORCE_GRACE_S) for pod in pods),
            return_exceptions=True,
        )
        errors = []
        for pod, outcome in zip(pods, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self.by_name[pod.name] = pod  # still there: a later listing or command sees it
                errors.append(outcome)
                continue
            await self.exited(pod, None, signal.SIGKILL)
            pod.gone.set()
        if pods:
            log.info("force-deleted %d pods of failed nodes (%s)", len(pods) - len(errors), why)
        if errors:
            raise errors[0]

    async def delete(self, pods: list[RankPod], grace_s: int, why: str) -> list[RankPod]:
        """Delete ``pods`` and wait (bounded) until they are gone; returns those that are not:
        reported lost, their nodes suspect."""
        for pod in pods:
            if not pod.exited:
                pod.expected_reason = why
        found = await asyncio.gather(
            *(asyncio.to_thread(self.delete_pod, pod.name, grace_s) for pod in pods)
        )
        for pod, exists in zip(pods, found, strict=True):
            if not exists:
                self._forget(pod)
                pod.gone.set()
        waiting = [pod.gone.wait() for pod in pods if not pod.gone.is_set()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waiting), grace_s + self.margin_s)
        stuck = [pod for pod in pods if not pod.gone.is_set()]
        for pod in stuck:
            self.suspect.setdefault(pod.node, set()).add(pod.name)
            await self.exited(pod, None, None)
        if stuck:
            log.warning(
                "pods still terminating %.0f s after their deletion: %s; their ranks are "
                "reported lost and node(s) %s suspect",
                grace_s + self.margin_s,
                ", ".join(p.name for p in stuck),
                ", ".join(sorted({p.node for p in stuck})),
            )
        return stuck

    def delete_pod(self, name: str, grace_s: int) -> bool:
        """Ask for the pod's deletion; False when it was already gone."""
        try:
            self.api.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace_s)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise RuntimeError(f"cannot delete pod {name}: {api_reason(exc)}") from exc
        return True

    async def on_pod(self, kind: str, pod: client.V1Pod) -> None:
        """A watch event: an exit is reported, a deletion ends the pod's life here."""
        entry = self.by_name.get(name_of(pod))
        if entry is None:
            return
        entry.seen = True
        phase = pod.status.phase if pod.status else None
        terminated = terminated_state(pod)
        if terminated is not None or phase in ("Succeeded", "Failed") or kind == "DELETED":
            await self.exited(entry, *exit_of(terminated))
        if kind == "DELETED":
            self._forget(entry)
            entry.gone.set()

    async def reconcile(self, pods: list[client.V1Pod]) -> None:
        """A full listing: pods seen before that vanished while the watch was down are deleted.

        A pod never seen may be created after the listing was taken: its absence means nothing.
        """
        present = {name_of(pod) for pod in pods}
        for pod in pods:
            await self.on_pod("MODIFIED", pod)
        for entry in [e for n, e in self.by_name.items() if e.seen and n not in present]:
            self._forget(entry)
            await self.exited(entry, None, None)
            entry.gone.set()

    def _forget(self, pod: RankPod) -> None:
        """The pod is gone (or about to be, for good): its node no longer waits on it."""
        self.by_name.pop(pod.name, None)
        names = self.suspect.get(pod.node)
        if names is not None:
            names.discard(pod.name)
            if not names:
                del self.suspect[pod.node]
                log.info("%s confirmed its pods' deletion: no longer suspect", pod.node)


def api_reason(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}"
    return str(error)
