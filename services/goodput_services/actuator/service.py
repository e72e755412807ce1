"""The actuator service process: executes remediation commands on a backend."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nats.errors

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, BusUnavailableError
from goodput.bus.commands import request
from goodput.bus.job_events import next_step
from goodput.checkpoint.index.index import CheckpointIndex
from goodput.config import ServiceConfig
from goodput.launch.rank_env import RankEnv
from goodput.launch.standby_channel import assign_on_bus
from goodput.supervisor.membership import MembershipError
from goodput_services.actuator.backend import Backend
from goodput_services.actuator.options import ActuatorOptions
from goodput_services.actuator.ports import BusPorts
from goodput_services.actuator.rejoin_round import rejoin_round
from goodput_services.actuator.skip_history import read_run_windows
from goodput_services.base import Service

log = logging.getLogger(__name__)

#: how long withdrawing a failed node's address from the checkpoint index may take
WITHDRAW_TIMEOUT_S = 5.0
#: how long a pod standby may take to answer its assignment before its rank starts cold
STANDBY_ASSIGN_TIMEOUT_S = 10.0


def create_backend(
    options: ActuatorOptions,
    *,
    job: str,
    state_dir: Path,
    bus_settings: BusSettings,
    ports: BusPorts,
) -> Backend:
    """The backend ``options.backend`` names (the options struct admits only known names)."""
    name = options.backend
    if name == "local":
        from goodput_services.actuator.local_backend import LocalBackend

        return LocalBackend(job=job, state_dir=state_dir, bus_settings=bus_settings, ports=ports)
    if name == "agent":
        from goodput_services.actuator.agent_backend import AgentBackend

        return AgentBackend(job=job, bus_settings=bus_settings, ports=ports)
    if name == "kubernetes":
        # imported here: the kubernetes client is slow to import and only this backend needs it
        from goodput_services.actuator.kubernetes_backend import KubernetesBackend
        from goodput_services.actuator.kubernetes_options import KubernetesOptions

        settings = KubernetesOptions.from_mapping(options.kubernetes)
        return KubernetesBackend.connect(
            job=job, bus_settings=bus_settings, ports=ports, options=settings
        )
    raise ValueError(f"unknown actuator backend {name!r}")


class ActuatorService(Service):
    name = "actuator"
    command_target = subjects.ACTUATOR
    options_type = ActuatorOptions
    options: ActuatorOptions
    backend: Backend

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        #: what the backend asks of the other parts, over this service's bus
        self.ports = BusPorts(
            emit=self._emit,
            prepare_node=self._restore_to_node if self.options.restore_timeout_s > 0 else None,
            reset_gpus=self._reset_gpus,
            rejoin=self._rejoin_round,
            next_step=self._next_step,
            assign_standby=self._assign_standby,
            run_skips=self._run_skips,
        )
        self.backend = create_backend(
            self.options,
            job=self.job,
            state_dir=Path(config.state_dir),
            bus_settings=config.bus,
            ports=self.ports,
        )

    async def start_bus(self) -> Bus:
        bus = await super().start_bus()
        await self.backend.connect_bus(bus)
        return bus

    @property
    def stop_deadline_s(self) -> float:
        # a stop lets the ranks checkpoint and exit first
        return self.backend.stop_grace_s + 10.0

    async def _emit(self, event: schemas.Event) -> None:
        assert self.bus is not None
        await self.bus.emit(event)
        if isinstance(event, schemas.JobStatus):
            kv = await self.bus.kv(subjects.STATE_BUCKET)
            await kv.put(subjects.kv_key(self.job, "job_status"), schemas.encode(event))

    async def _restore_to_node(
        self, node: str, part: int, parts: int, before_step: int | None
    ) -> str:
        """Ask the node's checkpoint tier to fill its volume (with ``part`` of ``parts`` of a
        checkpoint sharded across nodes; before ``before_step`` for a rollback), and wait."""
        command = schemas.RestoreToNode(
            job=self.job,
            node=node,
            part=part,
            parts=parts,
            before_step=before_step,
            reason="before launch",
        )
        result = await self._ask_node(command, self.options.restore_timeout_s)
        if isinstance(result, str):
            return f"{result}; launching anyway"
        return result.detail if result.ok else f"failed: {result.detail}"

    async def _reset_gpus(
        self, node: str, gpus: list[int], run_id: str, attempt: int
    ) -> tuple[bool, str]:
        """Ask the node's host monitor to reset GPUs no rank uses now; wait for its answer."""
        command = schemas.ResetGpu(
            job=self.job,
            node=node,
            gpus=gpus,
            attempt=attempt,
            run_id=run_id,
            reason="ranks stopped",
        )
        result = await self._ask_node(command, self.options.gpu_reset_timeout_s)
        if isinstance(result, str):
            return False, result
        return result.ok, result.detail

    async def _ask_node(
        self, command: schemas.Command, timeout_s: float
    ) -> schemas.ActionResult | str:
        """Send a per-node ``command`` to its executor there and wait for its result, or the
        line saying none came within ``timeout_s`` (the caller says what happens next)."""
        assert self.bus is not None
        target = subjects.command_target(command)
        result = await request(self.bus, target, command, timeout_s)
        return f"no answer from {target} within {timeout_s:.0f} s" if result is None else result

    async def _rejoin_round(
        self, command: schemas.Rejoin, ranks: set[int], deadline_s: float
    ) -> dict[int, schemas.RankRejoined]:
        """The Rejoin round (``rejoin_round``: sent again to the ranks that did not answer)."""
        assert self.bus is not None
        return await rejoin_round(self.bus, command, ranks, deadline_s)

    async def _assign_standby(self, subject: str, env: RankEnv) -> str:
        """Hand a pod standby its rank over the bus (``goodput.launch.standby_channel``)."""
        assert self.bus is not None
        return await assign_on_bus(self.bus.nc, subject, env, STANDBY_ASSIGN_TIMEOUT_S)

    async def _run_skips(self, start: schemas.StartJob) -> tuple[schemas.StepWindow, ...]:
        """The windows of the run's restarts before ``start`` (``skip_history``). A bus
        that does not answer starts the run without them, in one error line: a spike's batch
        met again is rolled back again, a run that does not start loses everything."""
        assert self.bus is not None
        try:
            return await read_run_windows(self.bus, start)
        except (nats.errors.Error, BusUnavailableError) as exc:
            log.error("run %s starts without its earlier skip windows: %s", start.run_id, exc)
            return ()

    async def _next_step(self) -> None:
        assert self.bus is not None
        await next_step(self.bus, self.job)

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        """Run a membership or lifecycle command; a refusal is a result, logged like a success,
        so no command leaves the actuator without a line in its log."""
        kind = schemas.kind_of(type(command))
        try:
            done = await self._run(command)
        except (MembershipError, RuntimeError) as exc:
            log.warning("refused %s: %s", kind, exc, extra={"command_id": command.command_id})
            return False, str(exc)
        if done is None:
            return await super().execute(command)
        log.info("%s done: %s", kind, done, extra={"command_id": command.command_id})
        return True, done

    async def _run(self, command: schemas.Command) -> str | None:
        backend = self.backend
        if backend.membership is not None:
            await self._withdraw_addresses(backend.membership.newly_failed(command))
        if isinstance(command, (schemas.Restart, schemas.HotSwap, schemas.ScaleTo)):
            backend.roll_back_before(command.restore_before_step)
        if isinstance(command, schemas.Restart) and command.skip_steps is not None:
            backend.skip_data(command.skip_steps)
        match command:
            case schemas.StartJob():
                return await backend.start_job(command)
            case schemas.Restart():
                return await backend.restart(command.reason, command.reset_gpus, command.standbys)
            case schemas.RestartInProcess():
                return await backend.restart_in_process(
                    command.reason, command.deadline_s, command.standbys
                )
            case schemas.HotSwap():
                return await backend.hot_swap(
                    command.failed_node, command.spare_node, command.reason, command.standbys
                )
            case schemas.ScaleTo():
                return await backend.scale_to(
                    command.nodes, command.drop_nodes, command.reason, command.standbys
                )
            case schemas.ReturnNode():
                return await backend.return_node(command.node)
            case schemas.Stop():
                return await backend.stop(command.reason)
        return None

    async def _withdraw_addresses(self, nodes: list[str]) -> None:
        """Before the relaunch (whose restores choose sources): failed nodes hold nothing
        for the checkpoint tiers, so their address records leave the index now, not when
        the node TTL expires. A failure is logged, not raised: the TTL is the backstop. All at
        once: a bus that does not answer delays the relaunch by one timeout, not one a node."""
        assert self.bus is not None
        index = CheckpointIndex(self.bus, self.job)

        async def withdraw(node: str) -> None:
            try:
                await asyncio.wait_for(index.withdraw_node(node), WITHDRAW_TIMEOUT_S)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("address of failed node %s not withdrawn: %r", node, exc)
                return
            log.info("failed node's address withdrawn from the checkpoint index: %s", node)

        await asyncio.gather(*(withdraw(node) for node in nodes))

    def command_fence(self, command: schemas.Command) -> str:
        """The run, attempt and state of the job: a restart begun by an actuator that died
        before recording it is not run again once the attempt it replaced is gone."""
        backend = self.backend
        return f"run {backend.run_id or '-'} attempt {backend.attempt} {backend.state}"

    def health(self) -> tuple[bool, str]:
        return True, f"job {self.backend.state}, attempt {self.backend.attempt}"

    async def on_stop(self) -> None:
        await self.backend.shutdown()


SERVICE = ActuatorService
