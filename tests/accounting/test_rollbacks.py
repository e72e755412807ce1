"""Which rollback threw each piece of work away (`rollbacks.discarded_by`), against a brute
force reading of its definition."""

from __future__ import annotations

import random

import pytest

from goodput.measure.accounting.rollbacks import Discard, Work, discarded_by, kept


def _brute_force(work: list[Work], rollbacks: list[tuple[float, int]]) -> list[Discard | None]:
    """The definition, quadratically: the earliest later load or work whose step is at or
    before a piece's last step; a load ending with a piece of work counts as before it."""
    found: list[Discard | None] = []
    for i, piece in enumerate(work):
        later = [
            ((t, 0, r), Discard(by_rollback=True, index=r))
            for r, (t, step) in enumerate(rollbacks)
            if t > piece.end_s and step <= piece.last_step
        ] + [
            ((other.end_s, 1, j), Discard(by_rollback=False, index=j))
            for j, other in enumerate(work)
            if (other.end_s, j) > (piece.end_s, i) and other.first_step <= piece.last_step
        ]
        found.append(min(later, key=lambda pair: pair[0])[1] if later else None)
    return found


def test_the_first_rollback_past_a_step_threw_it_away_not_a_deeper_later_one() -> None:
    # steps 1-3, back to resume at step 3 (a load at 4), step 3 again, then back to resume at
    # step 2 (at 6): step 3's first execution was lost to the first rollback, not the second
    work = [Work(1, 1, 1), Work(2, 2, 2), Work(3, 3, 3), Work(5, 3, 3)]
    rollbacks = [(4.0, 3), (6.0, 2)]
    assert discarded_by(work, rollbacks) == [
        None,
        Discard(by_rollback=True, index=1),
        Discard(by_rollback=True, index=0),
        Discard(by_rollback=True, index=1),  # the re-execution: the second rollback's loss
    ]
    assert kept(work, rollbacks) == [True, False, False, False]


def test_a_restart_without_a_load_is_told_by_the_work_that_ran_the_steps_again() -> None:
    work = [Work(1, 1, 1), Work(2, 2, 2), Work(4, 2, 2), Work(5, 3, 3)]
    assert discarded_by(work, []) == [None, Discard(by_rollback=False, index=2), None, None]


def test_a_load_ending_with_a_step_is_before_it() -> None:
    assert discarded_by([Work(2, 5, 5)], [(2.0, 1)]) == [None]
    assert discarded_by([Work(2, 5, 5)], [(2.5, 1)]) == [Discard(by_rollback=True, index=0)]


@pytest.mark.parametrize("seed", range(20))
def test_random_histories_match_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    work = []
    for _ in range(rng.randint(0, 60)):
        first = rng.randint(0, 30)
        work.append(Work(float(rng.randint(0, 80)), first, first + rng.randint(0, 3)))
    rollbacks = [(float(rng.randint(0, 80)), rng.randint(0, 30)) for _ in range(rng.randint(0, 8))]
    assert discarded_by(work, rollbacks) == _brute_force(work, rollbacks)
