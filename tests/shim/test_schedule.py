"""The checkpoint schedule: ranks that receive commands at different steps save the same steps."""

from __future__ import annotations

from goodput.shim.schedule import CheckpointSchedule, IntervalChange, checkpoint_due


def due_steps(changes: list[IntervalChange], last: int) -> list[int]:
    return [step for step in range(1, last + 1) if checkpoint_due(step, changes)]


def test_the_initial_interval_gives_its_multiples():
    assert due_steps([IntervalChange(0, 10)], 35) == [10, 20, 30]


def test_a_change_counts_from_the_step_it_was_made_at():
    changes = [IntervalChange(0, 10), IntervalChange(20, 7)]
    assert due_steps(changes, 40) == [10, 20, 27, 34]


def test_an_interval_of_zero_saves_nothing():
    assert due_steps([IntervalChange(0, 10), IntervalChange(10, 0)], 40) == [10]


def run_ranks(
    received: list[dict[int, tuple[str, int]]], last: int, every_steps: int = 10
) -> tuple[list[list[int]], list[CheckpointSchedule]]:
    """Drive one schedule per rank through steps 1..last; ``received[r][step]``: the command
    rank r receives just before that step (("interval", ts·every) or ("now", 0)). At
    agreement steps the ballots are reduced with MIN, as the all-reduce does."""
    ranks = [CheckpointSchedule(every_steps) for _ in received]
    saved: list[list[int]] = [[] for _ in received]
    for step in range(1, last + 1):
        for schedule, commands in zip(ranks, received, strict=True):
            if step in commands:
                what, value = commands[step]
                if what == "interval":
                    schedule.receive_interval(ts=value // 1000, every_steps=value % 1000)
                else:
                    schedule.request_now()
        if ranks[0].is_agreement_step(step, solo=False):
            ballots = [schedule.vote() for schedule in ranks]
            reduced = [min(column) for column in zip(*ballots, strict=True)]
            decisions = [schedule.decide(step, reduced) for schedule in ranks]
        else:
            decisions = [schedule.decide(step) for schedule in ranks]
        for steps, due in zip(saved, decisions, strict=True):
            if due:
                steps.append(step)
    return saved, ranks


def test_ranks_receiving_an_interval_at_different_steps_save_the_same_steps():
    # rank 0 gets "every 7" (ts 5) at step 12, rank 1 only at step 25: on receipt they would
    # diverge from step 12 on; agreed, both switch after the vote at step 30
    saved, ranks = run_ranks([{12: ("interval", 5007)}, {25: ("interval", 5007)}], 60)
    assert saved[0] == saved[1] == [10, 20, 30, 37, 44, 51, 58]
    assert [r.every_steps for r in ranks] == [7, 7]


def test_a_newer_interval_in_flight_postpones_agreement_and_the_newest_wins():
    # both hold "every 7" (ts 5) by step 20, but rank 0 also holds "every 4" (ts 6) then:
    # the ranks' newest differ, so nothing changes until both hold ts 6
    received = [
        {15: ("interval", 5007), 18: ("interval", 6004)},
        {19: ("interval", 5007), 33: ("interval", 6004)},
    ]
    saved, _ = run_ranks(received, 50)
    assert saved[0] == saved[1] == [10, 20, 30, 40, 44, 48]


def test_a_checkpoint_request_is_honoured_by_every_rank_at_the_same_step():
    # only rank 1 is asked, at step 13: both save at the next vote (step 20), then on schedule
    saved, _ = run_ranks([{}, {13: ("now", 0)}], 40, every_steps=25)
    assert saved[0] == saved[1] == [20, 25]


def test_a_rank_alone_applies_what_it_receives_at_once():
    schedule = CheckpointSchedule(10)
    schedule.receive_interval(ts=1, every_steps=3)
    assert schedule.is_agreement_step(4, solo=True)
    assert schedule.decide(4, schedule.vote()) is False
    assert [s for s in range(5, 12) if schedule.decide(s, schedule.vote())] == [7, 10]
    schedule.request_now()
    assert schedule.decide(11, schedule.vote()) is True


def test_a_redelivered_command_changes_nothing_and_the_last_received_wins():
    schedule = CheckpointSchedule(10)
    schedule.receive_interval(ts=9, every_steps=5)
    schedule.decide(1, schedule.vote())
    schedule.receive_interval(ts=9, every_steps=5)  # redelivered
    schedule.decide(2, schedule.vote())
    assert schedule.changes == [IntervalChange(0, 10), IntervalChange(1, 5)]
    # a standby controller's clock may lag: what arrives last is still the newest word
    schedule.receive_interval(ts=3, every_steps=2)
    schedule.decide(3, schedule.vote())
    assert schedule.changes[-1] == IntervalChange(3, 2)
