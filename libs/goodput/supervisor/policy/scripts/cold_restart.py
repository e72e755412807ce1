"""Policy: the built-in one with in-process restart and standbys turned off (every restart
is cold).

For jobs whose loop cannot be re-entered, and as the cold side of
``goodput bench recovery --mode cold``: a correctable crash or hang restarts every rank in
new processes, as before in-process restart and standby ranks existed.
"""

import msgspec

from goodput.policy import JobState, Plan, default_policy
from goodput.schemas import Restart, RestartInProcess, Signal


def decide(signal: Signal, state: JobState) -> Plan:
    # as if no node kept a standby: no command asks for one, and no reason mentions one
    plan = default_policy(signal, msgspec.structs.replace(state, standbys={}))
    if not any(isinstance(c, RestartInProcess) for c in plan.commands):
        return plan
    commands = [
        Restart(job=state.job) if isinstance(c, RestartInProcess) else c for c in plan.commands
    ]
    return Plan(
        commands,
        "in-job-restart",
        f"correctable {signal.signal} on {signal.node}: restart every rank cold from the newest "
        "checkpoint (in-process restart off)",
    )
