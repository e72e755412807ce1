"""The chaos faults a rank obeys when fault injection is on (``InjectFault`` on the trainer's
subject), and the one list of them (:data:`RankFaultKind`):

* "hang" blocks the training loop (heartbeats go on);
* "slow" stretches the rank's compute for a while (a straggler);
* "nan", "sdc" and "loss-spike" are numerical faults (issue 39), applied at the next step
  boundary (:meth:`InjectedFaults.at_step_boundary`, after the optimizer step, before the
  numerics monitor sees the step): "nan" makes the loss the monitor sees non-finite, as a
  diverging step's would be; "loss-spike" multiplies it by ``InjectFault.factor``, as a
  poisoned batch's would be (the training itself is unchanged: the detectors and the rollback
  are what is exercised); "sdc" flips one bit of one parameter in place, a silent data
  corruption of this replica that trains on (:data:`SDC_ELEMENT`, :func:`sdc_bit`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal, get_args

import torch

from goodput import schemas
from goodput.checkpoint.engine.sharded_save import is_dtensor

if TYPE_CHECKING:
    from goodput.shim.config import ShimConfig

log = logging.getLogger(__name__)

#: every fault a rank's shim obeys (``InjectFault.fault`` sent to the trainer)
RankFaultKind = Literal["hang", "slow", "nan", "sdc", "loss-spike"]
RANK_FAULT_KINDS: tuple[str, ...] = get_args(RankFaultKind)
#: "sdc": the element of the first floating-point parameter whose bit flips
SDC_ELEMENT = 0
#: "loss-spike" without a factor (``InjectFault.factor`` 1): the loss seen is this many times
DEFAULT_SPIKE_FACTOR = 10.0
_WORDS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def sdc_bit(dtype: torch.dtype) -> int:
    """The bit "sdc" flips in an element of ``dtype``: its mantissa's top bit (22 for float32,
    6 for bfloat16, 9 for float16). The value moves by up to half of itself and stays finite,
    so the loss goes on looking healthy: only the replicas' fingerprints can tell."""
    return round(-math.log2(torch.finfo(dtype).eps)) - 1


def flip_bit(parameters: Iterable[torch.Tensor]) -> str:
    """Flip :func:`sdc_bit` of element :data:`SDC_ELEMENT` of the first floating-point,
    contiguous, non-empty parameter (of a DTensor's, its local shard: this replica's copy of
    it under HSDP), in place; what was flipped ("" when none qualifies)."""
    for index, held in enumerate(parameters):
        parameter = held.to_local() if is_dtensor(held) else held
        if (
            not parameter.is_floating_point()
            or not parameter.is_contiguous()
            or parameter.numel() <= SDC_ELEMENT
            or parameter.element_size() not in _WORDS
        ):
            continue
        bit = sdc_bit(parameter.dtype)
        words = parameter.detach().view(-1).view(_WORDS[parameter.element_size()])
        words[SDC_ELEMENT : SDC_ELEMENT + 1].bitwise_xor_(1 << bit)
        return f"bit {bit} of element {SDC_ELEMENT} of parameter {index} ({parameter.dtype})"
    return ""


class InjectedFaults:
    """The faults injected into this rank, as the training loop reads them."""

    def __init__(self, config: ShimConfig):
        #: the shim's own config, read when a command comes (the rank it targets, whether on)
        self._config = config
        #: set: the training loop hangs at its next step
        self.hang = threading.Event()
        #: an injected straggler: (compute factor, monotonic end or None for until cleared)
        self._slowdown: tuple[float, float | None] = (1.0, None)
        #: numerical faults for the next step boundary (commands come on the bus link's thread)
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()

    def apply(self, command: schemas.InjectFault) -> None:
        """Take a fault meant for this rank (others are ignored, and said so when injection
        is off)."""
        if not self._targets_me(command):
            return
        if command.fault == "hang":
            self.hang.set()
        elif command.fault == "slow":
            factor = 1.0 if command.clear else command.factor
            until = time.monotonic() + command.duration_s if command.duration_s else None
            self._slowdown = (factor, until)
            log.warning("injected fault: compute %g× as long (%s)", factor, command.reason)
        elif command.fault in RANK_FAULT_KINDS:
            with self._lock:
                if command.clear:
                    self._pending.pop(command.fault, None)
                else:
                    self._pending[command.fault] = command.factor
            log.warning("injected fault: %s at the next step (%s)", command.fault, command.reason)
        else:
            log.warning("ignoring InjectFault %r: not a fault a rank knows", command.fault)

    def compute_slowdown(self) -> float:
        """The injected straggler's factor while it lasts, else 1.0."""
        factor, until = self._slowdown
        if until is not None and time.monotonic() >= until:
            return 1.0
        return factor

    def at_step_boundary(
        self,
        step: int,
        loss: torch.Tensor | float,
        parameters: Callable[[], Iterable[torch.Tensor]] | None,
    ) -> torch.Tensor | float:
        """Apply the numerical faults injected since the last step, once each: the loss the
        numerics monitor is to see for ``step`` ("nan", "loss-spike"); "sdc" flips a bit of
        ``parameters`` (after the optimizer step: this replica trains on with it)."""
        if not self._pending:
            return loss
        with self._lock:
            pending, self._pending = self._pending, {}
        if "sdc" in pending:
            flipped = flip_bit(parameters()) if parameters is not None else ""
            if flipped:
                log.error("injected fault at step %d: sdc, %s flipped", step, flipped)
            else:
                log.error("injected sdc at step %d not applied: no parameter to flip", step)
        if "loss-spike" in pending:
            factor = pending["loss-spike"] if pending["loss-spike"] > 1 else DEFAULT_SPIKE_FACTOR
            loss = loss * factor
            log.error("injected fault at step %d: loss-spike, loss × %g", step, factor)
        if "nan" in pending:
            loss = loss * math.nan
            log.error("injected fault at step %d: nan loss", step)
        return loss

    def _targets_me(self, command: schemas.InjectFault) -> bool:
        if not self._config.enable_fault_injection:
            log.warning("ignoring InjectFault %s: fault injection is not enabled", command.fault)
            return False
        if command.node and command.node != self._config.node:
            return False
        return not command.detail or command.detail == str(self._config.rank)
