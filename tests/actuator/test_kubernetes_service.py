"""The warm ladder on Kubernetes through the REAL actuator service and a REAL nats-server: the
service's Rejoin round and its standby assignment over the bus, against the Kubernetes API
FAKE of kubernetes_fake (no cluster runs here).

The trainers are stand-ins on the bus (``Survivors``: they answer a Rejoin as the shim does,
``RankRejoined``), and one standby pod's process is the real standby side of
``goodput.launch.standby_channel`` (what the shim's ``run_job`` runs in a pod), so what the
backend's unit tests take from fakes is checked here against the real exchange.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.config import ServiceConfig
from goodput.launch.standby_channel import await_assignment_on_bus
from goodput_services.actuator.kubernetes_backend import KubernetesBackend
from goodput_services.actuator.service import ActuatorService
from goodput_services.controller.service import ControllerService
from tests.stack.helpers import EventTap
from tests.telemetry.helpers import running

from .kubernetes_fake import (
    JOB,
    OPTIONS,
    POOL,
    RUN,
    FakeKubernetesApi,
    FakePodWatch,
    _env,
    _node,
    _pinned_node,
    _start,
)


class Survivors:
    """Stand-ins for the surviving ranks' shims: each Rejoin is answered ok for ``ranks``,
    once per command id as a rank's link handles it (the actuator re-sends it while a rank is
    silent)."""

    def __init__(self, bus: Bus, ranks: set[int]) -> None:
        self.bus, self.ranks = bus, ranks
        self.rejoins: list[schemas.Rejoin] = []

    async def start(self) -> Survivors:
        async def on_command(msg) -> None:
            command = schemas.decode_command(msg.data)
            seen = {rejoin.command_id for rejoin in self.rejoins}
            if isinstance(command, schemas.Rejoin) and command.command_id not in seen:
                self.rejoins.append(command)
                for rank in sorted(self.ranks):
                    await self.bus.emit(
                        schemas.RankRejoined(
                            job=JOB,
                            node="gpu-a" if rank < 2 else "gpu-b",  # two ranks a node
                            rank=rank,
                            pid=0,
                            attempt=command.attempt,
                        )
                    )

        await self.bus.nc.subscribe(subjects.command(JOB, subjects.TRAINER), cb=on_command)
        return self


@pytest.fixture
async def stack(
    tmp_path: Path, nats_server: EmbeddedNats
) -> AsyncIterator[tuple[Bus, EventTap, FakeKubernetesApi]]:
    settings = BusSettings(url=nats_server.url)
    api = FakeKubernetesApi([_node(f"gpu-{n}", POOL) for n in "abc"])
    service = ActuatorService(
        ServiceConfig(
            job=JOB, state_dir=str(tmp_path), bus=settings, options={"restore_timeout_s": 0}
        )
    )
    service.backend = KubernetesBackend(
        job=JOB,
        bus_settings=settings,
        ports=service.ports,
        # a deletion a node never confirms is given up on 0.2 s past its grace period
        options=msgspec.structs.replace(OPTIONS, delete_margin_s=0.2),
        api=api,
        watch_factory=lambda: FakePodWatch(api),
    )
    bus = await Bus.connect(settings, name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    async with running(service):
        yield bus, tap, api
    await tap.stop()
    await bus.close()


async def _ok(bus: Bus, tap: EventTap, command: schemas.Command) -> schemas.ActionResult:
    await bus.send_command(subjects.ACTUATOR, command)
    result = await tap.result_of(command, timeout_s=60)
    assert result.ok, result.detail
    return result


async def test_in_process_restart_and_a_warm_hot_swap_over_the_bus(
    stack, tmp_path: Path, monkeypatch
) -> None:
    bus, tap, api = stack
    survivors = await Survivors(bus, {0, 1, 3}).start()
    await _ok(bus, tap, msgspec.structs.replace(_start(nodes=2, spares=1, procs=2), standbys=2))

    # rank 2 crashes: survivors rejoin at rank 0's DNS name, rank 2 gets a new pod
    api.exit(f"job-k8s-{RUN}-a1-r2", 139)
    await tap.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.rank == 2, 30, "exit")
    result = await _ok(bus, tap, schemas.RestartInProcess(job=JOB, deadline_s=20.0))
    assert "3 rank(s) restarted in process, 1 started again (attempt 2)" in result.detail
    (rejoin,) = survivors.rejoins
    address = f"job-k8s-{RUN}-a1-r0.job-k8s-ranks.training.svc"
    assert (rejoin.master_addr, rejoin.master_port, rejoin.world_size) == (address, 29502, 4)
    assert _env(api.pods[f"job-k8s-{RUN}-a2-r2"])["MASTER_ADDR"] == address

    # the spare's standby pods: one is served by the real standby side, the other by nobody
    monkeypatch.setenv("GOODPUT_NATS_URL", bus.settings.url)
    served, silent = sorted(
        name for name, pod in api.pods.items() if pod.metadata.labels.get("goodput.dev/role")
    )
    standby = asyncio.ensure_future(
        await_assignment_on_bus(subjects.standby(JOB, served), tmp_path / "ready")
    )
    for _ in range(500):
        if (tmp_path / "ready").exists():
            break
        await asyncio.sleep(0.01)
    for name in (served, silent):
        api.set_ready(name)
    await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and len(e.standbys.get("gpu-c", [])) == 2,
        30,
        "both standbys ready",
    )
    await _ok(bus, tap, schemas.HotSwap(job=JOB, failed_node="gpu-a", standbys=True))
    told = await asyncio.wait_for(standby, 30)
    # whichever rank it was given, it is a rank of gpu-c in the new attempt's rendezvous
    assert (told.node, told.world_size, told.attempt, told.master_port) == ("gpu-c", 4, 3, 29503)
    assert served in api.pods and silent not in api.pods  # the silent one made room
    rank0 = served if told.rank == 0 else f"job-k8s-{RUN}-a3-r0"
    assert told.master_addr == f"{rank0}.job-k8s-ranks.training.svc"
    cold = [p for p in api.pods.values() if p.metadata.labels.get("goodput.dev/attempt") == "3"]
    assert sorted((p.metadata.labels["goodput.dev/rank"], _pinned_node(p)) for p in cold) == [
        (str(1 - told.rank), "gpu-c"),
        ("2", "gpu-b"),
        ("3", "gpu-b"),
    ]


async def test_a_node_that_never_confirms_a_deletion_is_replaced_and_the_job_runs(
    stack, tmp_path: Path
) -> None:
    """The REAL controller service decides; its refused restart is followed by a hot swap."""
    bus, tap, api = stack
    controller = ControllerService(
        ServiceConfig(job=JOB, state_dir=str(tmp_path / "controller"), bus=bus.settings)
    )
    async with running(controller):
        await _ok(bus, tap, _start(nodes=2, spares=1, procs=2))
        # gpu-b's kubelet is gone (nobody declared the node failed) and its ranks stop beating
        # (as the sensor says it): a frozen rank restarts cold, and gpu-b never confirms the
        # deletion of its pods
        api.kill_node("gpu-b")
        frozen = schemas.Signal(
            job=JOB, signal="missed_heartbeat", node="gpu-b", severity="correctable", detail="r2"
        )
        await bus.emit(frozen)
        status = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.state == "running" and e.attempt == 2,
            60,
            "running again",
        )
    first, second = [d for d in tap.of(schemas.Decision) if d.signal_id == frozen.signal_id]
    assert first.rule == "in-job-restart"
    assert second.rule == "replace-suspect", second.reason
    assert "restart refused (no pod placed: gpu-b never confirmed" in second.reason
    refused, swapped = [r for r in tap.of(schemas.ActionResult) if r.action != "start_job"]
    assert (refused.action, refused.ok, swapped.action, swapped.ok) == (
        "restart",
        False,
        "hot_swap",
        True,
    )
    assert (status.active_nodes, status.failed_nodes) == (["gpu-a", "gpu-c"], ["gpu-b"])
    assert status.suspect_nodes == []  # its pods force-deleted once it was declared failed
    running_on = sorted(_pinned_node(p) for p in api.pods.values())
    assert running_on == ["gpu-a", "gpu-a", "gpu-c", "gpu-c"]
