"""`goodput run --backend kubernetes` sends the job through an authenticated bus to an actuator
whose Kubernetes backend talks to the FAKE Kubernetes API of the backend's own tests.

The bus is real (nats-server requiring TLS and a password), the actuator service is real and
runs in this process, the CLI is the real command; only the cluster is the recording
``FakeKubernetesApi``: no Kubernetes API server runs here.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from goodput.bus import Bus, BusSettings
from goodput.config import ServiceConfig
from goodput.tools.cli.main import main
from goodput.tools.stack.runs import missing_actuator
from goodput_services.actuator.kubernetes_backend import KubernetesBackend
from goodput_services.actuator.kubernetes_options import KubernetesOptions
from goodput_services.actuator.service import ActuatorService
from tests.actuator import test_authenticated_bus as authenticated
from tests.actuator.kubernetes_fake import (
    NAMESPACE,
    POOL,
    FakeKubernetesApi,
    FakePodWatch,
    _node,
)
from tests.telemetry.helpers import running

JOB = "train"
USER, PASSWORD = authenticated.USER, authenticated.PASSWORD
# the TLS + password nats-server and the clean rank environment of the authenticated-bus tests
secure_bus = authenticated.secure_bus
clean_bus_environment = authenticated.clean_bus_environment


def _actuator(settings: BusSettings, state: Path, api: FakeKubernetesApi) -> ActuatorService:
    """The real actuator service with a Kubernetes backend on the fake API (no default image)."""
    service = ActuatorService(
        ServiceConfig(job=JOB, state_dir=str(state), bus=settings, options={"restore_timeout_s": 0})
    )
    service.backend = KubernetesBackend(
        job=JOB,
        bus_settings=settings,
        ports=service.ports,
        options=KubernetesOptions(
            namespace=NAMESPACE, gpus_per_rank=1, nats_auth_secret="goodput-nats-auth"
        ),
        api=api,
        watch_factory=lambda: FakePodWatch(api),
    )
    return service


def _cli(settings: BusSettings, *extra: str) -> list[str]:
    return [
        "run", "--backend", "kubernetes", "--job", JOB, "--json",
        "--nats-url", settings.url, "--nats-user", USER, "--nats-tls-ca", settings.tls_ca_file,
        *extra,
    ]  # fmt: skip


async def _reporting(settings: BusSettings) -> None:
    """Wait until the actuator's health record is on the bus (a bound, not a speed test)."""
    bus = await Bus.connect(settings, name="test")
    try:
        for _ in range(600):
            if await missing_actuator(bus, JOB) is None:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the actuator never reported")
    finally:
        await bus.close()


async def _finish_pods(api: FakeKubernetesApi, count: int) -> None:
    """The "cluster": every rank pod of the first attempt runs and exits 0."""
    while len(api.created) < count:
        await asyncio.sleep(0.05)
    for pod in api.created[:count]:
        api.exit(pod.metadata.name, 0)


async def test_the_job_reaches_the_in_cluster_actuator_with_its_image_and_gpus(
    tmp_path: Path, secure_bus: BusSettings, clean_bus_environment: None, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GOODPUT_NATS_PASSWORD", PASSWORD)
    api = FakeKubernetesApi([_node(f"gpu-{i}", POOL) for i in range(3)])
    argv = _cli(
        secure_bus,
        "--image", "registry.example/team/trainer:7", "--gpus-per-rank", "4",
        "--nodes", "2", "--procs-per-node", "2", "--spares", "1", "--nodes-per-dp", "1",
        "--workdir", "/workspace",
        "--", "python", "-m", "goodput.examples.gpt.supervised", "--steps", "5",
    )  # fmt: skip
    async with running(_actuator(secure_bus, tmp_path, api)):
        await _reporting(secure_bus)
        finisher = asyncio.create_task(_finish_pods(api, 4))
        code = await asyncio.to_thread(main, argv)
        await finisher
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["job"], result["state"]) == (JOB, "finished")
    pods = api.created
    assert len(pods) == 4  # 2 nodes x 2 ranks; the spare runs nothing
    for pod in pods:
        (container,) = pod.spec.containers
        assert container.image == "registry.example/team/trainer:7"
        assert container.resources.limits == {"nvidia.com/gpu": "4"}
        # the command runs in the image as given: not this machine's interpreter or folder
        assert container.command == ["python", "-m", "goodput.examples.gpt.supervised",
                                     "--steps", "5"]  # fmt: skip
        assert container.working_dir == "/workspace"
    assert {pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
            .node_selector_terms[0].match_fields[0].values[0] for pod in pods} == {"gpu-0", "gpu-1"}  # fmt: skip


async def test_a_job_without_an_image_is_refused_by_the_actuator(
    tmp_path: Path, secure_bus: BusSettings, clean_bus_environment: None, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GOODPUT_NATS_PASSWORD", PASSWORD)
    api = FakeKubernetesApi([_node("gpu-0", POOL)])
    argv = _cli(secure_bus, "--nodes", "1", "--spares", "0", "--timeout", "20", "--", "train")
    async with running(_actuator(secure_bus, tmp_path, api)):
        await _reporting(secure_bus)
        code = await asyncio.to_thread(main, argv)
    assert code == 1 and api.created == []
    assert "the job names no rank image" in capsys.readouterr().err


def test_no_actuator_of_the_job_on_the_bus_is_one_line(
    secure_bus: BusSettings, clean_bus_environment: None, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GOODPUT_NATS_PASSWORD", PASSWORD)
    code = main(_cli(secure_bus, "--image", "t:1", "--", "train"))
    err = capsys.readouterr().err
    assert code == 1
    assert "no actuator of job train reports on this bus" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "needs the cluster's bus"),
        (["--nats-url", "nats://10.1.2.3:4222"], "refusing to use the NATS server at 10.1.2.3"),
    ],
)
def test_a_remote_bus_must_be_named_and_authenticated(
    extra: list[str], message: str, clean_bus_environment: None, capsys
) -> None:
    code = main(["run", "--backend", "kubernetes", "--image", "t:1", *extra, "--", "train"])
    assert code == 2 and message in capsys.readouterr().err


def test_image_flags_need_the_kubernetes_backend(capsys) -> None:
    assert main(["run", "--image", "t:1", "--", sys.executable, "-c", "pass"]) == 2
    assert "need --backend kubernetes" in capsys.readouterr().err
