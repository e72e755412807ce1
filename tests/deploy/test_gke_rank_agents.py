"""On GKE the ranks run in one pod per GPU node holding all its GPUs (issue 38): a node agent
from the rank image, whose rendered command line the real `goodput agent` parser reads, whose
bus and job are goodput.toml's, and whose ranks write where the node's replicator serves."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest

from goodput.bus import BusSettings
from goodput.bus.settings import settings_from_env
from goodput.checkpoint.format import node_volume
from goodput.config import BUS_FLAGS, load_service_config
from goodput.state_dir import StateDir
from goodput.tools.cli.main import build_parser
from goodput_services.actuator.options import ActuatorOptions
from tests.deploy.rendered import (
    BASE,
    CONFIG_MOUNT,
    POD_FIELDS,
    config_without_bus,
    container,
    container_named,
    expanded,
    host_path,
    pod_env,
    pod_specs,
    render,
)
from tests.deploy.test_gke_overlay import KUBERNETES_VERSION

AGENT = "goodput-rank-agent"
#: GPUs of the A3 / A2 8-GPU machine types the overlay is written for
GPUS_PER_NODE = "8"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def agent(objects) -> dict[str, Any]:
    return container(objects, AGENT)


def _agent_args(agent: dict[str, Any]):
    argv = [*agent["command"][1:], *expanded(agent)]
    assert agent["command"][0] == "goodput"
    return build_parser("agent").parse_args(argv)


def test_one_rank_pod_per_gpu_node_holds_every_gpu_of_its_node(objects, agent) -> None:
    (workload,) = [o for o in objects if o["metadata"]["name"] == AGENT]
    kubernetes_validate.validate(workload, KUBERNETES_VERSION, strict=True)
    assert workload["kind"] == "DaemonSet"  # exactly one pod on each node it selects
    spec = pod_specs(objects)[AGENT]
    # the nodes the node daemons serve, GPU taint tolerated
    assert spec["nodeSelector"] == pod_specs(objects)["goodput-hostmon"]["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    resources = agent["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == GPUS_PER_NODE
    assert resources["limits"]["nvidia.com/gpu"] == GPUS_PER_NODE
    assert [c["name"] for c in spec["containers"]] == ["agent"]  # the ranks share it
    # NCCL's shared-memory transport needs more than the runtime's 64 MiB /dev/shm
    shm = next(m for m in agent["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in spec["volumes"] if v["name"] == shm["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    # the pod's own network: the agent announces the pod's IP, not the node's
    assert not spec.get("hostNetwork")
    assert spec["serviceAccountName"] == "goodput-trainer"
    assert spec["automountServiceAccountToken"] is False


def test_the_agent_runs_the_nodes_ranks_as_goodput_agent_reads_its_command_line(
    objects, agent
) -> None:
    args = _agent_args(agent)
    assert args.node == POD_FIELDS["spec.nodeName"]
    assert args.address == POD_FIELDS["status.podIP"]
    # the DaemonSets of the base are the node's host monitor and replicator
    assert args.no_node_daemons is True and args.no_host_report is True
    for daemon in ("goodput-hostmon", "goodput-replicator"):
        assert (
            pod_specs(objects)[daemon]["nodeSelector"] == pod_specs(objects)[AGENT]["nodeSelector"]
        )
    # the job and the bus are the services' (goodput.toml)
    toml = tomllib.loads((BASE / "goodput.toml").read_text())
    assert args.job == toml["job"]
    assert not any(getattr(args, flag) for flag in BUS_FLAGS)  # the environment's, below
    bus = settings_from_env(pod_env(agent))
    assert bus == msgspec.convert(toml["bus"], BusSettings)
    # ... and the files it names are mounted from the Secrets the services mount
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    for path in (bus.creds_file, bus.tls_ca_file, pod_env(agent)["GOODPUT_CKPT_KEY_FILE"]):
        mount = mounts[str(Path(path).parent)]
        assert mount["readOnly"] is True
    hostmon = container(objects, "goodput-hostmon")
    assert {m["mountPath"] for m in hostmon["volumeMounts"]} >= {"/etc/goodput/nats",
                                                                "/etc/goodput/tls"}  # fmt: skip


def test_the_actuator_runs_the_agent_backend(objects, tmp_path: Path) -> None:
    main = container(objects, "goodput-actuator")
    config = str(config_without_bus(tmp_path))
    args = [config if arg == CONFIG_MOUNT else arg for arg in main["args"]]
    options = msgspec.convert(load_service_config("actuator", args).options, ActuatorOptions)
    assert options.backend == "agent"


def test_the_ranks_volume_is_the_one_the_nodes_replicator_serves(objects, agent) -> None:
    """The actuator tells each rank the volume ``node_volume(<the agent's state_dir>)``; the
    replicator serves ``node_volume(<its --state-dir>)``: one directory of the node."""
    args = _agent_args(agent)
    node = args.node
    agent_dir = StateDir(Path(args.state_dir)).agent(node).root  # what the agent announces
    ranks = node_volume(agent_dir, node, args.job)
    replicator = container(objects, "goodput-replicator")
    flags = expanded(replicator)
    served = node_volume(flags[flags.index("--state-dir") + 1], node, args.job)
    ranks_on_host = host_path(pod_specs(objects)[AGENT], agent, ranks)
    served_on_host = host_path(pod_specs(objects)["goodput-replicator"], replicator, served)
    assert ranks_on_host == served_on_host
    # the agent (uid 10001, the replicator's) may write there once the init container ran
    init = container_named(objects, AGENT, "checkpoint-owner")
    uid = agent["securityContext"]["runAsUser"]
    assert uid == replicator["securityContext"]["runAsUser"]
    assert init["command"][:3] == ["chown", "-R", f"{uid}:{uid}"]
    assert host_path(pod_specs(objects)[AGENT], init, Path(init["command"][3])) in (
        ranks_on_host.parents
    )
