"""torchdata's ``StatefulDataLoader`` through the plain loop: a resume mid-epoch goes on exactly
where each rank's loader stood, with two ranks on one node sharing its checkpoint (their
positions differ: each is kept, not the first rank's for both), and a node whose ranks have
no process group to gather their positions is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.extras import require
from tests.integrations.harness import assert_identical

require("torchdata")

from goodput.integrations.loop import SupervisedLoop  # noqa: E402
from goodput.shim import ShimConfig, TrainerShim  # noqa: E402
from goodput.shim.data_position import DataPositionError  # noqa: E402
from tests.integrations.harness import Indexed  # noqa: E402
from tests.integrations.stateful_loader_rank import (  # noqa: E402
    PLAN,
    STOP_AFTER,
    StatefulDataLoader,
    run_node,
)


@pytest.mark.timeout(300)
def test_each_rank_of_a_node_resumes_mid_epoch_where_its_own_loader_stood(tmp_path: Path) -> None:
    ranks = run_node(tmp_path)
    for outcome in ranks:
        assert outcome["restored"] == STOP_AFTER
        assert outcome["first_seen"] + outcome["resumed_seen"] == outcome["reference_seen"]
        # the model, optimizer, RNG and every rank's loader position, bit for bit
        assert_identical(outcome["resumed_state"], outcome["reference_state"])
    # the ranks really stood at different places: one rank's position would not do for both
    assert ranks[0]["reference_seen"] != ranks[1]["reference_seen"]


def test_a_stateful_loader_on_a_node_of_ranks_without_a_group_is_refused(tmp_path: Path) -> None:
    shim = TrainerShim(
        ShimConfig(ckpt_dir=str(tmp_path), world_size=2, local_world_size=2),
        install_signal_handlers=False,
    )
    loader = StatefulDataLoader(Indexed(), batch_size=PLAN.micro_batch)
    loop = SupervisedLoop(shim=shim, plan=PLAN, data=loader)
    assert loop.restore() is None  # a fresh start: nothing saved yet
    with pytest.raises(DataPositionError, match="needs the default process group"):
        loop.state()  # what every checkpoint saves
    shim.engine.close()
