"""Crash-loop protection: restarts that keep failing back off, then the controller gives up.

While fewer than ``max_restarts`` remediations of failures happened within ``window_s``, the
policy acts at once. Past that, each further failure first waits ``backoff_s × 2^level``
(level 0, 1, ...) and then is remediated; once ``max_backoffs`` back-offs did not help, the
controller stops the job with a reason that says so. A quiet window resets the level.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from goodput.supervisor.jobstate.folds import FAILURE_KINDS
from goodput.supervisor.jobstate.model import JobState

NS = 1_000_000_000


class CrashLoopLimits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    window_s: float = 600.0
    max_restarts: int = 3
    backoff_s: float = 30.0
    max_backoffs: int = 3


class Verdict(msgspec.Struct, kw_only=True):
    action: Literal["go", "defer", "give_up"]
    level: int
    until_ts: int = 0
    reason: str = ""


def judge(state: JobState, now: int, limits: CrashLoopLimits, *, retry: bool) -> Verdict:
    """May a failure's restarting remediation run now? ``retry``: its back-off was served."""
    since = now - int(limits.window_s * NS)
    recent = sum(1 for r in state.restarts if r.ts >= since and r.signal in FAILURE_KINDS)
    if recent < limits.max_restarts:
        return Verdict(action="go", level=0 if recent == 0 else state.backoff_level)
    if retry:
        return Verdict(action="go", level=state.backoff_level)
    if state.backoff_level >= limits.max_backoffs:
        return Verdict(
            action="give_up",
            level=state.backoff_level,
            reason=(
                f"crash loop: {recent} restarts within {limits.window_s:g} s and still failing "
                f"after {state.backoff_level} back-off(s); giving up"
            ),
        )
    delay_s = limits.backoff_s * 2**state.backoff_level
    return Verdict(
        action="defer",
        level=state.backoff_level + 1,
        until_ts=now + int(delay_s * NS),
        reason=(
            f"crash loop: {recent} restarts within {limits.window_s:g} s; "
            f"backing off {delay_s:g} s before remediating"
        ),
    )
