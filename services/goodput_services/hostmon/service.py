"""The host monitor service process (one per node)."""

from __future__ import annotations

from goodput_services.base import Service


class HostMonitorService(Service):
    name = "hostmon"


SERVICE = HostMonitorService
