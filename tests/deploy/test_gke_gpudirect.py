"""The GKE overlay's A3 variants (issue 38): GPUDirect-TCPX for A3 High (overlays/gke-a3-high)
and GPUDirect-TCPXO for A3 Mega (overlays/gke-a3-mega) add to the rank-agent pod what Google
documents for GKE Standard clusters, and nothing else changes.

Every value is checked, not only its key: the multi-network and device annotations, the
receive-data-path manager sidecar, the plugin installer and where it writes on the node, the
NCCL environment, and the agent's command line read by the real ``goodput agent`` parser (for
A3 Mega through its shell wrapper, run for real with a FAKE ``goodput`` that records its argv).
No GKE cluster or A3 machine ran these pods; Google's images were not pulled.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from goodput.tools.cli.main import build_parser
from tests.deploy.rendered import (
    A3_HIGH,
    A3_MEGA,
    container_named,
    expanded,
    host_path,
    pod_env,
    pod_specs,
    render,
)
from tests.deploy.test_gke_overlay import KUBERNETES_VERSION

AGENT = "goodput-rank-agent"
#: where the plugin lands on the node: the driver's libraries GKE installs
NODE_LIBRARIES = PurePosixPath("/home/kubernetes/bin/nvidia/lib64")
#: where the ranks load it from (LD_LIBRARY_PATH), as in GKE's GPU containers
LIBRARIES = "/usr/local/nvidia/lib64"
GPUS = [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]
#: the NCCL configuration Google lists for GPUDirect-TCPX on a3-highgpu-8g
TCPX_NCCL = {
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    "NCCL_CROSS_NIC": "0",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_P2P_PXN_LEVEL": "0",
    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "eth1,eth2,eth3,eth4",
    "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0",
    "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_P2P_PCI_CHUNKSIZE": "524288",
    "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_NSOCKS_PERTHREAD": "4",
    "NCCL_SOCKET_NTHREADS": "1",
    "NCCL_GPUDIRECTTCPX_TX_BINDINGS": (
        "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177"
    ),
    "NCCL_GPUDIRECTTCPX_RX_BINDINGS": (
        "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191"
    ),
    "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "500000",
}
#: A3 Mega's ranks take their NCCL configuration from the plugin's profile, sourced here
TCPXO_WRAPPER = [
    "/bin/sh",
    "-c",
    f'. {LIBRARIES}/nccl-env-profile.sh && exec goodput agent "$@"',
    "goodput-agent",
]
#: per variant: the sidecar, its image and start, its capabilities, the GPU NICs, the plugin
VARIANTS = {
    "a3-high": {
        "directory": A3_HIGH,
        "sidecar": "tcpx-daemon",
        "image": "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.15",
        "start": [
            "/tcpgpudmarxd/build/app/tcpgpudmarxd",
            "--gpu_nic_preset",
            "a3vm",
            "--gpu_shmem_type",
            "fd",
            "--uds_path",
            "/run/tcpx",
            "--setup_param",
            '\\"--verbose 128 2 0 \\"',
        ],
        "capabilities": ["NET_ADMIN"],
        "nics": 4,
        "devices": GPUS,
        "installer": "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/nccl-plugin-gpudirecttcpx-dev:v3.1.12",
        "installed": "/var/lib/tcpx/lib64",
    },
    "a3-mega": {
        "directory": A3_MEGA,
        "sidecar": "tcpxo-daemon",
        "image": "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.17",
        "start": [
            "/bin/sh",
            "-c",
            "set -ex\nchmod 755 /fts/entrypoint_rxdm_container.sh\n"
            "/fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics=8 --uid= --alsologtostderr\n",
        ],
        "capabilities": ["NET_ADMIN", "NET_BIND_SERVICE"],
        "nics": 8,
        "devices": [*GPUS, "/dev/dmabuf_import_helper"],
        "installer": "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.11",
        "installed": "/var/lib/tcpxo/lib64",
    },
}


@pytest.fixture(scope="module")
def gke() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    wanted = VARIANTS[request.param]
    return wanted, render(wanted["directory"])


def _by_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _mounts(one: dict[str, Any], spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's mounts by path: the volume each shows there."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"]: {**volumes[m["name"]], **m} for m in one["volumeMounts"]}


def test_only_the_rank_agent_changes_and_every_object_is_valid(variant, gke) -> None:
    _, objects = variant
    mine, base = _by_name(objects), _by_name(gke)
    assert mine.keys() == base.keys()
    changed = [key for key in mine if mine[key] != base[key]]
    assert changed == [("DaemonSet", AGENT)]
    kubernetes_validate.validate(mine[("DaemonSet", AGENT)], KUBERNETES_VERSION, strict=True)


def test_one_rank_pod_per_node_holds_all_8_gpus_on_the_pods_own_network(variant) -> None:
    wanted, objects = variant
    (workload,) = [o for o in objects if o["metadata"]["name"] == AGENT]
    assert workload["kind"] == "DaemonSet"
    spec = pod_specs(objects)[AGENT]
    assert [c["name"] for c in spec["containers"]] == ["agent", wanted["sidecar"]]
    agent, sidecar = spec["containers"]
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert agent["resources"]["requests"]["nvidia.com/gpu"] == "8"
    # the sidecar takes no GPU from the ranks: its devices come from the annotation
    assert "nvidia.com/gpu" not in sidecar["resources"]["requests"]
    assert "nvidia.com/gpu" not in sidecar["resources"]["limits"]
    # the pod's network (the GPU NICs attached to it), the pod's IPC namespace, its PIDs
    for host_namespace in ("hostNetwork", "hostIPC", "hostPID"):
        assert host_namespace not in spec
    assert _mounts(agent, spec)["/dev/shm"]["emptyDir"] == {"medium": "Memory"}


def test_the_annotations_attach_the_gpu_nics_and_the_sidecars_devices(variant) -> None:
    wanted, objects = variant
    (workload,) = [o for o in objects if o["metadata"]["name"] == AGENT]
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {
        "networking.gke.io/default-interface",
        "networking.gke.io/interfaces",
        f"devices.gke.io/container.{wanted['sidecar']}",
    }
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    nics = [
        {"interfaceName": f"eth{i}", "network": f"vpc{i}"} for i in range(1, wanted["nics"] + 1)
    ]
    assert json.loads(annotations["networking.gke.io/interfaces"]) == [
        {"interfaceName": "eth0", "network": "default"},
        *nics,
    ]
    devices = yaml.safe_load(annotations[f"devices.gke.io/container.{wanted['sidecar']}"])
    assert devices == [{"path": path} for path in wanted["devices"]]


def test_the_receive_data_path_manager_sidecar_is_as_documented(variant) -> None:
    wanted, objects = variant
    spec = pod_specs(objects)[AGENT]
    sidecar = container_named(objects, AGENT, wanted["sidecar"])
    assert sidecar["image"] == wanted["image"]
    assert sidecar["command"] + sidecar.get("args", []) == wanted["start"]
    assert sidecar["securityContext"] == {"capabilities": {"add": wanted["capabilities"]}}
    assert pod_env(sidecar) == {"LD_LIBRARY_PATH": LIBRARIES}
    mounts = _mounts(sidecar, spec)
    assert host_path(spec, sidecar, Path(LIBRARIES)) == NODE_LIBRARIES
    assert mounts["/hostsysfs"]["hostPath"] == {"path": "/sys"}
    assert mounts["/hostprocsysfs"]["hostPath"] == {"path": "/proc/sys"}


def test_the_plugin_installer_writes_where_the_ranks_load_it(variant) -> None:
    wanted, objects = variant
    spec = pod_specs(objects)[AGENT]
    agent = container_named(objects, AGENT, "agent")
    installer = container_named(objects, AGENT, "nccl-plugin-installer")
    assert installer in spec["initContainers"]  # done before the agent starts
    assert installer["image"] == wanted["installer"]
    assert installer["securityContext"] == {"privileged": True}
    script = installer["args"][0].splitlines()
    assert "/scripts/container_entry.sh install --install-nccl" in script
    # it copies what it installed into the driver's directory of the node...
    copy = f"cp -r {wanted['installed']}/. {LIBRARIES}"
    assert script[-1] == copy
    assert host_path(spec, installer, Path(LIBRARIES)) == NODE_LIBRARIES
    # ... which the ranks see on their loader's path
    (ld_path,) = pod_env(agent)["LD_LIBRARY_PATH"].split(":")
    assert host_path(spec, agent, Path(ld_path)) == NODE_LIBRARIES
    assert _mounts(agent, spec)[ld_path]["readOnly"] is True


def test_a3_high_ranks_get_googles_nccl_configuration_and_the_daemons_sockets(gke) -> None:
    objects = render(A3_HIGH)
    spec = pod_specs(objects)[AGENT]
    agent = container_named(objects, AGENT, "agent")
    sidecar = container_named(objects, AGENT, "tcpx-daemon")
    env = pod_env(agent)
    nccl = {name: value for name, value in env.items() if name.startswith("NCCL_")}
    assert nccl == TCPX_NCCL
    # the GKE overlay's environment is all still there, unchanged
    assert pod_env(container_named(gke, AGENT, "agent")).items() <= env.items()
    # the daemon's sockets (--uds_path) reach the ranks at the plugin's default prefix, /tmp
    uds = sidecar["command"][sidecar["command"].index("--uds_path") + 1]
    volume = _mounts(sidecar, spec)[uds]
    assert _mounts(agent, spec)["/tmp"]["name"] == volume["name"]
    assert volume["emptyDir"] == {}


def test_a3_high_agent_command_line_parses_as_the_gke_overlays(gke) -> None:
    agent = container_named(render(A3_HIGH), AGENT, "agent")
    original = container_named(gke, AGENT, "agent")
    assert agent["command"] == original["command"] == ["goodput", "agent"]
    args = build_parser("agent").parse_args([*agent["command"][1:], *expanded(agent)])
    assert args == build_parser("agent").parse_args([*original["command"][1:], *expanded(original)])


def test_a3_mega_ranks_get_the_aperture_devices_and_the_plugins_profile(gke) -> None:
    objects = render(A3_MEGA)
    spec = pod_specs(objects)[AGENT]
    agent = container_named(objects, AGENT, "agent")
    env = pod_env(agent)
    assert {n: v for n, v in env.items() if n.startswith("NCCL_")} == {
        "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices"
    }
    assert host_path(spec, agent, Path("/dev/aperture_devices")) == PurePosixPath(
        "/dev/aperture_devices"
    )
    assert pod_env(container_named(gke, AGENT, "agent")).items() <= env.items()
    # the profile the wrapper sources is one the installer put on the node's library path
    profile = Path(TCPXO_WRAPPER[2].split()[1])
    assert host_path(spec, agent, profile) == NODE_LIBRARIES / "nccl-env-profile.sh"


def test_a3_mega_agent_runs_through_the_profile_with_the_gke_overlays_command_line(
    gke, tmp_path: Path
) -> None:
    """The wrapper, run by a real shell: it sources the profile, then execs ``goodput agent``
    with the args exactly as the kubelet expands them (a FAKE goodput records its argv)."""
    agent = container_named(render(A3_MEGA), AGENT, "agent")
    assert agent["command"] == TCPXO_WRAPPER
    original = container_named(gke, AGENT, "agent")
    assert agent["args"] == original["args"]
    profile = tmp_path / "nccl-env-profile.sh"
    profile.write_text("export NCCL_PROTO=Simple,LL128\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    record = tmp_path / "argv.json"
    fake = fake_bin / "goodput"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"json.dump([sys.argv[1:], os.environ.get('NCCL_PROTO')], open({str(record)!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    script = agent["command"][2].replace(f"{LIBRARIES}/nccl-env-profile.sh", str(profile))
    argv = expanded(agent)
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["/bin/sh", "-c", script, agent["command"][3], *argv], env=env, check=True)
    seen, proto = json.loads(record.read_text())
    assert proto == "Simple,LL128"
    assert seen == ["agent", *argv]
    parsed = build_parser("agent").parse_args(seen)
    assert parsed == build_parser("agent").parse_args(
        [*original["command"][1:], *expanded(original)]
    )
