"""The replicator service process."""

from __future__ import annotations

from goodput_services.base import Service


class ReplicatorService(Service):
    name = "replicator"


SERVICE = ReplicatorService
