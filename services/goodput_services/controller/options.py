"""The controller's options (``[options]`` of its config file, ``--set KEY=VALUE``)."""

from __future__ import annotations

import msgspec

from goodput.supervisor.control.engine import ControllerSettings


class ControllerOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: the user's policy script (empty: the built-in policy); it must load at start-up
    policy: str = ""
    settings: ControllerSettings = msgspec.field(default_factory=ControllerSettings)
    #: the leader lease's time to live: a dead leader is replaced after about this long
    lease_ttl_s: float = 3.0
    #: nodes per data-parallel replica, until the actuator's job status says otherwise
    num_nodes_per_dp: int = 1
    #: fault injection for failover tests: hold a decision between storing and sending it
    inject_pause_before_send_s: float = 0.0

    def __post_init__(self) -> None:
        if self.lease_ttl_s <= 0:
            raise ValueError("lease_ttl_s must be positive")
        if self.num_nodes_per_dp < 1:
            raise ValueError("num_nodes_per_dp must be at least 1")
