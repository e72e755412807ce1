"""How the ranks of a job are arranged: the layout a checkpoint records about itself.

Its own module because two owners build on it: the rescale callbacks compare the saved layout
with the new one (``rescale``), and a restore reads the saved one back out of the checkpoint
(``restore_result``), which then runs those callbacks.
"""

from __future__ import annotations

import msgspec


class DpLayout(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the ranks of a job are arranged: what a checkpoint was saved under."""

    world_size: int
    #: data-parallel size: how many ranks share one global batch (``world_size`` divided by
    #: the model-parallel size); the rescale callbacks compare this one
    dp_size: int
    #: ranks per node (they split one node's checkpoint files among them)
    procs_per_node: int = 1
    #: nodes one model replica spans (``goodput run --nodes-per-dp``)
    num_nodes_per_dp: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.dp_size < 1 or self.world_size % self.dp_size:
            raise ValueError(
                f"data-parallel size {self.dp_size} does not divide world size {self.world_size}"
            )
