"""The in-process restart's timeouts, in one struct whose order is checked when it is built.

A warm restart crosses three processes' clocks. A rank leaves its broken group within
``abort_s``; the actuator waits ``rejoin_deadline_s`` (``RestartInProcess.deadline_s``) for
every rank to answer its ``Rejoin``; the new group's collectives give up after ``group_s``.
Each bound must sit inside the next: an abort that outlasts the actuator's deadline fails the
warm restart without its reason, and a group timeout under that deadline fails the survivors
waiting on a rank the actuator is still bringing back. A rank whose step failed waits
``rejoin_wait_s`` for the ``Rejoin`` (detection, decision and the actuator's preparation come
first), then exits for a cold restart.
"""

from __future__ import annotations

import msgspec


class WarmPathError(ValueError):
    """The timeouts are out of order (the message says which and why)."""


class WarmPathTimeouts(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: a rank leaving its broken process group
    abort_s: float = 10.0
    #: the actuator waiting for every rank's RankRejoined
    rejoin_deadline_s: float = 30.0
    #: a rank whose step failed waiting for the Rejoin
    rejoin_wait_s: float = 60.0
    #: a collective of the (new) process group that neither completes nor fails
    group_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.abort_s < self.rejoin_deadline_s < self.group_s:
            raise WarmPathError(
                f"warm-path timeouts out of order: need 0 < abort ({self.abort_s:g} s) < "
                f"rejoin deadline ({self.rejoin_deadline_s:g} s) < group timeout "
                f"({self.group_s:g} s), or a warm restart fails without its reason or "
                "before the actuator has brought every rank back"
            )
        if self.rejoin_wait_s <= 0:
            raise WarmPathError(f"rejoin wait must be positive, not {self.rejoin_wait_s:g} s")


#: the timeouts every part uses unless a job sets its own
WARM_PATH = WarmPathTimeouts()
