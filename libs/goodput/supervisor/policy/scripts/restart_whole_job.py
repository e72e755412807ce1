"""Baseline policy: what a fixed-size job without goodput's remediation does.

Any fault restarts the whole job, on the same nodes, from the newest checkpoint. It never
swaps in a spare, never changes the data-parallel size and ignores stragglers, so a lost node
keeps the job down until that node is repaired (``node_returned``) — a plain torchrun job
under a batch scheduler with requeue. ``goodput demo --compare-baseline`` runs it against the
built-in policy on the same fault scenario.
"""

from goodput.policy import JobState, Plan
from goodput.schemas import Restart, Signal


def decide(signal: Signal, state: JobState) -> Plan:
    down = [n for n in state.active if (record := state.node(n)) is not None and record.down]
    if signal.signal == "straggler":
        return Plan([], "baseline-ignore-straggler", "a fixed-size job runs at its slowest rank")
    if down:
        return Plan(
            [],
            "baseline-wait-for-repair",
            f"{', '.join(down)} down: the job needs all of its nodes and has no spare",
        )
    if signal.signal == "node_returned" and signal.node not in state.active:
        return Plan([], "baseline-not-ours", f"{signal.node} is not one of the job's nodes")
    return Plan(
        [Restart(job=state.job)],
        "baseline-restart-job",
        f"{signal.signal} on {signal.node or 'the job'}: restart the whole job",
    )
