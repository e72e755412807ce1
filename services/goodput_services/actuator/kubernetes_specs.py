"""The bodies and names of a Kubernetes run's pods: rank and standby pods of the current
run, their names and stable DNS names, and each attempt's rendezvous port.

Mixed into :class:`~goodput_services.actuator.kubernetes_backend.KubernetesBackend`, whose
attributes below it reads: what a pod is made of is decided here, when it is created there.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from goodput.checkpoint.format import node_volume
from goodput.launch.standby_channel import READY_FILE
from goodput_services.actuator.kubernetes_options import KubernetesOptions, RankBus
from goodput_services.actuator.kubernetes_pods import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_NODE,
    LABEL_RANK,
    LABEL_ROLE,
    LABEL_RUN,
    pod_name,
    rank_pod,
    run_tag,
)
from goodput_services.actuator.kubernetes_ranks import RankPod
from goodput_services.actuator.kubernetes_standbys import standby_env
from goodput_services.actuator.rank_environments import RankEnvironments

#: an attempt's rendezvous port is ``master_port`` plus its attempt number modulo this: a
#: survivor restarting in process still holds the previous attempt's store port
RENDEZVOUS_PORTS = 64


class PodSpecs(RankEnvironments):
    """The current run's pods as the API server is asked to create them."""

    options: KubernetesOptions
    rank_bus: RankBus
    #: the job's headless Service, the subdomain of every pod's hostname
    service_name: str
    run_id: str

    def pod_name(self, attempt: int, rank: int) -> str:
        return pod_name(self.job, self.run_id, attempt, rank)

    def address(self, name: str) -> str:
        """A rank pod's stable DNS name through the job's headless Service."""
        return f"{name}.{self.service_name}.{self.options.namespace}.svc"

    def rendezvous_port(self, attempt: int) -> int:
        return self.options.master_port + attempt % RENDEZVOUS_PORTS

    def rank_bus_environment(self) -> dict[str, str]:
        return self.rank_bus.env

    def _standby_pod(self, name: str, node: str) -> client.V1Pod:
        """A standby of the current run on ``node`` (``kubernetes_standbys``)."""
        assert self.spec is not None
        env = standby_env(self.spec.env, self.rank_bus_environment(), self.job, node, name)
        labels = {LABEL_ROLE: "standby", LABEL_NODE: node}
        return self._pod(name, node, labels, env, ready_file=str(READY_FILE))

    def _rank_pod(
        self, entry: RankPod, node_index: int, master_addr: str, master_port: int
    ) -> client.V1Pod:
        """The pod of one rank of the current attempt, pinned to its node."""
        env = self.rank_environment(
            node=entry.node,
            node_index=node_index,
            rank=entry.rank,
            local_rank=entry.local_rank,
            master_addr=master_addr,
            master_port=master_port,
            volume=self.volume(entry.node),
            device=self.pod_device(),
        )
        labels = {
            LABEL_ATTEMPT: str(entry.attempt),
            LABEL_RANK: str(entry.rank),
            LABEL_NODE: entry.node,
        }
        return self._pod(entry.name, entry.node, labels, env)

    def pod_device(self) -> int | None:
        """The GPU a rank binds in its pod: the pod holds its own GPUs, so the first it sees,
        whatever its local rank (``RankEnv.device``); None in a pod without one."""
        assert self.spec is not None
        gpus = self.spec.gpus_per_rank
        return 0 if (self.options.gpus_per_rank if gpus is None else gpus) else None

    def _pod(
        self, name: str, node: str, labels: dict[str, str], env: dict[str, str], ready_file=""
    ) -> client.V1Pod:
        assert self.spec is not None
        gpus = self.spec.gpus_per_rank
        return rank_pod(
            name=name,
            labels={LABEL_JOB: self.job, LABEL_RUN: run_tag(self.run_id), **labels},
            node=node,
            service_name=self.service_name,
            argv=self.spec.argv,
            workdir=self.spec.workdir,
            env=env,
            image=self.spec.image or self.options.image,
            gpus=self.options.gpus_per_rank if gpus is None else gpus,
            options=self.options,
            rank_bus=self.rank_bus,
            ready_file=ready_file,
        )

    def volume(self, node: str) -> Path:
        """The node's checkpoint volume as rank pods see it."""
        return node_volume(Path(self.options.checkpoint_mount_path), node, self.job)
