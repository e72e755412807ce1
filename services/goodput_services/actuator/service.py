"""The actuator service process."""

from __future__ import annotations

from goodput_services.base import Service


class ActuatorService(Service):
    name = "actuator"


SERVICE = ActuatorService
