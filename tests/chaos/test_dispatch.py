"""The chaos dispatch table: every fault kind has its implementation, which is handed only
faults of its own kind (the table's entries are checked by the type checker, this at run time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.tools.chaos import actions
from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.targets import ChaosContext


def test_every_fault_kind_has_an_implementation() -> None:
    assert set(actions._IMPLEMENTATIONS) == set(faults.FAULT_TYPES)


def test_an_implementation_refuses_a_fault_of_another_kind(tmp_path: Path) -> None:
    ctx = ChaosContext.open(tmp_path)  # no stack there: nothing is reached before the refusal
    kill_rank = actions._IMPLEMENTATIONS[faults.KillRank]
    with pytest.raises(TypeError, match="the kill-rank action got a fail-node"):
        kill_rank(faults.FailNode(node="node-0"), ctx)
