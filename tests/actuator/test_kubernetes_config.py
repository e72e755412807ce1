"""The Kubernetes backend's options and wiring: what its options refuse, where its API
credentials come from, the protocol and capabilities the actuator service sees, and the
deployed manifests' options against the node daemons and RBAC."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from kubernetes import client

from goodput import schemas
from goodput.bus import BusSettings
from goodput.config import ServiceConfig
from goodput_services.actuator.backend import Backend
from goodput_services.actuator.kubernetes_backend import KubernetesBackend
from goodput_services.actuator.kubernetes_options import KubernetesOptions
from goodput_services.actuator.kubernetes_pods import labels_of, name_of
from goodput_services.actuator.local_backend import LocalBackend
from goodput_services.actuator.ports import BusPorts
from goodput_services.actuator.service import ActuatorService
from goodput_services.replicator.options import ReplicatorOptions
from tests.actuator.kubernetes_fake import (
    CLUSTER_BUS,
    JOB,
    OPTIONS,
    POOL,
    Recorder,
    _backend,
    _container_config,
    _manifest,
    _node,
    _serialize,
    _started_pod,
)


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
