"""The partition: every instant has exactly one owner, the strongest claim's."""

from __future__ import annotations

import pytest

from goodput.measure.accounting import categories as c
from goodput.measure.accounting.intervals import WORK, Claim, partition


def owners(pieces) -> list[tuple[float, float, object]]:
    return [(p.start, p.end, p.owner) for p in pieces]


def test_unclaimed_time_is_job_down() -> None:
    pieces = partition([Claim(2, 4, WORK, 0)], 0, 6)
    assert owners(pieces) == [(0, 2, c.JOB_DOWN), (2, 4, 0), (4, 6, c.JOB_DOWN)]


def test_stronger_claim_wins_and_weaker_resumes_after_it() -> None:
    claims = [
        Claim(0, 10, c.PROGRAM_STARTUP, c.PROGRAM_STARTUP),
        Claim(3, 5, c.CHECKPOINT_RESTORE, c.CHECKPOINT_RESTORE),
        Claim(4, 8, c.RESTART, c.RESTART),
    ]
    assert owners(partition(claims, 0, 10)) == [
        (0, 3, c.PROGRAM_STARTUP),
        (3, 5, c.CHECKPOINT_RESTORE),
        (5, 8, c.RESTART),
        (8, 10, c.PROGRAM_STARTUP),
    ]


def test_claims_are_clipped_to_the_window_and_lengths_add_up() -> None:
    claims = [
        Claim(-5, 1, WORK, 0),
        Claim(0.5, 2, c.CHECKPOINT_SAVE, c.CHECKPOINT_SAVE),
        Claim(9, 20, WORK, 1),
    ]
    pieces = partition(claims, 0, 10)
    assert pieces[0].start == 0 and pieces[-1].end == 10
    assert sum(p.length for p in pieces) == pytest.approx(10)
    assert owners(pieces)[-1] == (9, 10, 1)


def test_empty_and_inverted_claims_own_nothing() -> None:
    pieces = partition([Claim(5, 5, WORK, 0), Claim(7, 6, WORK, 1)], 0, 10)
    assert owners(pieces) == [(0, 10, c.JOB_DOWN)]


def test_adjacent_pieces_of_the_same_owner_merge() -> None:
    pieces = partition([Claim(0, 2, c.RESTART, c.RESTART), Claim(2, 4, c.RESTART, c.RESTART)], 0, 4)
    assert owners(pieces) == [(0, 4, c.RESTART)]
