"""When a service that exited on its own is started again: the one backoff for `goodput up`'s
keeper (``tools/stack/keeper.py``) and a node agent's daemons
(``supervisor/agent/daemons.py``).

Doubling from :data:`FIRST_DELAY_S`, capped at :data:`MAX_DELAY_S`, back to the first delay
once a run lasted :data:`STEADY_S`: a service crashing at start is not started in a tight
loop, and one that crashes once a day is back within a second.
"""

from __future__ import annotations

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
#: a service that ran this long before exiting starts the backoff from the first delay again
STEADY_S = 60.0


def restart_delay(restarts_in_a_row: int) -> float:
    """The backoff before the next start: doubling from :data:`FIRST_DELAY_S`, capped."""
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** min(restarts_in_a_row, 16))


def restarts_in_a_row(before: int, ran_s: float) -> int:
    """The count of restarts in a row once a run of ``ran_s`` seconds ended: ``before``,
    unless the run was a steady one."""
    return 0 if ran_s >= STEADY_S else before
