"""`goodput status`, `report` and `chaos` against a cluster's bus: remote, TLS, authenticated.

The job runs as in ``test_run_kubernetes``: the real actuator service on the FAKE Kubernetes
API, reached through a real nats-server that requires TLS and a password; a real host monitor
(on FakeNvml GPUs, fault injection on) stands for a GPU node's DaemonSet pod. The commands
are the real CLI with the bus flags a user outside the cluster gives.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from goodput.bus import BusSettings
from goodput.config import ServiceConfig
from goodput.tools.cli.main import main
from goodput_services.hostmon.gpu import GpuProbe
from goodput_services.hostmon.service import HostMonitorService
from tests.actuator.kubernetes_fake import POOL, FakeKubernetesApi, _node
from tests.cli import test_run_kubernetes as cluster
from tests.hostmon.fake_nvml import two_gpus
from tests.telemetry.helpers import running

JOB = cluster.JOB
secure_bus = cluster.secure_bus
clean_bus_environment = cluster.clean_bus_environment


def _host_monitor(settings: BusSettings, state: Path) -> HostMonitorService:
    service = HostMonitorService(
        ServiceConfig(
            job=JOB,
            node="gpu-0",
            state_dir=str(state),
            bus=settings,
            options={"enable_fault_injection": True},
        )
    )
    service.gpu = GpuProbe(two_gpus())  # FAKE NVML: no GPU here
    return service


def _bus_flags(settings: BusSettings, state: Path) -> list[str]:
    # an empty state directory: nothing local to fall back on
    return ["--job", JOB, "--state-dir", str(state), "--nats-url", settings.url,
            "--nats-user", cluster.USER, "--nats-tls-ca", settings.tls_ca_file]  # fmt: skip


async def test_status_report_and_chaos_work_against_the_cluster_bus(
    tmp_path: Path, secure_bus: BusSettings, clean_bus_environment: None, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GOODPUT_NATS_PASSWORD", cluster.PASSWORD)
    api = FakeKubernetesApi([_node("gpu-0", POOL), _node("gpu-1", POOL)])
    flags = _bus_flags(secure_bus, tmp_path / "empty")
    services = (
        cluster._actuator(secure_bus, tmp_path / "actuator", api),
        _host_monitor(secure_bus, tmp_path / "hostmon"),
    )
    async with running(*services):
        await cluster._reporting(secure_bus)
        finisher = asyncio.create_task(cluster._finish_pods(api, 2))
        run = cluster._cli(
            secure_bus, "--image", "t:1", "--nodes", "2", "--spares", "0", "--", "train"
        )
        assert await asyncio.to_thread(main, run) == 0
        await finisher
        capsys.readouterr()

        code = await asyncio.to_thread(
            main, ["chaos", "gpu-xid", "--node", "gpu-0", "--json", *flags]
        )
        fired = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert code == 0 and fired["ok"], fired
        assert "hostmon-gpu-0" in fired["detail"]

    assert await asyncio.to_thread(main, ["status", "--once", "--json", *flags]) == 0
    view = json.loads(capsys.readouterr().out)["job_view"]
    assert view["state"] == "finished"
    assert sorted(n["name"] for n in view["nodes"]) == ["gpu-0", "gpu-1"]

    assert await asyncio.to_thread(main, ["report", "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["job"] == JOB


def test_each_command_refuses_a_remote_bus_without_credentials(tmp_path: Path, capsys) -> None:
    flags = ["--job", JOB, "--state-dir", str(tmp_path), "--nats-url", "nats://10.1.2.3:4222"]
    for command in (["status", "--once"], ["report"], ["chaos", "gpu-xid"]):
        assert main([*command, *flags]) != 0
        out, err = capsys.readouterr()  # chaos reports the failed fault as its outcome line
        assert "refusing to use the NATS server at 10.1.2.3" in out + err, (command, out, err)
        assert "Traceback" not in out + err
