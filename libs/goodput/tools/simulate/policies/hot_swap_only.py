"""A job with spares but a fixed size: restart in place, hot swap a broken node for a spare,
and with no spare free wait for a repair (never scale down); stragglers are ignored.

The simulator's ``+hot-swap`` strategy: what spares alone buy over the baseline.
"""

from goodput.policy import JobState, Plan
from goodput.schemas import HotSwap, Restart, Signal


def decide(signal: Signal, state: JobState) -> Plan:
    down = [n for n in state.active if (record := state.node(n)) is not None and record.down]
    if down and state.spares:
        return Plan(
            [HotSwap(job=state.job, failed_node=down[0], spare_node=state.spares[0])],
            "hot-swap",
            f"{down[0]} is down: swap in spare {state.spares[0]}",
        )
    if signal.signal == "straggler":
        return Plan([], "straggler-ignored", "a fixed-size job runs at its slowest rank")
    if down:
        return Plan([], "wait-for-repair", f"{', '.join(down)} down and no spare free")
    if signal.signal == "node_returned":
        if signal.node in state.active:
            return Plan([Restart(job=state.job)], "restart-repaired", f"{signal.node} is back")
        return Plan([], "spare-kept", f"{signal.node} is back: kept as a spare")
    return Plan(
        [Restart(job=state.job)],
        "in-job-restart",
        f"{signal.signal} on {signal.node or 'the job'}: restart in place",
    )
