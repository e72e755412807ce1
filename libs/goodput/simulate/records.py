"""The simulated clock's units and what the simulator keeps per rank the sensor follows."""

from __future__ import annotations

from dataclasses import dataclass

NS = 1_000_000_000
#: the simulated clock's origin (epoch ns): the sensor treats 0 as "never"
T0 = 1_700_000_000 * NS


@dataclass(slots=True)
class FedRank:
    """A rank the sensor knows of: what the simulator keeps sending for it."""

    node: str
    heartbeating: bool = True
    stepping: bool = True
    busy: str = ""
    last_beat: int = 0
    compute_factor: float = 1.0
