"""The scenario's straggler lasts long enough to be judged however loaded the machine is: a
straggler is judged over steps, and 60 s of a 4x slower rank is 75 steps on an idle machine
but 10 at the steps of 1.5 s a loaded one gives (the baseline of a loaded clean-clone demo
never had it signalled)."""

from __future__ import annotations

from goodput.demo.scenarios import SCENARIOS, DemoFault
from goodput.schemas import StepDone
from goodput.stack.watch import JobWatcher


def _straggler() -> DemoFault:
    return next(f for f in SCENARIOS["full"].faults if f.action == "slow-rank")


def test_the_straggler_lasts_its_seconds_or_its_steps_whichever_is_longer() -> None:
    fault = _straggler()
    assert fault.slow_for_s(0.2) == fault.duration_s == 60.0  # idle: 75 slowed steps
    assert fault.slow_for_s(1.5) == fault.min_slow_steps * fault.factor * 1.5 == 180.0


def _step(rank: int, step: int, seconds: float) -> StepDone:
    return StepDone(
        job="demo", node="n", rank=rank, step=step, step_time_s=seconds, tokens=1, loss=1.0
    )


def test_the_watcher_knows_the_jobs_pace_from_rank_zeros_steps() -> None:
    watcher = JobWatcher(bus=None, job="demo", total_steps=100)  # type: ignore[arg-type]
    assert watcher.step_time_s() == 0.0
    for step, seconds in enumerate([0.2, 9.0, 0.3, 0.25], start=1):
        watcher._apply(_step(0, step, seconds))
    watcher._apply(_step(1, 4, 50.0))
    assert watcher.step_time_s() == 0.275  # the median of rank 0's: one slow step moves it little
