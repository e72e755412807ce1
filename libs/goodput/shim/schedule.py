"""Which steps a rank checkpoints: the same steps on every rank of a job.

Ranks restore the newest checkpoint that *every* rank holds, so a rank that checkpoints other
steps than its peers makes the whole job fall back. Commands that change the schedule
(``SetCheckpointInterval``, ``CheckpointNow``) reach each rank over its own subscription, at
whatever step that rank happens to be at; applied on receipt they would make ranks diverge.
So a command only takes effect once every rank holds it, and that is established by a vote
at *agreement steps* — multiples of ``agree_every``, a step every rank can compute without
any command — where the ranks all-reduce (MIN) what :meth:`CheckpointSchedule.vote` returns:

* the last interval command each received (its ``ts``, and ``-ts`` so that MIN also yields
  the maximum): when minimum and maximum are equal, every rank holds that same command, and from
  the step after the vote its interval is in force on every rank; otherwise a rank has not
  received it yet and the vote is repeated at the next agreement step (nothing diverges);
* whether any rank was asked for a checkpoint now: then every rank checkpoints this step.

Which steps are due is then a pure function of the step and the agreed changes
(:func:`checkpoint_due`). A rank without peers agrees with itself at every step.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

#: steps between agreement votes: how long a command may wait before it takes effect
AGREE_EVERY = 10


class IntervalChange(msgspec.Struct, frozen=True):
    """From the step after ``after_step`` on, checkpoint every ``every_steps`` steps."""

    after_step: int
    every_steps: int


def checkpoint_due(step: int, changes: Sequence[IntervalChange]) -> bool:
    """Whether ``step`` is a checkpoint step under ``changes`` (sorted by ``after_step``).

    The change in force at ``step`` is the last one made before it; its steps are counted from
    the step it was made at, so the initial change ``(0, k)`` gives the multiples of ``k``.
    An interval of 0 disables scheduled checkpoints.
    """
    in_force = None
    for change in changes:
        if change.after_step >= step:
            break
        in_force = change
    if in_force is None or in_force.every_steps <= 0:
        return False
    return (step - in_force.after_step) % in_force.every_steps == 0


class CheckpointSchedule:
    """One rank's schedule: the agreed changes, and the commands received but not agreed yet.

    ``receive_interval`` and ``request_now`` may be called from another thread than ``vote``
    and ``decide`` only under a lock the caller holds (the shim does).
    """

    def __init__(self, every_steps: int, agree_every: int = AGREE_EVERY):
        self.changes: list[IntervalChange] = [IntervalChange(0, every_steps)]
        self.agree_every = agree_every
        self._newest: tuple[int, int] = (0, every_steps)  # (command ts, interval) received
        self._agreed_ts = 0
        self._now_requested = False
        self._voted: tuple[int, int] | None = None

    @property
    def every_steps(self) -> int:
        """The interval in force after the newest agreed change."""
        return self.changes[-1].every_steps

    def receive_interval(self, ts: int, every_steps: int) -> None:
        """A ``SetCheckpointInterval`` arrived; the last one received is put to the vote.

        Every rank reads the same stream, so arrival order is the order commands were sent
        (``ts`` is only their name: a standby controller's clock may lag the old leader's)."""
        if ts not in (self._newest[0], self._agreed_ts):  # not a redelivery
            self._newest = (ts, every_steps)

    def request_now(self) -> None:
        self._now_requested = True

    def is_agreement_step(self, step: int, solo: bool) -> bool:
        return solo or (self.agree_every > 0 and step % self.agree_every == 0)

    def vote(self) -> list[int]:
        """This rank's ballot for the MIN all-reduce; consumes a pending checkpoint request."""
        self._voted = self._newest
        now, self._now_requested = self._now_requested, False
        return [self._voted[0], -self._voted[0], -int(now)]

    def decide(self, step: int, ballot: Sequence[int] | None = None) -> bool:
        """Whether to checkpoint ``step``; ``ballot``: the reduced votes at an agreement step."""
        now = False
        if ballot is not None:
            assert self._voted is not None, "decide with a ballot follows this rank's vote"
            newest, oldest = ballot[0], -ballot[1]
            ts, every_steps = self._voted
            if newest == oldest == ts and ts not in (0, self._agreed_ts):
                self._agreed_ts = ts
                if every_steps != self.every_steps:
                    # steps only grow within a process: older changes are never in force again
                    self.changes = [self.changes[-1], IntervalChange(step, every_steps)]
            now = ballot[2] < 0
            self._voted = None
        return now or checkpoint_due(step, self.changes)
