"""The controller service process."""

from __future__ import annotations

from goodput_services.base import Service


class ControllerService(Service):
    name = "controller"


SERVICE = ControllerService
