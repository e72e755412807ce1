"""The restore agreement's decision (pure), and its one-process path (no group: no collective).
Two real ranks disagreeing are in test_unfilled_volume.py and tests/ckpt/test_ckpt_parts.py."""

from __future__ import annotations

import pytest

from goodput.checkpoint.engine import NoCheckpointError
from goodput.checkpoint.engine.events import RestoreFallback
from goodput.shim.restore_agreement import Agreed, Refuse, Retry, judge, restore_agreed
from goodput.shim.restore_result import UnrestorableCheckpointError


def test_every_rank_on_one_step_is_agreed() -> None:
    assert judge(10, 10, 10) == Agreed(10)
    assert judge(10, 5, 5) == Agreed(5)  # every rank fell back to the same older step


def test_ranks_on_different_steps_all_restore_the_smallest_again() -> None:
    assert judge(10, 5, 10) == Retry(5)


def test_a_rank_with_nothing_refuses_on_every_rank() -> None:
    verdict = judge(10, None, 10)
    assert isinstance(verdict, Refuse) and "at or before step 10" in verdict.reason
    assert isinstance(judge(10, None, None), Refuse)


def test_alone_a_fresh_start_when_nothing_is_held_and_the_newest_intact_otherwise() -> None:
    def load(step: int) -> tuple[int, str, str]:
        return step - 1, "state", "local"  # the newest at or before ``step`` is older

    assert restore_agreed(None, load, rank=0, where="/v") is None
    assert restore_agreed(7, load, rank=0, where="/v") == (6, "state", "local")


def test_alone_nothing_restorable_refuses_in_one_line_naming_each_step() -> None:
    def load(step: int) -> tuple[int, str, str]:
        fallbacks = (RestoreFallback(step=7, reason="data-0.bin: checksum"),)
        raise NoCheckpointError("no intact checkpoint under /v at or before step 7", fallbacks)

    with pytest.raises(UnrestorableCheckpointError) as raised:
        restore_agreed(7, load, rank=3, where="/v")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("rank 3: no intact checkpoint under /v at or before step 7; ")
    assert "step 7: data-0.bin: checksum" in message and "refusing to start over" in message
