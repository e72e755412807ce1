"""The Kubernetes deployment as it runs (issues 23 and 28), asserted on what kubectl renders,
for the base and for the GKE overlay: the host monitor can reset a GPU, the node's checkpoint
hostPath belongs to the replicator, no object store on a node's own disk, requests and limits,
the actuator's rights and rollout, the NATS StatefulSet's headless Service."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from goodput.bus import BusSettings
from goodput_services.hostmon.gpu import GKE_DRIVER_MOUNT_DIR, GKE_NVIDIA_SMI
from goodput_services.hostmon.options import HostMonitorOptions
from goodput_services.replicator.options import ReplicatorOptions, store_uri
from tests.deploy.rendered import (
    BASE,
    OVERLAY,
    config_without_bus,
    container,
    container_named,
    pod_specs,
    render,
    service_config,
)

#: the uid of the service image (deploy/docker/Dockerfile: USER 10001)
SERVICE_UID = 10001
LAYOUTS = {"base": BASE, "gke": OVERLAY}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(LAYOUTS[request.param])


@pytest.fixture(scope="module")
def gke() -> list[dict[str, Any]]:
    return render(OVERLAY)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return config_without_bus(tmp_path)


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


# ---- the GPU reset (issue 23) ----------------------------------------------------------------


def test_the_host_monitor_can_reset_a_gpu_and_see_who_holds_it(layout) -> None:
    """Root (nvidia-smi --gpu-reset needs CAP_SYS_ADMIN, which uid 10001 never has, privileged
    or not), the device nodes (privileged) and the host's pids (hostPID: NVML's pids are the
    host's)."""
    _, objects = layout
    spec = pod_specs(objects)["goodput-hostmon"]
    security = container(objects, "goodput-hostmon")["securityContext"]
    assert security["privileged"] is True
    assert security["runAsUser"] == 0 and security.get("runAsNonRoot") is not True
    assert spec["hostPID"] is True


def test_on_gke_the_host_monitor_runs_the_mounted_drivers_nvidia_smi(gke, config) -> None:
    options = HostMonitorOptions(**service_config(gke, "goodput-hostmon", config).options)
    assert options.nvidia_smi == GKE_NVIDIA_SMI
    mounts = container(gke, "goodput-hostmon")["volumeMounts"]
    assert any(
        m["mountPath"] == GKE_DRIVER_MOUNT_DIR and GKE_NVIDIA_SMI.startswith(m["mountPath"] + "/")
        for m in mounts
    ), "nvidia-smi is not inside the driver's mount"


# ---- the node's checkpoint hostPath (issue 23) -----------------------------------------------


def test_the_checkpoint_hostpath_is_handed_to_the_replicator_before_it_starts(layout) -> None:
    """fsGroup does not apply to hostPath volumes: an init container, as root, chowns it."""
    _, objects = layout
    spec = pod_specs(objects)["goodput-replicator"]
    replicator = container(objects, "goodput-replicator")
    uid = replicator["securityContext"]["runAsUser"]
    assert uid == SERVICE_UID and replicator["securityContext"]["runAsNonRoot"] is True
    (init,) = spec["initContainers"]
    assert init["securityContext"]["runAsUser"] == 0
    volume = next(v for v in spec["volumes"] if v["name"] == "checkpoints")
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    state = _mount_of(replicator, "checkpoints")
    assert _mount_of(init, "checkpoints") == state
    assert init["command"] == ["chown", "-R", f"{uid}:{uid}", state]
    # its state directory is the hostPath's root, or (GKE: the rank agents') a directory in it
    state_dir = replicator["args"][replicator["args"].index("--state-dir") + 1]
    assert Path(state_dir).is_relative_to(state)


def _mount_of(container: dict[str, Any], volume: str) -> str:
    return next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume)


@pytest.fixture
def kubelet_hostpath() -> Iterator[Path]:
    """A directory as the kubelet makes a DirectoryOrCreate hostPath: root's, mode 0755, on a
    path every user can traverse (pytest's own tmp_path is 0700)."""
    if os.geteuid() != 0:
        pytest.skip("playing the kubelet and the replicator's uid needs root")
    top = Path(tempfile.mkdtemp(prefix="goodput-hostpath-"))
    top.chmod(0o755)
    hostpath = top / "goodput-checkpoints"
    hostpath.mkdir(mode=0o755)
    os.chown(hostpath, 0, 0)
    (hostpath / "nodes" / "node-0").mkdir(parents=True)  # a root rank pod wrote here first
    yield hostpath
    shutil.rmtree(top)


def _mkdir_as(uid: int, path: Path) -> subprocess.CompletedProcess:
    """mkdir -p as ``uid`` (a real process with that uid, as the replicator's container)."""
    return subprocess.run(
        ["mkdir", "-p", str(path)], user=uid, group=uid, capture_output=True, text=True
    )


def test_the_init_container_lets_the_replicator_create_its_directories(
    gke, kubelet_hostpath: Path
) -> None:
    """The rendered init command, run on a root-owned 0755 tree, against the replicator's uid:
    refused before it, allowed after it."""
    init = container_named(gke, "goodput-replicator", "checkpoint-owner")
    uid = container(gke, "goodput-replicator")["securityContext"]["runAsUser"]
    target = kubelet_hostpath / "nodes" / "node-0" / "checkpoints" / "train"
    before = _mkdir_as(uid, target)
    assert before.returncode != 0 and "Permission denied" in before.stderr
    mount = _mount_of(init, "checkpoints")
    command = [str(kubelet_hostpath) if arg == mount else arg for arg in init["command"]]
    subprocess.run(command, check=True)
    assert _mkdir_as(uid, target).returncode == 0
    assert target.stat().st_uid == uid


# ---- the object store off the node (issue 28, item 6) -----------------------------------------


def test_the_base_refuses_an_object_store_on_the_nodes_disk(config) -> None:
    objects = render(BASE)
    settings = service_config(objects, "goodput-replicator", config)
    options = ReplicatorOptions.from_mapping(settings.options)
    assert options.require_off_node_store is True and options.object_store == ""
    with pytest.raises(SystemExit, match=r"on this node's disk .* would die with the node"):
        store_uri(options, Path(settings.state_dir))
    inside = ReplicatorOptions.from_mapping(
        {**settings.options, "object_store": f"dir:{settings.state_dir}/copies"}
    )
    with pytest.raises(SystemExit, match="on this node's disk"):
        store_uri(inside, Path(settings.state_dir))
    # a file:// elsewhere is the operator's shared volume (Filestore, gcsfuse): accepted
    shared = ReplicatorOptions.from_mapping({**settings.options, "object_store": "file:///mnt/fs"})
    assert str(store_uri(shared, Path(settings.state_dir))) == "file:///mnt/fs"


def test_gke_names_a_bucket_and_the_local_stack_keeps_its_default(gke, config) -> None:
    settings = service_config(gke, "goodput-replicator", config)
    options = ReplicatorOptions.from_mapping(settings.options)
    assert store_uri(options, Path(settings.state_dir)).scheme == "gs"
    # a stack on one machine (no require_off_node_store) keeps its directory store
    local = ReplicatorOptions.from_mapping({})
    assert str(store_uri(local, Path("/state"))) == "file:///state/object-store"


# ---- requests, limits, rights, rollouts (issue 28, item 6) ------------------------------------


def test_every_goodput_container_requests_cpu_and_memory_and_has_a_memory_limit(layout) -> None:
    _, objects = layout
    for workload, spec in pod_specs(objects).items():
        for one in spec["containers"] + spec.get("initContainers", []):
            resources = one.get("resources", {})
            where = f"{workload}/{one['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where


def test_the_actuator_may_delete_the_headless_services_it_creates(layout) -> None:
    _, objects = layout
    role = _by_kind(objects, "Role")["goodput-actuator"]
    binding = _by_kind(objects, "RoleBinding")["goodput-actuator"]
    assert binding["roleRef"]["name"] == "goodput-actuator"
    assert {s["name"] for s in binding["subjects"]} == {
        pod_specs(objects)["goodput-actuator"]["serviceAccountName"]
    }
    services = [r for r in role["rules"] if "services" in r["resources"] and "" in r["apiGroups"]]
    verbs = {verb for rule in services for verb in rule["verbs"]}
    assert {"create", "delete"} <= verbs


def test_the_actuator_is_replaced_never_doubled(layout) -> None:
    _, objects = layout
    actuator = _by_kind(objects, "Deployment")["goodput-actuator"]
    assert actuator["spec"]["replicas"] == 1
    assert actuator["spec"]["strategy"] == {"type": "Recreate"}


def test_the_nats_statefulset_is_governed_by_a_headless_service(layout) -> None:
    _, objects = layout
    nats = _by_kind(objects, "StatefulSet")["goodput-nats"]
    governing = _by_kind(objects, "Service")[nats["spec"]["serviceName"]]
    assert governing["spec"]["clusterIP"] == "None"
    labels = nats["spec"]["template"]["metadata"]["labels"]
    assert governing["spec"]["selector"].items() <= labels.items()
    # clients keep the ClusterIP Service the certificate names
    assert _by_kind(objects, "Service")["goodput-nats"]["spec"].get("clusterIP") != "None"


def test_the_bus_is_three_servers_in_one_cluster_with_r3_streams(layout) -> None:
    """Three NATS pods, started together, one per node, routed to each other through the
    headless Service; the services ask for three copies of every stream and bucket."""
    _, objects = layout
    nats = _by_kind(objects, "StatefulSet")["goodput-nats"]
    spec = nats["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (rule,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    assert (
        rule["labelSelector"]["matchLabels"].items()
        <= spec["template"]["metadata"]["labels"].items()
    )
    headless = _by_kind(objects, "Service")[spec["serviceName"]]
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["cluster"] == 6222
    assert _by_kind(objects, "PodDisruptionBudget")["goodput-nats"]["spec"]["maxUnavailable"] == 1
    env = {e["name"]: e for e in container(objects, "goodput-nats").get("env", [])}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    conf = (BASE / "nats" / "nats.conf").read_text()
    assert "server_name: $POD_NAME" in conf
    routes = re.findall(r"nats-route://([\w.-]+):6222", conf)
    pods = [f"{nats['metadata']['name']}-{i}.{spec['serviceName']}" for i in range(3)]
    assert routes == pods, "a route to every pod of the StatefulSet, by its stable name"
    bus = tomllib.loads((BASE / "goodput.toml").read_text())["bus"]
    assert msgspec.convert(bus, BusSettings).replicas == 3
