"""Example policy: on a broken node, scale down at once instead of waiting for a hot swap.

Useful when spares take long to join (a cold image pull, a far zone): training continues on
fewer replicas right away, and the built-in ``scale-up`` rule grows the job back when a node
returns. Everything else is left to the built-in policy.
"""

from goodput.policy import JobState, Plan, default_policy, scale_down
from goodput.schemas import Signal


def decide(signal: Signal, state: JobState) -> Plan:
    plan = default_policy(signal, state)
    if plan.rule in ("hot-swap", "repeat-offender", "evict-straggler-hot-swap"):
        chosen = scale_down(state, signal.node, why=f"{signal.signal} on {signal.node}")
        return Plan(chosen.commands, f"prefer-scale-down ({chosen.rule})", chosen.reason)
    return plan
