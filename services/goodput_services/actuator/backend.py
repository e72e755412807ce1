"""What the actuator service needs from a backend, and how it picks one by name.

The service only speaks this protocol, so the local backend (processes on this machine) and
the Kubernetes backend (one pod per rank) are interchangeable behind the same commands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from goodput import schemas
from goodput_services.actuator.membership import Membership

EventSink = Callable[[schemas.Event], Awaitable[None]]
#: fills a node's local volume with the newest complete checkpoint; returns what it did
NodePreparer = Callable[[str], Awaitable[str]]

BACKENDS = ("local", "kubernetes")


@runtime_checkable
class Backend(Protocol):
    """Runs one job's worker group and reports every change as an event."""

    state: str
    attempt: int
    membership: Membership | None
    prepare_node: NodePreparer | None

    async def start_job(self, spec: schemas.StartJob) -> str: ...

    async def restart(self, reason: str) -> str: ...

    async def hot_swap(self, failed: str, spare: str, reason: str) -> str: ...

    async def scale_to(self, nodes: list[str], drop: list[str], reason: str) -> str: ...

    async def return_node(self, node: str) -> str: ...

    async def stop(self, reason: str) -> str: ...

    async def shutdown(self) -> None: ...

    def status(self, detail: str = "") -> schemas.JobStatus: ...


def create_backend(
    name: str,
    *,
    job: str,
    state_dir: Path,
    bus_url: str,
    emit: EventSink,
    options: dict[str, Any],
) -> Backend:
    """The backend called ``name``; an unknown name stops the service with the choices."""
    if name == "local":
        from goodput_services.actuator.local_backend import LocalBackend

        return LocalBackend(job=job, state_dir=state_dir, bus_url=bus_url, emit=emit)
    if name == "kubernetes":
        # imported here: the kubernetes client is slow to import and only this backend needs it
        from goodput_services.actuator.kubernetes_backend import (
            KubernetesBackend,
            KubernetesOptions,
        )

        settings = KubernetesOptions.from_mapping(options.get("kubernetes", {}))
        return KubernetesBackend.connect(job=job, bus_url=bus_url, emit=emit, options=settings)
    raise SystemExit(f"unknown actuator backend {name!r}; choose one of: {', '.join(BACKENDS)}")
