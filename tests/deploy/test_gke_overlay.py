"""The GKE overlay renders, every object is valid for the current Kubernetes minor, and the
objects fit together: registry, node pools, Secrets, NVML access, configuration."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest
import yaml

from goodput.bus.embedded import nats_server_binary
from goodput.config import load_service_config
from goodput_services.actuator.kubernetes_options import CKPT_KEY_ITEM, KubernetesOptions
from goodput_services.hostmon.gpu import GKE_DRIVER_HOST_DIR, GKE_DRIVER_MOUNT_DIR
from goodput_services.hostmon.options import HostMonitorOptions
from goodput_services.sensor.options import SensorOptions
from tests.deploy.rendered import (
    K8S,
    OVERLAY,
    config_without_bus,
    container,
    credentials_secrets,
    pod_specs,
    render,
)

#: the Kubernetes minor the objects are validated for (kubernetes-validate's newest schemas)
KUBERNETES_VERSION = "1.37.0"
README = K8S / "README.md"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[str]]:
    """The credentials step, run once: its folder, its Secrets by name, the nsc calls."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed by the credentials step")
    out = tmp_path_factory.mktemp("creds") / "out"
    made, calls = credentials_secrets(out)
    return out, {s["metadata"]["name"]: s for s in made}, calls


@pytest.fixture(scope="module")
def secrets(credentials) -> dict[str, dict[str, Any]]:
    return credentials[1]


def test_every_rendered_object_is_valid_for_the_current_kubernetes(objects) -> None:
    assert len(objects) == 20
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_registry_is_set_once_and_reaches_every_goodput_container(objects) -> None:
    overlay = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    wanted = {e["name"]: f"{e['newName']}:{e['newTag']}" for e in overlay["images"]}
    # the base and the overlay name the images unqualified: only the overlay says where
    assert set(wanted) == {"goodput-service", "goodput-rank"}
    images = {
        name: {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
        for name, spec in pod_specs(objects).items()
        if name != "goodput-nats"
    }
    # the rank agents run the job from the rank image; every service from the service image
    assert images.pop("goodput-rank-agent") == {wanted["goodput-rank"]}
    assert set().union(*images.values()) == {wanted["goodput-service"]}


def _documented_pools() -> dict[str, str]:
    """The README's node-pool table: pool label value -> what runs there."""
    section = README.read_text().split("## Node pools", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `goodput\.dev/pool=(\w+)` \| ([^|]+)\|", section, re.M))


def test_every_workload_lands_on_a_documented_node_pool(objects) -> None:
    pools = _documented_pools()
    assert set(pools) == {"gpu", "cpu"}
    placed = {
        name: spec["nodeSelector"]["goodput.dev/pool"] for name, spec in pod_specs(objects).items()
    }
    assert placed == {
        "goodput-sensor": "cpu",
        "goodput-controller": "cpu",
        "goodput-actuator": "cpu",
        "goodput-nats": "cpu",
        "goodput-hostmon": "gpu",
        "goodput-replicator": "gpu",
        "goodput-rank-agent": "gpu",
    }
    for name, pool in placed.items():
        assert name.removeprefix("goodput-") in pools[pool], f"README: {name} on {pool}"
    # rank pods go where the node daemons run
    options = _actuator_options(objects)
    assert options.node_selector == "goodput.dev/pool=gpu"


def _actuator_options(objects) -> KubernetesOptions:
    args = container(objects, "goodput-actuator")["args"]
    flags = [a for i, a in enumerate(args) if i and args[i - 1] == "--set"]
    config = load_service_config("actuator", [f"--set={flag}" for flag in flags])
    return KubernetesOptions.from_mapping(config.options["kubernetes"])


def test_every_secret_a_pod_mounts_is_made_by_the_credentials_step(objects, secrets) -> None:
    options = _actuator_options(objects)
    mounted: set[tuple[str, str]] = set()
    for spec in pod_specs(objects).values():
        for volume in spec["volumes"]:
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                keys = [i["key"] for i in volume["secret"].get("items", [])]
                mounted.update((name, key) for key in keys or [""])
    # and what the actuator mounts into every rank pod
    mounted.add((options.nats_creds_secret, ""))
    mounted.add((options.nats_tls_secret, options.nats_tls_ca_key))
    mounted.add((options.ckpt_key_secret, CKPT_KEY_ITEM))
    for name, key in mounted:
        assert name in secrets, f"{name} is mounted but the credentials step does not make it"
        assert not key or key in secrets[name]["data"], f"{name} has no key {key}"
    assert set(secrets) == {name for name, _ in mounted}


def test_the_mounted_files_are_the_ones_the_configuration_names(objects, secrets) -> None:
    """Services find creds and CA where goodput.toml says; the server its certificate and the
    resolver where nats.conf says."""
    toml = tomllib.loads((K8S / "base" / "goodput.toml").read_text())
    for name in ("goodput-sensor", "goodput-hostmon"):
        files = _mounted_files(pod_specs(objects)[name], secrets)
        assert toml["bus"]["creds_file"] in files and toml["bus"]["tls_ca_file"] in files
    server = _mounted_files(pod_specs(objects)["goodput-nats"], secrets)
    nats_conf = secrets["goodput-nats-server"]["data"]["nats.conf"]
    conf = base64.b64decode(nats_conf).decode()
    assert "/etc/nats/nats.conf" in server
    for path in re.findall(r"(?:cert|key)_file: (\S+)", conf):
        assert path in server, f"nats.conf reads {path}, which no volume provides"
    included = re.findall(r"^include (\S+)", conf, re.M)
    assert included == ["resolver.conf"] and "/etc/nats/resolver.conf" in server


def _mounted_files(spec: dict[str, Any], secrets: dict[str, dict[str, Any]]) -> set[str]:
    """The paths inside the container of every file of a mounted Secret."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    files = set()
    for mount in spec["containers"][0]["volumeMounts"]:
        secret = volumes.get(mount["name"], {}).get("secret")  # not: claim templates
        if secret is None:
            continue
        keys = [i["key"] for i in secret.get("items", [])] or list(
            secrets[secret["secretName"]]["data"]
        )
        files.update(f"{mount['mountPath'].rstrip('/')}/{key}" for key in keys)
    return files


def test_the_credentials_step_makes_operator_account_user_and_a_certificate_for_every_name(
    credentials,
) -> None:
    out, _, calls = credentials
    verbs = [" ".join(c.split()[6:8]) for c in calls]  # after the three directory flags
    assert verbs[:2] == ["add operator", "edit operator"]
    assert "add account" in verbs and "add user" in verbs and "generate creds" in verbs
    assert verbs[-1] == "generate config"
    text = (
        __import__("subprocess")
        .run(
            ["openssl", "x509", "-in", str(out / "tls.crt"), "-noout", "-ext", "subjectAltName"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout
    )
    for name in ("goodput-nats.goodput.svc", "localhost", "127.0.0.1", "203.0.113.7",
                 "nats.example.com"):  # fmt: skip
        assert name in text
    assert oct((out).stat().st_mode)[-3:] == "700"  # the keys stay private


def test_the_host_monitor_reaches_nvml_without_taking_a_gpu(objects) -> None:
    spec = pod_specs(objects)["goodput-hostmon"]
    hostmon = spec["containers"][0]
    assert hostmon["securityContext"]["privileged"] is True  # /dev/nvidia*
    assert "nvidia.com/gpu" not in str(hostmon.get("resources", {}))
    volumes = {v["name"]: v for v in spec["volumes"]}
    driver = next(
        m
        for m in hostmon["volumeMounts"]
        if volumes[m["name"]].get("hostPath", {}).get("path") == GKE_DRIVER_HOST_DIR
    )
    assert driver["mountPath"] == GKE_DRIVER_MOUNT_DIR and driver["readOnly"] is True
    env = {e["name"]: e.get("value") for e in hostmon["env"]}
    assert f"{GKE_DRIVER_MOUNT_DIR}/lib64" in env["LD_LIBRARY_PATH"].split(":")
    # the GPU taint of the pool is tolerated
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


def test_the_configuration_carries_the_source_knobs_into_the_services_options(
    objects, tmp_path: Path
) -> None:
    text = (K8S / "base" / "goodput.toml").read_text()
    # without [bus]: its files exist only in the pods
    path = str(config_without_bus(tmp_path))
    assert "[services.sensor.thresholds]" in Path(path).read_text()
    for knob in (
        "heartbeat_polling_period_s", "heartbeat_timeout_s", "pod_termination_threshold_s",
        "jobset_downtime_threshold_s", "num_dp_replicas", "num_nodes_per_dp",
        "enable_fault_injection",
    ):  # fmt: skip
        assert knob in text
    raw = tomllib.loads(text)["services"]
    sensor = msgspec.convert(load_service_config("sensor", ["--config", path]).options,
                             SensorOptions)  # fmt: skip
    for knob, value in raw["sensor"]["thresholds"].items():
        assert getattr(sensor.thresholds, knob) == value
    hostmon = msgspec.convert(load_service_config("hostmon", ["--config", path]).options,
                              HostMonitorOptions)  # fmt: skip
    assert hostmon.enable_fault_injection is raw["hostmon"]["enable_fault_injection"] is False
    # the other services ignore the tables that are not theirs, and the ConfigMap is mounted
    assert load_service_config("controller", ["--config", path]).options == {}
    config_maps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    for spec in pod_specs(objects).values():
        for volume in spec["volumes"]:
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_the_real_nats_server_accepts_the_server_configuration(credentials, tmp_path) -> None:
    """nats.conf as the Secret holds it, with the credential step's certificate; the operator
    resolver is replaced by a plain account (its JWTs would come from the real nsc)."""
    out, made, _ = credentials
    conf = base64.b64decode(made["goodput-nats-server"]["data"]["nats.conf"]).decode()
    conf = conf.replace("/etc/nats-tls", str(out)).replace("/data/jetstream", str(tmp_path))
    (tmp_path / "nats.conf").write_text(conf)
    (tmp_path / "resolver.conf").write_text(
        "accounts { A: { jetstream: enabled, users: [{user: u, password: p}] } }\n"
    )
    checked = subprocess.run(
        [nats_server_binary(), "-c", str(tmp_path / "nats.conf"), "-t"],
        capture_output=True,
        text=True,
        env={**os.environ, "POD_NAME": "goodput-nats-0"},  # the StatefulSet's env
    )
    assert checked.returncode == 0, checked.stderr
