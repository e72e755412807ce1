"""The actuator's options (``[options]`` of its config file, ``--set KEY=VALUE``)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ActuatorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    backend: Literal["local", "agent", "kubernetes"] = "local"
    #: how long a pre-launch restore (RestoreToNode) may take; 0 turns them off (no checkpoint
    #: tier runs, e.g. a shared filesystem)
    restore_timeout_s: float = 120.0
    #: how long to wait for a host monitor's GPU reset (it bounds its own, 60 s by default)
    gpu_reset_timeout_s: float = 90.0
    #: the kubernetes backend's table, checked by that backend (``KubernetesOptions``): its
    #: client is slow to import and only that backend needs it
    kubernetes: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.restore_timeout_s < 0:
            raise ValueError("restore_timeout_s must not be negative")
        if self.gpu_reset_timeout_s <= 0:
            raise ValueError("gpu_reset_timeout_s must be positive")
