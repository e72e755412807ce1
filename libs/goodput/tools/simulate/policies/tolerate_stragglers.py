"""The built-in policy, except that stragglers are tolerated instead of evicted.

The simulator's ``+scale-down/up`` and ``+interval-tuning`` strategies: elastic remediation
before straggler eviction is added (``goodput``, the built-in policy itself).
"""

from goodput.policy import JobState, Plan, default_policy
from goodput.schemas import Signal


def decide(signal: Signal, state: JobState) -> Plan:
    if signal.signal == "straggler":
        return Plan([], "straggler-ignored", "this strategy does not evict stragglers")
    return default_policy(signal, state)
