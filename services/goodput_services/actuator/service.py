"""The actuator service process: executes remediation commands on a backend."""

from __future__ import annotations

import logging
from pathlib import Path

from goodput import schemas, subjects
from goodput.config import ServiceConfig
from goodput_services.actuator.local_backend import LocalBackend
from goodput_services.actuator.membership import MembershipError
from goodput_services.base import Service

log = logging.getLogger(__name__)


class ActuatorService(Service):
    name = "actuator"
    command_target = subjects.ACTUATOR

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        backend = config.options.get("backend", "local")
        if backend != "local":
            raise SystemExit(f"unknown actuator backend {backend!r}; this build supports: local")
        self.backend = LocalBackend(
            job=self.job,
            state_dir=Path(config.state_dir),
            bus_url=config.bus.url,
            emit=self._emit,
        )

    async def _emit(self, event: schemas.Event) -> None:
        assert self.bus is not None
        await self.bus.emit(event)
        if isinstance(event, schemas.JobStatus):
            kv = await self.bus.kv(subjects.STATE_BUCKET)
            await kv.put(subjects.kv_key(self.job, "job_status"), schemas.encode(event))

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        backend = self.backend
        try:
            match command:
                case schemas.StartJob():
                    return True, await backend.start_job(command)
                case schemas.Restart():
                    return True, await backend.restart(command.reason)
                case schemas.HotSwap():
                    return True, await backend.hot_swap(
                        command.failed_node, command.spare_node, command.reason
                    )
                case schemas.ScaleTo():
                    return True, await backend.scale_to(
                        command.nodes, command.drop_nodes, command.reason
                    )
                case schemas.ReturnNode():
                    return True, await backend.return_node(command.node)
                case schemas.Stop():
                    return True, await backend.stop(command.reason)
        except (MembershipError, RuntimeError) as exc:
            return False, str(exc)
        return await super().execute(command)

    def health(self) -> tuple[bool, str]:
        return True, f"job {self.backend.state}, attempt {self.backend.attempt}"

    async def on_stop(self) -> None:
        await self.backend.shutdown()


SERVICE = ActuatorService
