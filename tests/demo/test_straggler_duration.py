"""The scenario's straggler lasts long enough to be judged however loaded the machine is, or
its pace changes while it lasts: a straggler is judged over steps, and 60 s of a 3x slower
rank is 100 steps on an idle machine but 13 at the steps of 1.5 s a loaded one gives (a
clean-clone CI demo once had its straggler end unjudged after its slowdown was sized in
seconds from the pace before it fired)."""

from __future__ import annotations

from goodput.supervisor.detect.thresholds import Thresholds
from goodput.tools.demo.scenarios import SCENARIOS, DemoFault


def _straggler() -> DemoFault:
    return next(f for f in SCENARIOS["full"].faults if f.action == "slow-rank")


def test_the_straggler_lasts_its_seconds_and_its_steps() -> None:
    fault = _straggler()
    assert (fault.duration_s, fault.min_slow_steps) == (60.0, 30)
    assert not fault.slow_played(slowed_s=59.0, slowed_steps=100, flagged=True)  # idle
    assert fault.slow_played(slowed_s=60.0, slowed_steps=100, flagged=True)
    assert not fault.slow_played(slowed_s=180.0, slowed_steps=29, flagged=True)  # loaded
    assert fault.slow_played(slowed_s=180.0, slowed_steps=30, flagged=True)
    # the detector needs more than half of its window slowed, with room to spare
    assert fault.min_slow_steps > Thresholds().straggler_window // 2 + 1


def test_an_unflagged_straggler_lasts_on_until_its_cap() -> None:
    """On a loaded machine the peer a straggler is measured against is slowed too, and the
    ratio can take longer than the fault's seconds and steps to be judged."""
    fault = _straggler()
    assert not fault.slow_played(slowed_s=60.0, slowed_steps=100, flagged=False)
    assert not fault.slow_played(
        slowed_s=fault.unflagged_cap_s - 1, slowed_steps=500, flagged=False
    )
    assert fault.slow_played(slowed_s=fault.unflagged_cap_s, slowed_steps=500, flagged=False)
    # room for several of the detector's holds past the played length
    assert fault.unflagged_cap_s >= fault.duration_s + 4 * Thresholds().straggler_hold_s
