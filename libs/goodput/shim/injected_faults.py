"""The chaos faults a rank obeys when fault injection is on (``InjectFault``): "hang" blocks the
training loop (heartbeats go on), "slow" stretches the rank's compute for a while (a straggler).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from goodput import schemas

if TYPE_CHECKING:
    from goodput.shim.config import ShimConfig

log = logging.getLogger(__name__)


class InjectedFaults:
    """The faults injected into this rank, as the training loop reads them."""

    def __init__(self, config: ShimConfig):
        #: the shim's own config, read when a command comes (the rank it targets, whether on)
        self._config = config
        #: set: the training loop hangs at its next step
        self.hang = threading.Event()
        #: an injected straggler: (compute factor, monotonic end or None for until cleared)
        self._slowdown: tuple[float, float | None] = (1.0, None)

    def apply(self, command: schemas.InjectFault) -> None:
        """Take a "hang" or "slow" fault meant for this rank (others are ignored, and said so
        when injection is off)."""
        if not self._targets_me(command):
            return
        if command.fault == "hang":
            self.hang.set()
        else:
            factor = 1.0 if command.clear else command.factor
            until = time.monotonic() + command.duration_s if command.duration_s else None
            self._slowdown = (factor, until)
            log.warning("injected fault: compute %g× as long (%s)", factor, command.reason)

    def compute_slowdown(self) -> float:
        """The injected straggler's factor while it lasts, else 1.0."""
        factor, until = self._slowdown
        if until is not None and time.monotonic() >= until:
            return 1.0
        return factor

    def _targets_me(self, command: schemas.InjectFault) -> bool:
        if not self._config.enable_fault_injection:
            log.warning("ignoring InjectFault %s: fault injection is not enabled", command.fault)
            return False
        if command.node and command.node != self._config.node:
            return False
        return not command.detail or command.detail == str(self._config.rank)
