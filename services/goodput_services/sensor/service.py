"""The sensor service process."""

from __future__ import annotations

import logging

from goodput import schemas, subjects
from goodput_services.base import Service
from goodput_services.sensor.thresholds import Thresholds, updated

log = logging.getLogger(__name__)


class SensorService(Service):
    name = "sensor"
    command_target = subjects.SENSOR

    def __init__(self, config):
        super().__init__(config)
        self.thresholds = updated(Thresholds(), dict(config.options.get("thresholds", {})))

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        if isinstance(command, schemas.SetThresholds):
            try:
                self.thresholds = updated(self.thresholds, command.values)
            except ValueError as exc:
                return False, str(exc)
            log.info("thresholds changed", extra={"values": command.values})
            return True, f"thresholds now {self.thresholds}"
        return await super().execute(command)


SERVICE = SensorService
